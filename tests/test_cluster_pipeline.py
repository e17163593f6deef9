"""The whole pipeline on a real Valkey cluster (issue 17), marked `cluster`: `python -m pytest -m cluster`.

Three masters with two replicas each on localhost, the streams partitioned over them by subject
(hash tags: a partition's keys in one slot), the RPC queue on a server of its own (RQ runs on no
cluster), every write acknowledged once a replica holds it (MEMFLOW_REDIS_WAIT_REPLICAS=1). A master is
killed mid-ingest: its replica takes over and every event whose publish was acknowledged is stored once
— or dead-lettered with its reason — and every key holds its last value.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import pytest
import redis

from memflow.shared.admission.apikeys import KeyStore
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.cluster import LocalCluster, start_cluster
from memflow.shared.redisdb.server import RedisServer
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings
from tests.conftest import start_system, wait_for
from tests.faults.common import account, events, read_by_groups

pytestmark = pytest.mark.cluster
SUBJECTS = 6
PER_SUBJECT = 40


@pytest.fixture
def own_cluster(tmp_path: Path) -> Iterator[LocalCluster]:
    # Two replicas per master: once one is promoted, its master still has a replica to WAIT for.
    cluster = start_cluster(tmp_path / "cluster", replicas=2, binary=Settings().redis.server)
    yield cluster
    cluster.stop()


def cluster_settings(cluster: LocalCluster, queue: RedisServer, tmp_path: Path, prefix: str) -> Settings:
    return Settings(redis_url=cluster.url, redis_cluster=True, redis_queue_url=queue.url, redis_wait_replicas=1,
                    redis_wait_timeout_ms=2000, stream_prefix=prefix, data_dir=tmp_path, partitions=8, lease_ms=1500,
                    reclaim_idle_ms=2000, block_ms=50, retry_base_s=0.01, retry_max_s=0.5, rpc_timeout_s=120.0)


class Publisher(threading.Thread):
    """Publishes every event, retrying one whose publish failed (a failover) with the same event id;
    remembers which were acknowledged."""

    def __init__(self, client: MemoryClient, batch: list[dict]) -> None:
        super().__init__(daemon=True)
        self.client, self.batch, self.acknowledged, self.refused = client, batch, set(), 0

    def run(self) -> None:
        for event in self.batch:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    self.client.publish(event)
                except (redis.RedisError, OSError, Exception):  # noqa: BLE001 - counted, retried: a failover
                    self.refused += 1
                    time.sleep(0.05)
                    continue
                self.acknowledged.add((event["subject"], event["event_id"]))
                break
            time.sleep(0.02)  # paced: the ingest is still being published when the master dies


def test_the_pipeline_on_a_cluster_loses_no_acknowledged_event_when_a_master_dies(
        own_cluster: LocalCluster, redis_server: RedisServer, tmp_path: Path, embedder: Embedder,
        settings: Settings) -> None:
    config = cluster_settings(own_cluster, redis_server, tmp_path, settings.redis.stream_prefix)
    system = start_system(config, embedder)
    client = system.client
    try:
        subjects = [f"tenant-{i}" for i in range(SUBJECTS)]
        batches = [events(PER_SUBJECT, s) for s in subjects]
        interleaved = [b[i] for i in range(PER_SUBJECT) for b in batches]
        publisher = Publisher(client, interleaved)
        publisher.start()
        wait_for(lambda: len(publisher.acknowledged) >= len(interleaved) // 3 and read_by_groups(client) > 0,
                 timeout_s=120, what="a third of the ingest")
        victim = own_cluster.owner(client.keys.work("events", subjects[0]))
        failover = own_cluster.kill(victim)
        publisher.join(timeout=180)
        assert not publisher.is_alive()
        assert client.wait_idle(timeout_s=240)
        for subject in subjects:
            report = account(client, subject, PER_SUBJECT)
            acknowledged_missing = [i for i in report["missing"] if (subject, f"f{i}") in publisher.acknowledged]
            assert acknowledged_missing == [] and report["doubled"] == [] and report["lost_updates"] == [], report
        assert len(publisher.acknowledged) == len(interleaved), "an event was never acknowledged, even retried"
        print(f"cluster pipeline: {len(interleaved)} events, {len(publisher.acknowledged)} acknowledged, "
              f"{publisher.refused} publishes refused during the failover, failover {failover.seconds:.2f} s")
    finally:
        system.shutdown()


def test_the_http_api_serves_a_cluster_deployment_with_its_keys(
        redis_cluster: LocalCluster, redis_server: RedisServer, tmp_path: Path, embedder: Embedder,
        settings: Settings) -> None:
    """`memflow serve` on a cluster: keys looked up (async cluster client), events published to their
    partitions, a search answered by the query worker over the queue server."""
    from tests.test_api import start_serve, stop

    config = cluster_settings(redis_cluster, redis_server, tmp_path, settings.redis.stream_prefix)
    system = start_system(config, embedder)
    url, process = start_serve(config)
    try:
        key = KeyStore(system.client.redis, system.client.keys).create(
            "agent", ["team-a/*"], read_only=False, now=datetime.now(UTC))[1]
        headers = {"Authorization": f"Bearer {key}"}
        event = {"event_id": "h1", "subject": "team-a/ann", "session_id": "s1", "kind": "message", "role": "user",
                 "text": "Remember: the staging database is called kestrel-7.", "ts": "2026-03-02T09:00:00Z"}
        assert httpx.post(f"{url}/v1/events", json=event, headers=headers, timeout=30).status_code == 202
        assert system.client.wait_idle(timeout_s=60)
        found = httpx.post(f"{url}/v1/search", json={"subject": "team-a/ann", "query": "staging database name"},
                           headers=headers, timeout=60).json()
        assert any("kestrel-7" in hit["content"] for hit in found["hits"]), found
        # Its fate, kept in its partition's slot: stored, as the memory the search found (issue 41 item 2).
        fate = httpx.get(f"{url}/v1/events/h1", params={"subject": "team-a/ann"}, headers=headers, timeout=30).json()
        assert fate["state"] == "stored" and found["hits"][0]["id"] in fate["memory_ids"], (fate, found)
        refused = httpx.post(f"{url}/v1/search", json={"subject": "team-b/bo", "query": "x"}, headers=headers,
                             timeout=30)
        assert refused.status_code == 403
    finally:
        stop(process)
        system.shutdown()
