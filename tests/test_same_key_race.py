"""A correction published beside the session it corrects, on a real redis-server and a real Edge shard.

The session's fact ("my manager is Tom") and the correction (read twice: at once, and again
at the session's end) reach resolve in one batch and are all decided against the same empty
key. Upsert wrote the first and sent the others back to be decided again (docs/write-path.md#staleness); resolve
now decides one statement per key per batch and lets the others wait for the next batch, so
none is decided on a state about to move (first test). Nothing is lost (first test). What went
wrong was `wait_idle`: it read the stages one after another, so a send-back that landed
between its read of resolve and its read of upsert was counted by neither; it returned
while the correction was on its way, and the search after it found Tom (second test).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar

import redis
from redis.client import Pipeline

from memflow.pipeline.models import (
    Candidate,
    Change,
    ChatEvent,
    ExtractTask,
    Kind,
    MType,
    Role,
    Status,
    Wire,
    WriteBatch,
)
from memflow.shared.codec import decode, encode
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.connections import connect
from memflow.shared.redisdb.keys import FIELD, STAGES
from memflow.shared.settings import Settings
from memflow.shared.storage.store import MemoryFilter
from memflow.shared.streaming.backlog import backlog
from memflow.shared.streaming.consumer import ConsumerConfig, StreamConsumer
from memflow.shared.streaming.handlers import Emit, Outcome, per_item
from memflow.workers import extract, resolve, trigger, upsert
from memflow.workers.runtime import Context

T0 = datetime(2026, 5, 4, 9, 0, tzinfo=UTC)
LATER = T0 + timedelta(days=20)
T = TypeVar("T")


def event(event_id: str, session: str, at: datetime, text: str = "") -> ChatEvent:
    kind, role = (Kind.message, Role.user) if text else (Kind.session_end, None)
    return ChatEvent(event_id=event_id, subject="boss", session_id=session, kind=kind, role=role, text=text, ts=at)


EVENTS = [
    event("b1", "s1", T0, "My manager is Tom Becker, he runs the platform group."),
    event("b2", "s1", T0 + timedelta(minutes=1), "I have a one-on-one every Monday."),
    event("end-s1", "s1", T0 + timedelta(minutes=5)),
    event("b3", "s2", LATER, "Correction: my manager is now Aisha Khan, Tom moved to another team."),
    event("end-s2", "s2", LATER + timedelta(minutes=5)),
]


def emitted(outcome: Outcome) -> list[Emit]:
    assert not isinstance(outcome, BaseException), outcome
    return outcome


def of(model: type[T], emits: Iterable[Emit]) -> list[T]:
    return [e.message for e in emits if isinstance(e.message, model)]


def test_same_key_candidates_decided_in_one_batch_settle_on_the_correction(settings: Settings,
                                                                          embedder: Embedder) -> None:
    ctx = Context.from_settings(settings)
    ctx._embedder = embedder
    try:
        tasks = of(ExtractTask, (e for ev in EVENTS for e in trigger.handle(trigger.Trigger.of(ctx), ev)))
        todo = of(Candidate, (e for task in tasks for e in extract.handle(extract.Extractor.of(ctx), task)))
        [key] = {c.key for c in todo if c.mtype is MType.fact and "Aisha" in c.content}
        assert sum(c.key == key for c in todo) == 3  # Tom's fact, the realtime correction, its re-reading
        sent_back = 0
        deferred = 0
        while todo:  # every candidate of a round in one resolve batch, as resolve's linger gathers them
            out = [e for o in resolve.handle(resolve.Resolver.of(ctx), todo) for e in emitted(o)]
            batches, todo = of(WriteBatch, out), of(Candidate, out)  # one per key decided; the rest wait
            deferred += len(todo)
            for batch in batches:
                written = upsert.handle(upsert.Upserter.of(ctx), batch)
                todo += of(Candidate, written)  # sent back: decided on a state that has moved on
            sent_back += len(todo)
        sent_back -= deferred
        versions = ctx.store.get(MemoryFilter("boss", keys=[key]))
        changes = [decode(f[FIELD.encode()], Change) for _, f in ctx.client.xrange(ctx.keys.changes, "-", "+")]
    finally:
        ctx.close()

    # Resolve decides one statement per key per batch (workers.resolve.handle): the others wait for the next
    # batch instead of being decided on a state upsert is about to move past, and sent back.
    assert deferred >= 2 and sent_back == 0
    [current] = [m for m in versions if m.status is Status.active]
    [tom] = [m for m in versions if "Tom Becker" in m.content]
    assert "Aisha Khan" in current.content and current.version == 2
    assert tom.status is Status.superseded and tom.superseded_by == current.id
    assert any(c.memory_id == current.id for c in changes)


class Note(Wire):
    n: int


class ThenAfterReading(redis.Redis):
    """A client that runs `then` once, right after the first command (or MULTI) that read `stream`."""

    def __init__(self, url: str, stream: str, then: Callable[[], object]) -> None:
        super().__init__(connection_pool=redis.ConnectionPool.from_url(url))
        self.stream, self.then, self.fired = stream, then, False

    def execute_command(self, *args: Any, **options: Any) -> Any:
        reply = super().execute_command(*args, **options)
        self.after(args)
        return reply

    def pipeline(self, transaction: bool = True, shard_hint: Any = None) -> Pipeline:
        return _ThenPipeline(self, transaction, shard_hint)

    def after(self, args: Sequence[Any]) -> None:
        names = [a.decode() if isinstance(a, bytes) else str(a) for a in args]
        if not self.fired and self.stream in names:
            self.fired = True
            self.then()


class _ThenPipeline(Pipeline):
    def __init__(self, owner: ThenAfterReading, transaction: bool, shard_hint: Any) -> None:
        super().__init__(owner.connection_pool, owner.response_callbacks, transaction, shard_hint)
        self.owner = owner

    def execute(self, raise_on_error: bool = True) -> list[Any]:
        args = [a for command, _ in self.command_stack for a in command]
        replies = super().execute(raise_on_error)
        self.owner.after(args)
        return replies


def test_a_send_back_landing_between_two_stage_reads_is_never_counted_idle(settings: Settings) -> None:
    """Upsert holds a stale batch; the instant resolve's backlog has been read, upsert (the real
    consumer loop) sends it back to resolve and acknowledges it, in one MULTI. The snapshot must
    still count it: at upsert (before the hand-over) or at resolve (after), never nowhere."""
    url, keys = settings.redis.url or "", settings.keys
    client = connect(url)
    send_back = per_item(lambda note: [Emit(keys.input_of("resolve", 0), note)])
    stage = StreamConsumer(client, keys, "upsert", Note, send_back, ConsumerConfig(block_ms=10, reclaim_idle_ms=60_000))
    stage.ensure_group()
    client.xgroup_create(keys.input_of("resolve", 0), keys.group("resolve"), id="0", mkstream=True)
    client.xadd(keys.input_of("upsert", 0), {FIELD: encode(Note(n=1))})
    reader = ThenAfterReading(url, keys.input_of("resolve", 0), then=stage.step)

    seen = backlog(reader, keys, STAGES)

    assert reader.fired and client.xlen(keys.input_of("resolve", 0)) == 1  # the hand-over did happen mid-read
    assert sum(lag + pending for lag, pending in seen.values()) == 1, seen
    assert backlog(client, keys, STAGES)["resolve"] == (1, 0)
