"""bench/diskload.py: the writer beside a bench writes and fsyncs, stays within its bound, and cleans up; `bench jobs`
under it reports every phase."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from memflow.bench.diskload import Bound, disk_load
from memflow.bench.jobs import measure, print_report
from memflow.shared.inference.embedder import Embedder
from memflow.shared.settings import Settings
from memflow.workers.cli.bench import writer_bound
from memflow.workers.embedded import embedded


def test_the_writer_stops_at_its_byte_bound_and_leaves_nothing(tmp_path: Path) -> None:
    folder = tmp_path / "diskload"
    # 1 MB files of 256 KB chunks, at most 3 MB: it rotates, and stops by its bound on its own
    bound = Bound(file_mb=1, chunk_kb=256, files=2, max_mb=3, max_s=600)
    with disk_load(folder, bound) as load:
        assert folder.is_dir()
        assert load.ended(120)  # by its own bound, not by the block's end
    report = load.report
    assert report["stopped_by"] == "bytes" and report["mb"] == 3 and report["fsyncs"] == 12
    assert report["mb_per_s"] > 0 and report["fsync_max_ms"] >= report["fsync_p50_ms"] >= 0
    assert not folder.exists() and list(tmp_path.iterdir()) == []


def test_the_writer_stops_when_the_block_ends(tmp_path: Path) -> None:
    folder = tmp_path / "diskload"
    with disk_load(folder, Bound(file_mb=1, chunk_kb=64, files=2, max_mb=100_000, max_s=600)) as load:
        pass
    assert load.report["stopped_by"] == "stop" and load.report["fsyncs"] >= 1
    assert not folder.exists()


def test_bench_jobs_under_disk_load_reports_every_phase_with_searches_and_the_load(
        settings: Settings, embedder: Embedder, capsys: pytest.CaptureFixture[str]) -> None:
    """`bench jobs --disk-load` at a tiny size: searches idle, idle under load, and each job alone and under load,
    each with its searches and verdict against the same run's idle p99; publish idle and under load next to a bare
    durable XADD; and what the writer wrote in each loaded phase."""
    load = Bound(file_mb=1, chunk_kb=64, files=2, max_mb=1000, max_s=600, mb_per_s=20)
    with embedded(settings, light_in_process=True, embedder=embedder) as system:
        report = measure(system, size=200, rate=20, idle_s=1.0, jobs=("decay",), load=load, publishes=20)

    loaded = report["disk_load"]
    phases = [report["idle"], report["jobs"]["decay"], loaded["idle"], loaded["jobs"]["decay"]]
    for figures in phases:
        assert figures["searches"] >= 1 and figures["failed"] == 0 and figures["partitions_lost"] == 0
        assert figures["max_ms"] >= figures["p99_ms"] >= figures["p50_ms"] > 0
        assert figures["verdict"] in ("ok", "MISSED")
        assert figures["vs_idle_p99"] == round(figures["p99_ms"] / report["idle"]["p99_ms"], 2)
    for figures in (loaded["idle"], loaded["jobs"]["decay"]):
        assert figures["writer"]["mb"] > 0 and figures["writer"]["fsyncs"] >= 1
        assert figures["writer"]["stopped_by"] == "stop"  # the load lasted the whole phase
    for publish in loaded["publish"].values():
        assert publish["p99_ms"] >= publish["p50_ms"] > 0 and publish["durable_xadd_p99_ms"] > 0
    assert not (settings.store.data_dir / "diskload").exists()
    print_report(report)
    printed = capsys.readouterr().out
    assert "idle, disk load" in printed and "decay, disk load" in printed and "bare durable XADD" in printed


def test_the_writer_options_change_only_what_they_name() -> None:
    """`--disk-load-mb-per-s`, `--disk-load-file-mb`, `--disk-load-max-mb` (bench perf and bench jobs alike): unset,
    the writer's own bound."""
    assert writer_bound(None, None, None) == Bound()
    assert writer_bound(0, 8, None) == replace(Bound(), mb_per_s=0, file_mb=8)
    assert writer_bound(None, None, 50).max_mb == 50 and writer_bound(None, None, 50).mb_per_s == Bound().mb_per_s
