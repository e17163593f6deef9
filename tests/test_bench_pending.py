"""`memflow bench pending` at a tiny size: the report has every figure the issue asks for, and the searches
measured "with" the layer really had pending entries to rank (else the figure would measure nothing)."""

from __future__ import annotations

import pytest

from memflow.bench.pending import live_session, measure, print_report
from memflow.shared.inference.embedder import CachedPassages, Embedder
from memflow.shared.settings import Settings
from memflow.workers.embedded import embedded

FIGURES = {"p50_ms", "p95_ms", "failed", "limit_p50_ms", "limit_p95_ms", "layer_p50_ms", "layer_p95_ms",
           "layer_kept_p50_ms", "layer_kept_p95_ms"}


def test_the_bench_reports_search_with_and_without_pending_entries_idle_and_under_a_burst(
        settings: Settings, embedder: Embedder, capsys: pytest.CaptureFixture[str]) -> None:
    # Wrapped as every process's embedder is (shared.inference.embedder.build_embedder): the layer reads the pending
    # turns' vectors from the passage cache after the first search.
    with embedded(settings, light_in_process=True, embedder=CachedPassages(embedder)) as system:
        report = measure(system, sizes=[200], queries=10, burst=100)

    assert report["machine"]["cpus"] and len(report["machine"]["load_avg"]) == 3
    size = report["sizes"]["200"]
    assert size["memories"] == 200 and size["pending_entries"] > 0
    for phase in ("idle", "burst"):
        without, with_ = size[phase]["without"], size[phase]["with"]
        assert FIGURES <= without.keys() and FIGURES <= with_.keys()
        assert 0 < without["p50_ms"] <= without["p95_ms"] and 0 < with_["p50_ms"] <= with_["p95_ms"]
        assert 0 < with_["limit_p50_ms"] <= with_["limit_p95_ms"]
        assert with_["pending_min"] > 0, f"{phase}: searched 'with' the layer but nothing was pending"
        assert without["pending_max"] == 0, f"{phase}: the 'without' subject had pending entries"
        assert size[phase]["queries"] >= 1 and with_["first_search_ms"] > 0
    assert size["idle"]["queries"] == 10
    assert size["burst"]["events"] == 100 and size["burst"]["backlog_max"] > 0

    print_report(report)  # the report for a person reads every figure the JSON has
    printed = capsys.readouterr().out
    assert "@ 200 memories" in printed and printed.count("search p50") == 4


def test_each_rounds_live_session_says_other_things() -> None:
    """The passage cache keeps what one round encoded: a session repeating an earlier one's turns would make
    the next round's first search look cheap (measured: 7.6 s at 10k, 0.3 s at 100k with the same turns)."""
    said = [{e["text"] for e in live_session(r)} for r in range(4)]
    assert all(len(s) == 45 for s in said)
    assert not any(said[i] & said[j] for i in range(4) for j in range(i + 1, 4))
