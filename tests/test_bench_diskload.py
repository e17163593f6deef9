"""bench/diskload.py: the writer beside a bench writes and fsyncs, stays within its bound, and cleans up."""

from __future__ import annotations

from pathlib import Path

from memflow.bench.diskload import Bound, disk_load


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
