"""What a mutation does to the points it names: the applier's rules (docs/write-path.md#the-applier).

`plan` is pure: the applier (shared/writer/applier.py) reads the points, asks `plan` what to write, writes
it and announces the changes. Per op the answer is one of: write this (and announce that), already
written by an earlier attempt of this mutation (announce only: the feed may not have heard of it), or
stale (built on a revision that has moved on). A non-quiet write moves the revision by one, logs
what it replaced, and stamps the point with its op key, which is how a retry recognises it.

A put of something forgotten is never written (`Tombstones`): a redelivery of a write made before a
forget, or a batch planned before it, would otherwise store the memory again.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal

from memflow.pipeline.lifecycle import Step
from memflow.pipeline.models import Change, CountOp, DeleteOp, Memory, Mutation, MutationOp, PatchOp, PutOp, WriteBatch
from memflow.pipeline.resolve import apply_patch

# What a change announces of a put: enough to follow the feed, not the whole payload.
SUMMARY_FIELDS = ("status", "version", "key", "content", "tier")
# Bookkeeping a job refreshes often (decay): not worth a revision, a line of history or an announcement.
QUIET_FIELDS = frozenset({"strength", "strength_at", "access_count", "last_accessed_at", "last_count"})
# Bookkeeping a patch rewrites on every change: not what the change is about.
_BOOKKEEPING = frozenset({"rev", "updated_at", "revisions", "last_op"})


@dataclass(frozen=True)
class Write:
    """One op, as the applier carries it out."""

    op_key: str
    kind: Literal["put", "patch", "count", "delete"]
    memory_id: str
    fields: dict[str, Any] = field(default_factory=dict)  # patch and count: the payload fields to set
    memory: Memory | None = None  # put: the point to write
    change: Change | None = None  # what the `changes` feed hears of it (None: bookkeeping)
    done: bool = False  # written before: only its announcement may be missing
    own: bool = False  # written by an earlier attempt of this very mutation (its op key is on the point)
    # The revision the write was planned on: the store writes it only if the point is still there
    # (compare-and-write; None: a put, written only where no point is).
    at_rev: int | None = None


@dataclass(frozen=True)
class Tombstones:
    """What forget left behind, as far as a mutation's puts are concerned (workers/forgetting.py): the
    forgotten events among their sources, and when each of their contents (by SHA-256) was forgotten."""

    events: frozenset[str] = frozenset()
    contents: Mapping[str, datetime] = field(default_factory=dict)

    def bury(self, memory: Memory, at: datetime) -> bool:
        """Whether a put of `memory`, said at `at`, writes back something forgotten: every event it was
        read from is forgotten, or its very words were forgotten after they were said (said again after the
        forget, they are new: a user may tell again what they asked to forget)."""
        if memory.source_event_ids and set(memory.source_event_ids) <= self.events:
            return True
        forgotten_at = self.contents.get(content_hash(memory.content))
        return forgotten_at is not None and at <= forgotten_at


def content_hash(content: str) -> str:
    """How a forget's receipt and tombstone name words without keeping them."""
    return hashlib.sha256(content.encode()).hexdigest()


@dataclass(frozen=True)
class Plan:
    writes: list[Write]
    stale: list[str]  # ids of the points whose ops were built on another revision
    forgotten: list[str] = field(default_factory=list)  # ids of the puts not written: forgotten (`Tombstones`)

    @property
    def started(self) -> bool:
        """Whether an earlier attempt of this mutation wrote part of it (it was cut short). A put found
        by its content alone does not count: a replay long after may meet it, and must not force the rest."""
        return any(w.own for w in self.writes)


def mutation_id(*parts: object) -> str:
    """A deterministic id for a mutation: the same change, retried or replayed, has the same id."""
    return hashlib.sha256(json.dumps(parts, default=str, sort_keys=True, ensure_ascii=False).encode()).hexdigest()[:32]


def of_batch(batch: WriteBatch) -> Mutation:
    """A write batch of resolve as a mutation: all or nothing on staleness, at the statement's event time."""
    ops = [op.model_dump(mode="json") for op in batch.ops]
    return Mutation(id=mutation_id("batch", batch.subject, batch.action.value, ops), subject=batch.subject,
                    action=batch.action.value, why=batch.why, at=batch.candidate.ts, ops=list(batch.ops),
                    on_stale="send_back", source_event_ids=batch.candidate.source_event_ids)


def mutation(subject: str, action: str, why: str, at: datetime, ops: Sequence[MutationOp],
             on_stale: Literal["send_back", "skip", "rebase"] = "skip") -> Mutation:
    """A mutation planned by a job or an op (its id from what it does and when)."""
    dumped = [op.model_dump(mode="json") for op in ops]
    return Mutation(id=mutation_id(action, subject, at.isoformat(), dumped), subject=subject, action=action,
                    why=why, at=at, ops=list(ops), on_stale=on_stale)


def patches(steps: Sequence[Step], why: str = "") -> list[PatchOp]:
    """A planner's steps as patches on the revisions it read (`why`: a prefix for each step's reason)."""
    return [PatchOp(id=st.memory.id, expected_rev=st.memory.rev, set=dict(st.fields), why=f"{why}{st.why}",
                    quiet=not set(st.fields) - QUIET_FIELDS) for st in steps]


def plan(m: Mutation, current: Mapping[str, Memory], *, rebase: bool = False,
         tombstones: Tombstones = Tombstones()) -> Plan:
    """What each op of `m` does to the points as they are now (`current`: the points its ops name;
    `tombstones`: what forget left of its puts' events and words)."""
    writes: list[Write] = []
    stale: list[str] = []
    forgotten: list[str] = []
    rebase = rebase or m.on_stale == "rebase"
    for i, op in enumerate(m.ops):
        there = current.get(target(op))
        if isinstance(op, PutOp) and there is None and tombstones.bury(op.memory, m.at):
            forgotten.append(op.memory.id)
            continue
        write = _plan_op(m, op_key(m, i), op, there, rebase)
        if write is None:
            stale.append(target(op))
        elif write.done or write.fields or write.memory is not None or write.kind == "delete":
            writes.append(write)  # the rest change nothing: a redelivered union, a count of a forgotten point
    return Plan(writes, stale, forgotten)


def op_key(m: Mutation, i: int) -> str:
    """The key of the `i`th op of `m`, stamped on what it writes (`last_op`): how a retry recognises its own."""
    return f"{m.id}:{i}"


def puts(m: Mutation) -> list[Memory]:
    """The memories `m` puts: what the applier asks forget's tombstones about."""
    return [op.memory for op in m.ops if isinstance(op, PutOp)]


def target(op: MutationOp) -> str:
    return op.memory.id if isinstance(op, PutOp) else op.id


def _plan_op(m: Mutation, key: str, op: MutationOp, there: Memory | None, rebase: bool) -> Write | None:
    if isinstance(op, PutOp):
        return _put(m, key, op, there)
    if isinstance(op, PatchOp):
        return _patch(m, key, op, there, rebase)
    if isinstance(op, CountOp):
        return _count(key, op, there)
    return _delete(key, op, there)


def _put(m: Mutation, key: str, op: PutOp, there: Memory | None) -> Write | None:
    change = _change(m, op.memory.id, m.why, None, _summary(op.memory), op.memory.rev)
    if there is None:
        return Write(key, "put", op.memory.id, memory=op.memory.model_copy(update={"last_op": key}), change=change)
    # Same content from the same events is this put, written before (a redelivery). Same id and content
    # from other events is another session saying it too: decided again, it becomes a repeat.
    own = there.last_op == key
    if own or (there.content == op.memory.content and set(op.memory.source_event_ids) <= set(there.source_event_ids)):
        if not own and not m.announce_found:
            return Write(key, "put", op.memory.id)  # held before: nothing to write or say
        return Write(key, "put", op.memory.id, change=change, done=True, own=own)
    return None


def _patch(m: Mutation, key: str, op: PatchOp, there: Memory | None, rebase: bool) -> Write | None:
    if there is None:
        return None
    if there.rev == op.expected_rev + 1 and there.last_op == key:
        return Write(key, "patch", op.id, change=_redone(m, op, there), done=True, own=True)
    if there.rev != op.expected_rev and not rebase:
        return None
    op = op.model_copy(update={"expected_rev": there.rev})
    if op.quiet:
        return Write(key, "patch", op.id, fields=dict(op.set), at_rev=there.rev)
    before, after = there.model_dump(mode="json"), apply_patch(there, op, m.at).model_dump(mode="json")
    changed = {k: v for k, v in after.items() if before.get(k) != v and k not in _BOOKKEEPING}
    if not changed:
        return Write(key, "patch", op.id)  # a redelivered union: nothing new to say or write
    fields = changed | {k: after[k] for k in ("rev", "updated_at", "revisions")} | {"last_op": key}
    return Write(key, "patch", op.id, fields=fields, at_rev=there.rev,
                 change=_change(m, op.id, op.why, {k: before.get(k) for k in changed}, changed, after["rev"]))


def _redone(m: Mutation, op: PatchOp, there: Memory) -> Change:
    """The announcement of a patch an earlier attempt wrote: what it replaced is in the point's history."""
    logged = next((r for r in there.revisions if r.rev == there.rev), None)
    before = logged.before if logged is not None else {}
    after = there.model_dump(mode="json")
    names = [*op.set, *(["source_event_ids"] if op.add_source_event_ids else []),
             *(["session_ids"] if op.add_session_ids else [])]
    return _change(m, op.id, op.why, {k: before.get(k) for k in names}, {k: after[k] for k in names}, there.rev)


def _count(key: str, op: CountOp, there: Memory | None) -> Write:
    if there is None or there.last_count == key:  # forgotten meanwhile, or counted by an earlier attempt
        return Write(key, "count", op.id)
    last = max((t for t in (there.last_accessed_at, op.at) if t is not None))
    return Write(key, "count", op.id, fields={"access_count": there.access_count + op.uses,
                                              "last_accessed_at": last.isoformat(), "last_count": key},
                 at_rev=there.rev)


def _delete(key: str, op: DeleteOp, there: Memory | None) -> Write:
    return Write(key, "delete", op.id, done=there is None)


def _summary(memory: Memory) -> dict[str, Any]:
    payload = memory.model_dump(mode="json")
    return {k: payload[k] for k in SUMMARY_FIELDS}


def _change(m: Mutation, memory_id: str, why: str, before: dict[str, Any] | None,
            after: dict[str, Any] | None, rev: int | None = None) -> Change:
    return Change(memory_id=memory_id, subject=m.subject, action=m.action, why=why, before=before, after=after,
                  at=m.at, source_event_ids=m.source_event_ids, rev=rev)
