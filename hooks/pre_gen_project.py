"""Check the answers before cookiecutter writes any file; a bad answer stops generation.

Each problem is one line that names the field, the value, what would be accepted and how to
pass a fix on the command line. cookiecutter_pytorch_checks.py runs these same checks when the
answers are complete, before cookiecutter creates the project directory (it cannot create one
named '' or '..', or of 300 characters, and ends in its own error); this hook runs them again
for `--replay`, which skips that step. Cookiecutter has already created the (empty) project
directory when this hook runs, and deletes it when the hook fails.

Both hooks run on the Python that cookiecutter runs on, from 3.9; an older one is refused here
with one line, before any check.
"""

from __future__ import annotations

import json
import keyword
import re
import subprocess
import sys
import sysconfig
from pathlib import Path

if sys.version_info < (3, 9):  # noqa: UP036 (the floor is what this checks at run time)
    sys.exit(
        f"cookiecutter-pytorch: cookiecutter runs on Python {sys.version.split()[0]}, and this "
        "template needs 3.9 or newer: install cookiecutter for a newer Python "
        "(e.g. pipx install --python python3.12 cookiecutter) and run it again"
    )

# Read once, as JSON in a raw string, so that quotes, backslashes and unicode in any answer cannot
# break this file; before rendering the line is valid Python too.
ANSWERS = json.loads(r"""{{ cookiecutter | tojson }}""")

# 3.10 reached its end of life in October 2026, and transformers 5 (the [hf] extra) needs 3.11.
PYTHON_VERSIONS = ("3.11", "3.12", "3.13")
# Import names of the baked project's dependencies (requirements.txt and the extras): a
# package of the same name would hide them.
DEPENDENCIES = {
    *("torch", "torchvision", "numpy", "yaml", "tqdm", "tensorboard", "pytest", "ruff"),
    *("PIL", "matplotlib", "onnx", "onnxruntime", "wandb", "mlflow"),  # the optional extras
}
# Names that clash with the project's own folders or read as something else on sys.path.
GENERIC_NAMES = {"test", "tests", "data", "models", "utils", "scripts", "configs", "src"}

# At most this many characters in the directory and in the package name: well inside the
# file-name limit (255) with room for the paths below them.
MAX_NAME = 64
SLUG_RULE = "lowercase letters, digits, '-', '_' and '.', starting with a letter or digit"
PACKAGE_RULE = "a lowercase Python identifier (a-z, 0-9, '_'; not starting with a digit)"
EMAIL_RE = re.compile(r"[^@\s\"'\\<>(),;:]+@[A-Za-z0-9-]+(\.[A-Za-z0-9-]+)+")


def check_slug(slug: str) -> str | None:
    """Why `slug` is not a usable directory and distribution name, or None."""
    if len(slug) > MAX_NAME:
        return f"it has {len(slug)} characters, at most {MAX_NAME} are accepted"
    if re.fullmatch(r"[a-z0-9][a-z0-9._-]*", slug):
        return None
    return f"use {SLUG_RULE} (no '/', no spaces, no leading '.' or '-')"


def stdlib_module_names() -> frozenset[str]:
    """Top-level module names of the standard library (sys.stdlib_module_names from 3.10)."""
    if hasattr(sys, "stdlib_module_names"):
        return frozenset(sys.stdlib_module_names)
    names = set(sys.builtin_module_names)
    for folder in (sysconfig.get_paths()["stdlib"], sysconfig.get_paths()["platstdlib"]):
        for path in (Path(folder), Path(folder) / "lib-dynload"):
            if path.is_dir():
                names.update(p.name.split(".")[0] for p in path.iterdir())
    return frozenset(names - {"site-packages", "lib-dynload", "__pycache__"})


def check_package_name(name: str) -> str | None:
    """Why `name` cannot be the import name of the package, or None."""
    if len(name) > MAX_NAME:
        return f"it has {len(name)} characters, at most {MAX_NAME} are accepted"
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        return f"use {PACKAGE_RULE}"
    if keyword.iskeyword(name):
        return "it is a Python keyword"
    if name in stdlib_module_names():
        return f"it would shadow the standard library module '{name}'"
    if name in DEPENDENCIES:
        return f"it would shadow the project's dependency '{name}'"
    if name in GENERIC_NAMES:
        return "it is too generic: it would clash with a folder or module of the same name"
    return None


def check_email(email: str) -> str | None:
    """Why `email` does not look like an e-mail address, or None (a shape check only)."""
    return None if EMAIL_RE.fullmatch(email) else "use the shape name@example.com"


def check_python_version(version: str) -> str | None:
    """Why `version` is not a supported Python version, or None."""
    return None if version in PYTHON_VERSIONS else f"use one of {', '.join(PYTHON_VERSIONS)}"


def suggest(field: str, value: str) -> str:
    """A value close to `value` that passes the check of `field`, for the error message."""
    if field == "project_slug":
        slug = re.sub(r"[^a-z0-9._-]+", "-", value.lower())[:MAX_NAME].strip(".-_")
        return slug or "my-project"
    if field == "package_name":
        # room for the "pkg_" or "_project" added below
        name = re.sub(r"\W+", "_", value.lower(), flags=re.ASCII)[: MAX_NAME - 8].strip("_")
        name = name or "my_project"
        name = f"pkg_{name}" if name[0].isdigit() else name
        return name if check_package_name(name) is None else f"{name}_project"
    if field == "python_version":
        return "3.11"
    return "you@example.com"


CHECKS = {
    "project_slug": check_slug,
    "package_name": check_package_name,
    "author_email": check_email,
    "python_version": check_python_version,
}


def problems(answers: dict) -> list[str]:
    """One line per bad answer: field, value, what is accepted and how to pass a fix."""
    lines = []
    slug = str(answers.get("project_slug", ""))
    for field, check in CHECKS.items():
        value = str(answers.get(field, ""))
        if field == "package_name" and check_slug(slug) and value == slug.replace("-", "_"):
            continue  # derived from the bad slug: it follows the fixed one
        reason = check(value)
        if field == "project_slug" and not value:
            name = str(answers.get("project_name", ""))
            if not any(char.isalnum() for char in name):  # the slug is made from the name
                reason = f"project_name={name!r} has no letter or digit to make it from"
        if reason is not None:
            lines.append(
                f"cookiecutter-pytorch: {field}={value!r} is not accepted: {reason}; "
                f"pass a fix on the command line, e.g. {field}={suggest(field, value)}"
            )
    return lines


def remove_empty_parents_later(project_dir: Path, output_dir: Path) -> None:
    """Remove the folders that a slug like 'a/b' made above the project directory.

    Cookiecutter deletes the project directory when this hook fails, but not the parents it
    created for it. A detached helper waits until the project directory is gone, then removes
    the parents that are empty, up to (not including) the output directory.
    """
    if output_dir not in project_dir.parents or any(project_dir.iterdir()):
        return
    parents = [str(p) for p in project_dir.parents if output_dir in p.parents]
    if not parents:
        return
    helper = (
        "import os, sys, time\n"
        "deadline = time.monotonic() + 30\n"
        "while os.path.exists(sys.argv[1]) and time.monotonic() < deadline:\n"
        "    time.sleep(0.05)\n"
        "for parent in sys.argv[2:]:\n"
        "    try:\n"
        "        os.rmdir(parent)\n"
        "    except OSError:\n"
        "        break\n"
    )
    subprocess.Popen(
        [sys.executable, "-c", helper, str(project_dir), *parents],
        cwd=output_dir,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )


def main() -> int:
    lines = problems(ANSWERS)
    for line in lines:
        print(line, file=sys.stderr)
    if lines and "_output_dir" in ANSWERS:
        output_dir = Path(ANSWERS["_output_dir"]).resolve()
        remove_empty_parents_later(Path.cwd().resolve(), output_dir)
    return 1 if lines else 0


if __name__ == "__main__":
    sys.exit(main())
