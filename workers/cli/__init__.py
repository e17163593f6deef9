"""The `memflow` command line. Human-readable by default, `--json` for scripts.

This module is its table: every command's name, in the order `memflow --help` lists them, with the module that
holds it: run.py (the processes), memories.py, transfer.py, maintenance.py (review, jobs, reindex), status.py
(status, partitions, traces), dlq.py, keys.py, bench.py (eval, bench) and demo.py; common.py what they share.
A module is imported only when one of its commands runs (lazy.py): `memflow --help` loads none of them.
"""

from __future__ import annotations

import typer

from memflow.workers.cli.lazy import Entry, LazyGroup

COMMANDS = (
    ("worker", "run", "worker"), ("query-worker", "run", "query_worker"), ("up", "run", "up"),
    ("serve", "run", "serve"), ("mcp", "run", "mcp_stdio"), ("scheduler", "run", "run_scheduler"),
    ("publish", "memories", "publish"), ("search", "memories", "search"), ("forget", "memories", "forget"),
    ("export", "transfer", "export_memories"), ("import", "transfer", "import_memories"),
    ("compact-aof", "memories", "compact_aof"), ("inspect", "memories", "inspect"),
    ("history", "memories", "history"), ("rollback", "memories", "rollback"), ("fate", "memories", "fate"),
    ("reindex", "maintenance", "reindex_store"),
    ("status", "status", "status"),
    ("eval", "bench", "eval_scenarios"),
    ("demo", "demo", "demo"),
)
GROUPS = (
    ("dlq", "dlq", "dlq_app"), ("traces", "status", "traces_app"), ("jobs", "maintenance", "jobs_app"),
    ("review", "maintenance", "review_app"), ("keys", "keys", "keys_app"), ("partitions", "status", "partitions_app"),
    ("bench", "bench", "bench_app"),
)
LazyGroup.table = tuple(Entry(*row) for row in (*COMMANDS, *GROUPS))

app = typer.Typer(cls=LazyGroup, no_args_is_help=True, pretty_exceptions_enable=False, add_completion=False,
                  rich_markup_mode=None)


@app.callback()
def memflow() -> None:
    """memflow: long-term memory for LLM agents."""


def main() -> None:
    """`memflow`: the commands, with every error memflow expects told in one line and what to do (lazy.py)."""
    app()
