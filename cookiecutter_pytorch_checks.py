"""Check the answers as soon as cookiecutter has them, before it creates the project directory.

Cookiecutter creates the directory named by project_slug before any generation hook runs, so a
name it cannot create ('' or '..': the output directory itself; 300 characters: "File name
too long") ends in its own error or a traceback, never in the hook's line. This Jinja extension
(listed in cookiecutter.json's `_extensions`; cookiecutter puts the template on sys.path for
it, and cruft does too) gives cookiecutter.json the filter `refuse_bad_answers`, which the last
answer, `__checked`, renders once all the others are known. It runs the checks of
hooks/pre_gen_project.py, rendered as cookiecutter renders the hook, and raises cookiecutter's
FailedHookException with one line per bad answer: the command line prints just that and exits
1, before anything is written. The hook runs the same checks again for `--replay`, which skips
this step.

What no template code reaches: a value outside a choice list (`compute=cu999`) is refused by
cookiecutter itself while it merges the given answers into cookiecutter.json, before this
filter, with a traceback ending in "cu999 provided for choice variable compute, but the choices
are [...]"; the pre_prompt hook runs earlier but is given no answers.
"""

from __future__ import annotations

from pathlib import Path
from types import ModuleType

from cookiecutter.exceptions import FailedHookException
from jinja2 import Environment
from jinja2.ext import Extension

PRE_GEN_HOOK = Path(__file__).resolve().parent / "hooks" / "pre_gen_project.py"


def load_pre_gen_hook(environment: Environment, answers: dict) -> ModuleType:
    """hooks/pre_gen_project.py rendered with `answers`, as a module (its main() not run)."""
    source = PRE_GEN_HOOK.read_text(encoding="utf-8")
    code = environment.from_string(source).render(cookiecutter=answers)
    module = ModuleType("cookiecutter_pytorch_pre_gen")
    exec(compile(code, str(PRE_GEN_HOOK), "exec"), module.__dict__)
    return module


class AnswerChecks(Extension):
    """The `refuse_bad_answers` filter: '' when every answer passes, else one line each."""

    def __init__(self, environment: Environment) -> None:
        super().__init__(environment)

        def refuse_bad_answers(answers) -> str:
            lines = load_pre_gen_hook(environment, dict(answers)).problems(dict(answers))
            if lines:
                raise FailedHookException("\n".join(lines))
            return ""

        environment.filters["refuse_bad_answers"] = refuse_bad_answers
