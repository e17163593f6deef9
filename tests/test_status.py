"""`memflow status` on a real system: lag while the stages are stopped, nothing waiting once they
drained, dead letters counted, read rates measured."""

from __future__ import annotations

import threading
from datetime import UTC, datetime

import orjson
import pytest
import redis

from memflow.shared.inference.embedder import Embedder
from memflow.shared.monitoring.status import PipelineStatus, StageStatus, read_status, sampled_rates
from memflow.shared.redisdb.keys import FIELD, STAGES, Keys
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings
from tests.conftest import run_cli, start_system, wait_for


def by_stage(report: PipelineStatus) -> dict[str, StageStatus]:
    return {s.stage: s for s in report.stages}


def publish(settings: Settings, count: int) -> None:
    publisher = MemoryClient(settings)
    for n in range(count):
        publisher.publish({"event_id": f"st-{n}", "subject": "sam", "session_id": "s1", "kind": "message",
                           "role": "user", "text": f"Remember: locker {n} holds the spare charger.",
                           "ts": datetime(2026, 3, 2, 9, n, tzinfo=UTC)})


def test_lag_shows_while_stopped_then_drains_and_a_poisoned_message_counts_in_the_dlq(
        settings: Settings, embedder: Embedder, client: redis.Redis, keys: Keys,
        monkeypatch: pytest.MonkeyPatch) -> None:
    publish(settings, 3)
    trigger = by_stage(read_status(client, keys))["trigger"]
    assert (trigger.length, trigger.lag, trigger.pending, trigger.dead, trigger.read_per_s) == (3, 3, 0, 0, 0)

    system = start_system(settings, embedder)
    try:
        client.xadd(keys.input_of("trigger", 0), {FIELD: b"{poisoned"})
        assert system.client.wait_idle(timeout_s=60)
        # The query worker registers with RQ once its loop has started.
        report = wait_for(lambda: (r := read_status(client, keys)).query_workers == 1 and r, what="query worker")
        assert isinstance(report, PipelineStatus)
        stages = by_stage(report)
        assert all((stages[s].lag, stages[s].pending) == (0, 0) for s in STAGES)
        assert [stages[s].dead for s in STAGES] == [1, 0, 0, 0]
        # Four entries arrived and were read within the last minute.
        assert (stages["trigger"].length, stages["trigger"].read_per_s) == (4, pytest.approx(4 / 60))
        assert stages["upsert"].read_per_s > 0
        assert (report.query_queue, report.jobs_queue, report.throughput) == (0, 0, "window")

        printed = orjson.loads(run_cli(system, monkeypatch, "status", "--json"))
        trigger = printed["stages"][0]
        assert trigger.pop("memory_bytes") > 0
        assert trigger == {"stage": "trigger", "length": 4, "lag": 0, "pending": 0, "dead": 1,
                           "read_per_s": pytest.approx(4 / 60)}
        table = run_cli(system, monkeypatch, "status").splitlines()
        assert table[0].split() == ["stage", "length", "memory", "lag", "pending", "dlq", "read/s"]
        row = table[1].split()
        assert row[:2] == ["trigger", "4"] and row[3] in ("B", "KiB") and row[4:7] == ["0", "0", "1"]
        assert "query workers 1" in table[5]
    finally:
        system.shutdown()


def test_a_sample_measures_what_a_group_reads_meanwhile(client: redis.Redis, keys: Keys) -> None:
    stream = keys.input_of("extract", 0)
    for n in range(500):
        client.xadd(stream, {FIELD: b"{}", "n": n})
    client.xgroup_create(stream, keys.group("extract"), id="0")
    stop = threading.Event()

    def read_slowly() -> None:
        # A consumer reading one entry at a time, paced, for as long as the sample lasts.
        while not stop.wait(0.01):
            client.xreadgroup(keys.group("extract"), "slow", {stream: ">"}, count=1)

    reader = threading.Thread(target=read_slowly)
    reader.start()
    try:
        rates = sampled_rates(client, keys, 0.3)
    finally:
        stop.set()
        reader.join(timeout=5)
    assert rates["extract"] is not None and rates["extract"] > 0
    assert rates["trigger"] == rates["resolve"] == 0
    report = read_status(client, keys, sample_s=0.05)
    assert (report.throughput, report.sample_s) == ("sample", 0.05)
