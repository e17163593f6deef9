"""The consumer loop on a real redis-server: ack, retry, reclaim, dead-letter, stop."""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Sequence

import pytest
import redis

from memflow.pipeline.models import Wire
from memflow.shared.codec import encode
from memflow.shared.errors import Permanent
from memflow.shared.polling import backoff_s
from memflow.shared.redisdb.keys import FIELD, Keys
from memflow.shared.streaming import dlq
from memflow.shared.streaming.backlog import backlog
from memflow.shared.streaming.consumer import ConsumerConfig, StreamConsumer
from memflow.shared.streaming.handlers import Emit, Outcome, per_item
from tests.conftest import wait_for


class Note(Wire):
    n: int


def config(**overrides: object) -> ConsumerConfig:
    base = {"max_deliveries": 3, "reclaim_idle_ms": 100, "block_ms": 20, "count": 10,
            "retry_base_s": 0.001, "retry_max_s": 0.01}
    return ConsumerConfig(**(base | overrides))  # type: ignore[arg-type]


def send(client: redis.Redis, keys: Keys, *values: int) -> None:
    for n in values:
        client.xadd(keys.input_of("extract", 0), {FIELD: encode(Note(n=n))})


def run(consumer: StreamConsumer[Note], started: list[tuple[threading.Event, threading.Thread]]) -> None:
    stop = threading.Event()
    consumer.ensure_group()
    thread = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    thread.start()
    started.append((stop, thread))


def test_success_emits_and_acks_together(client, keys, running) -> None:
    out = keys.tagged(0, "resolve")
    consumer = StreamConsumer(client, keys, "extract", Note, per_item(lambda m: [Emit(out, Note(n=m.n * 10))]),
                              config())
    run(consumer, running)
    send(client, keys, 1, 2, 3)
    wait_for(lambda: client.xlen(out) == 3, what="three emitted messages")
    wait_for(lambda: backlog(client, keys, ["extract"])["extract"] == (0, 0), what="all acknowledged")
    assert sorted(int(f[FIELD.encode()].decode().split('"n":')[1].rstrip("}")) for _, f in client.xrange(out)) \
        == [10, 20, 30]


def test_transient_failure_is_retried_then_succeeds(client, keys, running) -> None:
    attempts: Counter[int] = Counter()

    def flaky(m: Note) -> list[Emit]:
        attempts[m.n] += 1
        if attempts[m.n] < 3:
            raise ConnectionError("store briefly down")
        return []

    run(StreamConsumer(client, keys, "extract", Note, per_item(flaky), config(max_deliveries=5)), running)
    send(client, keys, 7)
    wait_for(lambda: attempts[7] == 3 and backlog(client, keys, ["extract"])["extract"] == (0, 0),
             what="third delivery acknowledged")
    assert client.xlen(keys.dlq("extract", 0)) == 0


def test_poison_message_goes_to_dlq_after_budget_and_stream_keeps_flowing(client, keys, running) -> None:
    seen: list[int] = []

    def handle(m: Note) -> list[Emit]:
        if m.n == 13:
            raise RuntimeError("cannot handle 13")
        seen.append(m.n)
        return []

    run(StreamConsumer(client, keys, "extract", Note, per_item(handle), config(max_deliveries=3)), running)
    send(client, keys, 13, 1)
    wait_for(lambda: 1 in seen, what="the message after the poison one")
    wait_for(lambda: client.xlen(keys.dlq("extract", 0)) == 1, what="dead letter")
    [letter] = dlq.list_dead(client, keys, "extract")
    assert letter.attempts == 3
    assert "cannot handle 13" in letter.error
    assert b'"n":13' in letter.payload
    assert backlog(client, keys, ["extract"])["extract"] == (0, 0)


def test_permanent_errors_and_bad_json_skip_the_retries(client, keys, running) -> None:
    def handle(m: Note) -> list[Emit]:
        raise Permanent("this can never work")

    run(StreamConsumer(client, keys, "extract", Note, per_item(handle), config(max_deliveries=50)), running)
    client.xadd(keys.input_of("extract", 0), {FIELD: b"{not json"})
    client.xadd(keys.input_of("extract", 0), {FIELD: b'{"v": 1, "n": 1, "extra": 2}'})
    send(client, keys, 5)
    wait_for(lambda: client.xlen(keys.dlq("extract", 0)) == 3, what="three dead letters")
    errors = [d.error for d in dlq.list_dead(client, keys, "extract")]
    assert "invalid JSON" in errors[0]
    assert "extra" in errors[1]
    assert "this can never work" in errors[2]


def test_replay_puts_dead_letters_back_on_their_stream(client, keys, running) -> None:
    fixed = threading.Event()
    handled: list[int] = []

    def handle(m: Note) -> list[Emit]:
        if not fixed.is_set():
            raise Permanent("bug")
        handled.append(m.n)
        return []

    run(StreamConsumer(client, keys, "extract", Note, per_item(handle), config()), running)
    send(client, keys, 4)
    wait_for(lambda: client.xlen(keys.dlq("extract", 0)) == 1, what="dead letter")
    fixed.set()
    assert dlq.replay(client, keys, "extract") == 1
    wait_for(lambda: handled == [4], what="replayed message handled")
    assert client.xlen(keys.dlq("extract", 0)) == 0


def test_entries_of_a_dead_consumer_are_reclaimed(client, keys, running) -> None:
    stream = keys.input_of("extract", 0)
    client.xgroup_create(stream, "extract", id="0", mkstream=True)
    send(client, keys, 1, 2)
    # A consumer that read both entries and died before acknowledging them.
    client.xreadgroup("extract", "dead-consumer", {stream: ">"}, count=10)
    handled: list[int] = []
    run(StreamConsumer(client, keys, "extract", Note, per_item(lambda m: handled.append(m.n) or []), config()),
        running)
    wait_for(lambda: sorted(handled) == [1, 2], what="reclaimed entries handled")
    wait_for(lambda: backlog(client, keys, ["extract"])["extract"] == (0, 0), what="acknowledged")


def test_stop_finishes_the_batch_in_hand(client, keys) -> None:
    stop = threading.Event()
    gate, handled = threading.Event(), []

    def slow(items: Sequence[Note]) -> list[Outcome]:
        gate.wait(5)
        handled.extend(m.n for m in items)
        return [[] for _ in items]

    consumer = StreamConsumer(client, keys, "extract", Note, slow, config())
    consumer.ensure_group()
    send(client, keys, 1, 2)
    thread = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    thread.start()
    wait_for(lambda: backlog(client, keys, ["extract"])["extract"][1] == 2, what="batch in hand")
    stop.set()
    gate.set()
    thread.join(timeout=5)
    assert not thread.is_alive()
    assert handled == [1, 2]
    assert backlog(client, keys, ["extract"])["extract"] == (0, 0)


def test_backoff_is_bounded_and_grows() -> None:
    assert backoff_s(0, 0.1, 5.0, rand=lambda: 1.0) == pytest.approx(0.1)
    assert backoff_s(3, 0.1, 5.0, rand=lambda: 1.0) == pytest.approx(0.8)
    assert backoff_s(60, 0.1, 5.0, rand=lambda: 1.0) == 5.0
    assert backoff_s(3, 0.1, 5.0, rand=lambda: 0.0) == 0.0


def test_an_outage_is_waited_out_without_spending_the_delivery_budget(client, keys, running) -> None:
    from memflow.shared.errors import StoreUnavailable

    calls: Counter[int] = Counter()

    def down_for_a_while(m: Note) -> list[Emit]:
        calls[m.n] += 1
        if calls[m.n] <= 6:  # more failures than max_deliveries allows
            raise StoreUnavailable("qdrant restarting")
        return []

    run(StreamConsumer(client, keys, "extract", Note, per_item(down_for_a_while), config(max_deliveries=3)),
        running)
    send(client, keys, 9)
    wait_for(lambda: calls[9] == 7 and backlog(client, keys, ["extract"])["extract"] == (0, 0),
             what="the message to pass once the store is back")
    assert client.xlen(keys.dlq("extract", 0)) == 0


def test_a_bug_escaping_a_step_is_logged_and_the_stage_lives_on(client, keys, running, caplog) -> None:
    """Risk 5: anything but a Redis error escaping `step()` used to end the stage's thread silently."""
    handled: list[int] = []
    buggy = threading.Event()
    buggy.set()

    def handle(items: Sequence[Note]) -> list[Outcome]:
        if buggy.is_set():  # one outcome too few: `zip(strict=True)` raises ValueError outside the handler
            buggy.clear()
            return []
        handled.extend(m.n for m in items)
        return [[] for _ in items]

    consumer = StreamConsumer(client, keys, "extract", Note, handle, config())
    run(consumer, running)
    send(client, keys, 3)
    # The entry the bug left pending is reclaimed after reclaim_idle_ms, by the same thread, alive.
    wait_for(lambda: handled == [3] and backlog(client, keys, ["extract"])["extract"] == (0, 0),
             what="the entry handled after the bug")
    [(_, thread)] = running
    assert thread.is_alive()
    died = [r for r in caplog.records if r.exc_info and "consumer" in r.getMessage()]
    assert died and died[0].exc_info[0] is ValueError  # logged with its traceback, not swallowed


def test_waiting_out_an_outage_keeps_the_claim_from_a_second_consumer(client, keys, running) -> None:
    """Risk 6: an entry retried in place through an outage must not be reclaimed by another
    consumer of the group after reclaim_idle_ms, nor spend its delivery budget."""
    from memflow.shared.errors import StoreUnavailable

    outage = threading.Event()
    outage.set()
    first_failure: list[float] = []
    done: list[int] = []
    seen_by_second: list[int] = []

    def owner(m: Note) -> list[Emit]:
        if outage.is_set():
            first_failure[:1] = first_failure[:1] or [time.monotonic()]
            raise StoreUnavailable("qdrant restarting")
        done.append(m.n)
        return []

    # Waits between retries longer than reclaim_idle_ms: the claim must be refreshed during a wait too.
    first = StreamConsumer(client, keys, "extract", Note, per_item(owner),
                           config(reclaim_idle_ms=100, retry_base_s=0.05, retry_max_s=0.4), name="owner")
    run(first, running)
    send(client, keys, 8)
    wait_for(lambda: first_failure, what="the first consumer to hold the entry")
    second = StreamConsumer(client, keys, "extract", Note,
                            per_item(lambda m: seen_by_second.append(m.n) or []), config(reclaim_idle_ms=100),
                            name="other")
    run(second, running)
    wait_for(lambda: time.monotonic() - first_failure[0] > 1.0, what="an outage of ten reclaim periods")
    pending = client.xpending_range(keys.input_of("extract", 0), "extract", "-", "+", 10)
    assert [(p["consumer"], p["times_delivered"]) for p in pending] == [(b"owner", 1)], seen_by_second
    outage.clear()
    wait_for(lambda: done == [8] and backlog(client, keys, ["extract"])["extract"] == (0, 0),
             what="the entry to pass once the store is back")
    assert seen_by_second == []
    assert client.xlen(keys.dlq("extract", 0)) == 0


def test_an_outage_handed_round_consumers_does_not_spend_the_delivery_budget(client, keys, running) -> None:
    """An outage every consumer sees outlasts the progress bound (MEMFLOW_MAX_BATCH_S): the partition is
    handed from consumer to consumer, each takeover a delivery. Waiting out an outage is not the entry's
    fault: past the budget it is handled, not dead-lettered. A crash loop (no outage recorded) still is."""
    from memflow.shared.errors import StoreUnavailable

    stream = keys.input_of("extract", 0)
    client.xgroup_create(stream, "extract", id="0", mkstream=True)
    send(client, keys, 1, 2)
    calls: Counter[int] = Counter()

    def outage_then_handover(m: Note) -> list[Emit]:
        calls[m.n] += 1
        raise StoreUnavailable("qdrant down")

    stop = threading.Event()
    first = StreamConsumer(client, keys, "extract", Note, per_item(outage_then_handover), config(max_deliveries=3))
    first.ensure_group()
    thread = threading.Thread(target=first.run, args=(stop,), daemon=True)
    thread.start()
    wait_for(lambda: calls[1] >= 2 and calls[2] >= 2, what="both entries waiting out the outage")
    stop.set()  # the consumer gives its partitions up (as after MEMFLOW_MAX_BATCH_S without progress)
    thread.join(timeout=10)
    for _ in range(4):  # more handovers than max_deliveries allows: each a delivery of entry 1
        client.xclaim(stream, "extract", "next-owner", 0, [client.xpending_range(stream, "extract", "-", "+", 1)[0]
                                                           ["message_id"]])
    client.xclaim(stream, "extract", "next-owner", 0, [client.xpending_range(stream, "extract", "-", "+", 2)[1]
                                                       ["message_id"]])
    client.hdel(keys.errors("extract", 0), client.xpending_range(stream, "extract", "-", "+", 2)[1]["message_id"])
    for _ in range(4):  # entry 2: as many deliveries, but no outage on record (a crash loop)
        client.xclaim(stream, "extract", "next-owner", 0, [client.xpending_range(stream, "extract", "-", "+", 2)[1]
                                                           ["message_id"]])
    handled: list[int] = []
    run(StreamConsumer(client, keys, "extract", Note, per_item(lambda m: handled.append(m.n) or []),
                       config(max_deliveries=3)), running)
    wait_for(lambda: backlog(client, keys, ["extract"])["extract"] == (0, 0), what="both settled")
    assert handled == [1]
    assert client.xlen(keys.dlq("extract", 0)) == 1
