"""The generation hooks: answer checks (unit and through the CLI), awkward names, git, skip,
regeneration over an existing project."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _hookutil import (
    HOOK_VARIABLES,
    TEMPLATE,
    answers,
    hook_lines,
    output_lines,
    render_hook,
    run_cli,
)
from conftest import FAST
from cookiecutter.exceptions import FailedHookException
from cookiecutter.main import cookiecutter

AWKWARD = {
    "quotes": 'Tom\'s "Quoted" Project',
    "triple quotes": 'Triple """ Quote Project',
    "trailing backslash": "Backslash Project \\",
    "unicode": "Ünïcødé Prøject ✓ 日本",
    "spaces": "  Lots   of   Spaces  ",
}


@pytest.fixture(autouse=True)
def _no_hook_variables(monkeypatch):
    for name in HOOK_VARIABLES:
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def pre(tmp_path):
    return render_hook("pre_gen_project", tmp_path)


# --- the hook files themselves ---


@pytest.mark.parametrize("name", ["pre_gen_project", "post_gen_project"])
def test_hook_is_valid_python_before_rendering(name):
    ast.parse((TEMPLATE / "hooks" / f"{name}.py").read_text(encoding="utf-8"))


def test_answer_checks_parse_as_python_39():
    # cookiecutter imports them (cookiecutter.json's _extensions), on its own Python
    source = (TEMPLATE / "cookiecutter_pytorch_checks.py").read_text(encoding="utf-8")
    ast.parse(source, feature_version=(3, 9))


@pytest.mark.parametrize("name", ["pre_gen_project", "post_gen_project"])
@pytest.mark.parametrize("value", AWKWARD.values(), ids=AWKWARD.keys())
def test_rendered_hook_reads_awkward_answers_exactly(tmp_path, name, value):
    hook = render_hook(name, tmp_path, project_name=value, author_name=value)
    assert hook.ANSWERS["project_name"] == value
    assert hook.ANSWERS["author_name"] == value


# --- pre_gen_project checks, unit ---


@pytest.mark.parametrize(
    "slug", ["my-project", "cat_classifier", "v2.model", "a", "9lives", "a" * 64]
)
def test_good_slug(pre, slug):
    assert pre.check_slug(slug) is None


@pytest.mark.parametrize(
    "slug",
    ["", ".", "..", "a/b", "../x", "/abs", ".hidden", "-dash", "My-Project", "my project", "a\\b"],
)
def test_bad_slug(pre, slug):
    assert pre.check_slug(slug)


def test_slug_and_package_name_are_at_most_64_characters(pre):
    assert "300 characters, at most 64" in pre.check_slug("a" * 300)
    assert "65 characters, at most 64" in pre.check_package_name("a" * 65)
    assert pre.check_package_name("a" * 64) is None


@pytest.mark.parametrize("name", ["my_project", "cat_classifier", "_private", "pkg2"])
def test_good_package_name(pre, name):
    assert pre.check_package_name(name) is None


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("my-pkg", "identifier"),
        ("My_Pkg", "identifier"),
        ("2fast", "identifier"),
        ("my pkg", "identifier"),
        ("", "identifier"),
        ("class", "keyword"),
        ("lambda", "keyword"),
        ("json", "standard library"),
        ("typing", "standard library"),
        ("torch", "dependency"),
        ("yaml", "dependency"),
        ("numpy", "dependency"),
        ("tests", "generic"),
        ("data", "generic"),
        ("models", "generic"),
        ("utils", "generic"),
    ],
)
def test_bad_package_name(pre, name, reason):
    assert reason in pre.check_package_name(name)


@pytest.mark.parametrize("email", ["you@example.com", "a.b+c@sub.example.org"])
def test_good_email(pre, email):
    assert pre.check_email(email) is None


@pytest.mark.parametrize("email", ["", "you", "you@", "@example.com", "a b@x.org", 'a"@x.org'])
def test_bad_email(pre, email):
    assert pre.check_email(email)


@pytest.mark.parametrize("version", ["3.11", "3.12", "3.13"])
def test_good_python_version(pre, version):
    assert pre.check_python_version(version) is None


@pytest.mark.parametrize("version", ["3.9", "3.10", "3.14", "3", "2.7", ""])
def test_bad_python_version(pre, version):
    assert "3.11, 3.12, 3.13" in pre.check_python_version(version)


def test_default_answers_pass(pre):
    assert pre.problems(answers()) == []


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("project_slug", "My Project/x"),
        ("package_name", "json"),
        ("package_name", "class"),
        ("package_name", "2fast"),
        ("author_email", "nobody"),
        ("python_version", "3.9"),
        ("project_slug", ".."),
        ("project_slug", "x" * 300),
        ("package_name", "p" * 300),
        ("package_name", "9" * 300),
    ],
)
def test_problem_is_one_line_with_field_value_and_a_fix_that_passes(pre, field, value):
    (line,) = pre.problems({**answers(), field: value})
    assert "\n" not in line
    assert line.startswith(f"cookiecutter-pytorch: {field}={value!r} is not accepted")
    fix = line.rsplit(f"e.g. {field}=", 1)[1]
    assert pre.CHECKS[field](fix) is None


def test_package_name_derived_from_a_bad_slug_is_not_reported_twice(pre):
    bad_slug = {**answers(), "project_slug": "My Project", "package_name": "My Project"}
    assert [line.split("=")[0] for line in pre.problems(bad_slug)] == [
        "cookiecutter-pytorch: project_slug"
    ]
    both = {**bad_slug, "package_name": "json"}
    assert len(pre.problems(both)) == 2


def test_an_empty_slug_made_from_the_name_names_the_name(pre):
    (line,) = pre.problems({**answers(), "project_name": "!!! ???", "project_slug": ""})
    assert line.startswith("cookiecutter-pytorch: project_slug='' is not accepted: ")
    assert "project_name='!!! ???' has no letter or digit" in line
    assert line.endswith("e.g. project_slug=my-project")


# --- the slug cookiecutter.json derives from the name ---


def test_derived_slug_is_capped_at_64_characters_on_a_word_boundary():
    assert len(answers(project_name="a" * 300)["project_slug"]) == 64
    slug = answers(project_name=" ".join(["word"] * 80))["project_slug"]
    assert len(slug) <= 64 and slug.endswith("-word")
    assert answers(project_name="a" * 300)["package_name"] == "a" * 64


def test_answers_are_checked_before_cookiecutter_makes_the_folder():
    # The extension of cookiecutter.json runs the hook's checks while cookiecutter collects
    # the answers: FailedHookException carries the hook's line, and no folder exists yet.
    with pytest.raises(FailedHookException, match=r"^cookiecutter-pytorch: project_slug=''"):
        answers(project_name="!!! ???")
    with pytest.raises(FailedHookException, match=r"package_name='json'.*\n.*author_email"):
        answers(package_name="json", author_email="nobody")


def test_the_checks_render_after_every_answer():
    # cookiecutter renders the answers in file order: the one that runs the checks must come
    # after every answer the checks read.
    keys = [k for k in json.loads((TEMPLATE / "cookiecutter.json").read_text()) if k[0] != "_"]
    order = list(json.loads((TEMPLATE / "cookiecutter.json").read_text()))
    assert order.index("__checked") > max(order.index(k) for k in keys)


# --- the answer checks through the CLI: exit 1, one line, nothing left behind ---


@pytest.mark.parametrize(
    ("answer", "field"),
    [
        ("project_slug=My Project", "project_slug"),
        ("project_slug=a/b", "project_slug"),
        ("project_slug=a/b/c", "project_slug"),
        ("project_slug=.hidden", "project_slug"),
        ("project_slug=-dash", "project_slug"),
        ("project_slug=..", "project_slug"),  # the output folder's parent
        ("project_slug=.", "project_slug"),  # the output folder itself
        ("project_slug=", "project_slug"),
        ("project_name=!!! ???", "project_slug"),  # no slug can be made from it
        ("project_slug=" + "s" * 300, "project_slug"),  # longer than a file name can be
        ("package_name=" + "p" * 300, "package_name"),
        ("package_name=class", "package_name"),
        ("package_name=json", "package_name"),
        ("package_name=torch", "package_name"),
        ("package_name=tests", "package_name"),
        ("author_email=not-an-email", "author_email"),
    ],
    ids=lambda value: value[:30],
)
def test_bad_answer_is_one_line_and_creates_nothing(tmp_path, answer, field):
    out = tmp_path / "out"
    out.mkdir()
    result = run_cli(out, answer, "env_manager=none", "run_smoke_test=no", "init_git=no")
    assert result.returncode == 1
    (line,) = output_lines(result)  # cookiecutter adds no line of its own, no traceback
    value = "" if answer.startswith("project_name=") else answer.split("=", 1)[1]
    assert line.startswith(f"cookiecutter-pytorch: {field}={value!r} is not accepted")
    assert f"e.g. {field}=" in line
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
    assert list(out.iterdir()) == []


def wait_until_empty(folder: Path, seconds: float = 5.0) -> list[str]:
    """What is left in `folder` once the hook's clean-up had time to run."""
    deadline = time.monotonic() + seconds
    while any(folder.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(p.name for p in folder.iterdir())


def test_replayed_bad_answer_is_refused_by_the_hook(tmp_path):
    # --replay skips the answer checks of cookiecutter.json: the pre-generation hook has them
    # too, and removes the parents that a slug like a/b made.
    replay = tmp_path / "replay.json"
    bad = {**answers(**FAST), "project_slug": "a/b", "package_name": "a_b"}
    replay.write_text(json.dumps({"cookiecutter": bad}), encoding="utf-8")
    out = tmp_path / "out"
    out.mkdir()
    cmd = [sys.executable, "-m", "cookiecutter", str(TEMPLATE), "--replay-file", str(replay)]
    result = subprocess.run([*cmd, "-o", str(out)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 1
    (line,) = hook_lines(result.stderr)
    assert "project_slug='a/b' is not accepted" in line
    assert wait_until_empty(out) == []


def test_long_name_bakes_with_a_capped_folder_name(tmp_path):
    name = "Cat Classifier " * 20  # 300 characters
    result = run_cli(tmp_path, f"project_name={name}", *(f"{k}={v}" for k, v in FAST.items()))
    assert result.returncode == 0, result.stdout + result.stderr
    (project,) = tmp_path.iterdir()
    assert len(project.name) <= 64 and project.name.startswith("cat-classifier-cat")
    saved = json.loads((project / ".cookiecutter.json").read_text(encoding="utf-8"))
    assert saved["project_name"] == name
    assert (project / saved["package_name"] / "trainer.py").is_file()


CHOICES = json.loads((TEMPLATE / "cookiecutter.json").read_text(encoding="utf-8"))


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("python_version", "3.9"),
        ("compute", "cu999"),
        ("license", "GPL-3.0"),
        ("env_manager", "pipenv"),
    ],
)
def test_value_outside_a_choice_list_is_refused_by_cookiecutter_before_any_file(
    tmp_path, field, value
):
    # cookiecutter checks a choice while it merges the given answers into cookiecutter.json,
    # before any template code runs (the pre_prompt hook is given no answers): the template
    # README quotes the traceback's last line. The hook checks python_version again for
    # --replay, which skips that validation.
    result = run_cli(tmp_path, f"{field}={value}")
    assert result.returncode == 1
    last = output_lines(result)[-1]
    assert last == (
        f"ValueError: {value} provided for choice variable {field}, "
        f"but the choices are {CHOICES[field]}."
    )
    assert list(tmp_path.iterdir()) == []


# --- awkward names bake with the hooks on ---


@pytest.mark.parametrize("value", AWKWARD.values(), ids=AWKWARD.keys())
def test_awkward_names_bake(bake, value):
    project = bake(project_name=value, author_name=value, description=value)
    saved = json.loads((project / ".cookiecutter.json").read_text(encoding="utf-8"))
    assert saved["project_name"] == value
    assert saved["author_name"] == value
    assert (project / "scripts" / "create_env.py").is_file()
    assert not (project / "setup.log").exists()  # nothing ran, nothing logged


# --- post_gen_project ---


@pytest.mark.parametrize(
    ("value", "skip"),
    [("1", True), ("true", True), ("YES", True), ("", False), ("0", False), ("no", False)],
)
def test_skip_setup_values(tmp_path, value, skip):
    post = render_hook("post_gen_project", tmp_path)
    assert post.skip_setup({post.SKIP_ENV: value}) is skip
    assert post.skip_setup({}) is False


def test_skip_setup_runs_nothing_heavy(bake, monkeypatch, capfd):
    monkeypatch.setenv("COOKIECUTTER_PYTORCH_SKIP_SETUP", "1")
    project = bake(env_manager="venv", run_smoke_test="yes", init_git="yes", license="none")
    out = capfd.readouterr().out
    assert "COOKIECUTTER_PYTORCH_SKIP_SETUP is set" in out
    for heavy in (".venv", ".conda-env", ".git", "setup.log"):
        assert not (project / heavy).exists(), heavy
    assert not (project / "LICENSE").exists()  # dropping unused files is not a heavy step


@pytest.mark.parametrize("license_", ["MIT", "none"])
def test_license_file_only_with_a_license(bake, license_):
    project = bake(license=license_)
    assert (project / "LICENSE").exists() is (license_ != "none")


def git_log(project: Path, fmt: str) -> list[str]:
    result = subprocess.run(
        ["git", "log", f"--format={fmt}"], cwd=project, capture_output=True, text=True, check=True
    )
    return result.stdout.splitlines()


def test_git_first_commit_uses_author_without_git_identity(bake, monkeypatch, tmp_path, capfd):
    empty = tmp_path / "empty.gitconfig"
    empty.write_text("")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(empty))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")
    for name in ("GIT_AUTHOR_NAME", "GIT_AUTHOR_EMAIL", "GIT_COMMITTER_NAME", "EMAIL"):
        monkeypatch.delenv(name, raising=False)
    name = AWKWARD["quotes"]
    project = bake(init_git="yes", author_name=name, author_email="tom@example.org")
    assert "git init + first commit ... done" in capfd.readouterr().out
    assert git_log(project, "%an <%ae>|%s") == [
        f"{name} <tom@example.org>|Initial commit from cookiecutter-pytorch"
    ]
    tracked = subprocess.run(
        ["git", "ls-files"], cwd=project, capture_output=True, text=True, check=True
    ).stdout.split()
    assert "scripts/create_env.py" in tracked
    assert "setup.log" not in tracked


@pytest.fixture
def git_identity(monkeypatch):
    for variable in ("GIT_AUTHOR", "GIT_COMMITTER"):
        monkeypatch.setenv(f"{variable}_NAME", "T")
        monkeypatch.setenv(f"{variable}_EMAIL", "t@example.org")


def generate(out: Path, **extra_context) -> Path:
    """Generate into `out` with git on, over a project that is already there."""
    context = {**FAST, "init_git": "yes", **extra_context}
    path = cookiecutter(
        str(TEMPLATE),
        no_input=True,
        extra_context=context,
        output_dir=str(out),
        overwrite_if_exists=True,
    )
    return Path(path)


def git_lines(project: Path, *args: str) -> list[str]:
    result = subprocess.run(
        ["git", *args], cwd=project, capture_output=True, text=True, check=True
    )
    return result.stdout.splitlines()


def test_regeneration_leaves_the_existing_repository_alone(tmp_path, git_identity, capfd):
    project = generate(tmp_path)
    (project / "notes.txt").write_text("mine, not committed\n")
    (project / "mine.py").write_text("MINE = 1\n")
    subprocess.run(["git", "add", "mine.py"], cwd=project, check=True)
    subprocess.run(["git", "commit", "-q", "-m", "mine"], cwd=project, check=True)
    capfd.readouterr()
    assert generate(tmp_path) == project
    out = capfd.readouterr().out
    assert git_log(project, "%s") == ["mine", "Initial commit from cookiecutter-pytorch"]
    assert git_lines(project, "status", "--porcelain") == ["?? notes.txt"]
    (line,) = [line for line in out.splitlines() if "git" in line]
    assert line == (
        f"  git: already in the repository at {project}: left as it is, nothing committed; "
        "review `git status` and commit what you keep"
    )


def test_first_commit_holds_only_the_files_the_template_wrote(tmp_path, git_identity, capfd):
    folder = tmp_path / "my-pytorch-project"  # a folder of the user's, generated over
    (folder / "extra").mkdir(parents=True)
    (folder / "notes.txt").write_text("mine\n")
    (folder / "extra" / "keep.txt").write_text("mine too\n")
    project = generate(tmp_path, license="none", ci="none")
    assert "not committed: 2 file(s) that were here before" in capfd.readouterr().out
    tracked = set(git_lines(project, "ls-files"))
    written = {
        p.relative_to(project).as_posix()
        for p in project.rglob("*")
        if p.is_file() and ".git" not in p.parts
    }
    assert tracked == written - {"notes.txt", "extra/keep.txt"}
    assert "my_pytorch_project/trainer.py" in tracked and "LICENSE" not in tracked
    assert git_lines(project, "status", "--porcelain") == ["?? extra/", "?? notes.txt"]


def test_project_inside_another_repository_gets_no_repository(tmp_path, git_identity):
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    project = generate(tmp_path)
    assert not (project / ".git").exists()
    empty = subprocess.run(["git", "rev-parse", "HEAD"], cwd=tmp_path, capture_output=True)
    assert empty.returncode != 0  # nothing was committed into the enclosing repository


def test_without_the_template_folder_nothing_is_committed(tmp_path, capfd):
    post = render_hook("post_gen_project", tmp_path)
    project = tmp_path / "project"
    project.mkdir()
    (project / "notes.txt").write_text("mine\n")
    unknown = {k: v for k, v in answers().items() if k != "_repo_dir"}
    assert post.init_git(unknown, project) is True
    assert "the template's folder is unknown, so nothing was committed" in capfd.readouterr().out
    assert not (project / ".git").exists()


@pytest.mark.parametrize("folder", [".venv", ".conda-env"])
def test_an_existing_environment_is_left_as_it_is(tmp_path, monkeypatch, capfd, folder):
    post = render_hook("post_gen_project", tmp_path, env_manager="auto", run_smoke_test="yes")
    project = tmp_path / "project"
    (project / folder / "bin").mkdir(parents=True)
    calls = []
    monkeypatch.setattr(post.subprocess, "run", lambda *a, **k: calls.append(a))
    assert post.setup_environment(post.ANSWERS, project) is True
    assert calls == []  # create_env.py (an update of .venv, a new .conda-env) never ran
    (line,) = capfd.readouterr().out.splitlines()
    assert line.startswith(f"  environment: {folder} is already here: left as it is, no smoke")


def test_git_keeps_the_configured_identity(tmp_path):
    post = render_hook("post_gen_project", tmp_path)
    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    subprocess.run(["git", "config", "user.name", "Someone"], cwd=tmp_path, check=True)
    subprocess.run(["git", "config", "user.email", "s@example.org"], cwd=tmp_path, check=True)
    assert post.git_identity_args(answers(), tmp_path) == []


def test_missing_git_is_reported_and_generation_goes_on(bake, monkeypatch, tmp_path, capfd):
    monkeypatch.setenv("PATH", str(tmp_path))  # no git, no conda, no uv
    project = bake(init_git="yes")
    out = capfd.readouterr().out
    assert "git: not found; skipped" in out
    assert "ready" in out
    assert not (project / ".git").exists()


def test_post_hook_exits_0_when_setup_cannot_run(tmp_path, monkeypatch, capfd):
    post = render_hook("post_gen_project", tmp_path, init_git="no", run_smoke_test="yes")
    project = tmp_path / "project"  # no scripts/create_env.py in it
    project.mkdir()
    monkeypatch.chdir(project)
    assert post.main() == 0
    assert "setup had problems" in capfd.readouterr().out
