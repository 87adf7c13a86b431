"""Features chosen at generation: the presets, the marks of a feature's lines in shared files,
and the post-generation hook that removes what was not chosen (tests/test_bake.py bakes every
pair of option values and greps each bake for traces)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from _hookutil import TEMPLATE, render_hook
from conftest import FAST, copy_template
from cookiecutter.main import cookiecutter

PROJECT = TEMPLATE / "{{cookiecutter.project_slug}}"


@pytest.fixture
def post(tmp_path):
    return render_hook("post_gen_project", tmp_path)


def test_each_feature_is_an_option_with_preset_yes_no_and_a_prompt(post):
    options = json.loads((TEMPLATE / "cookiecutter.json").read_text())
    prompts = options["__prompts__"]
    # lean first, cookiecutter's default: optional tools are asked for, as in its big templates
    assert options["preset"] == ["lean", "full"] == list(post.PRESETS)
    for feature in post.FEATURES:
        assert options[feature] == ["preset", "yes", "no"], feature
        assert set(prompts[feature]) == {"__prompt__", "preset", "yes", "no"}, feature
    assert set(prompts["preset"]) == {"__prompt__", "full", "lean"}


def test_every_option_is_in_the_readme_s_table_with_its_values():
    options = json.loads((TEMPLATE / "cookiecutter.json").read_text())
    readme = (TEMPLATE / "README.md").read_text()
    rows = dict(re.findall(r"^\| `([a-z_]+)`[^|]*\| [^|]*\| (.*) \|$", readme, re.M))
    for name, values in options.items():
        if name.startswith("_") or name in ("description", "author_name", "author_email"):
            continue
        assert name in rows, name
        if isinstance(values, list) and set(values) != {"yes", "no"}:  # a yes/no: its meaning
            assert all(value in rows[name] for value in values), (name, rows[name])


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        ({"preset": "full"}, True),
        ({"preset": "lean"}, False),
        ({"preset": "lean", "gpu_check": "yes"}, True),
        ({"preset": "full", "gpu_check": "no"}, False),
        ({}, True),  # answers saved before the option existed: today's full project
    ],
)
def test_a_preset_answer_takes_the_preset_s_value(post, answers, expected):
    assert post.chosen_features({"gpu_check": "preset", **answers})["gpu_check"] is expected


@pytest.mark.parametrize(
    ("answers", "images"),
    [
        ({"preset": "lean", "pretrained": "yes", "images": "no"}, True),
        ({"preset": "lean", "pretrained": "yes"}, True),
        ({"preset": "full", "pretrained": "no", "images": "no"}, False),
        ({"preset": "lean", "images": "yes"}, True),
    ],
)
def test_a_feature_brings_what_it_needs_whatever_its_answer(post, answers, images):
    """Pretrained models fine-tune on image folders: choosing them brings images."""
    assert post.BRINGS == {"pretrained": ("images",), "gpu_check": ("text",)}
    assert post.chosen_features(answers)["images"] is images


def test_the_bake_tests_choose_features_as_the_hook_does(post):
    """tests/test_bake.py's expectations follow the hook's rules, for every case it bakes."""
    import test_bake

    for case in test_bake.CASES:
        hook = post.chosen_features(case)
        assert {f: test_bake.chosen(case, f) for f in post.FEATURES} == hook, case


def test_every_feature_file_is_in_the_template(post):
    for feature, paths in post.FEATURES.items():
        for path in paths:
            path = path.format(package="{{cookiecutter.package_name}}")
            assert (PROJECT / path).exists(), (feature, path)


TEXT = """keep 1
# >>> gpu_check
only with the feature
  # >>> gpu_check
  nested, same feature
  # <<< gpu_check
# <<< gpu_check
<!-- >>> gpu_check -->
markdown block
<!-- <<< gpu_check -->
tagged = 1  # feature: gpu_check
| a row | <!-- feature: gpu_check -->
# >>> !gpu_check
without the feature
# <<< !gpu_check
keep 2
"""


def test_marked_lines_stay_only_with_their_feature_and_no_mark_stays(post):
    without = post.keep_marked_lines(TEXT, {"gpu_check": False})
    assert without == "keep 1\nwithout the feature\nkeep 2\n"
    with_it = post.keep_marked_lines(TEXT, {"gpu_check": True})
    assert with_it.splitlines() == [
        "keep 1",
        "only with the feature",
        "  nested, same feature",
        "markdown block",
        "tagged = 1",
        "| a row |",
        "keep 2",
    ]
    assert post.keep_marked_lines(with_it, {"gpu_check": False}) == with_it  # nothing left


EITHER = """# >>> !fsdp|!text
either left out
# <<< !fsdp|!text
shared = 1  # feature: fsdp|text
"""


@pytest.mark.parametrize("fsdp", [True, False])
@pytest.mark.parametrize("text", [True, False])
def test_a_mark_of_two_features_keeps_its_lines_where_either_holds(post, fsdp, text):
    kept = post.keep_marked_lines(EITHER, {"fsdp": fsdp, "text": text}).splitlines()
    assert ("either left out" in kept) == (not fsdp or not text)
    assert ("shared = 1" in kept) == (fsdp or text)


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("# >>> nope\nx\n# <<< nope\n", "unknown feature 'nope'"),
        ("x = 1  # feature: gpu_check|nope\n", "unknown feature 'nope'"),
        ("x = 1  # feature: nope\n", "unknown feature 'nope'"),
        ("# >>> gpu_check\nx\n", "block '>>> gpu_check' is not closed"),
        ("x\n# <<< gpu_check\n", "'<<< gpu_check' closes no open block"),
        ("a <!-- feature: gpu_check --> b\n", ":1: a feature mark must end its line"),
    ],
)
def test_a_broken_mark_is_an_error_naming_file_and_line(post, text, error):
    with pytest.raises(ValueError, match=re.escape(error)) as raised:
        post.keep_marked_lines(text, {"gpu_check": True}, "Makefile")
    assert str(raised.value).startswith("Makefile")


def test_a_broken_mark_fails_the_bake_in_one_line_and_keeps_nothing(tmp_path, capfd):
    """The hook caught every exception: a mark error left a half-processed project, exit 0."""
    from conftest import FAST, copy_template
    from cookiecutter.exceptions import FailedHookException
    from cookiecutter.main import cookiecutter

    template = tmp_path / "template"
    copy_template(template)
    makefile = template / "{{cookiecutter.project_slug}}" / "Makefile"
    makefile.write_text(makefile.read_text() + "x = 1  # feature: nope\n")
    with pytest.raises(FailedHookException):
        cookiecutter(
            str(template), no_input=True, extra_context=FAST, output_dir=str(tmp_path / "out")
        )
    out = capfd.readouterr().out
    lines = [line for line in out.splitlines() if line.startswith("cookiecutter-pytorch:")]
    assert len(lines) == 1 and "unknown feature 'nope'" in lines[0], out
    assert "Makefile" in lines[0] and not any((tmp_path / "out").iterdir())


def test_every_mark_in_the_template_is_well_formed(post):
    """Each file of the baked project parses under both values of every feature."""
    marked = 0
    for path in PROJECT.rglob("*"):
        if path.suffix not in post.MARKED_SUFFIXES or not path.is_file():
            continue
        text = path.read_text(encoding="utf-8", errors="ignore")
        lines = text.splitlines()
        if not any(
            post.FEATURE_MARK.match(line) or post.ANY_LINE_MARK.search(line) for line in lines
        ):
            continue
        marked += 1
        for value in (True, False):
            post.keep_marked_lines(text, dict.fromkeys(post.FEATURES, value), str(path))
    assert marked >= 3


def test_applying_the_features_twice_changes_nothing(post, bake, tmp_path):
    """cruft re-runs the hook on its renders: a second run must find nothing to do."""
    project = bake(preset="lean")
    copy = tmp_path / "again"
    shutil.copytree(project, copy)
    post.apply_features({"preset": "lean", "gpu_check": "preset"}, copy)
    before = {p.relative_to(project): p.read_bytes() for p in project.rglob("*") if p.is_file()}
    after = {p.relative_to(copy): p.read_bytes() for p in copy.rglob("*") if p.is_file()}
    assert before == after


def test_package_sources_are_copied_without_rendering(tmp_path):
    """No Python file of the package is a Jinja template: `{{` in it (an f-string's escaped
    brace) reaches the project unchanged."""

    template = tmp_path / "template"
    copy_template(template)
    source = 'def braces(x):\n    return f"{{{x}}} {{ cookiecutter.package_name }}"\n'
    package = template / "{{cookiecutter.project_slug}}" / "{{cookiecutter.package_name}}"
    (package / "b.py").write_text(source)
    project = cookiecutter(
        str(template), no_input=True, extra_context=FAST, output_dir=str(tmp_path)
    )
    assert (Path(project) / "my_pytorch_project" / "b.py").read_text() == source


def test_a_file_of_yours_is_not_read_for_marks(post, bake):
    """Generated again over a project, the hook edits only the files the template wrote."""
    project = bake(preset="lean")
    mine = project / "notes.py"
    mine.write_text("x = 1  # feature: gpu_check\n# >>> not_a_feature\n")
    answers = {"preset": "lean", "gpu_check": "preset", "package_name": "my_pytorch_project"}
    post.apply_features({**answers, "_repo_dir": str(TEMPLATE)}, project)
    assert mine.read_text() == "x = 1  # feature: gpu_check\n# >>> not_a_feature\n"
