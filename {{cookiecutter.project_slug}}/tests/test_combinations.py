"""Options as users combine them: every pair of values of tests/pairwise.py's axes, each case
either refused up front or trained end to end.

A refused case must end with exit 2, one `error:` line naming the conflicting keys, and no run
folder. Any other case trains until a SIGTERM stops it (saved, exit 75), resumes to the end
and then the commands its summary prints (evaluate, predict and the other tools it names)
must work on
its checkpoints, with evaluate's metrics equal to what the run recorded. A traceback, a hang or
a setting silently dropped fails the case, and the failure prints the command to rerun it.

One-process cases run in this process (the SIGTERM is raised right after the run's first line,
so it stops after one step); two-rank cases run under torchrun and the SIGTERM goes to its
whole process group after the first epoch, as SLURM sends it. COMBINATIONS_DEVICE=cuda runs
the suite on GPUs: fp16 and NCCL cases train there instead of
being refused.
"""

from __future__ import annotations

import contextlib
import csv
import faulthandler
import io
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from conftest import ROOT
from pairwise import (
    AXES,
    IMAGE_TASKS,
    REFUSED,
    case_id,
    covering_cases,
    possible,
    refusal,
    resume_refusal,
)
from test_distributed import STANDALONE, child_env

from {{ cookiecutter.package_name }} import checkpoint, trainer
from {{ cookiecutter.package_name }}.config import flatten, load_config, to_dict
from {{ cookiecutter.package_name }}.data import close_loader
from {{ cookiecutter.package_name }}.distributed import DistInfo
from {{ cookiecutter.package_name }}.tools.consolidate import consolidate_main  # feature: fsdp
from {{ cookiecutter.package_name }}.tools.evaluate import evaluate_main
from {{ cookiecutter.package_name }}.tools.export import export_main  # feature: export
from {{ cookiecutter.package_name }}.tools.predict import predict_main
from {{ cookiecutter.package_name }}.tools.train import train_main

pytestmark = pytest.mark.slow

DEVICE = os.environ.get("COMBINATIONS_DEVICE", "cpu")
CASES = covering_cases(device=DEVICE)
CONFIGS = ROOT / "configs" / "experiments"


def family_args(task: str, data: Path) -> list[str]:
    """--config and overrides that make each task's example tiny (seconds a case)."""
    if task in ZOO_FAMILIES:  # feature: pretrained
        return ZOO_FAMILIES[task](data)  # feature: pretrained
    return {
        "cls-synthetic-cnn": [
            "data.train_size=384",
            "data.val_size=64",
            "data.image_size=8",
            "data.num_classes=4",
            "model.width=8",
        ],
        "cls-csv-mlp": [
            "data.name=csv",
            f"data.path={data / 'classes.csv'}",
            "data.label=species",
            "model.name=mlp",
            "model.width=16",
        ],
        # >>> images
        "cls-images-cnn": [
            "--config",
            str(CONFIGS / "image_folder.yaml"),
            f"data.root={data / 'images'}",
            "data.image_size=8",
            "model.width=8",
        ],
        # <<< images
        "cls-imbalanced-mlp": [
            "--config",
            str(CONFIGS / "imbalanced_table.yaml"),
            f"data.path={data / 'imbalanced.csv'}",
            "model.width=16",
        ],
        # >>> multilabel
        "ml-tags-mlp": [
            "--config",
            str(CONFIGS / "multilabel_table.yaml"),
            f"data.path={data / 'multilabel.csv'}",
            "model.width=16",
        ],
        # <<< multilabel
        "reg-csv-mlp": [
            "--config",
            str(CONFIGS / "csv_regression.yaml"),
            f"data.path={data / 'regression.csv'}",
            "model.width=16",
        ],
        # >>> text
        "lm-text": [
            "--config",
            str(CONFIGS / "char_lm.yaml"),
            f"data.path={data / 'text.txt'}",
            "data.seq_len=16",
            "model.width=16",
            "model.depth=1",
            "model.heads=2",
            "model.max_len=16",
        ],
        # <<< text
    }[task]


# >>> pretrained
def timm_args(data: Path) -> list[str]:
    """timm's 0.37M-parameter test model from weights made here (random init, timm's format)."""
    weights = data / "test_resnet.pth"
    if not weights.exists():  # cases of other workers may make it too: write, then rename
        import timm

        staged = data / f".test_resnet.{os.getpid()}.pth"
        torch.save(timm.create_model("test_resnet").state_dict(), staged)
        os.replace(staged, weights)
    return [
        "--config",
        str(CONFIGS / "finetune_image_folder.yaml"),
        f"data.root={data / 'images'}",
        "data.image_size=32",
        "model.arch=test_resnet",
        f"model.weights={weights}",
        "train.freeze_epochs=1",
    ]


# >>> text
def hf_args(data: Path) -> list[str]:
    """A 2-layer BERT and its tokenizer, made here as a save_pretrained folder."""
    folder = data / "bert"
    if not folder.exists():
        from test_hf_text import texts_of, tiny_bert

        staged = tiny_bert(data / f".bert.{os.getpid()}", texts_of(data / "tickets.csv"))
        with contextlib.suppress(OSError):  # another worker's folder got there first
            staged.rename(folder)
    return [
        "--config",
        str(CONFIGS / "hf_text_classifier.yaml"),
        f"data.path={data / 'tickets.csv'}",
        "data.max_length=32",
        f"model.arch={folder}",
        "train.freeze_epochs=1",
    ]


# <<< text
ZOO_FAMILIES = {"cls-images-timm": timm_args, "cls-text-hf": hf_args}  # feature: text
ZOO_FAMILIES = {"cls-images-timm": timm_args}  # feature: !text
# <<< pretrained

COMMON = [
    "train.batch_size=16",
    "train.epochs=3",
    "train.warmup_steps=2",
    "run.log_every=2",
    "run.threads=1",
]


def case_args(case: dict, data: Path, out: Path, base: Path | None) -> list[str]:
    """The first launch's arguments (everything but how it resumes)."""
    args = [*family_args(case["task"], data), *COMMON, f"run.device={DEVICE}"]
    args += [f"run.output_dir={out}", f"run.name={case_id(case)[:80]}"]
    args += [
        f"train.strategy={case['strategy']}",
        f"train.amp={case['amp']}",
        f"train.compile={str(case['compile']).lower()}",
        f"train.channels_last={str(case['channels_last']).lower()}",
        f"train.grad_accum_steps={case['accum']}",
        f"data.num_workers={case['workers']}",
        f"run.loggers=[{case['loggers'].replace('+', ',')}]",
        f"train.activation_checkpointing={str(case['act_ckpt']).lower()}",
        f"train.sync_bn={str(case['sync_bn']).lower()}",
        f"train.cpu_offload={str(case['cpu_offload']).lower()}",  # feature: fsdp
        f"run.deterministic={str(case['deterministic']).lower()}",
        f"train.freeze_epochs={case['freeze']}",
        f"train.ema_decay={case['ema']}",
        f"train.on_nonfinite={case['nonfinite']}",
        f"train.micro_batch_size={case['micro']}",
    ]
    if case["early_stop"]:  # no epoch improves by 100: stops after the second epoch
        args += ["train.early_stop_patience=1", "train.early_stop_min_delta=100"]
    if case["folds"]:
        args += [f"data.folds={case['folds']}", "data.fold=1"]
    if case["start"] in ("init", "init-fresh"):
        args.append(f"train.init_from={base}")
    if case["start"] == "init":
        args.append("train.resume=auto")
    return args


def config_of(args: list[str]):
    """The Config that scripts/train.py makes of `args` ([--config FILE] key=value...)."""
    if args[:1] == ["--config"]:
        return load_config(args[1], args[2:])
    return load_config(None, args)


def changed_setting(case: dict, args: list[str]) -> str:
    """The override the resume adds: the case's resume_change (tests/pairwise.py)."""
    cfg = config_of(args)
    return {
        "lr": f"train.lr={cfg.train.lr / 2}",
        "amp": f"train.amp={ {'off': 'bf16', 'bf16': 'off', 'fp16': 'bf16'}[case['amp']] }",
        "channels_last": f"train.channels_last={str(not case['channels_last']).lower()}",
        "seed": f"run.seed={cfg.run.seed + 1}",
    }[case["resume_change"]]


@pytest.fixture(scope="module", autouse=True)
def _own_compile_cache(tmp_path_factory):
    """torch.compile's cache in a folder of the suite's own, for this process and torchrun's:
    a file left truncated in the shared one (a process killed while compiling) would fail
    every later compile of that kernel, whichever test it is."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path_factory.mktemp("inductor")))
        yield


@pytest.fixture(scope="module")
def data(demo_root, tmp_path_factory) -> Path:
    """The demo data, cut down: 400 table rows (800 of the imbalanced one: 80 positives),
    6,000 characters of text,  # feature: text
    the 480 images,  # feature: images
    a copy of the session's demo data (the fast tests have made it already)."""
    root = tmp_path_factory.mktemp("combination-data") / "demo"
    shutil.copytree(demo_root / "data" / "demo", root)
    tables = [("classes.csv", 400), ("regression.csv", 400), ("imbalanced.csv", 800)]
    for name, rows in [*tables, ("multilabel.csv", 400)]:  # feature: multilabel
    for name, rows in tables:  # feature: !multilabel
        lines = (root / name).read_text().splitlines(keepends=True)
        (root / name).write_text("".join(lines[: rows + 1]))
    # >>> text
    (root / "text.txt").write_text((root / "text.txt").read_text()[:6000])
    lines = (root / "tickets.csv").read_text().splitlines(keepends=True)
    (root / "tickets.csv").write_text("".join(lines[:301]))
    # <<< text
    return root


@pytest.fixture(scope="module")
def bases(data, tmp_path_factory) -> dict:
    """A finished one-epoch run per task, whose best.pt the init_from cases start from."""
    out = tmp_path_factory.mktemp("combination-bases")
    found = {}
    for task in AXES["task"]:
        args = [*family_args(task, data), *COMMON, "train.epochs=1", "run.loggers=[csv]"]
        args += [f"run.device={DEVICE}", f"run.output_dir={out}", f"run.name={task}"]
        code, text = launch(args)
        assert code == 0, text
        found[task] = out / task / "best.pt"
    return found


def launch(argv: list[str], stop_after_announce: bool = False) -> tuple[int, str]:
    """scripts/train.py in this process: (exit code, stdout + stderr)."""
    out = io.StringIO()
    announce = trainer.announce

    def announce_then_stop(*args, **kwargs):
        announce(*args, **kwargs)
        signal.raise_signal(signal.SIGTERM)  # as a scheduler would: stop, save, exit 75

    torch._dynamo.reset()  # compiled cases: no recompile limit carried between cases
    faulthandler.dump_traceback_later(300, exit=True)  # a hang ends the suite, with stacks
    try:
        if stop_after_announce:
            trainer.announce = announce_then_stop
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            code = train_main(argv)
    finally:
        trainer.announce = announce
        faulthandler.cancel_dump_traceback_later()
    return code, out.getvalue()


def torchrun(argv: list[str], stop_after_announce: bool = False) -> tuple[int, str]:
    """scripts/train.py on two ranks; with `stop_after_announce`, SIGTERM to the whole job
    (torchrun, ranks, loader workers), as scancel sends it, once the first epoch is done.
    Not sooner: torchrun kills its ranks 30 s after a SIGTERM, and a first step that compiles
    on two loaded cores can take longer than that."""
    cmd = [sys.executable, "-m", "torch.distributed.run", *STANDALONE, "scripts/train.py"]
    proc = subprocess.Popen(
        [*cmd, *argv],
        cwd=ROOT,
        env=child_env(PYTHONUNBUFFERED="1"),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if stop_after_announce and line.startswith("epoch 1/"):
                os.killpg(proc.pid, signal.SIGTERM)
        code = proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
    return code, "".join(lines)


def assert_no_traceback(text: str, rerun: str) -> None:
    """No traceback from the project's code (torchrun's own report of a rank that exited 75,
    or of the SIGTERM it was sent, is torchrun's way of saying so)."""
    ours = re.search(r'File "[^"]*(scripts/\w+\.py|/{{ cookiecutter.package_name }}/)', text)
    assert ours is None, f"{rerun}\n{text[-5000:]}"


TOOLS = {
    "scripts/consolidate.py": consolidate_main,  # feature: fsdp
    "scripts/evaluate.py": evaluate_main,
    "scripts/predict.py": predict_main,
    "scripts/export.py": export_main,  # feature: export
}


def tool(script: str, args: list[str]) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        code = TOOLS[script](args)
    assert code == 0, f"python {script} {shlex.join(args)} -> exit {code}\n{out.getvalue()}"
    return out.getvalue()


def next_commands(text: str) -> dict[str, list[str]]:
    """The summary's `next:` commands: {name: [script, args...]}."""
    found = {}
    for line in text.split("\nnext:\n", 1)[-1].splitlines():
        name, sep, command = line.strip().partition(": python ")
        if sep:
            found[name] = shlex.split(command)
    return found


def recorded(out: Path, run: str) -> dict:
    with (out / "runs.csv").open(newline="") as f:
        return next(row for row in csv.DictReader(f) if row["run"] == run)


def evaluated(checkpoint: Path, case: dict) -> dict:
    # >>> fsdp
    if case["strategy"] == "fsdp":  # what the summary's consolidate command does
        tool("scripts/consolidate.py", ["--checkpoint", str(checkpoint)])
        checkpoint = checkpoint.with_name(f"{checkpoint.stem}.full.pt")
    # <<< fsdp
    text = tool("scripts/evaluate.py", ["--checkpoint", str(checkpoint), "--json"])
    return json.loads(text.strip().splitlines()[-1])


def run_folder(path: Path) -> dict:
    """Every file's bytes, but the lock's (which names the process that last held it)."""
    return {p: p.read_bytes() for p in path.rglob("*") if p.is_file() and p.name != ".lock"}


def assert_refused(code: int, text: str, keys: tuple, ranks: int, rerun: str) -> None:
    """Exit 2 (torchrun: every rank exited 2), one `error:` line naming `keys`, no traceback."""
    errors = [line for line in text.splitlines() if line.startswith("error:")]
    exited = code == 2 if ranks == 1 else code != 0 and text.count("exitcode  : 2") == ranks
    assert exited and len(errors) == 1, f"{rerun}\nexpected a refusal:\n{text[-3000:]}"
    assert all(key in errors[0] for key in keys), f"{rerun}\n{errors[0]}"
    assert_no_traceback(text, rerun)


def assert_applied(change: str, first: str, second: str, saved: dict, rerun: str) -> None:
    """The resume lists the changed setting and, unless the run had nothing left to do, uses
    it (the run's line shows lr and amp) and its checkpoints record it."""
    key, value = change.split("=", 1)
    changed = re.search(r"settings changed since step \d+: (.*)", second)
    assert changed and f"{key} " in changed.group(1), f"{rerun}\nchange not listed:\n{second}"
    if "is complete; nothing to do" in second:
        return
    if key == "train.amp":
        assert f"| amp {value} |" in second, f"{rerun}\namp not applied:\n{second}"
    if key == "train.lr":
        lr = r"\| lr ([\d.e+-]+) \|"
        lrs = [float(re.search(lr, text).group(1)) for text in (first, second)]
        assert lrs[1] == pytest.approx(lrs[0] / 2, rel=0.01), f"{rerun}\nlr not applied: {lrs}"
    want = flatten(to_dict(config_of([key + "=" + value])))[key]
    assert flatten(saved["config"])[key] == want, f"{rerun}\n{key} not recorded"


def batch_norm_counts(model: dict) -> set[int]:
    return {int(v) for k, v in model.items() if k.endswith("num_batches_tracked")}


def assert_batch_norm_counted_each_batch_once(args: list, ranks: int, saved, model, start, rerun):
    """Every BatchNorm's num_batches_tracked is the number of training batches rank 0 took
    (after `start`, init_from's count), times the micro-batches each was cut into: a
    recomputation (train.activation_checkpointing) must not count them twice, and a frozen
    backbone's (train.freeze_epochs) must not count any."""
    cfg = config_of(args)
    data = trainer.build_loaders(cfg, DistInfo(world_size=ranks), torch.device("cpu"))
    batches = len(data.train_loader)  # whole batches only (drop_last): samples / batch_size
    close_loader(data.train_loader), close_loader(data.val_loader)
    progress = saved["progress"]
    per_batch = cfg.train.batch_size * ranks
    # The pretrained models' BatchNorms are all in their backbones: still while frozen.
    frozen = min(cfg.train.freeze_epochs, progress["epoch"])
    micro = progress["micro_batch"] or cfg.train.batch_size  # train.micro_batch_size
    parts = -(-cfg.train.batch_size // micro)
    want = start + (progress["epoch"] - frozen) * batches * parts
    if progress["epoch"] >= cfg.train.freeze_epochs:
        want += progress["epoch_samples"] // per_batch * parts
    counts = batch_norm_counts(model)
    assert counts == {want}, f"{rerun}\n{counts} vs {want} batches"


def assert_close(got: float, want: float, what: str) -> None:
    assert abs(got - want) <= 1e-3 * max(1.0, abs(want)), f"{what}: evaluate {got} vs {want}"


def test_the_suite_covers_every_pair_and_every_refusal():
    """The generated cases hold every pair of values that some case can train with, and one
    case per rule that refuses it (the generator itself, checked independently of it)."""
    for a in AXES:
        for b in AXES:
            for va in AXES[a]:
                for vb in AXES[b]:
                    if a >= b or not possible({a: va, b: vb}, DEVICE):
                        continue
                    assert any(
                        c[a] == va and c[b] == vb and not refusal(c, DEVICE) for c in CASES
                    ), (a, va, b, vb)
    for rule in REFUSED:
        if DEVICE in rule.devices:
            assert any(refusal(c, DEVICE) is rule for c in CASES), rule.why
    assert len({case_id(c) for c in CASES}) == len(CASES)


def test_the_readme_lists_every_refused_combination():
    readme = (ROOT / "docs" / "combinations.md").read_text()
    for rule in REFUSED:
        assert all(key.split("=")[0] in readme for key in rule.keys), rule.keys
        assert rule.why in readme, f"docs/combinations.md's refused combinations lack: {rule.why}"


@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_combination(case, data, bases, tmp_path):
    out = tmp_path / "runs"
    args = case_args(case, data, out, bases[case["task"]])
    name = case_id(case)[:80]
    ranks = case["world"]
    run = torchrun if ranks > 1 else launch
    rerun = f"rerun: {'torchrun --nproc_per_node=2' if ranks > 1 else 'python'} scripts/train.py"
    rerun += f" {shlex.join(args)}"
    if ranks > torch.cuda.device_count() and DEVICE == "cuda":
        pytest.skip(f"needs {ranks} GPUs")

    rule = refusal(case, DEVICE)
    if rule is not None:
        code, text = run(args)
        assert_refused(code, text, rule.keys, ranks, rerun)
        assert not (out / name).exists(), f"{rerun}\na refused run wrote {out / name}"
        return

    # 1. Train until a SIGTERM right after the run's first line: saved, exit 75.
    code, first = run(args, stop_after_announce=True)
    assert_no_traceback(first, rerun)
    assert "stopped (SIGTERM)" in first and (out / name / "last.pt").exists(), (
        f"{rerun}\nno stop and save after SIGTERM (exit {code}):\n{first[-4000:]}"
    )
    if ranks == 1:
        assert code == trainer.EXIT_PREEMPTED, f"{rerun}\n{first[-4000:]}"
    if case["start"] in ("init", "init-fresh"):  # fine-tuning must load the weights
        assert f"init_from {bases[case['task']]}" in first, f"{rerun}\ninit_from dropped:\n{first}"
    steps = int(re.search(r"(\d+) steps/epoch", first).group(1))
    stopped_at = int(re.search(r"stopped \(SIGTERM\) at step (\d+)", first).group(1))

    # 2. Resume to the end, the way the case says.
    resume = {
        "fresh": ["train.resume=auto"],
        "init": [],  # train.resume=auto is in args already
        "init-fresh": ["train.resume=auto"],
        "path": [f"train.resume={out / name / 'last.pt'}"],
    }[case["start"]]
    max_steps = stopped_at + max(steps // 2, 1)
    max_steps += max_steps % steps == 0  # mid-epoch, whatever the epoch
    if case["max_steps"] == "mid-epoch":
        resume.append(f"train.max_steps={max_steps}")
    # 2a. With one setting changed: refused in one line, leaving the run as it was, or applied.
    change = changed_setting(case, args)
    keys = resume_refusal(case)
    if keys:
        files = run_folder(out / name)
        code, text = run([*args, *resume, change])
        assert_refused(code, text, keys, ranks, f"{rerun} {shlex.join([*resume, change])}")
        assert run_folder(out / name) == files, f"{rerun} {change}\nthe run folder changed"
    else:
        resume.append(change)
    code, second = run([*args, *resume])
    rerun += f" {shlex.join(resume)}"
    assert_no_traceback(second, rerun)
    assert code == 0, f"{rerun}\nresume failed (exit {code}):\n{second[-4000:]}"
    # A stop that landed on the epoch where early stopping ends the run leaves nothing to do.
    done = case["early_stop"] and "stopped early" in second and "is complete" in second
    assert done or re.search(r"resumed at step [1-9]", second), f"{rerun}\nnot resumed:\n{second}"

    saved = checkpoint.load(out / name / "last.pt")
    if not keys:
        assert_applied(change, first, second, saved, rerun)

    # 3. What the run recorded is what its checkpoints hold.
    row = recorded(out, name)
    best_key = next(key for key in row if key.startswith("best_val_"))
    metric = best_key.removeprefix("best_val_")
    best = evaluated(out / name / "best.pt", case)
    assert_close(best[metric], float(row[best_key]), f"{rerun}\nbest.pt's {metric}")
    last = evaluated(out / name / "last.pt", case)
    if case["task"] in IMAGE_TASKS:  # the CNN's BatchNorms
        sharded = case["strategy"] == "fsdp"  # its consolidated file holds the model  # feature: fsdp
        model = (checkpoint.load(out / name / "last.full.pt") if sharded else saved)["model"]  # feature: fsdp
        model = saved["model"]  # feature: !fsdp
        start = 0
        if case["start"] in ("init", "init-fresh"):  # init_from copies the counts too
            (start,) = batch_norm_counts(checkpoint.load(bases[case["task"]])["model"])
        assert_batch_norm_counted_each_batch_once(
            [*args, *resume], ranks, saved, model, start, rerun
        )
    for key in ("loss", metric):  # the summary's final metrics are the last model's
        assert_close(last[key], float(row[f"val_{key}"]), f"{rerun}\nlast.pt's {key}")
    if case["max_steps"] == "mid-epoch" and not case["early_stop"]:
        assert int(row["steps"]) == max_steps, f"{rerun}\n{row}"

    # 4. The summary's next commands work: predict and export (in the case's format).  # feature: export
    # 4. The summary's next command works: predict.  # feature: !export
    commands = next_commands(second)
    for what in ("predict", "export"):  # feature: export
    for what in ("predict",):  # feature: !export
        script, *tool_args = commands[what]
        if what == "export":  # feature: export
            tool_args[tool_args.index("--format") + 1] = case["export"]  # feature: export
        text = tool(script, tool_args)
        if what == "predict" and "accuracy" in text and "acc" in best:
            acc = float(re.search(r"accuracy ([\d.]+)", text).group(1))
            # The validation split gives evaluate's accuracy (which, like training's
            # validation, runs under train.amp: predict computes in fp32).
            if "--split" in tool_args and saved["config"]["train"]["amp"] == "off":
                assert_close(acc, best["acc"], f"{rerun}\npredict's accuracy")


def test_the_table_with_a_test_split_example(data, tmp_path):
    """configs/experiments/table_with_test.yaml: trains, scores its test table once at the end
    (with best.pt), and the summary's commands work: evaluate --split test (equal to what the
    run recorded), predict, export; a stop and resume does not score the test table twice."""  # feature: export
    run recorded), predict; a stop and resume does not score the test table twice."""  # feature: !export
    out = tmp_path / "runs"
    args = ["--config", str(CONFIGS / "table_with_test.yaml"), f"data.path={data / 'classes.csv'}"]
    args += [f"data.test_path={data / 'classes_test.csv'}", "model.width=16", *COMMON]
    args += [f"run.device={DEVICE}", f"run.output_dir={out}"]
    code, first = launch(args, stop_after_announce=True)
    assert code == trainer.EXIT_PREEMPTED and "test (" not in first, first[-3000:]
    code, text = launch([*args, "train.resume=auto"])
    assert_no_traceback(text, shlex.join(args))
    assert code == 0, text[-3000:]
    lines = [line for line in text.splitlines() if line.lstrip().startswith("test (")]
    assert len(lines) == 1 and "test (best.pt" in lines[0], text[-3000:]
    row = recorded(out, "table_with_test")
    assert int(row["test_count"]) == 500 and row["test_model"] == "best.pt"
    commands = next_commands(text)
    script, *tool_args = commands["test"]
    scored = json.loads(tool(script, [*tool_args, "--json"]).strip().splitlines()[-1])
    assert scored["split"] == "test" and scored["count"] == 500
    assert_close(scored["acc"], float(row["test_acc"]), "evaluate --split test's acc")
    for what in ("predict", "export"):  # feature: export
    for what in ("predict",):  # feature: !export
        script, *tool_args = commands[what]
        tool(script, tool_args)
    # >>> export
    exported = sorted((out / "table_with_test").glob("best.*.json"))
    assert exported and json.loads(exported[0].read_text())["input"]["columns"][:2] == ["f0", "f1"]
    # <<< export
