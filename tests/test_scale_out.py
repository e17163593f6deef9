"""Scale-out: four consumers per store stage over partitioned streams, killed at random mid-batch.

Resolve and upsert each run as four consumers (threads sharing one store, as in one process; on the
Edge shard and on the server adapter), trigger and extract as one each, on 8 partitions. At random
moments a store-stage consumer dies in the middle of a batch — after writing part of it to the store,
before acknowledging any of it, its leases still held — and a new one starts in its place, as a
restarted process would. Afterwards every event is stored once (none lost, none doubled), every key
holds its last value in one active memory, and every partition of every stage is drained.
"""

from __future__ import annotations

import random
import threading
import uuid
from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from qdrant_client import QdrantClient

from memflow.shared.inference.embedder import Embedder
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings
from memflow.shared.storage.server_store import ServerStore
from memflow.shared.streaming.consumer import StreamConsumer
from memflow.shared.streaming.handlers import Outcome
from memflow.workers.query import build_worker
from memflow.workers.runtime import STORE_STAGES, Context
from memflow.workers.system import build_consumer, start_consumers
from tests.conftest import wait_for
from tests.faults.common import account, events, read_by_groups

pytestmark = [pytest.mark.faults, pytest.mark.scale]
SUBJECTS = 8
PER_SUBJECT = 30
KILLS = 6
CONSUMERS = 4


class Crashed(BaseException):
    """Not an Exception: nothing in the consumer loop catches it, as nothing catches a kill -9."""


class Mortal:
    """A store-stage consumer in a thread of its own; `doom()` makes it die in its next batch, after
    handling half of it (those writes reach the store) and before acknowledging anything."""

    def __init__(self, ctx: Context, stage: str) -> None:
        self.stage, self.doomed, self.stop = stage, False, threading.Event()
        self.consumer: StreamConsumer[Any] = build_consumer(ctx, stage)
        self.consumer.name = f"{stage}-{uuid.uuid4().hex[:6]}"
        self.consumer.leases.name = self.consumer.name
        live = self.consumer.handler
        self.consumer.handler = lambda items: self._handle(live, items)
        self.consumer.ensure_group()
        self.thread = threading.Thread(target=self._loop, daemon=True)
        self.thread.start()

    def _handle(self, live: Any, items: Sequence[Any]) -> Sequence[Outcome]:
        if not self.doomed:
            return live(items)  # type: ignore[no-any-return]
        live(items[:max(1, len(items) // 2)])
        raise Crashed

    def _loop(self) -> None:
        # As StreamConsumer.run, but a crash releases nothing: its leases run out.
        self.consumer.leases.keep_renewing(self.stop)
        try:
            while not self.stop.is_set():
                self.consumer._step_surviving()
        except Crashed:
            self.stop.set()  # the process is gone, its lease renewals with it

    def doom(self) -> None:
        self.doomed = True

    @property
    def dead(self) -> bool:
        return not self.thread.is_alive()


class Serialized:
    """qdrant-client's local mode, one call at a time: it stands in for a Qdrant server (which serves
    concurrent requests itself) but is not thread-safe (its numpy arrays grow under a concurrent reader)."""

    def __init__(self, client: QdrantClient) -> None:
        self._client, self._lock = client, threading.Lock()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args: Any, **kwargs: Any) -> Any:
            with self._lock:
                return attr(*args, **kwargs)

        return call


@pytest.fixture(params=["edge", "server"])
def store(request: pytest.FixtureRequest, embedder: Embedder) -> Any:
    if request.param == "edge":
        return None  # the context opens the Edge shard in its data dir
    store = ServerStore(Serialized(QdrantClient(":memory:")), f"scale-{uuid.uuid4().hex[:6]}",  # type: ignore[arg-type]
                        embedder.dim)
    store.ensure()
    return store


@pytest.fixture
def stopping() -> Iterator[list[threading.Event]]:
    stops: list[threading.Event] = []
    yield stops
    for stop in stops:
        stop.set()


@pytest.mark.timeout(400)
def test_four_consumers_per_store_stage_through_a_kill_storm_lose_and_double_nothing(
        settings: Settings, embedder: Embedder, store: Any, stopping: list[threading.Event]) -> None:
    settings = settings.replace(partitions=8, lease_ms=1000, reclaim_idle_ms=2000, rpc_timeout_s=120.0)
    ctx = Context.from_settings(settings)
    ctx._embedder, ctx._store = embedder, store
    stop = threading.Event()
    stopping.append(stop)
    start_consumers(ctx, ("trigger", "extract"), stop)
    worker = build_worker(ctx, stop)
    threading.Thread(target=worker.work, kwargs={"logging_level": "WARNING"}, daemon=True).start()
    mortals = [Mortal(ctx, stage) for stage in STORE_STAGES for _ in range(CONSUMERS)]
    stopping.extend(m.stop for m in mortals)

    client = MemoryClient(settings)
    subjects = [f"tenant-{i}" for i in range(SUBJECTS)]
    batches = [events(PER_SUBJECT, s) for s in subjects]
    interleaved = [batch[i] for i in range(PER_SUBJECT) for batch in batches]
    chunk = len(interleaved) // (KILLS + 1) + 1

    # The ingest comes in KILLS + 1 bursts; each kill lands while its burst is part-way through the
    # stages (about four stream entries per event: extract, resolve, upsert, changes).
    rng, killed = random.Random(20261202), []
    for k in range(KILLS + 1):
        before = read_by_groups(client)
        burst = interleaved[k * chunk:(k + 1) * chunk]
        for event in burst:
            client.publish(event)
        if k == KILLS:
            break
        goal = before + int(4 * len(burst) * rng.uniform(0.1, 0.6))
        wait_for(lambda goal=goal: read_by_groups(client) >= goal or client.is_idle(), timeout_s=120,
                 what="ingest progress")
        victim = rng.choice([m for m in mortals if not m.dead and not m.stop.is_set()])
        victim.doom()
        wait_for(lambda v=victim: v.dead or client.is_idle(), timeout_s=60, what="the doomed consumer's batch")
        victim.stop.set()  # idle when doomed: it never got a batch to die in; it stops holding its leases
        replacement = Mortal(ctx, victim.stage)
        stopping.append(replacement.stop)
        mortals.append(replacement)
        killed.append(victim.stage if victim.dead else f"{victim.stage} (idle)")
    assert client.wait_idle(timeout_s=240)

    for subject in subjects:
        report = account(client, subject, PER_SUBJECT)
        assert (report["missing"], report["doubled"], report["lost_updates"]) == ([], [], []), (subject, report)
        assert report["dead_letters"] == 0, subject
    for stage in ("trigger", "extract", *STORE_STAGES):
        for p in range(ctx.keys.partitions):
            stream = ctx.keys.input_of(stage, p)
            if ctx.client.exists(stream):
                [group] = ctx.client.xinfo_groups(stream)
                assert (group["lag"], group["pending"]) == (0, 0), (stage, p)
    alive = [m for m in mortals if not m.dead and not m.stop.is_set()]
    wait_for(lambda: sorted(p for m in alive if m.stage == "resolve" for p in m.consumer.leases.owned())
             == list(range(ctx.keys.partitions)), what="every partition of resolve owned by one live consumer")
    print(f"scale-out storm ({'server' if store else 'edge'}): {len(killed)} kills ({', '.join(killed)}), "
          f"{len(interleaved)} events over {SUBJECTS} subjects and {ctx.keys.partitions} partitions")
