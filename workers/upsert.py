"""upsert: `upsert` → the store, and `changes`.

Hands one WriteBatch at a time to the applier (shared/writer/applier.py), which applies it whole and
idempotently and announces its changes. A batch built on a state that has moved on (someone else
wrote the same id, or a patched point changed) is sent back to `resolve` to be decided again,
never forced.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import redis

from memflow.pipeline.fates import FORGOTTEN_IN_FLIGHT, FateState, stored_as
from memflow.pipeline.models import PutOp, WriteBatch
from memflow.pipeline.writes import of_batch
from memflow.shared.errors import Permanent
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.keys import Keys
from memflow.shared.streaming.consumer import StreamConsumer
from memflow.shared.streaming.handlers import Emit, per_item
from memflow.shared.unstored import fates, pending
from memflow.shared.unstored.pending import settled_by
from memflow.shared.writer.applier import Applier
from memflow.workers.runtime import Context

# Times a candidate is sent back to resolve after its batch met a concurrent write, then the DLQ. Same-key
# candidates in one resolve batch all see the store as it was: each stale round settles at least one of them,
# so a burst of k writes on one key may need k rounds before the last one lands (a correction, its repeat at
# session end and the session it corrects are three already). Raised from 3 for that burst (7197746); it was
# MEMFLOW_MAX_RESOLVE_RETRIES.
MAX_RESOLVE_RETRIES = 8


@dataclass(frozen=True)
class Upserter:
    """What the upsert stage touches: the applier (the one writer of the store: built, and the store opened, when
    a batch is written; a batch sent back opens nothing), the embedder whose vectors the store holds, how often a
    candidate may be sent back, and Redis for the pending layer and resolve streams."""

    client: redis.Redis
    keys: Keys
    applier: Callable[[], Applier]
    embedder: Embedder
    max_resolve_retries: int

    @classmethod
    def of(cls, ctx: Context) -> Upserter:
        return cls(ctx.client, ctx.keys, lambda: ctx.applier, ctx.embedder, MAX_RESOLVE_RETRIES)


def build(ctx: Context) -> StreamConsumer[WriteBatch]:
    # Unpacked per batch, as the context opens its store and loads its model when first used.
    return StreamConsumer(ctx.client, ctx.keys, "upsert", WriteBatch,
                          per_item(lambda batch: handle(Upserter.of(ctx), batch)), ctx.consumer_config())


def handle(stage: Upserter, batch: WriteBatch) -> list[Emit]:
    if batch.vector_model not in (None, stage.embedder.model_id):
        # Embedded before `memflow reindex` switched models: decided again, and embedded by this model
        # (through send_back, so that two processes on different models cannot pass it back and forth).
        return send_back(stage.keys, stage.max_resolve_retries, batch)
    if batch.vector is not None and len(batch.vector) != stage.embedder.dim:
        # Another model's vector fails in the store on every delivery: refused at once, with the reason.
        raise Permanent(f"vector has {len(batch.vector)} dimensions; the store holds {stage.embedder.dim}")
    applied = stage.applier().apply(of_batch(batch), vectors=vectors_of(batch))
    if applied.stale:
        return send_back(stage.keys, stage.max_resolve_retries, batch)
    # In the store now (and searchable): the statement's pending entry goes, never before.
    pending.settle(stage.client, stage.keys, settled_by([batch.candidate]))
    if applied.forgotten and not applied.changes:  # forgotten meanwhile: none of it written (shared/writer/applier.py)
        fates.record(stage.client, stage.keys, batch.subject, FateState.dropped, batch.candidate.source_event_ids,
                     FORGOTTEN_IN_FLIGHT)
    else:
        fates.stored(stage.client, stage.keys, batch.subject, stored_as(batch))
    return []


def vectors_of(batch: WriteBatch) -> dict[str, list[float]]:
    """Every memory a batch puts is its candidate's statement: one vector for all."""
    if batch.vector is None:
        return {}
    return {op.memory.id: batch.vector for op in batch.ops if isinstance(op, PutOp)}


def send_back(keys: Keys, max_retries: int, batch: WriteBatch) -> list[Emit]:
    """The batch's candidate back to resolve (decided again on what is stored now), at most `max_retries` times."""
    candidate = batch.candidate
    if candidate.retries >= max_retries:
        raise Permanent(f"candidate {candidate.key!r} kept meeting concurrent writes; gave up after "
                        f"{candidate.retries} re-resolves")
    retry = candidate.model_copy(update={"retries": candidate.retries + 1})
    return [Emit(keys.work("resolve", retry.subject), retry)]
