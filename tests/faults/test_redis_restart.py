"""redis-server killed (-9) and restarted on its AOF in the middle of an ingest.

The stages and the query worker wait the outage out and carry on; the publisher retries what
was refused while Redis was down. Every event Redis acknowledged to the publisher is processed:
stored once, or dead-lettered with its reason.
"""

from __future__ import annotations

import os
import signal
import threading
from pathlib import Path

import pytest
import redis

from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.server import start_redis
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings
from tests.conftest import start_system, wait_for
from tests.faults.common import FULL, account, events

pytestmark = pytest.mark.faults
EVENTS = 2000 if FULL else 300
RESTARTS = 3 if FULL else 1


@pytest.mark.timeout(1800 if FULL else 240)
def test_a_redis_restart_mid_ingest_loses_nothing_acknowledged(settings: Settings, embedder: Embedder,
                                                               tmp_path: Path) -> None:
    server = start_redis(tmp_path / "own-redis", binary=settings.redis.server)
    port = int(server.url.rsplit(":", 1)[1].split("/")[0])
    settings = settings.replace(redis_url=server.url, rpc_timeout_s=60.0)
    system = start_system(settings, embedder)
    client = MemoryClient(settings)
    acknowledged: list[str] = []
    refused = [0]
    errors: list[BaseException] = []

    def publish_all() -> None:
        try:
            publish_paced()
        except BaseException as exc:  # noqa: BLE001 - surfaced by the assertion below, not lost in a thread
            errors.append(exc)

    def publish_paced() -> None:
        for i, event in enumerate(events(EVENTS, "restart")):
            while True:  # a publisher retries what Redis refused; what it acknowledged must never be lost
                try:
                    if i % 20 == 0:  # paced by the pipeline, so that publishing spans the outage
                        wait_for(lambda i=i: _triggered(client) >= i - 40, timeout_s=120, what="the trigger to keep up")
                    client.publish(event)
                    acknowledged.append(event["event_id"])
                    break
                except (redis.ConnectionError, redis.TimeoutError, redis.ResponseError):  # down, or loading its AOF
                    refused[0] += 1
                    threading.Event().wait(0.05)

    publisher = threading.Thread(target=publish_all, daemon=True)
    try:
        publisher.start()
        for n in range(RESTARTS):
            goal = (n + 1) * EVENTS // (RESTARTS + 1)  # mid-way through the publishing, paced by the pipeline
            wait_for(lambda goal=goal: len(acknowledged) >= goal, timeout_s=120, what="publishing progress")
            os.kill(server.process.pid, signal.SIGKILL)
            server.process.wait()
            wait_for(lambda n=n: refused[0] > n, timeout_s=30, what="a publish refused while Redis is down")
            server = start_redis(tmp_path / "own-redis", port=port, binary=settings.redis.server)
        publisher.join(timeout=300)
        assert errors == [] and len(acknowledged) == EVENTS
        assert client.wait_idle(timeout_s=240)
        assert all(t.is_alive() for t in system.threads), "a stage or the query worker died in the outage"
        report = account(client, "restart", EVENTS)
        print(f"redis restart: {RESTARTS} kill -9 + restart, {refused[0]} publishes refused and retried, {report}")
        assert report["missing"] == [] and report["doubled"] == [] and report["lost_updates"] == []
    finally:
        system.shutdown()
        server.stop()


def _triggered(client: MemoryClient) -> int:
    """Events the trigger stage has handed on or dropped: what it has read of the events stream.

    Counted from the group's last-delivered id, which survives a restart from the AOF (its
    `entries-read` counter may not)."""
    return sum(_triggered_of(client, stream) for stream in client.keys.inputs_of("trigger"))


def _triggered_of(client: MemoryClient, stream: str) -> int:
    if not client.redis.exists(stream):
        return 0
    [group] = client.redis.xinfo_groups(stream)
    last = group["last-delivered-id"]
    return len(client.redis.xrange(stream, max=last)) if last not in (b"0-0", "0-0") else 0
