"""Errors a user can fix (the scripts print these as one line and exit non-zero), the exit
code of a stop, and the wording of messages said in more than one place. Imports no torch:
the scripts read it before their heavy imports."""

import json
import re

# EX_TEMPFAIL: stopped by a signal (SIGTERM, SIGUSR1, a first Ctrl-C in training) before the
# work was done; run the same command again: training, the tools and the scripts all use it.
EXIT_STOPPED = 75


class UserError(Exception):
    """Bad input (a config value, a path, a checkpoint); the message names problem and fix."""


class ConfigError(UserError):
    """A config file, key or value that cannot be used."""


class CheckpointError(UserError):
    """A checkpoint that is missing, corrupt, unsafe or does not fit the model."""


class CorruptCheckpoint(CheckpointError):
    """The bytes are not a checkpoint (truncated, overwritten, not a torch file), so the file
    can be set aside. Other read failures (I/O, memory) say nothing about the file."""


def unreadable(path, exc: BaseException) -> str:
    """Why a checkpoint that may be whole could not be read (the system's fault, not the
    file's): nothing is set aside."""
    reason = f"{type(exc).__name__}: {first_line(exc, 160)}"
    return (
        f"checkpoint {str(path)!r} could not be read ({reason}); "
        "nothing was renamed: fix the cause (disk, network filesystem, permissions, memory) "
        "and run the same command again"
    )


def holds_code(path, what: str | None = None) -> str:
    """Why a checkpoint file (or a shard index) holding pickled Python objects is refused:  # feature: fsdp
    """Why a checkpoint file holding pickled Python objects is refused:  # feature: !fsdp
    loading them could run code. `what`: the global it names, where known."""
    named = f" ({what})" if what else ""
    return (
        f"checkpoint {str(path)!r} holds pickled Python objects{named}, which weights_only "
        "loading refuses (they can run code); re-save it with tensors and plain containers "
        "only, if you trust its source"
    )


# What a project generated with more of the template's options accepts (a config key, a
# key=value, a checkpoint's kind) and this one was generated without: {what: the option that
# brings it}. A config or checkpoint of such a project is refused with that option, by name.
LEFT_OUT: dict[str, str] = {}
# The value a config key of LEFT_OUT holds where that project did not use it (its configs
# write every key): such a config or checkpoint loads here. Not listed: false.
UNUSED: dict[str, object] = {}
# >>> !fsdp
LEFT_OUT |= {"train.strategy=fsdp": "fsdp", "train.cpu_offload": "fsdp", "shards": "fsdp"}
# <<< !fsdp
# >>> !text
LEFT_OUT |= dict.fromkeys(("data.name=text", "data.name=text_table", "model.name=hf"), "text")
LEFT_OUT |= dict.fromkeys(("task.name=language_model", "model.name=transformer"), "text")
# <<< !text
# >>> !pretrained
LEFT_OUT |= {f"model.name={name}": "pretrained" for name in ("timm", "torchvision", "hf_image")}
LEFT_OUT |= dict.fromkeys(("model.name=hf", "data.name=text_table"), "pretrained")  # feature: text
# <<< !pretrained
LEFT_OUT |= {"data.name=image_folder": "images"}  # feature: !images
LEFT_OUT |= {f"run.loggers={name}": "trackers" for name in ("wandb", "mlflow")}  # feature: !trackers
# >>> !multilabel
LEFT_OUT |= dict.fromkeys(("task.name=multilabel", "data.labels", "data.label_sep"), "multilabel")
UNUSED |= {"data.labels": "", "data.label_sep": "|"}  # an image folder's, a CSV table's
# <<< !multilabel


def unused(key: str, value) -> bool:
    """Whether config key `key` of LEFT_OUT holds the value that means it was not used."""
    off = UNUSED.get(key, False)
    return key in LEFT_OUT and type(value) is type(off) and value == off


def left_out(key: str, subject: str = "") -> str:
    """The line refusing `key` of LEFT_OUT (said as `subject`), naming the option to bring."""
    option = LEFT_OUT[key]
    return (
        f"{subject or key} needs the template option {option}, which this project was "
        f"generated without; bring it in with cruft (README.md, at the top): cruft update "
        "--variables-to-update '" + json.dumps({option: "yes"}) + "'"
    )


def is_out_of_memory(exc: BaseException) -> bool:
    """An allocation that failed: a size in the config too large for this machine or GPU."""
    if isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError":
        return True
    text = str(exc)
    return isinstance(exc, RuntimeError) and (
        "DefaultCPUAllocator" in text or "not enough memory" in text or "out of memory" in text
    )


def first_line(exc: BaseException, limit: int = 200) -> str:
    """The first line of an exception's message, shortened: for one-line error reports."""
    lines = str(exc).strip().splitlines()
    text = lines[0] if lines else type(exc).__name__
    text = re.sub(r"^\[enforce fail at [^\]]*\] (err == 0\. )?", "", text)  # c10's prefix
    return text if len(text) <= limit else text[: limit - 3] + "..."


def user_message(exc: UserError) -> str:
    """The message of a UserError. One raised in a DataLoader worker (an image that cannot be
    decoded) comes back to the main process as the same type whose message is the worker's
    whole traceback ("Caught ... in DataLoader worker process 0. Original Traceback ..."); its
    last line is the original "module.ConfigError: message"."""
    text = str(exc).strip()
    if text.startswith("Caught ") and "Original Traceback" in text:
        text = text.splitlines()[-1].partition(": ")[2] or text.splitlines()[-1]
    return bounded(text)


# A message quotes what the user gave (a value, a key, a column name), which can be a megabyte.
QUOTE_LIMIT = 200  # characters of one quoted value
LINE_LIMIT = 1000  # characters of a whole message


def _quoted(q: str) -> str:
    """q, over QUOTE_LIMIT characters of one line, q (spelt without brace pairs: this file
    is a template)."""
    return q + "[^" + q + "\\n]" + "{" + str(QUOTE_LIMIT + 1) + ",}" + q


# A repr's quote follows a space, ( [ = or :, never a letter, as the apostrophe of "it's" does.
_LONG_QUOTE = re.compile(r"(?<!\w)(" + _quoted("'") + "|" + _quoted('"') + ")")


def bounded(text: str) -> str:
    """`text` with each quoted value cut to QUOTE_LIMIT characters, and the whole kept under
    LINE_LIMIT: its start (the problem) and its end (the fix) survive."""
    text = _LONG_QUOTE.sub(lambda m: m[0][: QUOTE_LIMIT + 1] + "…" + m[0][0], text)
    if len(text) > LINE_LIMIT:
        text = f"{text[: LINE_LIMIT - 320]} … {text[-300:]}"
    return text
