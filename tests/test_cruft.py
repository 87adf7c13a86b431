"""cruft: create a project from the template, change the template, update the project.

The template is copied into a git repository of its own (cruft needs one to diff commits). cruft
re-renders the template in temporary folders on every update, so the heavy setup (git,
environment, smoke test) must not run there: the post-generation hook skips it when
COOKIECUTTER_PYTORCH_SKIP_SETUP is set, and also when cruft runs it. The project's own edits
must survive the update.
Also: the baked .cookiecutter.json holds the answers only, enough to bake the project again.
"""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from _hookutil import HOOK_VARIABLES, load_module
from conftest import FAST, TEMPLATE, copy_template
from cookiecutter.main import cookiecutter

GIT_IDENTITY = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.org",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.org",
}
PROJECT_README = "{{cookiecutter.project_slug}}/README.md"
TEMPLATE_LINE = "Upgrading: this line arrived with `cruft update`."
USER_LINE = "# my note: keep this line through template updates"
CRUFT = [sys.executable, "-m", "cruft"]


@pytest.fixture
def env(tmp_path):
    home = tmp_path / "home"  # no user gitconfig or cookiecutterrc of the machine
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in HOOK_VARIABLES}
    return {**env, **GIT_IDENTITY, "HOME": str(home), "GIT_CONFIG_NOSYSTEM": "1"}


def run(cmd: list[str], cwd: Path, env: dict) -> str:
    result = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{cmd}\n{result.stdout}\n{result.stderr}"
    return result.stdout


def commit_all(repo: Path, env: dict, message: str) -> None:
    run(["git", "add", "-A"], repo, env)
    run(["git", "commit", "-q", "-m", message], repo, env)


def template_repo(tmp_path: Path, env: dict) -> Path:
    """A copy of the template with a git history of its own (this checkout may be a worktree)."""
    repo = tmp_path / "template"
    copy_template(repo)
    run(["git", "init", "-q"], repo, env)
    commit_all(repo, env, "template v1")
    return repo


@pytest.mark.parametrize(
    ("skip_variable", "answers"),
    [
        ("1", FAST),
        # Without the variable, with a git repository asked for: the hook sees cruft's answers
        # and skips the setup by itself (a .git in cruft's renders breaks its diff).
        (None, {**FAST, "init_git": "yes"}),
    ],
    ids=["skip variable", "cruft detected"],
)
def test_cruft_create_then_update_keeps_user_edits(tmp_path, env, skip_variable, answers):
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    pytest.importorskip("cruft")
    if skip_variable is not None:
        env["COOKIECUTTER_PYTORCH_SKIP_SETUP"] = skip_variable
    template = template_repo(tmp_path, env)
    out = tmp_path / "out"
    extra = json.dumps(answers)
    run([*CRUFT, "create", str(template), "--no-input", "--output-dir", str(out),
         "--extra-context", extra], tmp_path, env)  # fmt: skip
    project = out / "my-pytorch-project"
    assert json.loads((project / ".cruft.json").read_text())["template"] == str(template)
    assert not (project / ".git").exists()  # the setup (git, env, smoke) was skipped
    assert not (project / "setup.log").exists()
    run(["git", "init", "-q"], project, env)
    commit_all(project, env, "generated")

    # The user's edits: a changed config, a new model file, the README's first line.
    config = project / "configs" / "default.yaml"
    config.write_text(f"{USER_LINE}\n{config.read_text()}")
    (project / "my_pytorch_project" / "models" / "mine.py").write_text('"""Mine."""\n')
    readme = project / "README.md"
    user_title = "# My own title\n"
    readme.write_text(user_title + readme.read_text().split("\n", 1)[1])
    commit_all(project, env, "my edits")

    # The template moves on: a line at the end of the README and a new rendered file.
    baked_readme = template / PROJECT_README
    baked_readme.write_text(f"{baked_readme.read_text()}\n{TEMPLATE_LINE}\n")
    (template / "{{cookiecutter.project_slug}}" / "UPGRADING.md").write_text(
        "Notes for {{ cookiecutter.package_name }}.\n"
    )
    commit_all(template, env, "template v2")

    check = subprocess.run([*CRUFT, "check"], cwd=project, env=env, capture_output=True)
    assert check.returncode != 0  # out of date before the update

    run([*CRUFT, "update", "--skip-apply-ask", "--allow-untracked-files"], project, env)

    assert (project / "UPGRADING.md").read_text() == "Notes for my_pytorch_project.\n"
    text = readme.read_text()
    assert text.startswith(user_title) and text.rstrip().endswith(TEMPLATE_LINE)
    assert config.read_text().startswith(USER_LINE)
    assert (project / "my_pytorch_project" / "models" / "mine.py").exists()
    for leftover in ("*.rej", "*.orig"):
        assert not list(project.rglob(leftover))
    run([*CRUFT, "check"], project, env)


# Per feature: files that are its own, and a shared file with a line only it brings.
FEATURE_TRACES = {
    "export": (
        ["my_pytorch_project/tools/export.py", "scripts/export.py"],
        "pyproject.toml",
        "onnx",
    ),
    "fsdp": (
        ["my_pytorch_project/fsdp.py", "scripts/consolidate.py"],
        "configs/default.yaml",
        "cpu_offload",
    ),
    "gpu_check": (["scripts/gpu_check.py", "scripts/gpu_checks"], "Makefile", "gpu-check:"),
    "text": (["my_pytorch_project/data/text.py"], "docs/data.md", "char_lm"),
    "pretrained": (["my_pytorch_project/models/zoo.py"], "pyproject.toml", "timm"),
    "trackers": (["my_pytorch_project/utils/tracker_wandb.py"], "configs/default.yaml", "mlflow"),
    "multilabel": (["my_pytorch_project/tasks/multilabel.py"], "docs/data.md", "label_sep"),
    "images": (["my_pytorch_project/data/image_folder.py"], "pyproject.toml", "pillow"),
    "sweeps": (
        ["scripts/sweep.py", "my_pytorch_project/tools/sweep.py", "docs/sweeps.md"],
        "pyproject.toml",
        "optuna",
    ),
}


@pytest.mark.parametrize("feature", FEATURE_TRACES)
def test_cruft_update_brings_a_feature_in_and_takes_it_out(tmp_path, env, feature):
    """An option changed in .cruft.json (here through --variables-to-update) adds the feature's
    files and lines, or removes them, and leaves the user's own edits and files alone."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    pytest.importorskip("cruft")
    env["COOKIECUTTER_PYTORCH_SKIP_SETUP"] = "1"
    template = template_repo(tmp_path, env)
    extra = json.dumps({**FAST, "preset": "lean"})
    run([*CRUFT, "create", str(template), "--no-input", "--output-dir", str(tmp_path),
         "--extra-context", extra], tmp_path, env)  # fmt: skip
    project = tmp_path / "my-pytorch-project"
    paths, shared_name, line = FEATURE_TRACES[feature]
    own = [project / path for path in paths]
    shared = project / shared_name
    assert not any(path.exists() for path in own) and line not in shared.read_text()
    run(["git", "init", "-q"], project, env)
    commit_all(project, env, "generated")
    round_trip(project, env, feature)


def round_trip(project: Path, env: dict, feature: str) -> None:
    """The user edits a shared file (marked for `feature`) and adds one; `cruft update`
    brings the feature in, then takes it out: its files and lines come and go, the user's
    edits and file stay, and .cruft.json says each answer."""
    paths, shared_name, line = FEATURE_TRACES[feature]
    own = [project / path for path in paths]
    shared = project / shared_name
    unmarked = project / "Makefile"
    shared.write_text(f"{USER_LINE}\n{shared.read_text()}")
    unmarked.write_text(f"{unmarked.read_text()}{USER_LINE}\n")
    mine = project / "tests" / "test_mine.py"
    mine.write_text('"""Mine."""\n')
    commit_all(project, env, "my edits")

    for value in ("yes", "no"):
        update = ["update", "-y", "--variables-to-update", json.dumps({feature: value})]
        run([*CRUFT, *update], project, env)
        assert all(path.exists() == (value == "yes") for path in own), value
        text = shared.read_text()
        assert text.startswith(USER_LINE) and (line in text) == (value == "yes")
        assert mine.read_text() == '"""Mine."""\n'
        assert unmarked.read_text().endswith(f"{USER_LINE}\n")
        answers = json.loads((project / ".cruft.json").read_text())["context"]["cookiecutter"]
        assert answers[feature] == value
        assert not list(project.rglob("*.rej")) and not list(project.rglob("*.orig"))
        commit_all(project, env, f"{feature}={value}")


def test_the_readme_s_cookiecutter_command_makes_a_commit_and_a_project_cruft_updates(
    tmp_path, env
):
    """The template README's command, `cookiecutter --no-input . --output-dir ..` in the
    template's folder, committed nothing (the hook resolved `.` inside the new project); the
    baked README's `cruft link` asked every question again with the template's defaults, and
    the update that followed added nothing and said it had. Now the hook writes .cruft.json
    with the project's own answers, and `cruft update` works on a project plain cookiecutter
    made."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    pytest.importorskip("cruft")
    template = template_repo(tmp_path / "t", env)  # its parent: where --output-dir .. writes
    answers = " ".join(
        f"{k}={v}" for k, v in {**FAST, "init_git": "yes", "preset": "lean"}.items()
    )
    command = f"cookiecutter --no-input . --output-dir .. {answers}"  # the README's, plus answers
    out = run(
        ["bash", "-c", command],
        template,
        {**env, "PATH": f"{Path(sys.executable).parent}:{env['PATH']}"},
    )
    project = template.parent / "my-pytorch-project"
    assert "git init + first commit ... done" in out and "cruft: linked to" in out, out
    log = run(["git", "log", "--format=%s"], project, env).splitlines()
    assert log == ["Initial commit from cookiecutter-pytorch"]
    assert run(["git", "status", "--porcelain"], project, env) == ""  # .cruft.json committed
    state = json.loads((project / ".cruft.json").read_text())
    assert Path(state["template"]) == template.resolve() and len(state["commit"]) == 40
    assert state["context"]["cookiecutter"]["preset"] == "lean"
    round_trip(project, env, "export")
    run([*CRUFT, "check"], project, env)


def test_a_template_that_is_no_git_checkout_says_how_to_link_later(tmp_path, env):
    template = tmp_path / "plain"
    copy_template(template)  # no .git
    answers = [f"{k}={v}" for k, v in {**FAST, "init_git": "yes"}.items()]
    bake = ["cookiecutter", "--no-input", str(template), "--output-dir", str(tmp_path)]
    out = run([sys.executable, "-m", *bake, *answers], tmp_path, env)
    assert (
        'nothing linked (later: cruft link -y --extra-context "$(cat .cookiecutter.json)"' in out
    )
    assert not (tmp_path / "my-pytorch-project" / ".cruft.json").exists()


# --- .cookiecutter.json: the answers, without the generating machine's paths ---


def test_cookiecutter_json_holds_the_answers_and_no_paths(bake, tmp_path):
    project = bake(project_name="Ça va model 2")
    text = (project / ".cookiecutter.json").read_text(encoding="utf-8")
    saved = json.loads(text)
    public = [k for k in json.loads((TEMPLATE / "cookiecutter.json").read_text()) if k[0] != "_"]
    assert sorted(saved) == sorted(public)
    assert not [k for k in saved if k.startswith("_")]
    for path in (str(tmp_path), str(TEMPLATE), str(Path.home())):
        assert path not in text


def test_cookiecutter_json_bakes_the_same_project_again(bake, tmp_path):
    project = bake(project_name="Round Trip", license="Apache-2.0", compute="cpu", ci="none")
    saved = json.loads((project / ".cookiecutter.json").read_text(encoding="utf-8"))
    # As a user config file (JSON is YAML): `cookiecutter --config-file <it> --no-input`.
    config = tmp_path / "again.yaml"
    config.write_text(json.dumps({"default_context": saved}))
    again = Path(
        cookiecutter(
            str(TEMPLATE), no_input=True, config_file=str(config), output_dir=str(tmp_path / "b")
        )
    )
    assert again.name == project.name
    assert_same_tree(project, again)


def assert_same_tree(left: Path, right: Path) -> None:
    compare = filecmp.dircmp(left, right)
    stack = [compare]
    while stack:
        node = stack.pop()
        assert not (node.left_only or node.right_only), (node.left_only, node.right_only)
        _, mismatch, errors = filecmp.cmpfiles(node.left, node.right, node.common_files, False)
        assert not (mismatch or errors), (node.left, mismatch, errors)
        stack.extend(node.subdirs.values())


def test_create_env_reads_its_defaults_from_the_saved_answers(bake, monkeypatch):
    monkeypatch.setenv("COOKIECUTTER_PYTORCH_SKIP_SETUP", "1")  # env_manager=uv: no real .venv
    project = bake(env_manager="uv", compute="cu128", python_version="3.12")
    create_env = load_module(project / "scripts" / "create_env.py")
    args = create_env.parse_args([], create_env.load_answers(project))
    assert (args.manager, args.compute, args.python_version) == ("uv", "cu128", "3.12")
