"""An embedded index as N Edge shards keyed by subject hash (shared/storage/edge_shards.py): a shard's handover holds only its
own subjects, the reads that name no subject fan out and merge, a crash mid-handover is recovered per shard, and a
directory written before shards opens as one."""

from __future__ import annotations

import json
import threading
import uuid
from functools import partial
from pathlib import Path

import pytest

from memflow.shared.storage import edge_build
from memflow.shared.storage.edge_shards import EdgeCatalog, ShardedStore, open_index, shard_of
from memflow.shared.storage.edge_store import EdgeStore
from memflow.shared.storage.store import Identity, MemoryFilter, Query
from tests.test_edge_build import memories
from tests.test_edge_build import units as units_of

DIM = 16
WAIT_S = 30.0  # a bound on a wait for a condition, never a sleep


# The same points as the build's tests, in a small dimension: these tests are about where points go.
units = partial(units_of, dim=DIM)


def subjects_in(shards: int, wanted: int) -> dict[int, str]:
    """One subject per shard, for the first `wanted` shards."""
    found: dict[int, str] = {}
    i = 0
    while any(k not in found for k in range(wanted)):
        k = shard_of(f"agent-{i}", shards)
        if k < wanted:
            found.setdefault(k, f"agent-{i}")
        i += 1
    return found


@pytest.fixture
def sharded(tmp_path: Path) -> ShardedStore:
    store = open_index(tmp_path / "index", DIM, 4)
    assert isinstance(store, ShardedStore)
    store.ensure()
    return store


def test_a_search_of_one_subject_is_answered_while_another_shards_handover_is_held(sharded: ShardedStore) -> None:
    """What a handover holds (EdgeStore._hand_over): its shard's writes and its reader gate, for the engine's load
    of the built shard. With one shard that held every search; here only the subjects of the shard handed over."""
    by_shard = subjects_in(4, 2)
    held, free = by_shard[0], by_shard[1]
    for subject in (held, free):
        sharded.put(memories(5, subject), units(5))
    answered = {s: threading.Event() for s in (held, free)}

    def search_and_write(subject: str) -> None:
        sharded.query(MemoryFilter(subject), mode="dense", limit=3, dense=units(1, seed=9)[0])
        sharded.put(memories(1, subject), units(1, seed=3))
        answered[subject].set()

    handed_over = sharded.parts[0]
    with handed_over._writing, handed_over._readers.alone():
        threads = [threading.Thread(target=search_and_write, args=(s,)) for s in (held, free)]
        for t in threads:
            t.start()
        assert answered[free].wait(WAIT_S), "a subject of another shard waited for the handover"
        assert not answered[held].is_set()  # its own shard's subjects do wait: the hold is real
    assert answered[held].wait(WAIT_S)
    for t in threads:
        t.join()
    assert sharded.count(held) == sharded.count(free) == 6
    sharded.close()


def test_reads_that_name_no_subject_fan_out_and_merge(sharded: ShardedStore) -> None:
    written = {s: memories(7, s) for s in (f"agent-{i}" for i in range(12))}
    for i, some in enumerate(written.values()):
        sharded.put(some, units(len(some), seed=i))
    assert len({shard_of(s, 4) for s in written}) > 1  # the subjects really are spread
    everyone = sorted(m.id for some in written.values() for m in some)

    assert sharded.count() == len(everyone) and sharded.subjects() == sorted(written)
    assert sharded.changed_since_optimize() == len(everyone)
    paged, offset, first = [], None, True
    while first or offset is not None:  # small pages across shards: every point once, in id order
        page, offset = sharded.page(offset, 5)
        paged += [m.id for m in page]
        first = False
    assert paged == everyone

    subjects = list(written)
    queries = [Query(MemoryFilter(s), "dense", 3, units(1, seed=5)[0]) for s in (subjects[3], subjects[0], subjects[7])]
    answers = sharded.query_many(queries)
    assert [{a.memory.subject for a in answer} for answer in answers] == [{subjects[3]}, {subjects[0]}, {subjects[7]}]

    target, doomed = written[subjects[5]][0], [written[subjects[2]][0], written[subjects[9]][1]]
    sharded.set_fields(subjects[5], target.id, {"content": "patched"}, if_rev=None)
    sharded.set_fields(subjects[5], target.id, {"content": "not at that rev"}, if_rev=99)
    assert [m.content for m in sharded.get(MemoryFilter(subjects[5], ids=[target.id]))] == ["patched"]
    for m in doomed:
        sharded.delete(m.subject, [m.id, str(uuid.uuid4())])  # an id held nowhere is no error
    assert sharded.count() == len(everyone) - 2
    with pytest.raises(KeyError):
        sharded.set_fields(subjects[5], str(uuid.uuid4()), {"content": "nobody"})
    sharded.close()


def test_a_handover_a_crash_interrupted_is_recovered_in_its_shard(sharded: ShardedStore, tmp_path: Path) -> None:
    by_shard = subjects_in(4, 4)
    for k, subject in by_shard.items():
        sharded.put(memories(10 + k, subject), units(10 + k, seed=k))
    sharded.close()
    part = tmp_path / "index" / "part-02"
    built = edge_build.copy(part)
    edge_build.swap_in(part, built)  # shard 2's old directory renamed away, the copy in its place: the crash
    (part / "half-replayed").write_text("the build, not yet the shard")

    reopened = open_index(tmp_path / "index", DIM, 4)
    assert [reopened.count(by_shard[k]) for k in range(4)] == [10, 11, 12, 13]
    assert not (part / "half-replayed").exists()
    assert sorted(p.name for p in (tmp_path / "index").iterdir()) == [
        "part-00", "part-01", "part-02", "part-03", "shards.json"]
    reopened.close()


def test_a_directory_written_before_shards_opens_as_one_and_keeps_working(tmp_path: Path) -> None:
    catalog = EdgeCatalog(tmp_path, "memflow", shards=4)
    old = tmp_path / "memflow"  # today's layout: the engine's files straight in the index directory
    before = EdgeStore(old, DIM)
    before.ensure()
    before.put(memories(3, "alice"), units(3))
    before.close()

    index = catalog.current()
    assert index is not None and index.dim == DIM and catalog.names() == ["memflow"]
    store = catalog.open(index)
    assert isinstance(store, EdgeStore)  # read as one shard, in place: not migrated
    store.put(memories(2, "bob"), units(2, seed=2))
    assert store.count() == 5 and store.subjects() == ["alice", "bob"]
    assert not (old / "shards.json").exists()
    catalog.close()


def test_the_shard_count_is_the_index_s_not_the_setting_s(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    catalog = EdgeCatalog(tmp_path, "memflow", shards=3)
    index = catalog.create(Identity("test:shards", DIM))
    catalog.switch(index)
    written = memories(4, "carol")
    catalog.open(index).put(written, units(4))
    catalog.close()

    later = EdgeCatalog(tmp_path, "memflow", shards=5)  # the setting changed since
    reopened = later.open(index)
    assert isinstance(reopened, ShardedStore) and len(reopened.parts) == 3
    assert reopened.count("carol") == 4  # routed where it was written
    assert json.loads((tmp_path / index.name / "shards.json").read_text()) == {"shards": 3}
    assert "3 shards (recorded)" in caplog.text
    later.close()


def test_a_new_index_needs_a_shard(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="at least one shard"):
        open_index(tmp_path / "index", DIM, 0)


def test_a_directory_written_before_shards_caught_mid_handover_comes_back_as_itself(tmp_path: Path) -> None:
    old = tmp_path / "memflow__m"
    before = EdgeStore(old, DIM)
    before.put(memories(3, "alice"), units(3))
    before.close()
    old.rename(edge_build.beside(old, edge_build.OLD))  # the handover's first rename, then the crash

    reopened = open_index(old, DIM, 4)
    assert isinstance(reopened, EdgeStore) and reopened.count("alice") == 3
    assert not (old / "shards.json").exists()
    reopened.close()
