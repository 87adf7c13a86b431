"""The generation hooks: answer checks (unit and through the CLI), awkward names, git, skip."""

from __future__ import annotations

import ast
import json
import subprocess
import time
from pathlib import Path

import pytest
from _hookutil import (
    HOOK_VARIABLES,
    TEMPLATE,
    answers,
    hook_lines,
    render_hook,
    run_cli,
)

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


@pytest.mark.parametrize("name", ["pre_gen_project", "post_gen_project"])
@pytest.mark.parametrize("value", AWKWARD.values(), ids=AWKWARD.keys())
def test_rendered_hook_reads_awkward_answers_exactly(tmp_path, name, value):
    hook = render_hook(name, tmp_path, project_name=value, author_name=value)
    assert hook.ANSWERS["project_name"] == value
    assert hook.ANSWERS["author_name"] == value


# --- pre_gen_project checks, unit ---


@pytest.mark.parametrize("slug", ["my-project", "cat_classifier", "v2.model", "a", "9lives"])
def test_good_slug(pre, slug):
    assert pre.check_slug(slug) is None


@pytest.mark.parametrize(
    "slug", ["", "a/b", "../x", "/abs", ".hidden", "-dash", "My-Project", "my project", "a\\b"]
)
def test_bad_slug(pre, slug):
    assert pre.check_slug(slug)


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


@pytest.mark.parametrize("version", ["3.10", "3.11", "3.12", "3.13"])
def test_good_python_version(pre, version):
    assert pre.check_python_version(version) is None


@pytest.mark.parametrize("version", ["3.9", "3.14", "3", "2.7", ""])
def test_bad_python_version(pre, version):
    assert "3.10, 3.11, 3.12, 3.13" in pre.check_python_version(version)


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


# --- pre_gen_project through the CLI: non-zero exit, one line, nothing left behind ---


def wait_until_empty(folder: Path, seconds: float = 5.0) -> list[str]:
    """What is left in `folder` once the hook's clean-up had time to run."""
    deadline = time.monotonic() + seconds
    while any(folder.iterdir()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return sorted(p.name for p in folder.iterdir())


@pytest.mark.parametrize(
    ("answer", "field"),
    [
        ("project_slug=My Project", "project_slug"),
        ("project_slug=a/b", "project_slug"),
        ("project_slug=a/b/c", "project_slug"),
        ("project_slug=.hidden", "project_slug"),
        ("project_slug=-dash", "project_slug"),
        ("package_name=class", "package_name"),
        ("package_name=json", "package_name"),
        ("package_name=torch", "package_name"),
        ("package_name=tests", "package_name"),
        ("author_email=not-an-email", "author_email"),
    ],
)
def test_bad_answer_stops_generation(tmp_path, answer, field):
    result = run_cli(tmp_path, answer, "env_manager=none", "run_smoke_test=no", "init_git=no")
    assert result.returncode != 0
    (line,) = hook_lines(result.stderr)
    value = answer.split("=", 1)[1]
    assert f"{field}={value!r} is not accepted" in line
    assert f"e.g. {field}=" in line
    assert wait_until_empty(tmp_path) == []


def test_python_39_is_refused_before_any_directory(tmp_path):
    # cookiecutter itself refuses a value outside a choice list, before the hook runs; the hook
    # checks again for replays (`--replay`, cruft), which skip that validation.
    result = run_cli(tmp_path, "python_version=3.9")
    assert result.returncode != 0
    assert "3.9 provided for choice variable python_version" in result.stderr
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
