"""What ops do to memories by hand, run in the query worker (it holds the store):
history, rollback, review list/accept/reject, and the utilisation counters that
`inspect` reports (docs/write-path.md#uses-and-adoption: the share of recalled memories that were adopted).

A memory is named by its id; without a subject every subject is searched for it (ops
tooling, not a tenant's query: nothing here is reachable from search or pack).
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

import redis
from redis.client import Pipeline

from memflow.pipeline.holders import Person, people
from memflow.pipeline.ids import IdSpace, is_keyed
from memflow.pipeline.lifecycle import Step, plan_accept, plan_reject, plan_rollback
from memflow.pipeline.models import CountOp, Memory, MutationOp, PutOp, Status
from memflow.pipeline.prefixes import Ambiguous, expand, is_full_id, is_prefix
from memflow.pipeline.scopes import allows
from memflow.pipeline.score import strength
from memflow.pipeline.writes import mutation, mutation_id, patches
from memflow.shared.errors import InvalidInput, NotFound, StaleVersion
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.counters import DailyCounters
from memflow.shared.redisdb.keys import Keys
from memflow.shared.sdk.rpc import Utilisation
from memflow.shared.storage.store import MemoryFilter, Store
from memflow.shared.writer.applier import Applier
from memflow.shared.writer.uses import Uses

REVIEWABLE = (Status.pending_review, Status.contested)
# Utilisation counters are kept per day this long (the report looks back 30 days).
UTILISATION_KEEP = timedelta(days=40)
UTILISATION_DAYS = 30


def locate(store: Store, memory_id: str, subject: str | None, within: Sequence[str] | None = None) -> Memory:
    """The memory `memory_id` (a whole id, or the start of one as `memflow inspect` shows it) of `subject`; without
    one, of the subjects the patterns `within` cover (None: every subject, for the operator's commands): another
    subject's point is never read for a caller that may not see it."""
    subjects = [subject] if subject else [s for s in store.subjects() if within is None or allows(within, s)]
    found = _by_id(store, memory_id, subjects) if is_full_id(memory_id) else _by_prefix(store, memory_id, subjects)
    if found is None:
        raise NotFound(f"no memory {memory_id}" + (f" for subject {subject}" if subject else ""))
    return found


def resolve_ids(store: Store, subject: str, memory_ids: Sequence[str]) -> list[str]:
    """Each of `memory_ids` as a whole id of `subject`: whole ones as they are (one forgotten already is no error),
    a prefix as the one id of the subject it starts; NotFound for one that names nothing (a word that is no id
    never reaches the store, which would refuse it with a traceback)."""
    return [m if is_full_id(m) else locate(store, m, subject).id for m in memory_ids]


def _by_id(store: Store, memory_id: str, subjects: Sequence[str]) -> Memory | None:
    for s in subjects:
        found = store.get(MemoryFilter(s, ids=[memory_id.lower()]))
        if found:
            return found[0]
    return None


def _by_prefix(store: Store, prefix: str, subjects: Sequence[str]) -> Memory | None:
    """The memory whose id `prefix` starts, among `subjects`' (read whole: ops tooling, never a search's path)."""
    if not is_prefix(prefix):
        return None
    started = {m.id: m for s in subjects for m in store.get(MemoryFilter(s)) if m.id.startswith(prefix.lower())}
    try:
        chosen = expand(prefix, started)
    except Ambiguous as exc:  # the caller's to settle: answered, never logged as the worker's error
        raise InvalidInput("memory_id", str(exc)) from None
    return started[chosen[0]] if chosen else None


def versions(store: Store, memory: Memory) -> list[Memory]:
    """Every version of a keyed memory (the points of its key), oldest first; else the memory alone."""
    if not is_keyed(memory.mtype):
        return [memory]
    found = store.get(MemoryFilter(memory.subject, keys=[memory.key]))
    return sorted(found, key=lambda m: (m.version, m.created_at))


def history(store: Store, memory_id: str, subject: str | None, within: Sequence[str] | None = None) -> dict[str, Any]:
    memory = locate(store, memory_id, subject, within)
    shown = ("id", "version", "status", "tier", "content", "source", "confidence", "created_at", "updated_at",
             "supersedes", "superseded_by", "conflicts_with", "source_event_ids", "revisions")
    return {"subject": memory.subject, "key": memory.key, "asked": memory.id, "about": memory.about,
            "versions": [{k: v for k, v in m.model_dump(mode="json").items() if k in shown}
                         for m in versions(store, memory)]}


def rollback(applier: Applier, embedder: Embedder, memory_id: str, to_version: int, subject: str | None,
             at: datetime, space: IdSpace) -> dict[str, Any]:
    """Restore version `to_version` as a new version (its words encoded by `embedder`, its id named in `space`); the
    live ones are superseded by it."""
    memory = locate(applier.store, memory_id, subject)
    try:
        plan = plan_rollback(versions(applier.store, memory), to_version, at, space)
    except ValueError as exc:  # no such version: the caller's mistake, answered without a traceback
        raise InvalidInput("to_version", str(exc)) from None
    restored = plan.restored
    puts = [] if restored is None else [PutOp(memory=restored)]
    vectors = {} if restored is None else {restored.id: embedder.encode_passages([restored.content])[0]}
    ops: list[MutationOp] = [*puts, *patches(plan.steps)]
    applier.apply(mutation(memory.subject, "rollback", f"rolled back to version {to_version}", at, ops), vectors)
    return {"subject": memory.subject, "key": memory.key, "to_version": to_version,
            "restored": None if restored is None else {"id": restored.id, "version": restored.version,
                                                        "content": restored.content},
            "superseded": [st.memory.id for st in plan.steps]}


def review_list(store: Store, subject: str | None) -> list[dict[str, Any]]:
    found = []
    for s in [subject] if subject else store.subjects():
        found += store.get(MemoryFilter(s, statuses=REVIEWABLE))
    found.sort(key=lambda m: (m.subject, m.key, m.created_at))
    return [{"id": m.id, "subject": m.subject, "status": m.status.value, "key": m.key, "mtype": m.mtype.value,
             "content": m.content, "confidence": m.confidence, "conflicts_with": m.conflicts_with,
             "created_at": m.created_at.isoformat()} for m in found]


def review_decide(applier: Applier, memory_id: str, accept: bool, subject: str | None,
                  at: datetime) -> dict[str, Any]:
    memory = locate(applier.store, memory_id, subject)
    same_key = applier.store.get(MemoryFilter(memory.subject, keys=[memory.key]))
    try:
        steps = plan_accept(memory, same_key, at) if accept else plan_reject(memory, same_key)
    except ValueError as exc:  # not waiting for a decision: the caller's mistake, answered without a traceback
        raise InvalidInput("memory_id", str(exc)) from None
    apply_steps(applier, steps, "review", at)
    return {"id": memory.id, "accepted": accept,
            "changed": [{"id": st.memory.id, "after": {k: str(v) for k, v in st.fields.items()}} for st in steps]}


def apply_steps(applier: Applier, steps: list[Step], action: str, at: datetime) -> list[str]:
    """Apply a planner's steps (all of one subject); the ids of memories that had moved on meanwhile."""
    if not steps:
        return []
    subject = steps[0].memory.subject
    return applier.apply(mutation(subject, action, action, at, patches(steps))).stale


def feedback(applier: Applier, uses: Uses, utilisation: UtilisationCounters, subject: str, memory_ids: list[str],
             when: datetime, request_id: str, *, recalled: int = 0) -> int:
    """Count memories of `subject` as adopted (used in an answer): access_count + 1 each, once per request
    (`request_id`: a retry of the same request counts nothing more, nor its `recalled` memories). Recorded
    without waiting for the subject's write lock (shared/writer/uses.py), counted on the points at once if it is
    free."""
    found = applier.store.get(MemoryFilter(subject, ids=memory_ids)) if memory_ids else []
    if uses.record(subject, request_id, [m.id for m in found], when, _clock_ms()):
        utilisation.count(subject, when, recalled=recalled, adopted=len(found))
    fold_uses(applier, uses, subject, wait=False)
    return len(found)


def fold_uses(applier: Applier, ledger: Uses, subject: str, *, wait: bool = True) -> int:
    """Count the uses recorded for `subject` on its points (a `CountOp` each, through the applier); how many
    points. `wait=False`: only if the write lock is free now (a read path never waits for it), else they
    stay recorded for the next fold."""
    try:
        with applier.holding(subject, **({} if wait else {"wait_s": 0})) as held:
            taken = ledger.take(subject)
            if taken.uses:  # the same snapshot after a crash: the same mutation (by its fold id), counted once
                ops: list[MutationOp] = [CountOp(id=u.memory_id, uses=u.uses, at=u.at) for u in taken.uses]
                counts = mutation(subject, "feedback", "adopted in an answer", max(u.at for u in taken.uses), ops)
                held.apply(counts.model_copy(update={"id": mutation_id("uses", subject, taken.fold)}))
            ledger.counted(subject)
    except StaleVersion:
        if wait:
            raise
        return 0
    return len(taken.uses)


def fold_all_uses(applier: Applier, ledger: Uses) -> int:
    """Count every subject's recorded uses on their points (the `uses` job); how many points."""
    return sum(fold_uses(applier, ledger, s) for s in ledger.subjects())


def _clock_ms() -> int:
    # The retry window of a request's uses is measured on this clock; the uses are dated by the request.
    return int(time.time() * 1000)


# -- utilisation -----------------------------------------------------------------------


@dataclass(frozen=True)
class UtilisationCounters:
    """Each subject's per-day counters of memories recalled (returned by a search) and adopted (used in an answer):
    the owner of `Keys.utilisation`, kept UTILISATION_KEEP (shared/redisdb/counters.py prunes the days past it). What
    they add up to is reported as the reply model `inspect` returns (`shared.sdk.rpc.Utilisation`)."""

    client: redis.Redis
    keys: Keys

    def count(self, subject: str, at: datetime, *, recalled: int = 0, adopted: int = 0,
              via: Pipeline | None = None) -> None:
        """Add to the subject's counters of the day of `at`; `via`: a pipeline the caller sends with more (a
        search's trace), else they are sent now."""
        day = at.date().isoformat()
        DailyCounters(self.client, UTILISATION_KEEP.days).add(
            self.keys.utilisation(subject), at, {f"recalled:{day}": recalled, f"adopted:{day}": adopted}, via=via)

    def report(self, subject: str, now: datetime, days: int = UTILISATION_DAYS) -> Utilisation:
        """The subject's memories recalled and adopted over the `days` up to `now`, and the share adopted."""
        raw = self.client.hgetall(self.keys.utilisation(subject))
        counts = {(k.decode() if isinstance(k, bytes) else k): int(v) for k, v in raw.items()}
        window = {(now - timedelta(days=d)).date().isoformat() for d in range(days)}
        recalled = sum(v for k, v in counts.items() if k.startswith("recalled:") and k.split(":", 1)[1] in window)
        adopted = sum(v for k, v in counts.items() if k.startswith("adopted:") and k.split(":", 1)[1] in window)
        return Utilisation(days=days, recalled=recalled, adopted=adopted,
                           share=round(adopted / recalled, 4) if recalled else None)


def people_of(memories: list[Memory]) -> list[dict[str, Any]]:
    """The people a subject has talked about, with what is known of each (pipeline.holders.people)."""
    return [{"about": who, "relation": Person.of(who).relation, "name": Person.of(who).name,
             "memories": [{"id": m.id, "content": m.content, "mtype": m.mtype, "status": m.status,
                           "created_at": m.created_at} for m in known]}
            for who, known in people(memories).items()]


def memory_state(m: Memory, now: datetime, tau_hours: dict[str, float]) -> dict[str, Any]:
    """What inspect shows of one memory: its payload, its strength now and its last change."""
    last = m.revisions[-1] if m.revisions else None
    return m.model_dump(mode="json") | {
        "strength_now": round(strength(m, now, tau_hours), 4),
        "last_change": {"at": (last.at if last else m.updated_at).isoformat(),
                        "why": last.why if last else "written"}}
