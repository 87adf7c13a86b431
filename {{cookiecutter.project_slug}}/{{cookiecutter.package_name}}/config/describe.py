"""Every setting of a config with its value and the comment its dataclass gives it: what
`scripts/train.py --show-config` prints, for the chosen data, model and task too (their own
options come from their Options dataclasses). The output is YAML: saved to a file, it is a
config that `--config` reads."""

from __future__ import annotations

import ast
import dataclasses
import inspect
import io
import tokenize

import yaml

from .load import to_dict
from .schema import Config, options_type


def describe(cfg: Config) -> str:
    """The settings of `cfg` section by section, each `key: value  # comment`."""
    settings = to_dict(cfg)
    lines = []
    for field in dataclasses.fields(cfg):
        section = getattr(cfg, field.name)
        comments = field_comments(type(section))
        if hasattr(section, "options"):  # data, model, task: the chosen one's own options
            comments |= field_comments(options_type(field.name, section.name))
        lines.append(f"{field.name}:")
        for key, value in settings[field.name].items():
            text = yaml.safe_dump(value, default_flow_style=True, width=10**6).strip()
            text = text.removesuffix("\n...").removesuffix("...").strip()
            note = comments.get(key)
            lines.append(f"  {key}: {text}" + (f"  # {note}" if note else ""))
    return "\n".join(lines) + "\n"


def field_comments(cls: type) -> dict[str, str]:
    """{field: its comment} from the source of dataclass `cls`: the comment on the field's
    lines, else the comment lines just above it (joined)."""
    try:
        source = inspect.getsource(cls)
    except (OSError, TypeError):  # defined where no source is kept (an interactive session)
        return {}
    source = inspect.cleandoc("\n" + source) if source.startswith(" ") else source
    on_line = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            on_line[token.start[0]] = token.string.lstrip("#").strip()
    node = next(n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef))
    found, last = {}, node.lineno
    for item in node.body:
        if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
            inline = [on_line[i] for i in range(item.lineno, item.end_lineno + 1) if i in on_line]
            above = [on_line[i] for i in range(last + 1, item.lineno) if i in on_line]
            text = " ".join(inline or above)
            if text:
                found[item.target.id] = text
        last = getattr(item, "end_lineno", last)
    return found
