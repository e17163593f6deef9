"""`memflow bench jobs` at a tiny size: the JSON has exactly the shape the issue asks for, and a partition a
consumer loses is counted from the lease owner's own warning."""

from __future__ import annotations

import logging

import pytest

from memflow.bench.jobs import LeaseLosses, measure, print_report
from memflow.shared.embedder import Embedder
from memflow.shared.settings import Settings
from memflow.workers.embedded import embedded

FIGURES = {"seconds", "p99_ms", "failed", "partitions_lost"}


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
