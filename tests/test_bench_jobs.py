"""`memflow bench jobs` at a tiny size: the JSON has exactly the shape the issue asks for, and a partition a
consumer loses is counted from the lease owner's own warning."""

from __future__ import annotations

import gc
import logging
import time
from pathlib import Path

import pytest
import redis

from memflow.bench.jobs import (
    STORE_LOGGER,
    LeaseLosses,
    Searches,
    Timeline,
    enqueue_as_scheduled,
    measure,
    print_report,
    redis_servers,
    stalls,
)
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.server import start_redis
from memflow.shared.settings import Settings
from memflow.shared.storage.edge_store import STEP_LOG
from memflow.workers.embedded import embedded
from memflow.workers.runtime import Context

IDLE = {"p50_ms", "p99_ms", "max_ms", "searches", "failed", "partitions_lost", "gc", "stalls", "vs_idle_p99", "verdict"}
FIGURES = IDLE | {"seconds"}


def test_the_bench_reports_search_p99_idle_and_during_each_job(settings: Settings, embedder: Embedder,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    with embedded(settings, light_in_process=True, embedder=embedder) as system:
        report = measure(system, size=300, rate=20, idle_s=1.0)

    assert set(report) == {"size", "idle", "jobs"} and report["size"] == 300
    assert set(report["idle"]) == IDLE and report["idle"]["p99_ms"] > 0 and report["idle"]["vs_idle_p99"] == 1
    assert set(report["jobs"]) == {"index", "consolidate"}
    for figures in report["jobs"].values():
        assert set(figures) == FIGURES and figures["searches"] >= 1
        assert figures["failed"] == 0 and figures["partitions_lost"] == 0 and figures["seconds"] >= 0
        assert figures["verdict"] == ("ok" if figures["p99_ms"] <= 2 * report["idle"]["p99_ms"] else "MISSED")
    print_report(report)
    printed = capsys.readouterr().out
    assert "idle search p99" in printed
    assert [line.split()[0] for line in printed.splitlines()[2:5]] == ["idle", "index", "consolidate"]


def test_a_job_run_twice_within_one_second_fires_twice(settings: Settings, embedder: Embedder) -> None:
    """A firing's id is its job and its second: the bench's second run of a job on a small store (its run under disk
    load) came within the second of the first and was refused as already enqueued (CI, once). Each run gets its own."""
    with embedded(settings, light_in_process=True, embedder=embedder) as system:
        fired = [enqueue_as_scheduled(system, "decay") for _ in range(3)]
        assert len({job.id for job in fired}) == 3


def test_lost_partitions_are_counted_from_the_lease_owners_warnings() -> None:
    losses, leases = LeaseLosses(), logging.getLogger("memflow.shared.streaming.leases")
    leases.addHandler(losses)
    try:
        leases.warning("consumer %s lost partition %d of %s", "c1", 3, "upsert")
        leases.error("consumer %s made no progress for %.0f s (MEMFLOW_MAX_BATCH_S=%g): giving up partitions %s of "
                     "%s to a healthy consumer; the batch in hand is left pending for it", "c2", 90.0, 60, [0, 1],
                     "resolve")
        leases.warning("something else")
    finally:
        leases.removeHandler(losses)
    assert losses.count == 3


def test_a_slow_search_is_matched_to_the_index_build_step_or_collection_that_ran_meanwhile() -> None:
    """The steps come from EdgeStore's own DEBUG log (sent as each ends, with its duration), the collections from
    the collector's callbacks; a search slower than the bound names what overlapped it, and only that."""
    timeline = Timeline(gc_noted_s=0.0)
    timeline.start()
    try:
        now = time.time()
        logging.getLogger(STORE_LOGGER).debug(STEP_LOG, "part-03", "load and replay (lock held)", 0.4)
        gc.collect()
    finally:
        timeline.stop()
    searches = Searches.__new__(Searches)
    searches.latencies, searches.answered = [0.5, 0.01, 0.3], [now - 0.01, now - 5.0, now - 2.0]

    found = stalls(searches, 0.2, timeline, "index")

    assert found[0]["ms"] == 500.0 and found[0]["during"].startswith("load and replay (lock held) of part-03")
    assert "gc generation 2" not in found[0]["during"]  # collected after that search's end
    assert found[1] == {"ms": 300.0, "during": "index: no step recorded"}
    assert len(found) == 2 and logging.getLogger(STORE_LOGGER).level == logging.NOTSET
    assert any(what.startswith("gc generation 2") for _, _, what in timeline.spans)


def server_now(client: redis.Redis) -> float:
    seconds, micros = client.time()
    return float(seconds) + micros / 1e6


def test_the_redis_servers_slow_moments_are_named(client: redis.Redis) -> None:
    """A search is a few Redis round trips: a moment the server itself was slow (its latency monitor) is a span
    a slow search can be matched to."""
    timeline = Timeline()
    client.config_set("latency-monitor-threshold", 10)
    try:
        client.execute_command("LATENCY", "RESET")  # type: ignore[no-untyped-call]
        busy = client.register_script("local n = 0 for i = 1, 1e7 do n = n + i end return 1")
        before = server_now(client)
        busy()
        after = server_now(client)
        timeline.redis_stalls([("", client)])
    finally:
        client.config_set("latency-monitor-threshold", 0)
    assert any(what.startswith("redis ") for _, _, what in timeline.spans), timeline.spans
    start, end, what = next(span for span in timeline.spans if span[2].startswith("redis "))
    # The span is the server's own report, on its clock (epoch seconds): it covers when the script ran.
    assert end - start >= 0.01 and start <= after and end >= before, (start, end, before, after)
    searches = Searches.__new__(Searches)
    searches.latencies, searches.answered = [0.3], [end - 0.5]
    assert stalls(searches, 0.2, timeline, "idle")[0]["during"] == what
    timeline.redis_stalls([("", client)])  # read once: the server's history was reset
    assert sum(w.startswith("redis ") for _, _, w in timeline.spans) == 1


def test_each_distinct_redis_server_is_read_and_named(settings: Settings, client: redis.Redis,
                                                     tmp_path: Path) -> None:
    """The RPC queues may live on a server of their own (one that does not persist): its slow moments are read too,
    named by which server had them; a second connection to the same server is not a second server."""
    again = redis.Redis.from_url(settings.redis.url or "")
    assert redis_servers(Context(settings, client, settings.keys)) == [("", client)]
    assert redis_servers(Context(settings, client, settings.keys, queue_client=again)) == [("", client)]
    queue_server = start_redis(tmp_path / "queue", binary=settings.redis.server)
    try:
        queue = redis.Redis.from_url(queue_server.url)
        servers = redis_servers(Context(settings, client, settings.keys, queue_client=queue))
        assert servers == [("streams", client), ("queue", queue)]
        timeline = Timeline()
        for _, each in servers:
            each.config_set("latency-monitor-threshold", 10)
            each.execute_command("LATENCY", "RESET")  # type: ignore[no-untyped-call]
        queue.register_script("local n = 0 for i = 1, 1e7 do n = n + i end return 1")()
        timeline.redis_stalls(servers)
        client.config_set("latency-monitor-threshold", 0)
    finally:
        queue_server.stop()
    named = [what for _, _, what in timeline.spans if what.startswith("redis")]
    assert any(what.startswith("redis (queue) ") for what in named), named
    assert all(what.startswith(("redis (queue) ", "redis (streams) ")) for what in named), named
