"""docs/settings.md, generated from the settings model: `python -m memflow.shared.settings_doc > docs/settings.md`.

One table of every setting, in the order of the model: its group, its name in the group, its MEMFLOW_*
variable, its default and what it means. The meaning is the field's `description`; a field without one is
described by the comment right above it in shared/settings.py, if any. The output depends on the code alone,
never on the environment, so CI (.ci/run) and tests/test_settings.py can check that the file is current.
"""

from __future__ import annotations

import ast
import inspect
import io
import json
import sys
import textwrap
import tokenize
from functools import lru_cache
from typing import Literal, get_args, get_origin

from pydantic.fields import FieldInfo

from memflow.shared.settings import GROUPS, Group, Settings

COMMAND = "python -m memflow.shared.settings_doc > docs/settings.md"
# A bound in a field's metadata (pydantic keeps Field(ge=...) as annotated_types.Ge(ge=...)), and its sign.
BOUNDS = {"ge": "≥", "gt": ">", "le": "≤", "lt": "<"}


def markdown() -> str:
    """The whole of docs/settings.md."""
    head = ["# Settings", "",
            f"Generated from `shared/settings.py` by `{COMMAND}`: edit the model, not this file (CI checks",
            "that it is current). Every setting is read from its `MEMFLOW_*` variable; in Python, `Settings(...)` and",
            "`settings.replace(...)` take the variable's name without `MEMFLOW_`, in lower case, and",
            "`settings.<group>.<name>` reads it. A dict is JSON in the environment. An unknown `MEMFLOW_*` variable",
            "is named in a warning when a process starts.", "",
            "| Group | Name | Variable | Default | Meaning |", "|---|---|---|---|---|"]
    rows = [_row(group, name, flat, model.model_fields[name], _meaning(model, name))
            for group, model in GROUPS.items() for flat, name in model.flat_names().items()]
    rows.append(_row("", "log_level", "log_level", Settings.model_fields["log_level"], ""))
    groups = ["", "## Groups", ""] + [f"- `{group}`: {_cell(model.__doc__ or '')}" for group, model in GROUPS.items()]
    return "\n".join(head + rows + groups) + "\n"


def _row(group: str, name: str, flat: str, field: FieldInfo, comment: str) -> str:
    meaning = " ".join(part for part in (field.description or comment, _limits(field)) if part)
    cells = [f"`{group}`" if group else "—", f"`{name}`", f"`MEMFLOW_{flat.upper()}`", _default(field), meaning]
    return "| " + " | ".join(_cell(cell) for cell in cells) + " |"


def _default(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if value == "":
        return "empty"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, dict):
        return f"`{json.dumps(value, sort_keys=True, ensure_ascii=False)}`"
    return f"`{value}`"


def _limits(field: FieldInfo) -> str:
    """The values a field takes, where its type or bounds say: "(≥ 1, ≤ 1024)", "(one of `a`, `b`)"."""
    said = [f"{sign} {getattr(bound, attr)}" for bound in field.metadata for attr, sign in BOUNDS.items()
            if hasattr(bound, attr)]
    if get_origin(field.annotation) is Literal and not said:
        said = ["one of " + ", ".join(f"`{choice}`" for choice in get_args(field.annotation))]
    return f"({', '.join(said)})" if said else ""


def _cell(text: str) -> str:
    """One table cell: one line, its pipes escaped."""
    return " ".join(text.split()).replace("|", "\\|")


def _meaning(model: type[Group], name: str) -> str:
    return "" if model.model_fields[name].description else _comments(model).get(name, "")


@lru_cache
def _comments(model: type[Group]) -> dict[str, str]:
    """{field: the comment block right above it}, from the model's source. A field below another without a
    comment of its own gets none: a comment that covers several fields cannot be told from one about the first."""
    source = textwrap.dedent(inspect.getsource(model))
    said = {tok.start[0]: tok.string.lstrip("#").strip() for tok in
            tokenize.generate_tokens(io.StringIO(source).readline)
            if tok.type == tokenize.COMMENT and tok.line.lstrip().startswith("#")}  # a line of its own
    body = ast.parse(source).body[0]
    fields = [node for node in getattr(body, "body", []) if isinstance(node, ast.AnnAssign)
              and isinstance(node.target, ast.Name)]
    return {ast.unparse(node.target): _block_above(said, node.lineno) for node in fields}


def _block_above(said: dict[int, str], line: int) -> str:
    lines: list[str] = []
    while line - 1 in said:
        line -= 1
        lines.insert(0, said[line])
    return " ".join(lines)


def main() -> None:
    sys.stdout.buffer.write(markdown().encode())  # UTF-8 whatever the locale, as the file is


if __name__ == "__main__":
    main()
