"""The `memflow` command line. Human-readable by default, `--json` for scripts.

This module is its table: every command's name, in the order `memflow --help` lists them, with the module that
holds it: run.py (the processes), memories.py, transfer.py, maintenance.py (review, jobs, reindex), status.py
(status, partitions, traces), dlq.py, keys.py, bench.py (eval, bench) and demo.py; common.py what they share.
"""

from __future__ import annotations

import redis
import typer

from memflow.shared.errors import MemflowError
from memflow.workers.cli import bench, demo, dlq, keys, maintenance, memories, run, status, transfer
from memflow.workers.cli.common import fail

app = typer.Typer(help="memflow: long-term memory for LLM agents.", no_args_is_help=True,
                  pretty_exceptions_enable=False)

COMMANDS = (
    ("worker", run.worker), ("query-worker", run.query_worker), ("up", run.up), ("serve", run.serve),
    ("mcp", run.mcp_stdio), ("scheduler", run.run_scheduler),
    ("publish", memories.publish), ("search", memories.search), ("forget", memories.forget),
    ("export", transfer.export_memories), ("import", transfer.import_memories),
    ("compact-aof", memories.compact_aof), ("inspect", memories.inspect), ("history", memories.history),
    ("rollback", memories.rollback),
    ("reindex", maintenance.reindex_store),
    ("status", status.status),
    ("eval", bench.eval_scenarios),
    ("demo", demo.demo),
)
GROUPS = (
    ("dlq", dlq.dlq_app), ("traces", status.traces_app), ("jobs", maintenance.jobs_app),
    ("review", maintenance.review_app), ("keys", keys.keys_app), ("partitions", status.partitions_app),
    ("bench", bench.bench_app),
)
for name, command in COMMANDS:
    app.command(name)(command)
for name, group in GROUPS:
    app.add_typer(group, name=name)


def main() -> None:
    """`memflow`: the commands, with every error memflow expects told in one line and what to do."""
    try:
        app()
    except MemflowError as exc:  # with its notes: an import's says what became of the subject it refused
        fail("; ".join([str(exc), *getattr(exc, "__notes__", [])]))
    except redis.ConnectionError as exc:
        fail(f"cannot reach Redis ({exc}): is `memflow up` still running, or is MEMFLOW_REDIS_URL right?")
