"""`memflow bench publish` at a tiny size: every figure present, for the variants asked (bench/publish.py)."""

from __future__ import annotations

import orjson
import pytest

from memflow.bench.publish import run_cli
from memflow.shared.settings import Settings


def test_bench_publish_reports_each_variant_next_to_bare_xadd(settings: Settings,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    assert run_cli(n=20, threads=2, batch=10, budget_s=0.3, variants=["everysec", "always+waitaof"], as_json=True,
                   settings=settings) == 0
    report = orjson.loads(capsys.readouterr().out)
    assert list(report["variants"]) == ["everysec", "always+waitaof"]
    for figures in report["variants"].values():
        assert figures["one_at_a_time"] >= 1 and figures["publish_p50_ms"] > 0 and figures["xadd_p50_ms"] > 0
        assert figures["xadd_per_s"] > 0 and figures["publish_per_s"] > 0 and figures["publish_many_events_per_s"] > 0
    assert "WAITAOF" in report["variants"]["always+waitaof"]["durability"]
    assert "not waited on" in report["variants"]["everysec"]["durability"]
