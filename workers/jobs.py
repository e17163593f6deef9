"""Maintenance jobs, run by a query worker (the process that holds the store) from the
`<prefix>-jobs` RQ queue, or by hand: `memflow jobs run <job> [--subject S] [--now T] [--dry-run]`.

A job takes `now` and a subject (or walks every subject the store holds), is idempotent
(running it twice changes nothing the second time) and reports every memory it changed
or, with `dry_run`, would change. Changes are announced on the `changes` feed.
The scheduler (issue: evolution) only enqueues these.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from pipeline.models import Memory
from pipeline.tagging import TAG_VERSION, retag
from shared.errors import MemflowError
from shared.store import MemoryFilter
from workers.runtime import Context, fields_of

# (the memory, the fields the job sets on it)
Planned = list[tuple[Memory, dict[str, Any]]]
Planner = Callable[[list[Memory], datetime], Planned]


def plan_retag(memories: list[Memory], now: datetime) -> Planned:
    """Memories placed by older tagging rules, with their new dir and tag_version (now is unused)."""
    return [(m, fields) for m in memories if (fields := retag(m, TAG_VERSION)) is not None]


JOBS: dict[str, tuple[Planner, str]] = {
    "retag": (plan_retag, f"re-tagged with the rules of tag_version {TAG_VERSION}"),
}


def run(ctx: Context, name: str, subject: str | None, now: datetime, dry_run: bool) -> dict[str, Any]:
    """One job over one subject (or all); what it changed, or would change."""
    if name not in JOBS:
        raise MemflowError(f"unknown job {name!r}: one of {', '.join(sorted(JOBS))}")
    planner, why = JOBS[name]
    subjects = [subject] if subject else ctx.store.subjects()
    changed: list[dict[str, Any]] = []
    examined = 0
    for s in subjects:
        memories = ctx.store.get(MemoryFilter(s))
        examined += len(memories)
        for memory, fields in planner(memories, now):
            changed.append({"id": memory.id, "subject": s, "content": memory.content[:120],
                            "before": fields_of(memory, fields), "after": fields})
            if not dry_run:
                ctx.set_fields(memory, fields, action="job", why=f"{name}: {why}", at=now)
    return {"job": name, "subjects": len(subjects), "examined": examined, "dry_run": dry_run,
            "now": now.isoformat(), "changed": changed}


def now_or_clock(now: str | None) -> datetime:
    return datetime.fromisoformat(now) if now else datetime.now(UTC)
