"""Leases with progress semantics, on a real redis-server (issue 29, item 5; docs/conventions.md#a-lease-means-progress).

A partition's lease is renewed while its consumer's loop makes progress, not by a timer beside it
(Kafka's max.poll.interval.ms): a consumer stuck in one batch past MEMFLOW_MAX_BATCH_S gives its
partitions up for a healthy one to take, and one that lost a lease runs no further side effects of
the batch in hand for that partition.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence

import pytest
import redis

from memflow.pipeline.models import Wire
from memflow.shared.codec import encode
from memflow.shared.errors import StoreUnavailable
from memflow.shared.redisdb.keys import FIELD, Keys
from memflow.shared.settings import Settings
from memflow.shared.streaming.backlog import backlog
from memflow.shared.streaming.consumer import ConsumerConfig, StreamConsumer
from memflow.shared.streaming.handlers import Emit, per_item
from tests.conftest import wait_for

P = 2
LEASE_MS = 400
MAX_BATCH_S = 1.0
LEASES_LOGGER = "memflow.shared.streaming.leases"


class Say(Wire):
    subject: str
    n: int


def config(**overrides: object) -> ConsumerConfig:
    base = {"max_deliveries": 5, "reclaim_idle_ms": 30_000, "block_ms": 20, "count": 16, "retry_base_s": 0.01,
            "retry_max_s": 0.05, "lease_ms": LEASE_MS, "max_batch_s": MAX_BATCH_S}
    return ConsumerConfig(**(base | overrides))  # type: ignore[arg-type]


@pytest.fixture
def pkeys(settings: Settings) -> Keys:
    return Keys(settings.redis.stream_prefix, P)


def publish(client: redis.Redis, keys: Keys, subject: str, n: int) -> None:
    client.xadd(keys.work("extract", subject), {FIELD: encode(Say(subject=subject, n=n))})


def run(consumer: StreamConsumer[Say], started: list[tuple[threading.Event, threading.Thread]]) -> threading.Event:
    stop = threading.Event()
    consumer.ensure_group()
    thread = threading.Thread(target=consumer.run, args=(stop,), daemon=True)
    thread.start()
    started.append((stop, thread))
    return stop


class Said(logging.Handler):
    """What the lease code logs, in order, beside what the test's handlers note in the same list."""

    def __init__(self, events: list[object]) -> None:
        super().__init__(logging.INFO)
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        self.events.append(record)


def test_a_consumer_stuck_in_a_batch_loses_its_partitions_to_a_healthy_one(
        client: redis.Redis, pkeys: Keys, running: list[tuple[threading.Event, threading.Thread]]) -> None:
    """Its handler blocks for good (on an Event the test holds): its lease-renewing thread is alive, its loop is
    not. Once the bound on one batch's time has passed, by the stuck consumer's own count, it gives every
    partition up, and only then does a second consumer own them and do the work."""
    entered, unblock = threading.Event(), threading.Event()
    stuck_calls: list[int] = []
    events: list[object] = []  # the lease code's log records and the healthy consumer's work, in order
    said = Said(events)
    logging.getLogger(LEASES_LOGGER).addHandler(said)

    def stuck(items: Sequence[Say]) -> list[list[Emit]]:
        stuck_calls.extend(item.n for item in items)
        entered.set()
        unblock.wait()  # a call that never returns: a hung connection, a retired index waited on
        return [[Emit(pkeys.work("resolve", item.subject), item)] for item in items]

    def healthy(m: Say) -> list[Emit]:
        events.append(("handled", m.n))
        return [Emit(pkeys.work("resolve", m.subject), m)]

    first = StreamConsumer(client, pkeys, "extract", Say, stuck, config(), name="stuck")
    run(first, running)
    wait_for(lambda: first.leases.owned() == list(range(P)), what="the first consumer to own every partition")
    publish(client, pkeys, "alice", 1)
    wait_for(entered.is_set, what="the first consumer to be stuck in its batch")

    second = StreamConsumer(client, pkeys, "extract", Say, per_item(healthy), config(), name="healthy")
    run(second, running)
    try:
        # A deadline, not the bound: without the give-up the stuck consumer renews its leases for good.
        wait_for(lambda: ("handled", 1) in events, timeout_s=MAX_BATCH_S + 30,
                 what="the healthy consumer to take the stuck one's partitions and do its work")
        gave_up = [e for e in events if isinstance(e, logging.LogRecord) and "made no progress" in e.msg]
        assert len(gave_up) == 1, [e for e in events if isinstance(e, logging.LogRecord)]
        name, stalled_s, bound_s, partitions = gave_up[0].args[:4]  # type: ignore[index,misc]
        # The stuck one's own account: it kept its partitions through the bound, then gave them all up.
        assert (name, bound_s, partitions) == ("stuck", MAX_BATCH_S, list(range(P)))
        assert stalled_s > MAX_BATCH_S
        # Taken over because it gave them up: nothing of its partitions was handled before that.
        assert events.index(gave_up[0]) < events.index(("handled", 1))
        assert second.leases.owned() == list(range(P))
        assert first.leases.owned() == []
        publish(client, pkeys, "bob", 2)
        wait_for(lambda: ("handled", 2) in events, what="new work to go to the healthy consumer")
    finally:
        unblock.set()
        logging.getLogger(LEASES_LOGGER).removeHandler(said)
    # The stuck batch returns at last: its owner no longer holds the lease, so it settles nothing.
    wait_for(lambda: backlog(client, pkeys, ("extract",))["extract"] == (0, 0), what="everything settled once")
    assert client.xlen(pkeys.work("resolve", "alice")) == 1, "the stale batch emitted a second time"
    assert stuck_calls == [1]
    assert [e for e in events if isinstance(e, tuple)] == [("handled", 1), ("handled", 2)]


def test_a_consumer_that_lost_its_lease_applies_nothing_more_of_its_batch(client: redis.Redis, pkeys: Keys) -> None:
    """The process stalled (or Redis did not answer its renewals) while the first entry was applied: the lease
    ran out and another consumer took the partition. The stale owner does not go on to apply the batch's next
    entries, nor settle any of it."""
    applied: list[int] = []
    lease = pkeys.lease("extract", pkeys.partition("alice"))

    def apply(item: Say) -> list[Emit]:
        applied.append(item.n)
        if item.n == 1:  # stepped by hand, no renewing thread: the stall outlives the lease
            wait_for(lambda: not client.exists(lease), what="the stalled consumer's lease to run out")
            assert client.set(lease, "usurper", px=60_000, nx=True)
        return [Emit(pkeys.work("resolve", item.subject), item)]

    stale = StreamConsumer(client, pkeys, "extract", Say, per_item(apply), config(), name="stale")
    stale.ensure_group()
    for n in (1, 2, 3):
        publish(client, pkeys, "alice", n)
    stale.step()
    assert applied == [1], "applied entries of a partition whose lease it had lost"
    assert client.xlen(pkeys.work("resolve", "alice")) == 0, "emitted without the lease"
    assert backlog(client, pkeys, ("extract",))["extract"] == (0, 3), "acknowledged without the lease"
    assert pkeys.partition("alice") not in stale.leases.owned()


def test_retrying_in_place_past_the_bound_hands_the_partitions_over(
        client: redis.Redis, pkeys: Keys, running: list[tuple[threading.Event, threading.Thread]]) -> None:
    """A consumer that retries in place for good (its store handle is down for it alone) is not making
    progress: past the bound it stops retrying, and a healthy consumer takes the entry."""
    down = threading.Event()
    down.set()
    tries: list[int] = []

    def broken(item: Say) -> list[Emit]:
        tries.append(item.n)
        if down.is_set():
            raise StoreUnavailable("this process's shard is retired")
        return []

    first = StreamConsumer(client, pkeys, "extract", Say, per_item(broken), config(), name="broken")
    run(first, running)
    wait_for(lambda: first.leases.owned() == list(range(P)), what="the first consumer to own every partition")
    publish(client, pkeys, "alice", 1)
    wait_for(lambda: len(tries) > 1, what="the first consumer to retry in place")
    handled: list[int] = []
    second = StreamConsumer(client, pkeys, "extract", Say, per_item(lambda m: handled.append(m.n) or []), config(),
                            name="healthy")
    stop_second = run(second, running)
    wait_for(lambda: handled == [1], timeout_s=MAX_BATCH_S + 10 * LEASE_MS / 1000,
             what="the healthy consumer to take over the entry retried in place")
    stop_second.set()
    wait_for(lambda: backlog(client, pkeys, ("extract",))["extract"] == (0, 0), what="the entry settled")
