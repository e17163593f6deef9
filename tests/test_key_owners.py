"""Every Redis key has one owner, a bound and a retention (issue 29, items 7, 9, 10, 11): dead letters are not
served as pending, uses are counted once off the read path, nothing a subject leaves grows without bound, and
forget reads an index of the subject's buffers, not the keyspace."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta

import pytest
import redis
from typer.testing import CliRunner

from memflow.pipeline.ids import new_memory
from memflow.pipeline.lifecycle import MAX_REVISIONS, PROVENANCE_MAX
from memflow.pipeline.models import (
    Candidate,
    ChatEvent,
    CountOp,
    Dir,
    Kind,
    MType,
    PatchOp,
    Role,
    SearchRequest,
    SearchResult,
    Source,
    Trace,
    Turn,
)
from memflow.pipeline.resolve import apply_patch
from memflow.pipeline.writes import mutation, mutation_id
from memflow.shared.codec import encode
from memflow.shared.errors import Permanent
from memflow.shared.inference.llm import USAGE_KEEP_DAYS, count_usage
from memflow.shared.inference.llm import usage as llm_usage
from memflow.shared.monitoring.status import recent_traces, subject_footprint, subject_keys
from memflow.shared.redisdb.keys import FIELD
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings, get_settings
from memflow.shared.streaming import dlq
from memflow.shared.streaming.consumer import ConsumerConfig, StreamConsumer
from memflow.shared.streaming.handlers import Outcome
from memflow.shared.unstored import pending
from memflow.shared.writer.uses import Uses
from memflow.workers import forgetting, ops, query, trigger
from memflow.workers.cli import app
from memflow.workers.ops import fold_uses
from memflow.workers.runtime import Context
from tests.conftest import System, wait_for
from tests.test_system import end, memories, say

T0 = datetime(2026, 3, 2, 9, tzinfo=UTC)  # tests.test_system's


def said(subject: str, event_id: str, text: str, session: str = "s1") -> ChatEvent:
    return ChatEvent(event_id=event_id, subject=subject, session_id=session, kind=Kind.message, role=Role.user,
                     text=text, ts=T0)


def _refusing(items: Sequence[ChatEvent]) -> list[Outcome]:
    return [Permanent("this one can never be read") for _ in items]


# -- item 7: dead letters are not served as pending --------------------------------------------


def test_a_dead_lettered_statement_is_no_longer_served_as_pending_and_its_replay_serves_it_again(
        settings: Settings, client: redis.Redis, running: list[tuple[threading.Event, threading.Thread]]) -> None:
    keys = settings.keys
    MemoryClient(settings).publish(said("ann", "e1", "I moved to Lisbon last spring"))
    assert [s.turn.event_id for s in pending.read(client, keys, "ann")] == ["e1"]
    config = ConsumerConfig(max_deliveries=2, reclaim_idle_ms=100, block_ms=20, retry_base_s=0.001,
                            retry_max_s=0.01)
    trigger = StreamConsumer(client, keys, "trigger", ChatEvent, _refusing, config)
    trigger.ensure_group()
    stop = threading.Event()
    thread = threading.Thread(target=trigger.run, args=(stop,), daemon=True)
    thread.start()
    running.append((stop, thread))
    wait_for(lambda: dlq.count(client, keys, "trigger") == 1, what="the statement dead-lettered")
    # Dead: what it said will never be stored, so a search must stop serving it (a publish of anything
    # else used to keep it alive for good, refreshing the hash's TTL).
    MemoryClient(settings).publish(said("ann", "e2", "My sister is called Maria"))
    wait_for(lambda: dlq.count(client, keys, "trigger") == 2, what="the second one dead-lettered")
    assert pending.read(client, keys, "ann") == []
    stop.set()
    thread.join(timeout=5)
    # Put back on its stream, it is on its way to the store again: served until it lands, as a publish is.
    assert dlq.replay(client, keys, "trigger", settings=settings.pending) == 2
    assert sorted(s.turn.event_id for s in pending.read(client, keys, "ann")) == ["e1", "e2"]


# -- item 9: uses are counted once, off the read path ------------------------------------------


def _uses(system: System, subject: str) -> dict[str, int]:
    return {m.id: m.access_count for m in memories(system, subject)}


def test_a_retried_pack_or_feedback_counts_its_uses_once(system: System) -> None:
    say(system, "una", "e1", "I prefer short answers with bullet points.")
    end(system, "una")
    assert system.client.wait_idle(timeout_s=60)
    day = T0 + timedelta(days=1)
    packed = system.client.pack("una", "how should answers look?", now=day, request_id="pack-1")
    assert packed.used_ids
    used = packed.used_ids[0]
    system.client.pack("una", "how should answers look?", now=day, request_id="pack-1")  # a retry
    assert _uses(system, "una")[used] == 1
    system.client.feedback("una", [used], at=day, request_id="fb-1")
    system.client.feedback("una", [used], at=day, request_id="fb-1")  # a retry
    assert _uses(system, "una")[used] == 2
    system.client.feedback("una", [used], at=day)  # another call: a fresh id
    assert _uses(system, "una")[used] == 3
    use = system.client.inspect("una", now=day).utilisation
    assert use.adopted == 3  # the per-day counters count each request once too


def test_pack_and_feedback_never_wait_for_the_write_lock(system: System) -> None:
    say(system, "vera", "e1", "I prefer short answers with bullet points.")
    end(system, "vera")
    assert system.client.wait_idle(timeout_s=60)
    day = T0 + timedelta(days=1)
    # Another writer of the subject holds its lock (a job's long mutation): searches and packs go on.
    held = system.ctx.client.lock(system.ctx.keys.write_lock("vera"), timeout=120)
    assert held.acquire(blocking=False)
    try:
        # Before: each waited for the lock (up to 30 s), then failed. Answered while the lock is still held,
        # and by no one breaking it, neither waited for it: no stopwatch needed.
        packed = system.client.pack("vera", "how should answers look?", now=day)
        assert system.client.feedback("vera", packed.used_ids, at=day) == len(packed.used_ids)
        assert held.owned(), "the write lock was taken from its holder"
        assert _uses(system, "vera")[packed.used_ids[0]] == 0  # recorded, not counted yet
    finally:
        held.release()
    # Counted once the lock is free: by the next pack or feedback, a lifecycle job, or the `uses` job.
    assert system.client.run_job("uses").examined >= 1
    assert _uses(system, "vera")[packed.used_ids[0]] == 2
    assert system.client.run_job("uses", subject="vera").examined == 0  # counted once


def test_a_fold_of_uses_redone_after_a_crash_counts_them_once(system: System) -> None:
    say(system, "wes", "e1", "I prefer short answers with bullet points.")
    end(system, "wes")
    assert system.client.wait_idle(timeout_s=60)
    [memory] = [m for m in memories(system, "wes") if m.mtype != "episode"][:1]
    ctx = system.ctx
    Uses(ctx.client, ctx.keys).record("wes", "r1", [memory.id], T0 + timedelta(days=1), 0)
    taken = Uses(ctx.client, ctx.keys).take("wes")
    ops_ = [CountOp(id=u.memory_id, uses=u.uses, at=u.at) for u in taken.uses]
    # The fold counted them on the points, then died before it said so: the next fold takes the same again.
    counts = mutation("wes", "feedback", "adopted in an answer", max(u.at for u in taken.uses), ops_)
    ctx.applier.apply(counts.model_copy(update={"id": mutation_id("uses", "wes", taken.fold)}))
    assert fold_uses(ctx.applier, Uses(ctx.client, ctx.keys), "wes") == 1
    assert _uses(system, "wes")[memory.id] == 1


# -- item 10: nothing a subject leaves grows without bound ---------------------------------------


@pytest.fixture
def ctx(settings: Settings) -> Iterator[Context]:
    context = Context.from_settings(settings)
    yield context
    context.close()


def test_the_per_day_counters_keep_their_window_however_often_they_are_written(ctx: Context) -> None:
    for day in range(90):  # a subject used every day: its TTL never ran out, and every day's fields stayed
        at = T0 + timedelta(days=day)
        ops.UtilisationCounters(ctx.transient, ctx.keys).count("ivy", at, recalled=3, adopted=1)
        count_usage(ctx.transient, ctx.keys, "ivy", {"calls": 1, "prompt_tokens": 100}, at)
    assert ctx.transient.hlen(ctx.keys.utilisation("ivy")) <= 2 * (ops.UTILISATION_KEEP.days + 1) + 1
    assert ctx.transient.hlen(ctx.keys.llm_usage("ivy")) <= 2 * (USAGE_KEEP_DAYS + 1) + 1
    last = T0 + timedelta(days=89)
    assert ops.UtilisationCounters(ctx.transient, ctx.keys).report("ivy", last).recalled == 3 * 30  # what is reported is unchanged
    assert llm_usage(ctx.transient, ctx.keys, "ivy", last)["calls"] == 30


def test_a_session_buffer_is_capped_as_it_is_written(ctx: Context) -> None:
    cap = ctx.settings.limits.session_buffer_max_turns
    for i in range(cap * 2):
        event = said("jo", f"e{i:04}", f"turn {i}")
        trigger.buffer_turn(trigger.buffers(ctx), event, Turn(event_id=event.event_id, role=Role.user, text=event.text,
                                             ts=T0 + timedelta(seconds=i)))
    key = ctx.keys.session_buffer("jo", "s1")
    assert ctx.client.hlen(key) <= cap + cap // 8
    close = ChatEvent(event_id="end", subject="jo", session_id="s1", kind=Kind.session_end, ts=T0 + timedelta(days=1))
    turns = trigger.buffered_turns(trigger.buffers(ctx), close)
    assert len(turns) == cap and turns[-1].event_id == f"e{cap * 2 - 1:04}"  # the newest kept


def test_a_points_revisions_and_provenance_stay_bounded_however_often_it_changes() -> None:
    memory = new_memory(Candidate(subject="kim", mtype=MType.preference, dir=Dir.preferences, key="drink.tea",
                                  content="likes tea", source=Source.explicit, confidence=0.9, ts=T0,
                                  source_event_ids=["first"], session_id="s0"))
    for i in range(500):  # restated every day, and its state changed each time
        op = PatchOp(id=memory.id, expected_rev=memory.rev, set={"confidence": 0.5 + (i % 2) * 0.1},
                     add_source_event_ids=[f"e{i}"], add_session_ids=[f"s{i}"], why="restated")
        memory = apply_patch(memory, op, T0 + timedelta(days=i))
    assert len(memory.revisions) == MAX_REVISIONS and memory.revisions[-1].rev == memory.rev
    assert len(memory.source_event_ids) == PROVENANCE_MAX and len(memory.session_ids) == PROVENANCE_MAX
    assert memory.source_event_ids[0] == "first" and memory.source_event_ids[-1] == "e499"


def test_a_subjects_traces_are_read_from_its_index_not_by_scanning_the_feed(ctx: Context) -> None:
    record_search_trace(ctx, "lou")
    pipe = ctx.transient.pipeline(transaction=False)
    for i in range(8_000):  # everyone else's searches since (a read scanned the feed's newest 5,000)
        pipe.xadd(ctx.keys.traces, {FIELD: encode(_trace(f"other{i}"))})
    pipe.execute()
    assert [t.subject for t in recent_traces(ctx.transient, ctx.keys, "lou", 20)] == ["lou"]
    assert ctx.transient.llen(ctx.keys.traces_of("lou")) == 1  # what a read reads: the subject's own index


def _trace(subject: str) -> Trace:
    return Trace(subject=subject, query="q", intent="", source="heuristic", dirs=[], candidates=[], chosen=[],
                 fallback=False, status="ok", error=None, latency_ms=1.0, now=T0)


def record_search_trace(ctx: Context, subject: str) -> None:
    """A search's trace recorded as the query worker records it."""
    result = SearchResult(subject=subject, query="q", status="ok", latency_ms=1.0)
    query.record_trace(ctx.traces, ops.UtilisationCounters(ctx.client, ctx.keys), SearchRequest(subject=subject, query="q", now=T0),
                       result, [], T0)


# -- item 11: forget reads the subject's own keys, not the keyspace -------------------------------


def _scans(client: redis.Redis) -> int:
    return int(client.info("commandstats").get("cmdstat_scan", {}).get("calls", 0))


def test_forget_finds_a_subjects_session_buffers_without_scanning_the_keyspace(ctx: Context) -> None:
    for session in ("s1", "s2"):
        event = said("max", f"{session}-e1", "my pin is 1234", session=session)
        trigger.buffer_turn(trigger.buffers(ctx), event, Turn(event_id=event.event_id, role=Role.user, text=event.text, ts=T0))
    before = _scans(ctx.client)
    removed = forgetting.scrub(forgetting.Places.of(ctx), "max", [], events=["s1-e1", "s2-e1"])
    assert removed["session_buffers"] == 2
    assert _scans(ctx.client) == before


# -- Redis memory per subject: bounded while used, flat once idle ----------------------------------

DAY_MS = 86_400_000


def _travel(client: redis.Redis, keys: list[str], ms: int) -> None:
    """Time passes for these keys: `ms` off every TTL, and a key whose TTL runs out is gone (Redis's own
    expiry, by hand: the server's clock cannot be moved). A key without a TTL is kept as Redis keeps it."""
    for key in keys:
        left = int(client.pttl(key))
        if left == -1 or left == -2:
            continue
        if left <= ms:
            client.delete(key)
        else:
            client.pexpire(key, left - ms)


def _a_day_of_use(ctx: Context, client: MemoryClient, subject: str, day: int) -> None:
    """One day of a subject's traffic, through each key's owner as the stages and the query worker call them."""
    at = T0 + timedelta(days=day)
    events = [ChatEvent(event_id=f"d{day}-{i}", subject=subject, session_id=f"s{day}", kind=Kind.message,
                        role=Role.user, text=f"note {i} of day {day}: I like tea number {i}", ts=at + timedelta(minutes=i))
              for i in range(3)]
    client.publish_many(events)  # the pending entries
    for event in events:  # the trigger keeps the session's turns
        trigger.buffer_turn(trigger.buffers(ctx), event, Turn(event_id=event.event_id, role=Role.user, text=event.text, ts=event.ts))
    pending.settle(ctx.client, ctx.keys, {subject: [events[0].event_id, events[1].event_id]})  # stored
    pending.settle_dead(ctx.client, ctx.keys, "trigger", encode(events[2]))  # dead-lettered
    trigger.buffers(ctx).close(subject, f"s{day}")
    for _ in range(5):  # searches: traces and the per-day counters
        record_search_trace(ctx, subject)
    used = [f"m{i}" for i in range(day % 7, day % 7 + 3)]  # a pack a day adopts a few of its memories
    Uses(ctx.client, ctx.keys).record(subject, f"pack-{day}", used, at, int(at.timestamp() * 1000))
    ops.UtilisationCounters(ctx.client, ctx.keys).count(subject, at, recalled=5, adopted=3)
    count_usage(ctx.client, ctx.keys, subject, {"calls": 2, "prompt_tokens": 300, "completion_tokens": 40}, at)


def status_of(settings: Settings, monkeypatch: pytest.MonkeyPatch, subject: str) -> str:
    """`memflow status --subject SUBJECT` against this test's Redis and prefix."""
    monkeypatch.setenv("MEMFLOW_REDIS_URL", settings.redis.url or "")
    monkeypatch.setenv("MEMFLOW_STREAM_PREFIX", settings.redis.stream_prefix)
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, ["status", "--subject", subject])
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    return result.output


def test_a_subjects_redis_memory_is_bounded_while_used_and_flat_once_idle_over_simulated_months(
        ctx: Context, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    client = MemoryClient(settings)
    sizes: list[int] = []
    for day in range(80):  # 50 days of daily use, then 30 idle; a day passes for its keys after each
        if day < 50:
            _a_day_of_use(ctx, client, "zoe", day)
        _travel(ctx.client, [key for _, key in subject_keys(ctx.client, ctx.keys, "zoe")], DAY_MS)
        sizes.append(subject_footprint(ctx.client, ctx.keys, "zoe", ctx.transient).bytes)
    used, idle = sizes[:50], sizes[50:]
    # Used every day: it grows while the day windows fill (40 days of counters), then holds.
    assert max(used[41:]) <= used[41] * 1.1, used
    # Idle: it only shrinks (what expires in a week is gone by then), and holds what the report windows keep.
    assert all(b <= a for a, b in zip(idle, idle[1:], strict=False)), idle
    left = {k.what for k in subject_footprint(ctx.client, ctx.keys, "zoe", ctx.transient).keys}
    assert left == {"utilisation", "llm-usage"}, left
    shown = status_of(settings, monkeypatch, "zoe")  # what `memflow status` reports of it
    assert "utilisation" in shown and f"zoe: 2 keys, {idle[-1] / 1024:.1f} KiB" in shown, shown
    print(f"\nzoe's Redis memory: day 10 {sizes[9]} B, day 41 {used[41]} B, day 50 {used[-1]} B, "
          f"idle a week {idle[6]} B, idle 30 days {idle[-1]} B")
