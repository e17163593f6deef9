"""`memflow --help` and every command's help (issue 41): plain to read (no `<bool>`, `<str>`, `<list[str]>`),
the exit codes told, and the top-level help quick because it imports none of the commands' modules."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import typer
from typer.testing import CliRunner

from memflow.workers.cli import COMMANDS, GROUPS, app

# What `memflow --help` must not load: Redis, RQ, the SDK, settings, the models, the store, an LLM client.
HEAVY = ("redis", "rq", "pydantic", "numpy", "qdrant_edge", "openai", "torch", "orjson", "memflow.shared.sdk",
         "memflow.shared.settings", "memflow.pipeline", "memflow.workers.cli.common")
PLACEHOLDER = re.compile(r"<(bool|str|int|float|list\[[^\]]*\]|Path|datetime)>")


NAMES = [row[0] for row in (*COMMANDS, *GROUPS)]


def every_command_line() -> list[list[str]]:
    root = typer.main.get_command(app)
    lines: list[list[str]] = [[]]
    for name in NAMES:
        command = root.get_command(typer.Context(root), name)  # type: ignore[attr-defined]
        lines += [[name], *([name, sub] for sub in getattr(command, "commands", {}))]
    return lines


def test_help_shows_no_type_placeholders() -> None:
    for line in every_command_line():
        shown = CliRunner().invoke(app, [*line, "--help"], terminal_width=120)
        assert shown.exit_code == 0, (line, shown.output)
        assert not PLACEHOLDER.search(shown.output), (line, PLACEHOLDER.findall(shown.output))


def test_the_top_level_help_lists_every_command_and_the_exit_codes() -> None:
    shown = CliRunner().invoke(app, ["--help"], terminal_width=120).output
    for name in NAMES:
        assert re.search(rf"^\W*{re.escape(name)} +\S", shown, re.M), name  # named, with its summary
    assert "Exit codes" in shown and "0: success" in shown and "1: an error" in shown and "2: usage" in shown


def test_the_top_level_help_imports_no_command_module() -> None:
    """Measured as what it imports, not as seconds (a loaded machine makes any time bound flaky)."""
    probe = ("import sys, json\nsys.argv = ['memflow', '--help']\nfrom memflow.workers.cli import main\n"
             "try:\n    main()\nexcept SystemExit:\n    pass\n"
             f"print(json.dumps(sorted(m for m in sys.modules if m.startswith({HEAVY!r}))))")
    ran = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert "Exit codes" in ran.stdout
    assert json.loads(ran.stdout.strip().splitlines()[-1]) == []
