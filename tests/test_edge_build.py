"""The Edge shard's index build runs in a process of its own and is handed over (shared/storage/edge_build.py): searches are
answered while it builds, writes made meanwhile are in its result, and a crash mid-handover loses nothing."""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import uuid
from datetime import UTC, datetime
from pathlib import Path

import numpy as np
import pytest

from memflow.pipeline.models import Dir, Memory, MType, Source
from memflow.shared.search.foreground import Foreground
from memflow.shared.storage import edge_build
from memflow.shared.storage.edge_store import STEP_LOG, EdgeStore
from memflow.shared.storage.store import MemoryFilter
from tests.conftest import wait_for

DIM = 768
T0 = datetime(2026, 4, 1, 9, 0, tzinfo=UTC)
# Past the engine's indexing threshold (10 MB of vectors, ~3,300 points of 768 dims): a build of seconds here.
POINTS = 8000
STORE_LOGGER = "memflow.shared.storage.edge_store"


def memories(n: int, subject: str = "ix") -> list[Memory]:
    return [Memory(id=str(uuid.uuid4()), subject=subject, uri=f"mem://{subject}/{i}", dir=Dir.general,
                   mtype=MType.fact, key=f"k.{i}", content=f"note number {i} of {subject}", confidence=0.9,
                   source=Source.explicit, created_at=T0, updated_at=T0) for i in range(n)]


def units(n: int, seed: int = 1, dim: int = DIM) -> list[list[float]]:
    drawn = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return (drawn / np.linalg.norm(drawn, axis=1, keepdims=True)).tolist()  # type: ignore[no-any-return]


@pytest.fixture
def shard(tmp_path: Path) -> EdgeStore:
    made = EdgeStore(tmp_path / "shard", DIM)
    made.ensure()
    for start in range(0, POINTS, 2000):
        made.put(memories(2000), units(2000, seed=start))
    return made


class Steps(logging.Handler):
    """The build's steps as EdgeStore logs them (each as it ends), in one list with what the test notes."""

    def __init__(self, events: list[object]) -> None:
        super().__init__(logging.DEBUG)
        self.events = events

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg == STEP_LOG:
            self.events.append(record.args[1])  # type: ignore[index]


def builders() -> set[int]:
    """This process's children that are index builds (Linux: /proc)."""
    found = set()
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if parent == os.getpid() and b"memflow.shared.storage.edge_build" in stat.with_name("cmdline").read_bytes():
                found.add(int(stat.parent.name))
        except (OSError, IndexError, ValueError):  # ended meanwhile
            continue
    return found


def test_searches_are_answered_while_the_index_builds(shard: EdgeStore) -> None:
    """Counted, not timed: searches asked after the copy was made and answered before the build was done, while
    the build ran in a child process. In process, the whole build held the interpreter lock (one search waited
    all of it). How long searches take meanwhile is `memflow bench jobs`'s figure (bench/RESULTS.md)."""
    events: list[object] = []
    steps = Steps(events)
    store_log = logging.getLogger(STORE_LOGGER)
    store_log.addHandler(steps)
    store_log.setLevel(logging.DEBUG)
    built: list[bool] = []
    builder = threading.Thread(target=lambda: built.append(shard.optimize()))
    query = units(1, seed=99)[0]
    try:
        builder.start()
        for n in itertools.count():
            if not builder.is_alive():
                break
            events.append(("asked", n))
            shard.query(MemoryFilter("ix"), mode="dense", limit=5, dense=query)
            events.append(("answered", n))
            if children := builders():
                events.append(("child", frozenset(children)))
            time.sleep(0.02)
        builder.join()
    finally:
        store_log.removeHandler(steps)
        store_log.setLevel(logging.NOTSET)
    assert built == [True]
    during = events[events.index("copy (writes held)"):events.index("build (child process)")]
    asked = {e[1] for e in during if isinstance(e, tuple) and e[0] == "asked"}
    answered = {e[1] for e in during if isinstance(e, tuple) and e[0] == "answered"}
    assert len(asked & answered) >= 3, f"{len(asked & answered)} searches answered during the build"
    assert any(isinstance(e, tuple) and e[0] == "child" for e in during), "the build ran in this process"
    assert shard.changed_since_optimize() == 0
    shard.close()


def test_writes_made_during_the_build_are_in_what_it_hands_over(shard: EdgeStore, tmp_path: Path) -> None:
    first = shard.get(MemoryFilter("ix"))[:2]
    builder = threading.Thread(target=shard.optimize)
    builder.start()
    late = memories(3, subject="late")
    wait_for(lambda: (tmp_path / "shard.build").exists(), 60, "the copy to be made (what follows is journaled)")
    shard.put(late, units(3, seed=7))
    shard.set_fields(first[0].subject, first[0].id, {"content": "patched during the build"})
    shard.delete(first[1].subject, [first[1].id])
    builder.join()

    assert sorted(m.id for m in shard.get(MemoryFilter("late"))) == sorted(m.id for m in late)
    assert [m.content for m in shard.get(MemoryFilter("ix", ids=[first[0].id]))] == ["patched during the build"]
    assert shard.get(MemoryFilter("ix", ids=[first[1].id])) == []
    assert shard.count() == POINTS + 3 - 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard"]  # nothing left beside it
    shard.close()
    again = EdgeStore(tmp_path / "shard", DIM)
    assert again.count() == POINTS + 3 - 1
    again.close()


def test_a_handover_a_crash_interrupted_gives_back_the_shard_from_before(shard: EdgeStore, tmp_path: Path) -> None:
    path = tmp_path / "shard"
    shard.close()
    built = edge_build.copy(path)
    edge_build.swap_in(path, built)  # the old shard renamed away, the copy in its place: then the crash
    (path / "half-replayed").write_text("the build, not yet the shard")
    reopened = EdgeStore(path, DIM)
    assert reopened.count() == POINTS and not (path / "half-replayed").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["shard"]
    reopened.close()


def test_the_handover_steps_aside_for_the_searches_in_flight(shard: EdgeStore, caplog: pytest.LogCaptureFixture) -> None:
    """Loading the built shard and closing the old one hold the interpreter lock: each waits for the searches
    the process is answering (a job's `between`, shared/search/foreground.py) before it starts. Each step is logged at
    DEBUG as it ends (`memflow bench jobs` matches slow searches to them)."""
    caplog.set_level(logging.DEBUG, logger="memflow.shared.storage.edge_store")
    foreground = Foreground(patience_s=0.05)
    in_flight, done = threading.Event(), threading.Event()

    def search() -> None:
        with foreground.serving():
            in_flight.set()
            done.wait(600)  # held until optimize returns (finally below); a build under load took over 30 s

    searcher = threading.Thread(target=search)
    searcher.start()
    in_flight.wait(5)
    try:
        assert shard.optimize(between=foreground.step_aside) is True
    finally:
        done.set()
        searcher.join()
    assert foreground.stepped_aside == 2  # before the load, before the close
    steps = [r.args[1] for r in caplog.records if r.msg == STEP_LOG and isinstance(r.args, tuple)]
    assert steps == ["copy (writes held)", "build (child process)", "warm the page cache", "step aside",
                     "load and replay (lock held)",
                     "write back the retired shard", "step aside", "close (lock held)", "drop the copy"]
    shard.close()


def test_warming_reads_every_file_of_a_built_shard(tmp_path: Path) -> None:
    """The load under the interpreter lock finds the built shard's pages in memory only if every file was read:
    the bytes read are the bytes on disk, nested folders included."""
    built = tmp_path / "part-00.build"
    (built / "segments" / "a").mkdir(parents=True)
    (built / "wal").mkdir()
    sizes = {built / "segments" / "a" / "vectors": 3 << 20, built / "wal" / "open-1": 12345, built / "config": 7}
    for path, size in sizes.items():
        path.write_bytes(os.urandom(size))

    assert edge_build.warm(built, chunk=1 << 16) == sum(sizes.values())
