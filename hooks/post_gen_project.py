"""Finish the new project: drop unused files, first git commit, environment, smoke test.

The environment and the smoke test are the job of the project's own scripts/create_env.py,
the same code that `make env` runs; this hook calls it with this interpreter. No set-up step
fails the generation: a failed step is reported with its log and the command to retry, and
the project is kept. A template error in applying the features (a mark it cannot read) fails
it with one line, and cookiecutter removes the half-made project.

A regeneration over an existing project (`--overwrite-if-exists`) keeps what the user has: a
git repository the project is already in gets no init and no commit, and an existing .venv or
.conda-env is not touched (and no smoke test runs); each says so in a line. A new repository's
first commit holds the files the template wrote, named one by one, never other files that were
already in the folder.

COOKIECUTTER_PYTORCH_SKIP_SETUP=1 skips git, environment and smoke test (for the CI of other
tools); so does cruft, which re-runs the hooks in temporary copies on every `cruft update` and
diffs them (a .git or .venv there breaks the diff).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

# Read once, as JSON in a raw string, so that quotes, backslashes and unicode in any answer cannot
# break this file; before rendering the line is valid Python too.
ANSWERS = json.loads(r"""{{ cookiecutter | tojson }}""")

SKIP_ENV = "COOKIECUTTER_PYTORCH_SKIP_SETUP"
COMMIT_MESSAGE = "Initial commit from cookiecutter-pytorch"


def say(message: str) -> None:
    print(message, flush=True)


def skip_setup(environ=os.environ) -> bool:
    return environ.get(SKIP_ENV, "").strip().lower() in {"1", "true", "yes", "on"}


def run_by_cruft(answers: dict) -> bool:
    """cruft adds the template's commit to the answers; plain cookiecutter does not."""
    return "_commit" in answers


# The features a project may leave out: the files that are theirs alone, removed when the
# feature is not chosen. Lines of shared files that belong to a feature are marked (see
# FEATURE_MARK); the rest of the project does not know the feature exists.
FEATURES = {
    "fsdp": (
        # {package}: the package folder (written with one brace: Jinja renders this file)
        "{package}/fsdp.py",
        "{package}/checkpoint/sharded.py",
        "{package}/checkpoint/shard_reader.py",
        "{package}/tools/consolidate.py",
        "scripts/consolidate.py",
        "tests/test_fsdp.py",
        "tests/test_checkpoint_safety.py",
    ),
    "export": (
        "{package}/tools/export.py",
        "{package}/tools/formats.py",
        "{package}/tools/serving.py",
        "scripts/export.py",
        "tests/test_export.py",
        "tests/test_export_lengths.py",
    ),
    "sweeps": (
        *("{package}/tools/sweep.py", "{package}/tools/sweep_cli.py"),
        *("{package}/tools/sweep_plan.py", "{package}/tools/sweep_report.py"),
        *("{package}/tools/sweep_manifest.py", "{package}/tools/sweep_optuna.py"),
        *("{package}/tools/sweep_study.py", "{package}/tools/sweep_launch.py"),
        *("{package}/tools/sweep_watch.py", "{package}/tools/sweep_trials.py"),
        "scripts/sweep.py",
        "tests/test_sweep.py",
        "tests/test_sweep_optuna.py",
        "docs/sweeps.md",
    ),
    "trackers": (
        "{package}/utils/tracker_wandb.py",
        "{package}/utils/tracker_mlflow.py",
        "tests/test_trackers.py",
    ),
    "text": (
        "{package}/models/transformer.py",
        "{package}/tasks/language_model.py",
        "{package}/data/text.py",
        "{package}/data/text_table.py",
        "{package}/tools/generate.py",
        "{package}/tools/predict_text.py",
        "configs/experiments/char_lm.yaml",
        "configs/experiments/hf_text_classifier.yaml",
        "tests/test_text.py",
        "tests/test_hf_text.py",
        "tests/test_export_lengths.py",
    ),
    "images": (
        "{package}/data/image_folder.py",
        "{package}/data/image_decode.py",
        "{package}/tools/predict_images.py",
        "configs/experiments/image_folder.yaml",
        "tests/test_image_folder.py",
    ),
    # A file in two features' lists goes where either is left out: Hugging Face text
    # classifiers (data.name=text_table) are text and pretrained models.
    "pretrained": (
        "{package}/models/zoo.py",
        "{package}/models/hf.py",
        "{package}/data/text_table.py",
        "{package}/tools/predict_text.py",
        "configs/experiments/finetune_image_folder.yaml",
        "configs/experiments/hf_text_classifier.yaml",
        "scripts/gpu_checks/pretrained.py",
        "tests/test_zoo.py",
        "tests/test_hf.py",
        "tests/test_hf_text.py",
    ),
    "multilabel": (
        "{package}/tasks/multilabel.py",
        "{package}/data/label_sets.py",
        "configs/experiments/multilabel_table.yaml",
        "tests/test_multilabel.py",
    ),
    "gpu_check": (
        "scripts/gpu_check.py",
        "scripts/gpu_checks",
        "scripts/benchmark_gpu.py",
        "tests/test_gpu_check.py",
        "tests/test_gpu_check_quick.py",
        "tests/test_benchmark_gpu.py",
        "docs/gpu-check.md",
    ),
}
# What each preset chooses; a feature answered "preset" takes its preset's value.
PRESETS = {
    "lean": dict.fromkeys(FEATURES, "no"),
    "full": dict.fromkeys(FEATURES, "yes"),
}
# A chosen feature brings the features it needs, whatever their own answers: pretrained
# models fine-tune on image folders and read image files as their weights were trained; the
# GPU check's speed check trains the transformer language model.
BRINGS = {"pretrained": ("images",), "gpu_check": ("text",)}
# A block of lines that belongs to feature NAME, in the comment syntax of its file:
#   # >>> NAME ... # <<< NAME    or, in Markdown,    <!-- >>> NAME --> ... <!-- <<< NAME -->
# and one line: a trailing `# feature: NAME` (or `<!-- feature: NAME -->`). The marks are
# removed from every bake; the marked lines stay only when NAME is chosen (!NAME: only when
# it is not, for the words that differ without it; A|B: when either is, for what two
# features share). Nested blocks: when each is.
FEATURE_MARK = re.compile(r"^\s*(?:#|<!--) (>>>|<<<) (!?\w+(?:\|!?\w+)*)(?: -->)?\s*$")
LINE_MARK = re.compile(
    r"\s*(?:# feature: (!?\w+(?:\|!?\w+)*)|<!-- feature: (!?\w+(?:\|!?\w+)*) -->)\s*$"
)
ANY_LINE_MARK = re.compile(r"(?:#|<!--) feature: !?\w+")  # one not at the end is an error
# Files that may hold marks (the others are not read).
MARKED_SUFFIXES = {".py", ".md", ".toml", ".txt", ".yml", ".yaml", ".sh", ".cfg", ""}


def chosen_features(answers: dict) -> dict[str, bool]:
    """{feature: chosen}, each "preset" answer resolved through the preset."""
    preset = PRESETS.get(answers.get("preset", "full"), PRESETS["full"])
    values = {name: answers.get(name, "preset") for name in FEATURES}
    chosen = {name: (preset[name] if v == "preset" else v) == "yes" for name, v in values.items()}
    for name, needs in BRINGS.items():
        if chosen[name]:
            chosen |= dict.fromkeys(needs, True)
    return chosen


def wanted(name: str, chosen: dict[str, bool]) -> bool:
    """Whether lines marked `name` (a feature, !feature, or either of a|b) stay."""
    if "|" in name:
        return any(wanted(part, chosen) for part in name.split("|"))
    return not chosen[name[1:]] if name.startswith("!") else chosen[name]


def known(name: str, chosen: dict[str, bool], where: str) -> str:
    """`name`, if each of its parts is a feature (or !feature); else the template's error."""
    for part in name.split("|"):
        if part.lstrip("!") not in chosen:
            raise ValueError(f"{where}: unknown feature {part!r}")
    return name


def keep_marked_lines(text: str, chosen: dict[str, bool], where: str = "") -> str:
    """`text` without the lines of unchosen features and without any mark; a mark of an
    unknown feature or an unclosed block is an error of the template, raised."""
    kept, open_blocks = [], []
    # Blank lines around a dropped run count once, as many as the larger side had: blank
    # lines kept before it, and those seen after it (ruff format's spacing stays).
    dropped, before, after = False, 0, 0
    for number, line in enumerate(text.splitlines(keepends=True), 1):
        block = FEATURE_MARK.match(line)
        if block:
            kind, name = block.groups()
            known(name, chosen, f"{where}:{number}")
            if kind == ">>>":
                open_blocks.append(name)
            elif not open_blocks or open_blocks.pop() != name:
                raise ValueError(f"{where}:{number}: '<<< {name}' closes no open block")
            continue
        tag = LINE_MARK.search(line)
        if not tag and ANY_LINE_MARK.search(line):
            raise ValueError(f"{where}:{number}: a feature mark must end its line")
        names = list(open_blocks)
        if tag:
            names.append(known(tag.group(1) or tag.group(2), chosen, f"{where}:{number}"))
            line = line[: tag.start()] + line[tag.end() :].lstrip(" \t")
            line = line if line.endswith("\n") else line + "\n"
        if not all(wanted(name, chosen) for name in names):
            if not dropped:
                before = next((i for i, k in enumerate(reversed(kept)) if k.strip()), len(kept))
            dropped, after = True, 0
            continue
        if not line.strip() and dropped:
            after += 1
            if after <= before:
                continue
        elif line.strip():
            dropped = False
        kept.append(line)
    if open_blocks:
        raise ValueError(f"{where}: block '>>> {open_blocks[-1]}' is not closed")
    while dropped and kept and not kept[-1].strip():  # a file ending in a dropped block
        kept.pop()
    return "".join(kept)


def apply_features(answers: dict, project: Path) -> None:
    """Remove the files of the features not chosen and the marked lines of shared files; the
    marks go from every file the template wrote (a file of yours, in a folder generated again,
    is not read). Running it again changes nothing."""
    chosen = chosen_features(answers)
    for name, paths in FEATURES.items():
        if chosen[name]:
            continue
        package = answers.get("package_name", "")
        for path in (project / path.format(package=package) for path in paths):
            if path.is_dir():
                shutil.rmtree(path)
            else:
                path.unlink(missing_ok=True)
    skip = {".git", ".venv", ".conda-env", "__pycache__", "node_modules"}
    written = template_files(answers, project)
    for path in project.rglob("*") if written is None else map(project.joinpath, written):
        if path.suffix not in MARKED_SUFFIXES or not path.is_file() or skip & set(path.parts):
            continue
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        if ">>> " in text or "feature: " in text:
            new = keep_marked_lines(text, chosen, str(path.relative_to(project)))
            if new != text:
                path.write_text(new, encoding="utf-8")


def remove_unused_files(answers: dict, project: Path) -> None:
    """Files that only some answers need (the template renders them for every answer)."""
    apply_features(answers, project)
    if answers.get("license") == "none":
        (project / "LICENSE").unlink(missing_ok=True)
    if answers.get("ci") == "none":
        shutil.rmtree(project / ".github", ignore_errors=True)
    if answers.get("docker") != "yes":
        for name in ("Dockerfile", ".dockerignore"):
            (project / name).unlink(missing_ok=True)
        shutil.rmtree(project / ".devcontainer", ignore_errors=True)


def git_identity_args(answers: dict, project: Path) -> list[str]:
    """`-c user.name=... -c user.email=...` for what git has no identity configured for."""
    args = []
    for key, answer in (("user.name", "author_name"), ("user.email", "author_email")):
        found = subprocess.run(["git", "config", "--get", key], cwd=project, capture_output=True)
        if found.returncode != 0:
            args += ["-c", f"{key}={answers[answer]}"]
    return args


def run_git(*args: str, project: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["git", *args], cwd=project, stdin=subprocess.DEVNULL, capture_output=True, text=True
    )


def last_line(result: subprocess.CompletedProcess) -> str:
    return ((result.stderr or result.stdout).strip().splitlines() or ["no output"])[-1]


def git(*args: str, project: Path) -> str | None:
    """Run git; None when it worked, else the last line it printed."""
    result = run_git(*args, project=project)
    return None if result.returncode == 0 else last_line(result)


def enclosing_repository(project: Path) -> str | None:
    """The top folder of the git repository `project` is already in, or None."""
    if (project / ".git").exists():  # the template writes none: it was here before
        return str(project)
    found = run_git("rev-parse", "--show-toplevel", project=project)
    return found.stdout.strip() if found.returncode == 0 else None


def templated(name: str) -> str:
    """The name of a templated folder of the template, for answer `name`. Its braces are not
    written side by side here, since Jinja renders this file."""
    return "{" * 2 + "cookiecutter." + name + "}" * 2


def template_dir(answers: dict, environ=os.environ) -> Path | None:
    """The template's folder, or None where it is not known. cookiecutter records it as the
    user gave it (`_repo_dir`: `.` for `cookiecutter .`) and runs this hook inside the new
    project, so a relative path is resolved against the folder cookiecutter was started in
    (the shell's PWD, which the hook inherits), never against the project."""
    given = answers.get("_repo_dir")
    if not given:
        return None
    starts = [Path(given)] if Path(given).is_absolute() else []
    starts += [Path(environ["PWD"]) / given] if environ.get("PWD") else []
    for folder in starts:
        baked = folder / templated("project_slug")
        if baked.is_dir() and (folder / "cookiecutter.json").is_file():
            return folder.resolve()
    return None


def template_files(answers: dict, project: Path) -> list[str] | None:
    """The files of `project` that the template wrote (relative, sorted), or None when the
    template folder is unknown. Only the package folder's name is templated."""
    folder = template_dir(answers)
    if folder is None:
        return None
    template = folder / templated("project_slug")
    package = templated("package_name")
    names = (
        p.relative_to(template).as_posix().replace(package, answers["package_name"])
        for p in template.rglob("*")
        if p.is_file()
    )
    names = [*names, CRUFT_FILE]  # written by this hook (link_cruft) for the template
    return sorted(name for name in names if (project / name).is_file())


CRUFT_FILE = ".cruft.json"
LINK_LATER = (
    'cruft link -y --extra-context "$(cat .cookiecutter.json)" <the template\'s git URL or '
    "checkout>"
)


def link_cruft(answers: dict, project: Path) -> None:
    """Write .cruft.json (what `cruft link` writes, with this project's own answers) so that
    `cruft update` and `cruft check` work on a project plain cookiecutter made; where the
    template is no git checkout, one line with the command that links it later."""
    if (project / CRUFT_FILE).exists() or shutil.which("git") is None:  # linked; no git (said)
        return
    folder = template_dir(answers)
    top = commit = None
    if folder is not None:
        top = git_output(folder, "rev-parse", "--show-toplevel")
        commit = top and git_output(folder, "rev-parse", "HEAD")
    if not commit:
        say(f"  cruft: the template is no git checkout here: nothing linked (later: {LINK_LATER})")
        return
    inside = folder.relative_to(Path(top).resolve()).as_posix()
    context = {k: v for k, v in answers.items() if not k.startswith("_")}
    context |= {"_template": top, "_commit": commit}
    state = {
        "template": top,
        "commit": commit,
        "checkout": None,
        "context": {"cookiecutter": context},
        "directory": None if inside == "." else inside,
    }
    text = json.dumps(state, ensure_ascii=False, indent=2, separators=(",", ": ")) + "\n"
    (project / CRUFT_FILE).write_text(text, encoding="utf-8")
    say(f"  cruft: linked to {top} at {commit[:12]} (cruft update brings its changes)")


def git_output(folder: Path, *args: str) -> str | None:
    """git's output in `folder`, stripped; None where it fails."""
    found = run_git(*args, project=folder)
    return found.stdout.strip() or None if found.returncode == 0 else None


def commit_template_files(answers: dict, project: Path, files: list[str]) -> str | None:
    """Add `files` (less what .gitignore excludes) and make the first commit: None, or the
    error. Pathspecs are literal, so that no file name is read as a pattern."""
    args = ("--literal-pathspecs", "ls-files", "-z", "--others", "--exclude-standard", "--")
    listed = run_git(*args, *files, project=project)
    if listed.returncode != 0:
        return last_line(listed)
    addable = listed.stdout.split("\0")[:-1]
    identity = git_identity_args(answers, project)
    return git("--literal-pathspecs", "add", "--", *addable, project=project) or git(
        *identity, "commit", "-q", "-m", COMMIT_MESSAGE, project=project
    )


def init_git(answers: dict, project: Path) -> bool:
    """`git init` and a first commit of the generated files, unless a repository is there."""
    if shutil.which("git") is None:
        say("  git: not found; skipped (later: git init && git add -A && git commit)")
        return True
    top = enclosing_repository(project)
    if top is not None:
        say(
            f"  git: already in the repository at {top}: left as it is, nothing committed; "
            "review `git status` and commit what you keep"
        )
        return True
    files = template_files(answers, project)
    if files is None:
        say(
            "  git: the template's folder is unknown, so nothing was committed "
            "(later: git init && git add -A && git commit)"
        )
        return True
    print("  git init + first commit ...", end="", flush=True)
    start = time.monotonic()
    error = git("init", "-q", project=project) or commit_template_files(answers, project, files)
    seconds = time.monotonic() - start
    if error is not None:
        say(f" FAILED ({seconds:.1f} s): {error}")
        return False
    others = run_git("ls-files", "--others", "--exclude-standard", project=project).stdout
    kept = len(others.splitlines())
    note = f"; not committed: {kept} file(s) that were here before (git status)" if kept else ""
    say(f" done ({seconds:.1f} s){note}")
    return True


def existing_environment(project: Path) -> str | None:
    """The environment folder already in `project` (a regeneration), or None."""
    for name in (".venv", ".conda-env"):
        if (project / name).exists():
            return name
    return None


def setup_environment(answers: dict, project: Path) -> bool:
    """scripts/create_env.py, plus the smoke test when asked; its own output is the report.
    An environment that is already there is the user's: it is not updated or recreated."""
    existing = existing_environment(project)
    if existing is not None:
        redo = "recreates" if existing == ".conda-env" else "updates"
        say(
            f"  environment: {existing} is already here: left as it is, no smoke test "
            f"(`make env` {redo} it, `make smoke` tests it)"
        )
        return True
    cmd = [sys.executable, "scripts/create_env.py"]
    if answers.get("run_smoke_test") == "yes":
        cmd.append("--smoke")
    try:
        return subprocess.run(cmd, cwd=project, stdin=subprocess.DEVNULL).returncode == 0
    except OSError as err:
        say(f"  environment: could not run scripts/create_env.py: {err}")
        return False


def main() -> int:
    project = Path.cwd()
    try:  # the template's own step: an error here is the template's, and fails the bake
        remove_unused_files(ANSWERS, project)
    except Exception as err:
        say(
            f"cookiecutter-pytorch: the features could not be applied ({type(err).__name__}: "
            f"{err}); nothing was kept: please report this against the template"
        )
        return 1
    try:  # the set-up steps: a failure is reported and the project kept
        return set_up(project)
    except Exception as err:  # never let cookiecutter delete a generated project
        say(f"cookiecutter-pytorch: setup stopped early ({type(err).__name__}: {err})")
        return 0


def set_up(project: Path) -> int:
    """git, the environment and the smoke test, as the answers ask."""
    if skip_setup():
        say(f"cookiecutter-pytorch: {SKIP_ENV} is set: no git, environment or smoke test")
        return 0
    if run_by_cruft(ANSWERS):
        say("cookiecutter-pytorch: run by cruft: no git, environment or smoke test (make env)")
        return 0
    start = time.monotonic()
    say(f"cookiecutter-pytorch: setting up {project}")
    ok = True
    if ANSWERS.get("init_git") == "yes":  # cruft updates a project through git
        link_cruft(ANSWERS, project)
        ok = init_git(ANSWERS, project)
    ok = setup_environment(ANSWERS, project) and ok
    status = "ready" if ok else "project generated and kept, but setup had problems (above)"
    say(f"cookiecutter-pytorch: {status} in {time.monotonic() - start:.1f} s")
    log = project / "setup.log"
    if not ok:
        say("  the commands to retry are above" + (f"; full log: {log}" if log.exists() else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
