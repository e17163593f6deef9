"""`memflow bench jobs` at a tiny size: the JSON has exactly the shape the issue asks for, and a partition a
consumer loses is counted from the lease owner's own warning."""

from __future__ import annotations

import gc
import logging
import time

import pytest
import redis

from memflow.bench.jobs import STORE_LOGGER, LeaseLosses, Searches, Timeline, measure, print_report, stalls
from memflow.shared.inference.embedder import Embedder
from memflow.shared.settings import Settings
from memflow.shared.storage.edge_store import STEP_LOG
from memflow.workers.embedded import embedded

FIGURES = {"seconds", "p99_ms", "failed", "partitions_lost", "stalls"}


def test_the_bench_reports_search_p99_idle_and_during_each_job(settings: Settings, embedder: Embedder,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    with embedded(settings, light_in_process=True, embedder=embedder) as system:
        report = measure(system, size=300, rate=20, idle_s=1.0)

    assert set(report) == {"size", "idle", "jobs"} and report["size"] == 300
    assert set(report["idle"]) == {"p99_ms", "stalls"} and report["idle"]["p99_ms"] > 0
    assert set(report["jobs"]) == {"index", "consolidate"}
    for figures in report["jobs"].values():
        assert set(figures) == FIGURES
        assert figures["failed"] == 0 and figures["partitions_lost"] == 0 and figures["seconds"] >= 0
    print_report(report)
    printed = capsys.readouterr().out
    assert "idle search p99" in printed and printed.count("partitions lost") == 2


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


def test_the_redis_servers_slow_moments_are_named(client: redis.Redis) -> None:
    """A search is a few Redis round trips: a moment the server itself was slow (its latency monitor) is a span
    a slow search can be matched to."""
    timeline = Timeline()
    client.config_set("latency-monitor-threshold", 10)
    try:
        client.execute_command("LATENCY", "RESET")  # type: ignore[no-untyped-call]
        busy = client.register_script("local n = 0 for i = 1, 1e7 do n = n + i end return 1")
        busy()
        timeline.redis_stalls(client)
    finally:
        client.config_set("latency-monitor-threshold", 0)
    assert any(what.startswith("redis ") for _, _, what in timeline.spans), timeline.spans
    start, end, what = next(span for span in timeline.spans if span[2].startswith("redis "))
    assert end - start >= 0.01 and abs(end - time.time()) < 60
    searches = Searches.__new__(Searches)
    searches.latencies, searches.answered = [0.3], [end - 0.5]
    assert stalls(searches, 0.2, timeline, "idle")[0]["during"] == what
    timeline.redis_stalls(client)  # read once: the server's history was reset
    assert sum(w.startswith("redis ") for _, _, w in timeline.spans) == 1
