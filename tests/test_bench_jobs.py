"""`memflow bench jobs` at a tiny size: the JSON has exactly the shape the issue asks for, and a partition a
consumer loses is counted from the lease owner's own warning."""

from __future__ import annotations

import gc
import logging
import time

import pytest

from memflow.bench.jobs import STORE_LOGGER, LeaseLosses, Searches, Timeline, measure, print_report, stalls
from memflow.shared.edge_store import STEP_LOG
from memflow.shared.embedder import Embedder
from memflow.shared.settings import Settings
from memflow.workers.embedded import embedded

FIGURES = {"seconds", "p99_ms", "failed", "partitions_lost", "stalls"}


def test_the_bench_reports_search_p99_idle_and_during_each_job(settings: Settings, embedder: Embedder,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    with embedded(settings, light_in_process=True, embedder=embedder) as system:
        report = measure(system, size=300, rate=20, idle_s=1.0)

    assert set(report) == {"size", "idle", "jobs"} and report["size"] == 300
    assert set(report["idle"]) == {"p99_ms"} and report["idle"]["p99_ms"] > 0
    assert set(report["jobs"]) == {"index", "consolidate"}
    for figures in report["jobs"].values():
        assert set(figures) == FIGURES
        assert figures["failed"] == 0 and figures["partitions_lost"] == 0 and figures["seconds"] >= 0
    print_report(report)
    printed = capsys.readouterr().out
    assert "idle search p99" in printed and printed.count("partitions lost") == 2


def test_lost_partitions_are_counted_from_the_lease_owners_warnings() -> None:
    losses, leases = LeaseLosses(), logging.getLogger("memflow.shared.leases")
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
