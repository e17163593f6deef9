"""Partitioned streams on a real redis-server: routing by subject, leases, take-over, fencing, retention."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence

import pytest
import redis

from memflow.pipeline.models import Wire
from memflow.shared.codec import encode
from memflow.shared.redisdb.keys import FIELD, Keys, partition_of
from memflow.shared.settings import Settings
from memflow.shared.streaming.backlog import backlog, trim_acknowledged
from memflow.shared.streaming.consumer import ConsumerConfig, StreamConsumer
from memflow.shared.streaming.handlers import Emit
from memflow.shared.streaming.leases import Leases
from tests.conftest import wait_for

P = 8
LEASE_MS = 600


class Say(Wire):
    subject: str
    n: int


class Crashed(BaseException):
    """A consumer dying mid-batch: not an Exception, so no loop catches it (a kill -9 catches nothing)."""


@pytest.fixture
def pkeys(settings: Settings) -> Keys:
    return Keys(settings.redis.stream_prefix, P)


def config(**overrides: object) -> ConsumerConfig:
    base = {"max_deliveries": 5, "reclaim_idle_ms": 5_000, "block_ms": 20, "count": 16, "retry_base_s": 0.001,
            "retry_max_s": 0.01, "lease_ms": LEASE_MS}
    return ConsumerConfig(**(base | overrides))  # type: ignore[arg-type]


def publish(client: redis.Redis, keys: Keys, subject: str, n: int) -> None:
    client.xadd(keys.work("extract", subject), {FIELD: encode(Say(subject=subject, n=n))})


class Consumer:
    """A consumer driven step by step in a thread, as a process would; `crash()` kills it mid-batch:
    it stops with its leases held and its batch read but not acknowledged."""

    def __init__(self, client: redis.Redis, keys: Keys, name: str, seen: list[tuple[str, str, int]]) -> None:
        self.name, self.seen, self.doomed, self.stop = name, seen, False, threading.Event()
        self.consumer = StreamConsumer(client, keys, "extract", Say, self.handle, config(), name=name)
        self.consumer.ensure_group()
        self.thread = threading.Thread(target=self.loop, daemon=True)
        self.thread.start()

    def handle(self, items: Sequence[Say]) -> list[list[Emit]]:
        if self.doomed:
            raise Crashed
        out = []
        for item in items:
            self.seen.append((self.name, item.subject, item.n))
            out.append([Emit(self.consumer.keys.work("resolve", item.subject), item)])
        return out  # type: ignore[return-value]

    def loop(self) -> None:
        try:
            while not self.stop.is_set():
                self.consumer._step_surviving()
        except Crashed:
            return

    def crash(self) -> None:
        self.doomed = True
        self.thread.join(timeout=10)

    def owned(self) -> list[int]:
        return self.consumer.leases.owned()


@pytest.fixture
def consumers() -> Iterator[list[Consumer]]:
    made: list[Consumer] = []
    yield made
    for c in made:
        c.stop.set()
        c.doomed = True
        c.thread.join(timeout=10)


def test_a_subjects_work_goes_through_one_partition_and_subjects_spread_over_all(pkeys: Keys) -> None:
    subjects = [f"user-{i}" for i in range(400)]
    assert {pkeys.work("events", s) for s in ["alice"] * 5} == {pkeys.work("events", "alice")}
    assert {pkeys.partition(s) for s in subjects} == set(range(P))
    # The same partition in every process and every version: a fixed hash, not Python's salted hash().
    assert partition_of("alice", 8) == 7 and partition_of("tenant/bob", 16) == 8  # CRC-32, pinned
    # Every key of one partition shares a hash tag: one slot in a cluster.
    p = pkeys.partition("alice")
    tags = {key[key.index("{"):key.index("}") + 1] for key in
            [pkeys.work("events", "alice"), pkeys.work("upsert", "alice"), pkeys.dlq("resolve", p),
             pkeys.lease("upsert", p), pkeys.errors("trigger", p), pkeys.autoclaim_cursor("extract", p)]}
    assert tags == {f"{{p{p}}}"}


def test_consumers_share_the_partitions_fairly_and_each_subject_is_handled_in_order(
        client: redis.Redis, pkeys: Keys, consumers: list[Consumer]) -> None:
    seen: list[tuple[str, str, int]] = []
    consumers += [Consumer(client, pkeys, f"c{i}", seen) for i in range(3)]
    wait_for(lambda: sorted(p for c in consumers for p in c.owned()) == list(range(P)), what="every partition owned")
    wait_for(lambda: all(len(c.owned()) in (2, 3) for c in consumers), what="a fair share each")
    subjects = [f"s{i}" for i in range(24)]
    for n in range(30):
        for s in subjects:
            publish(client, pkeys, s, n)
    wait_for(lambda: len(seen) == 30 * len(subjects), what="everything handled")
    for s in subjects:
        assert [n for _, subj, n in seen if subj == s] == list(range(30)), f"{s} out of order"
        assert len({name for name, subj, _ in seen if subj == s}) == 1, f"{s} handled by two consumers"
    assert backlog(client, pkeys, ("extract",))["extract"] == (0, 0)


def test_a_consumer_that_joins_gets_a_share_and_one_that_stops_cleanly_hands_its_share_over_at_once(
        client: redis.Redis, pkeys: Keys, consumers: list[Consumer]) -> None:
    seen: list[tuple[str, str, int]] = []
    first = Consumer(client, pkeys, "first", seen)
    consumers.append(first)
    wait_for(lambda: len(first.owned()) == P, what="the only consumer to own everything")
    second = Consumer(client, pkeys, "second", seen)
    consumers.append(second)
    wait_for(lambda: len(first.owned()) == len(second.owned()) == P // 2, what="the newcomer's share")
    second.stop.set()
    second.thread.join(timeout=10)
    second.consumer.leases.release_all()
    # Released in Redis, not left to run out: no lease names it, and it left the registry (its share is not
    # counted), both at once, before any lease of it could have run out.
    assert [p for p in range(P) if client.get(pkeys.lease("extract", p)) == b"second"] == []
    assert client.zscore(pkeys.consumers("extract"), "second") is None
    wait_for(lambda: len(first.owned()) == P, what="the released share taken back")


def test_a_crashed_consumers_partitions_and_its_batch_are_taken_over(
        client: redis.Redis, pkeys: Keys, consumers: list[Consumer]) -> None:
    seen: list[tuple[str, str, int]] = []
    a, b = Consumer(client, pkeys, "a", seen), Consumer(client, pkeys, "b", seen)
    consumers += [a, b]
    wait_for(lambda: len(a.owned()) == len(b.owned()) == P // 2, what="two shares")
    a.doomed = True  # its next batch: read, then the process dies before acknowledging anything
    victim = next(s for s in (f"v{i}" for i in range(100)) if pkeys.partition(s) in a.owned())
    for n in range(5):
        publish(client, pkeys, victim, n)
    a.thread.join(timeout=10)
    assert not a.thread.is_alive()
    # A deadline, not the bound (the bound is the next test's): the survivor takes over once the leases run out.
    wait_for(lambda: len(b.owned()) == P, timeout_s=10, what="the survivor to own every partition")
    wait_for(lambda: [n for _, s, n in seen if s == victim] == list(range(5)), what="the dead one's batch redone")
    assert backlog(client, pkeys, ("extract",))["extract"] == (0, 0)


def test_a_consumer_short_of_its_share_looks_again_when_a_dead_owners_lease_runs_out(
        client: redis.Redis, pkeys: Keys) -> None:
    """So a crashed consumer's partitions are taken a lease after its last renewal at most, not up to a refresh
    later: asserted with the lease's own expiry (PTTL) and when the survivor says it looks next, no stopwatch.
    The survivor refreshes once a second; the dead owner's leases have 0.6 s left."""
    for p in range(P):  # a consumer that died: its leases run out by themselves (it is in no registry)
        client.set(pkeys.lease("extract", p), "dead", px=LEASE_MS)
    survivor = Leases(client, pkeys, "extract", "survivor", lease_ms=4000)
    left_ms = min(int(client.pttl(pkeys.lease("extract", p))) for p in range(P))
    assert survivor.refresh(force=True) == []  # nothing free yet
    assert survivor.due_in_s() <= left_ms / 1000 < survivor.every_s

    def taken_over() -> bool:
        survivor.refresh()  # as its consumer's loop does, every turn: nothing unless due
        return survivor.owned() == list(range(P))
    wait_for(taken_over, timeout_s=10, what="the survivor to take every partition once the dead one's leases ran out")
    assert all(client.get(pkeys.lease("extract", p)) == b"survivor" for p in range(P))
    survivor.release_all()


def test_a_consumer_that_lost_its_lease_settles_nothing(client: redis.Redis, pkeys: Keys) -> None:
    """A stalled owner whose partition was taken over must not acknowledge, nor emit, what it read."""
    emitted: list[int] = []

    def handler(items: Sequence[Say]) -> list[list[Emit]]:
        # While this one works, its lease runs out and another consumer takes the partition.
        for p in range(P):
            client.set(pkeys.lease("extract", p), "usurper", px=60_000)
        emitted.extend(item.n for item in items)
        return [[Emit(pkeys.work("resolve", item.subject), item)] for item in items]

    stalled = StreamConsumer(client, pkeys, "extract", Say, handler, config(), name="stalled")
    stalled.ensure_group()
    publish(client, pkeys, "alice", 1)
    stalled.step()
    assert emitted == [1]
    assert client.xlen(pkeys.work("resolve", "alice")) == 0, "emitted without the lease"
    assert backlog(client, pkeys, ("extract",))["extract"] == (0, 1), "acknowledged without the lease"
    assert pkeys.partition("alice") not in stalled.leases.owned()


def test_retention_trims_what_was_acknowledged_and_keeps_what_is_unread_or_pending(
        client: redis.Redis, pkeys: Keys) -> None:
    stream, group = pkeys.input_of("extract", 0), "extract"
    client.xgroup_create(stream, group, id="0", mkstream=True)
    ids = [client.xadd(stream, {FIELD: b"x", "n": n}).decode() for n in range(300)]
    client.xreadgroup(group, "c", {stream: ">"}, count=200)
    client.xack(stream, group, *ids[:100])  # 0-99 acknowledged, 100-199 pending, 200-299 unread
    assert trim_acknowledged(client, stream, retention_ms=3_600_000) == 0, "trimmed inside the window"
    trim_acknowledged(client, stream, retention_ms=0)
    left = [e.decode() for e, _ in client.xrange(stream)]
    assert set(ids[100:]) <= set(left), "trimmed a pending or unread entry"
    assert len(left) < 300
    client.xack(stream, group, *ids[100:200])
    client.xreadgroup(group, "c", {stream: ">"})
    client.xack(stream, group, *ids[200:])
    trim_acknowledged(client, stream, retention_ms=0)
    assert client.xlen(stream) <= 100, "approximate trimming keeps at most one node of acknowledged entries"
    assert client.xinfo_groups(stream)[0]["lag"] == 0


def test_one_trim_takes_every_acknowledged_entry_past_the_window_however_many(client: redis.Redis,
                                                                            pkeys: Keys) -> None:
    """The servers memflow starts keep one entry a stream node (a forgotten entry's bytes go with its node), and an
    approximate trim stops at 100 nodes a call unless told otherwise: 100 entries a call, fewer than a busy
    partition gains between two trims, and the stream grew without bound."""
    stream, group = pkeys.input_of("extract", 1), "extract"
    client.xgroup_create(stream, group, id="0", mkstream=True)
    pipe = client.pipeline(transaction=False)
    for n in range(1000):
        pipe.xadd(stream, {FIELD: b"x", "n": n})
    ids = [i.decode() for i in pipe.execute()]
    client.xreadgroup(group, "c", {stream: ">"})
    client.xack(stream, group, *ids)
    nodes = int(client.config_get("stream-node-max-entries")["stream-node-max-entries"]) or 1
    trimmed = trim_acknowledged(client, stream, retention_ms=0)
    assert trimmed >= 1000 - nodes and client.xlen(stream) <= nodes


def test_a_slow_second_group_holds_the_trim_back(client: redis.Redis, pkeys: Keys) -> None:
    stream = pkeys.input_of("extract", 0)
    client.xgroup_create(stream, "extract", id="0", mkstream=True)
    client.xgroup_create(stream, "audit", id="0")
    ids = [client.xadd(stream, {FIELD: b"x"}).decode() for _ in range(250)]
    client.xreadgroup("extract", "c", {stream: ">"})
    client.xack(stream, "extract", *ids)
    trim_acknowledged(client, stream, retention_ms=0)
    assert client.xlen(stream) == 250, "trimmed what the audit group has not read"


def test_the_owner_trims_its_partitions_as_it_goes(client: redis.Redis, pkeys: Keys,
                                                   consumers: list[Consumer]) -> None:
    seen: list[tuple[str, str, int]] = []
    consumers.append(Consumer(client, pkeys, "owner", seen))
    consumers[0].consumer.config.retention_ms = 0
    for n in range(400):
        publish(client, pkeys, "alice", n)
    wait_for(lambda: len(seen) == 400, what="everything handled")
    consumers[0].consumer._next_trim = 0.0
    stream = pkeys.work("extract", "alice")
    wait_for(lambda: client.xlen(stream) < 400, what="the owner's trim")
