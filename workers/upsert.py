"""upsert: `upsert` → the store, and `changes`.

Applies one WriteBatch at a time, idempotently: a put whose deterministic id already
holds the same content was applied before (a redelivery) and is skipped; a patch
applies only to the revision it was built on. A batch built on a state that has moved
on (someone else wrote the same id, or a patched point changed) is sent back to
`resolve` to be decided again, never forced.
"""

from __future__ import annotations

from functools import partial
from typing import Any

from pipeline.models import Change, Memory, PatchOp, PutOp, WriteBatch
from pipeline.resolve import apply_patch
from shared.errors import Permanent
from shared.store import MemoryFilter
from shared.streams import Emit, StreamConsumer, per_item
from workers.runtime import Context


def build(ctx: Context) -> StreamConsumer[WriteBatch]:
    return StreamConsumer(ctx.client, ctx.keys, "upsert", WriteBatch, per_item(partial(handle, ctx)),
                          ctx.consumer_config())


def handle(ctx: Context, batch: WriteBatch) -> list[Emit]:
    if batch.vector_model not in (None, ctx.embedder.model_id):
        # Embedded before `memflow reindex` switched models: decided again, and embedded by this model
        # (through send_back, so that two processes on different models cannot pass it back and forth).
        return send_back(ctx, batch)
    if batch.vector is not None and len(batch.vector) != ctx.embedder.dim:
        # Another model's vector fails in the store on every delivery: refused at once, with the reason.
        raise Permanent(f"vector has {len(batch.vector)} dimensions; the store holds {ctx.embedder.dim}")
    ids = [op.memory.id if isinstance(op, PutOp) else op.id for op in batch.ops]
    current = {m.id: m for m in ctx.store.get(MemoryFilter(batch.subject, ids=ids))}
    if is_stale(batch, current):
        return send_back(ctx, batch)
    changes = apply_puts(ctx, batch, current) + apply_patches(ctx, batch, current)
    return [Emit(ctx.keys.changes, change, maxlen=ctx.settings.changes_maxlen) for change in changes]


def is_stale(batch: WriteBatch, current: dict[str, Memory]) -> bool:
    for op in batch.ops:
        if isinstance(op, PutOp):
            there = current.get(op.memory.id)
            # Same id and content is a redelivery only if it came from the same events: two sessions
            # saying the same thing, decided in one batch against the same state, both put version 1;
            # the second must become a repeat (provenance, sessions) rather than vanish.
            if there is not None and (there.content != op.memory.content
                                      or not set(op.memory.source_event_ids) <= set(there.source_event_ids)):
                return True
        elif op.id not in current or current[op.id].rev != op.expected_rev:
            return True
    return False


def send_back(ctx: Context, batch: WriteBatch) -> list[Emit]:
    candidate = batch.candidate
    if candidate.retries >= ctx.settings.max_resolve_retries:
        raise Permanent(f"candidate {candidate.key!r} kept meeting concurrent writes; gave up after "
                        f"{candidate.retries} re-resolves")
    retry = candidate.model_copy(update={"retries": candidate.retries + 1})
    return [Emit(ctx.keys.stream("resolve"), retry)]


def apply_puts(ctx: Context, batch: WriteBatch, current: dict[str, Memory]) -> list[Change]:
    new = [op.memory for op in batch.ops if isinstance(op, PutOp) and op.memory.id not in current]
    if not new:
        return []
    if batch.vector is None:
        raise Permanent("a write batch with a new memory carries no vector")
    ctx.store.put(new, [batch.vector] * len(new))
    return [_change(batch, m.id, batch.action.value, None, _summary(m.model_dump(mode="json"))) for m in new]


def apply_patches(ctx: Context, batch: WriteBatch, current: dict[str, Memory]) -> list[Change]:
    changes = []
    for op in batch.ops:
        if not isinstance(op, PatchOp):
            continue
        before = current[op.id].model_dump(mode="json")
        after = apply_patch(current[op.id], op, batch.candidate.ts).model_dump(mode="json")
        changed = {k: v for k, v in after.items() if before.get(k) != v and k not in ("rev", "updated_at")}
        if not changed:
            continue  # a redelivered union: nothing new to say
        ctx.store.set_fields(op.id, {k: after[k] for k in changed} | {"rev": after["rev"],
                                                                        "updated_at": after["updated_at"]})
        changes.append(_change(batch, op.id, op.why, {k: before.get(k) for k in changed}, changed))
    return changes


def _summary(payload: dict[str, Any]) -> dict[str, Any]:
    return {k: payload[k] for k in ("status", "version", "key", "content", "tier")}


def _change(batch: WriteBatch, memory_id: str, action: str, before: dict[str, Any] | None,
            after: dict[str, Any] | None) -> Change:
    return Change(memory_id=memory_id, subject=batch.subject, action=action, why=batch.why, before=before,
                  after=after, at=batch.candidate.ts, source_event_ids=batch.candidate.source_event_ids)
