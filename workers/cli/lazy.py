"""The `memflow` command group that imports a command's module only when that command runs (or shows its help):
`memflow --help` lists every command from the modules' source (their docstrings, read, never imported), so it
answers without loading Redis, the SDK, the store or a model (docs/cli.md#speed). Also what every command's help
shares (no type placeholders) and how an error memflow expects ends a command (one line, exit 1 or 2).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import sys
from dataclasses import dataclass
from functools import cache
from typing import Any

import typer
from typer.core import TyperArgument, TyperGroup, TyperOption

# The exit codes every command keeps (docs/cli.md#exit-codes), told by `memflow --help`.
OK, ERROR, USAGE = 0, 1, 2
EXIT_CODES = (f"{OK}: success. {ERROR}: an error (the system refused or failed: an unknown id or subject, a version "
              f"that does not exist, Redis down). {USAGE}: usage (the command line itself is wrong: a missing "
              "argument, an unknown option, a malformed time or id, nothing named to act on).")


@dataclass(frozen=True)
class Entry:
    """One command of the table: its name, and the module of this package and the attribute that hold it (a
    function for a command, a `typer.Typer` for a group of commands)."""

    name: str
    module: str
    attribute: str

    def load(self) -> Any:
        return getattr(importlib.import_module(f"{__package__}.{self.module}"), self.attribute)

    def summary(self) -> str:
        return _summaries(self.module).get(self.attribute, "")


@cache
def _summaries(module: str) -> dict[str, str]:
    """Each command's first paragraph (or group's `help=`) in `module`, read from its source without running it."""
    spec = importlib.util.find_spec(f"{__package__}.{module}")
    tree = ast.parse(spec.loader.get_source(spec.name) or "" if spec and spec.loader else "")  # type: ignore[attr-defined]
    found: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef):
            found[node.name] = _first_paragraph(ast.get_docstring(node) or "")
        elif isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            helps = [k.value.value for k in node.value.keywords
                     if k.arg == "help" and isinstance(k.value, ast.Constant)]
            for target in node.targets:
                if helps and isinstance(target, ast.Name):
                    found[target.id] = _first_paragraph(str(helps[0]))
    return found


def _first_paragraph(text: str) -> str:
    return " ".join(inspect.cleandoc(text).split("\n\n")[0].split())


class LazyGroup(TyperGroup):
    """The root group: its commands come from `table` (set by the package, in its order), each loaded when asked
    for; an error memflow expects, raised by any of them, ends here in one line (`_refuse`)."""

    table: tuple[Entry, ...] = ()

    def list_commands(self, ctx: Any) -> list[str]:
        return [e.name for e in self.table]

    def get_command(self, ctx: Any, cmd_name: str) -> Any:
        entry = next((e for e in self.table if e.name == cmd_name), None)
        return None if entry is None else _loaded(entry)

    def format_help(self, ctx: Any, formatter: Any) -> None:
        """The commands as the table lists them, each with its summary: nothing is imported to show them."""
        self.format_usage(ctx, formatter)
        formatter.write_paragraph()
        formatter.write_text(self.help or "")
        with formatter.section("Commands"):
            formatter.write_dl([(e.name, e.summary()) for e in self.table])
        with formatter.section("Options"):
            formatter.write_dl([("--help", "Show this message and exit. `memflow COMMAND --help`: one command's.")])
        with formatter.section("Exit codes"):
            formatter.write_text(EXIT_CODES)

    def invoke(self, ctx: Any) -> Any:
        from memflow.shared.errors import MemflowError

        try:
            return super().invoke(ctx)
        except typer.BadParameter as exc:
            _reword(exc)
            raise
        except MemflowError as exc:
            _refuse(exc)
        except Exception as exc:
            if not _is_redis_unreachable(exc):
                raise
            _fail(f"cannot reach Redis ({exc}): is `memflow up` still running, or is MEMFLOW_REDIS_URL right?", ERROR)


@cache
def _loaded(entry: Entry) -> Any:
    """The click command of one entry, built by typer, with help fit to read (`plain_help`)."""
    target = entry.load()
    command: Any
    if isinstance(target, typer.Typer):
        command = typer.main.get_group(target)
    else:
        single = typer.Typer(pretty_exceptions_enable=False, add_completion=False)
        single.command(entry.name)(target)
        command = typer.main.get_command(single)
    command.name = entry.name
    plain_help(command)
    return command


class _Argument(TyperArgument):
    """An argument shown by its name alone (SUBJECT), as click writes it; typer would add `<str>` beside it."""

    def display_type_rich(self, ctx: Any) -> str | None:
        return None

    def _usage_display_name(self) -> str:
        name = self.display_name_raw
        name = name if self.required else f"[{name}]"
        return name + ("..." if self.nargs != 1 else "")


def plain_help(command: Any) -> None:
    """No type placeholders (`<bool>`, `<str>`, `<list[str]>`) in help: a flag shows nothing, an option its value's
    name (TEXT, INTEGER), an argument its name in capitals. Set on the built command, recursively, for every
    command at once (typer 0.29 writes them and offers no switch)."""
    for param in getattr(command, "params", []):
        if isinstance(param, TyperOption):
            param.metavar = param.metavar or ("" if param.is_flag else _value_name(param))
        elif isinstance(param, TyperArgument):
            param.__class__ = _Argument  # same fields; only how it is shown differs
            param.metavar = param.metavar or (param.name or "").upper()
    helper = command.get_help_option(typer.Context(command))  # made once and kept by the command: shown bare too
    if helper is not None:
        helper.metavar = ""
    for sub in getattr(command, "commands", {}).values():
        plain_help(sub)


# How click names a value in help, by the type typer read from the signature; another type: the option's name.
_VALUE_NAMES = {"str": "TEXT", "int": "INTEGER", "float": "NUMBER", "Path": "PATH", "datetime": "TIME"}


def _value_name(option: TyperOption) -> str:
    bare = option.bare_type().removeprefix("list[").removesuffix("]")
    return _VALUE_NAMES.get(bare, (option.name or "value").upper())


def _reword(exc: typer.BadParameter) -> None:
    """A value typer read with pydantic (a number, its bounds) refused in the words the HTTP API uses for the same
    fault ("must be at least 1", pipeline/wording.py), not pydantic's ("Input should be greater than or equal
    to 1"); click still names the option and prints the usage."""
    cause = exc.__cause__
    errors = getattr(cause, "errors", None)
    if type(cause).__name__ == "ValidationError" and callable(errors):
        from memflow.pipeline.wording import reason

        exc.message = "; ".join(reason(error) for error in errors())


def _refuse(exc: Exception) -> None:
    """An error memflow expects, as one line: a request refused before it was sent (InvalidInput) is usage (2);
    anything the system answered or failed with is an error (1)."""
    from memflow.shared.errors import InvalidInput

    notes = getattr(exc, "__notes__", [])  # an import's say what became of the subject it refused
    said = error_line(exc).replace("Value error, ", "")  # pydantic's prefix: nothing a user reads
    _fail("; ".join([said, *notes]), USAGE if isinstance(exc, InvalidInput) else ERROR)


def error_line(exc: Exception) -> str:
    """What an error says, in one line (a failed call's message is already the worker's error alone: the SDK keeps
    its traceback apart, shared/sdk/client.py)."""
    return " ".join(str(exc).split())


def _is_redis_unreachable(exc: Exception) -> bool:
    redis = sys.modules.get("redis")  # loaded by any command that reached Redis: nothing to import here
    return redis is not None and isinstance(exc, redis.ConnectionError)


def _fail(message: str, code: int) -> None:
    sys.stderr.write(f"memflow: {message}\n")
    raise typer.Exit(code)
