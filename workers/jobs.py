"""Maintenance jobs, run by the jobs worker (beside the query worker, in the process that holds the
store: workers/system.py) from the `<prefix>-jobs` RQ queue, where the scheduler puts them, or by hand:
`memflow jobs run <decay|consolidate|review|retag|index> [--subject S] [--now T] [--dry-run]`.

A job takes `now` and a subject (or walks every subject the store holds), plans with the
pure functions of `pipeline/lifecycle.py`, and reports every memory it changed or, with
`dry_run`, would change. Planning again at the same `now` plans nothing: each job is
idempotent per (job, date, subject). Changes are announced on the `changes` feed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Protocol

import redis
from pydantic import TypeAdapter

from memflow.pipeline.ids import PUBLIC, IdSpace
from memflow.pipeline.lifecycle import Policy, Step, plan_decay, plan_patterns, plan_promotions, plan_review, reread
from memflow.pipeline.models import Candidate, Memory, MutationOp, PutOp, Tier
from memflow.pipeline.tagging import TAG_VERSION, retag
from memflow.pipeline.writes import mutation, patches
from memflow.shared.codec import encode
from memflow.shared.errors import InvalidInput
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.keys import FIELD, Keys
from memflow.shared.sdk.rpc import JobReport
from memflow.shared.search.foreground import collections_deferred
from memflow.shared.storage.store import MemoryFilter, Optimizable, Store
from memflow.shared.writer.applier import Applier
from memflow.shared.writer.uses import Uses
from memflow.workers import ops
from memflow.workers.runtime import Context, fields_of

log = logging.getLogger(__name__)


@dataclass
class Plan:
    """What one job would do to one subject."""

    steps: list[Step] = field(default_factory=list)
    # New memories the job writes itself (frequency patterns).
    new: list[Memory] = field(default_factory=list)
    # Statements found again, sent through resolve like any candidate.
    candidates: list[Candidate] = field(default_factory=list)
    # Contested memories review could not settle.
    undecided: list[Memory] = field(default_factory=list)


def _nothing() -> None:
    return None


class Planner(Protocol):
    """A job's plan for one subject's memories; `between`: called between its parts (a job steps aside there)."""

    def __call__(self, memories: list[Memory], now: datetime, policy: Policy, tier: Tier | None,
                 space: IdSpace = PUBLIC, *, between: Callable[[], object] = _nothing) -> Plan: ...


def plan_retag(memories: list[Memory], now: datetime, policy: Policy, tier: Tier | None,
               space: IdSpace = PUBLIC, *, between: Callable[[], object] = _nothing) -> Plan:
    """Memories placed by older tagging rules, with their new dir and tag_version."""
    why = f"re-tagged with the rules of tag_version {TAG_VERSION}"
    return Plan(steps=[Step(m, fields, why) for m in memories if (fields := retag(m, TAG_VERSION)) is not None])


def plan_decay_job(memories: list[Memory], now: datetime, policy: Policy, tier: Tier | None,
                   space: IdSpace = PUBLIC, *, between: Callable[[], object] = _nothing) -> Plan:
    return Plan(steps=plan_decay(memories, now, policy, tier))


def plan_consolidate(memories: list[Memory], now: datetime, policy: Policy, tier: Tier | None,
                     space: IdSpace = PUBLIC, *, between: Callable[[], object] = _nothing) -> Plan:
    """Its three parts one after the other, `between` them: each is a pass over the subject's memories (~4 ms per
    1,000 each), where the three at once held the interpreter lock ~12 ms a subject for a search to wait on."""
    steps = plan_promotions(memories, policy)
    between()
    new = plan_patterns(memories, now, policy, space)
    between()
    return Plan(steps=steps, new=new, candidates=reread(memories, now))


def plan_review_job(memories: list[Memory], now: datetime, policy: Policy, tier: Tier | None,
                    space: IdSpace = PUBLIC, *, between: Callable[[], object] = _nothing) -> Plan:
    verdict = plan_review(memories, now, policy)
    return Plan(steps=verdict.steps, undecided=verdict.undecided)


JOBS: dict[str, Planner] = {
    "decay": plan_decay_job,
    "consolidate": plan_consolidate,
    "review": plan_review_job,
    "retag": plan_retag,
}
# Every job `run` takes: the planners', and the store's own (`index`) and the uses' (`uses`).
NAMES = (*JOBS, "index", "uses")


# The engine indexes a segment once it passes its indexing threshold (10 MB of vectors: ~3,300 points of 768
# dims); fewer changes than this leave it nothing to build, so the job does not ask.
INDEX_AFTER_CHANGES = 5_000


def index(store: Store, step_aside: Callable[[], object], now: datetime, dry_run: bool) -> dict[str, Any]:
    """Build the store's search indexes (HNSW) once INDEX_AFTER_CHANGES points changed since the last build, off
    every search's path. On an Edge shard the build runs in a process of its own and is handed over
    (shared/storage/edge_build.py): searches go on meanwhile (`step_aside`: the process's searches go first). A Qdrant
    server builds its own: nothing to do."""
    changed = store.changed_since_optimize() if isinstance(store, Optimizable) else 0
    if isinstance(store, Optimizable) and changed >= INDEX_AFTER_CHANGES and not dry_run:
        started = time.perf_counter()
        built = store.optimize(between=step_aside)
        log.info("index: %d points changed since the last build; built: %s, in %.1f s", changed, built,
                 time.perf_counter() - started)
    return {"job": "index", "tier": None, "subjects": 0, "examined": changed, "dry_run": dry_run,
            "now": now.isoformat(), "changed": [], "written": [], "sent": [], "undecided": [], "skipped": []}


def uses(applier: Applier, ledger: Uses, subject: str | None, now: datetime, dry_run: bool) -> dict[str, Any]:
    """Count on their points the uses packs and feedback recorded (shared/writer/uses.py) and could not count at once
    (the subject's write lock was taken): of `subject`, or of every subject that has some."""
    folded = 0 if dry_run else (ops.fold_uses(applier, ledger, subject) if subject
                                else ops.fold_all_uses(applier, ledger))
    return {"job": "uses", "tier": None, "subjects": 1 if subject else 0, "examined": folded, "dry_run": dry_run,
            "now": now.isoformat(), "changed": [], "written": [], "sent": [], "undecided": [], "skipped": []}


def run(ctx: Context, name: str, subject: str | None, now: datetime, dry_run: bool,
        tier: str | None = None) -> dict[str, Any]:
    """One job over one subject (or all), or `index` over the store; what it changed, or would change."""
    if name == "index":
        return index(ctx.store, ctx.foreground.step_aside, now, dry_run)
    if name == "uses":
        return uses(ctx.applier, Uses(ctx.client, ctx.keys), subject, now, dry_run)
    if name not in JOBS:
        raise InvalidInput("name", f"unknown job {name!r}: one of {', '.join(sorted(NAMES))}")
    only = Tier(tier) if tier else None
    policy = ctx.settings.lifecycle.policy()
    subjects = [subject] if subject else ctx.store.subjects()
    report: dict[str, Any] = {"job": name, "tier": tier, "subjects": len(subjects), "examined": 0,
                              "dry_run": dry_run, "now": now.isoformat(), "changed": [], "written": [],
                              "sent": [], "undecided": [], "skipped": []}
    aside = ctx.foreground.step_aside  # before each step: the searches this process is answering go first
    applier, ledger, resolve = ctx.applier, Uses(ctx.client, ctx.keys), Resolve(ctx.client, ctx.keys)
    for s in subjects:
        if not dry_run:  # the counts a plan reads (hotness, support) include every use recorded
            aside()
            ops.fold_uses(applier, ledger, s)
        aside()
        with collections_deferred():  # collected once after the read and plan (shared/search/foreground.py)
            memories = ctx.store.get(MemoryFilter(s), between=aside)  # a page at a time
            report["examined"] += len(memories)
            aside()
            plan = JOBS[name](memories, now, policy, only, ctx.id_space, between=aside)
            _report(report, s, plan)
        if not dry_run:
            aside()
            report["skipped"] += apply(applier, ctx.embedder, resolve, s, plan, name, now, between=aside)
    return report


def _report(report: dict[str, Any], subject: str, plan: Plan) -> None:
    report["changed"] += [{"id": st.memory.id, "subject": subject, "content": st.memory.content[:120],
                           "why": st.why, "before": fields_of(st.memory, st.fields), "after": _plain(st.fields)}
                          for st in plan.steps]
    report["written"] += [{"id": m.id, "subject": subject, "content": m.content[:160]} for m in plan.new]
    report["sent"] += [{"subject": subject, "mtype": c.mtype.value, "key": c.key, "content": c.content[:120]}
                       for c in plan.candidates]
    report["undecided"] += [{"id": m.id, "subject": subject, "key": m.key, "content": m.content[:120]}
                            for m in plan.undecided]


# Jobs whose every step stands alone (one memory's own change, a new pattern): applied APPLY_CHUNK ops at a time,
# the searches of the process served between chunks (a subject's 1,000 strength refreshes are ~0.5 s of lock
# renewals and store writes: a search arriving meanwhile waited for all of it). Review's steps go together: a
# winner and the rivals it retires (applied apart, a crash between would leave a rival alone in its contest, and
# the next review would let it win too).
SEPARATE_STEPS = frozenset({"decay", "retag", "consolidate"})
APPLY_CHUNK = 64


@dataclass(frozen=True)
class Resolve:
    """The resolve stage's work streams, where a job sends the statements it found again."""

    client: redis.Redis
    keys: Keys

    def send(self, candidates: Sequence[Candidate]) -> None:
        for c in candidates:
            self.client.xadd(self.keys.work("resolve", c.subject), {FIELD: encode(c)})


def apply(applier: Applier, embedder: Embedder, resolve: Resolve, subject: str, plan: Plan, name: str,
          now: datetime, between: Callable[[], object] = lambda: None) -> list[str]:
    """Carry a plan out (`between`: called between its chunks): its changes through `applier`, its new memories
    encoded by `embedder`, its statements found again sent to `resolve`; the ids of memories left alone because
    they changed while it was made (the next run plans them again from what they are then)."""
    ops: list[MutationOp] = [*patches(plan.steps, f"{name}: "), *(PutOp(memory=m) for m in plan.new)]
    vectors = _vectors(embedder, plan.new)
    size = APPLY_CHUNK if name in SEPARATE_STEPS else max(1, len(ops))
    skipped: list[str] = []
    for start in range(0, len(ops), size):
        if start:
            between()
        skipped += applier.apply(mutation(subject, name, f"{name} job", now, ops[start:start + size]),
                                 vectors).stale
    resolve.send(plan.candidates)
    return skipped


def _vectors(embedder: Embedder, memories: list[Memory]) -> dict[str, list[float]]:
    if not memories:
        return {}
    return dict(zip([m.id for m in memories], embedder.encode_passages([m.content for m in memories]),
                    strict=True))


def _plain(fields: dict[str, Any]) -> dict[str, Any]:
    return {k: v.isoformat() if isinstance(v, datetime) else v for k, v in fields.items()}


def now_or_clock(now: str | None) -> datetime:
    return datetime.fromisoformat(now) if now else datetime.now(UTC)


# A report names every memory a job changed: at 20k memories, 20k entries and ~0.1 s of validation.
REPORT_CHUNK = 1000


def report_of(report: dict[str, Any], between: Callable[[], object]) -> JobReport:
    """The reply of a job, its long lists validated REPORT_CHUNK entries at a time (`between` the chunks: the
    searches of the process go first) rather than in one stretch a search arriving would wait for."""
    lists = {name: report[name] for name in ("changed", "written", "sent", "undecided")}
    reply = JobReport.model_validate({**report, **dict.fromkeys(lists, [])})
    for name, entries in lists.items():
        adapter: TypeAdapter[list[Any]] = TypeAdapter(JobReport.model_fields[name].annotation or list[Any])
        validated: list[Any] = []
        for start in range(0, len(entries), REPORT_CHUNK):
            between()
            validated += adapter.validate_python(entries[start:start + REPORT_CHUNK])
        setattr(reply, name, validated)
    return reply
