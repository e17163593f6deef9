"""upsert: `upsert` → the store, and `changes`.

Hands one WriteBatch at a time to the applier (shared/applier.py), which applies it whole and
idempotently and announces its changes. A batch built on a state that has moved on (someone else
wrote the same id, or a patched point changed) is sent back to `resolve` to be decided again,
never forced.
"""

from __future__ import annotations

from functools import partial

from memflow.pipeline.models import PutOp, WriteBatch
from memflow.pipeline.writes import of_batch
from memflow.shared import pending
from memflow.shared.errors import Permanent
from memflow.shared.pending import settled_by
from memflow.shared.streams import Emit, StreamConsumer, per_item
from memflow.workers.runtime import Context


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
    applied = ctx.applier.apply(of_batch(batch), vectors=vectors_of(batch))
    if applied.stale:
        return send_back(ctx, batch)
    # In the store now (and searchable): the statement's pending entry goes, never before.
    pending.settle(ctx.client, ctx.keys, settled_by([batch.candidate]))
    return []


def vectors_of(batch: WriteBatch) -> dict[str, list[float]]:
    """Every memory a batch puts is its candidate's statement: one vector for all."""
    if batch.vector is None:
        return {}
    return {op.memory.id: batch.vector for op in batch.ops if isinstance(op, PutOp)}


def send_back(ctx: Context, batch: WriteBatch) -> list[Emit]:
    candidate = batch.candidate
    if candidate.retries >= ctx.settings.write.max_resolve_retries:
        raise Permanent(f"candidate {candidate.key!r} kept meeting concurrent writes; gave up after "
                        f"{candidate.retries} re-resolves")
    retry = candidate.model_copy(update={"retries": candidate.retries + 1})
    return [Emit(ctx.keys.work("resolve", retry.subject), retry)]
