"""`memflow bench profile` at a tiny size: every figure the issue asks for is there, each read it times found
the kept profile, the HTTP read is the same document as the worker's rebuild, and each write's next read shows
that write (else the rebuild figure would time a read served from a stale copy)."""

from __future__ import annotations

import pytest

from memflow.bench.profile import CONTESTS, measure, print_report
from memflow.shared.inference.embedder import Embedder
from memflow.shared.settings import Settings
from memflow.workers.embedded import embedded

READS = ("floor", "cached", "parsed", "http", "http_floor")


def test_the_bench_reports_the_read_next_to_its_floor_and_the_rebuild_after_a_write(
        settings: Settings, embedder: Embedder, capsys: pytest.CaptureFixture[str]) -> None:
    with embedded(settings, light_in_process=True, embedder=embedder) as system:
        report = measure(system, size=200, reads=5, writes=2)

    assert report["subject"] == {"memories": 200, "searchable": 174}  # the mix: 13% superseded or archived
    assert report["profile"]["items"] == 80 and report["profile"]["contested"] == 2 * CONTESTS
    assert report["http_same_as_rebuild"] is True
    assert set(report["read"]) == set(READS)
    for figures in (*report["read"].values(), report["rebuild"]["next_read"], report["rebuild"]["read_after"]):
        assert 0 < figures["p50_ms"] <= figures["p95_ms"] <= figures["max_ms"]
    assert report["rebuild"]["writes"] == 2 and set(report["rebuild"]["parts"]) == {"scroll", "assemble", "serialize"}
    print_report(report)
    assert "cached / floor" in capsys.readouterr().out
