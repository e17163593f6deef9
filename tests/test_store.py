"""The store contract, run on both engines: an Edge shard in a tmp dir and the
qdrant-client code path on `QdrantClient(":memory:")`.

Vectors are tiny (dim 8) and hand-made so that every expected cosine is known.
"""

from __future__ import annotations

import json
import math
import shutil
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from qdrant_client import QdrantClient

from memflow.pipeline.models import Dir, Memory, MType, Source, Status, Tier
from memflow.shared.errors import StoreUnavailable
from memflow.shared.settings import Settings
from memflow.shared.storage.edge_shards import ShardedStore, open_index
from memflow.shared.storage.edge_store import EdgeStore
from memflow.shared.storage.server_store import ServerStore
from memflow.shared.storage.store import RRF_K, Identity, MemoryFilter, Query, Store, admits, open_store

DIM = 8
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def axis(i: int) -> list[float]:
    return [1.0 if j == i else 0.0 for j in range(DIM)]


def blend(cos: float) -> list[float]:
    """A unit vector at cosine `cos` from axis(0), in the plane of axes 0 and 1."""
    return [cos, math.sqrt(1 - cos * cos)] + [0.0] * (DIM - 2)


def memory(subject: str = "alice", content: str = "prefers short answers", **fields: Any) -> Memory:
    key = fields.pop("key", "reply.length")
    dir_ = fields.pop("dir", Dir.preferences)
    return Memory(
        id=str(uuid.uuid4()), subject=subject, uri=f"mem://{subject}/{dir_.value}/{key}", dir=dir_,
        mtype=fields.pop("mtype", MType.preference), key=key, content=content, confidence=0.9,
        source=Source.explicit, created_at=T0, updated_at=T0, **fields,
    )


def open_backend(kind: str, tmp_path: Path) -> Store:
    if kind == "edge":
        return EdgeStore(tmp_path / "shard", DIM)
    if kind == "sharded":  # the same contract over several Edge shards, fanned out (shared/storage/edge_shards.py)
        return open_index(tmp_path / "index", DIM, 3)
    return ServerStore(QdrantClient(":memory:"), f"test-{uuid.uuid4().hex[:8]}", DIM)


@pytest.fixture(params=["edge", "sharded", "server"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    opened = open_backend(request.param, tmp_path)
    opened.ensure()
    yield opened
    opened.close()


def ids(found: list[Any]) -> list[str]:
    return [getattr(x, "memory", x).id for x in found]


# -- writing and reading back ------------------------------------------------------


def test_put_then_get_returns_every_field(store: Store) -> None:
    full = memory(
        content="我不喜欢冗长的解释", status=Status.contested, tier=Tier.long_term,
        last_accessed_at=T0 + timedelta(days=1), access_count=3, strength=0.42, pinned=True,
        expires_at=datetime(2026, 4, 1, 8, 0, tzinfo=timezone(timedelta(hours=8))),
        valid_from=T0, version=2, rev=5, supersedes=str(uuid.uuid4()), conflicts_with=[str(uuid.uuid4())],
        source_event_ids=["e1", "e2"], session_ids=["s1"], evidence="“别啰嗦”", tag_version=3,
        external_ref="ticket-9",
    )
    store.put([full], [axis(0)])
    assert store.get(MemoryFilter("alice")) == [full]


def test_same_id_twice_is_one_point(store: Store) -> None:
    first = memory()
    second = first.model_copy(update={"content": "prefers very short answers"})
    store.put([first], [axis(0)])
    store.put([second], [axis(1)])
    assert store.count("alice") == 1
    assert store.get(MemoryFilter("alice")) == [second]


def test_subjects_lists_each_subject_once(store: Store) -> None:
    assert store.subjects() == []
    store.put([memory("bob"), memory("alice"), memory("alice", "likes tea"), memory("a/../b")],
              [axis(0), axis(1), axis(2), axis(3)])
    assert store.subjects() == ["a/../b", "alice", "bob"]


def test_put_refuses_mismatched_vectors(store: Store) -> None:
    with pytest.raises(ValueError):
        store.put([memory(), memory()], [axis(0)])


# -- filters -------------------------------------------------------------------------


def test_subject_never_sees_another_subject(store: Store) -> None:
    mine, theirs = memory("bob", "冗长的解释"), memory("alice", "冗长的解释")
    store.put([mine, theirs], [axis(0), axis(0)])
    assert ids(store.get(MemoryFilter("bob"))) == [mine.id]
    for mode in ("dense", "sparse", "hybrid"):
        hits = store.query(MemoryFilter("bob"), mode=mode, limit=10, dense=axis(0), text="冗长")
        assert ids(hits) == [mine.id], mode


def test_filters_on_status_dir_mtype_key_and_ids(store: Store) -> None:
    live = memory(key="reply.length")
    old = memory(key="reply.length", status=Status.superseded)
    city = memory(key="city", dir=Dir.entities, mtype=MType.fact, content="lives in Shanghai")
    store.put([live, old, city], [axis(0), axis(1), axis(2)])

    def found(**constraints: Any) -> set[str]:
        return set(ids(store.get(MemoryFilter("alice", **constraints))))

    assert found(statuses=[Status.active]) == {live.id, city.id}
    assert found(dirs=[Dir.entities]) == {city.id}
    assert found(mtypes=[MType.preference], statuses=[Status.superseded]) == {old.id}
    assert found(keys=["reply.length"]) == {live.id, old.id}
    assert found(ids=[city.id, old.id]) == {city.id, old.id}
    assert found(dirs=[]) == set()  # an empty constraint matches nothing, not everything


def test_filters_on_the_events_a_memory_was_read_from_and_its_index_exists(store: Store) -> None:
    """What resolve asks to recognise a replay: the memories read from any of a candidate's events, in any status."""
    merged = memory(source_event_ids=["e1", "e2"], status=Status.superseded)
    other = memory(content="likes tea", source_event_ids=["e3"])
    store.put([merged, other], [axis(0), axis(1)])
    assert set(ids(store.get(MemoryFilter("alice", sources=["e2"])))) == {merged.id}
    assert set(ids(store.get(MemoryFilter("alice", sources=["e2", "e3"])))) == {merged.id, other.id}
    assert ids(store.get(MemoryFilter("bob", sources=["e2"]))) == []
    hits = store.query(MemoryFilter("alice", sources=["e2"]), mode="dense", limit=5, dense=axis(1))
    assert ids(hits) == [merged.id]
    assert admits(MemoryFilter("alice", sources=["e2"]), merged) and not admits(MemoryFilter("alice", sources=["e2"]),
                                                                               other)


def test_get_reads_past_one_page(store: Store) -> None:
    many = [memory(content=f"fact {i}") for i in range(600)]  # the adapters page by 512
    store.put(many, [axis(i % DIM) for i in range(600)])
    assert len(store.get(MemoryFilter("alice"))) == 600


# -- searching -------------------------------------------------------------------------


def test_dense_ranks_nearest_first_with_cosine(store: Store) -> None:
    far, near, nearest = memory(content="far"), memory(content="near"), memory(content="nearest")
    store.put([far, near, nearest], [blend(0.1), blend(0.8), blend(1.0)])
    hits = store.query(MemoryFilter("alice"), mode="dense", limit=2, dense=axis(0))
    assert ids(hits) == [nearest.id, near.id]
    assert [h.score for h in hits] == pytest.approx([1.0, 0.8], abs=1e-4)


def test_sparse_finds_chinese_memory_by_one_word(store: Store) -> None:
    wanted = memory(content="我不喜欢冗长的解释")
    store.put([wanted, memory(content="用户住在上海"), memory(content="prefers tea")], [axis(0)] * 3)
    hits = store.query(MemoryFilter("alice"), mode="sparse", limit=5, text="冗长")
    assert ids(hits) == [wanted.id]
    assert hits[0].score > 0


def test_hybrid_fuses_both_lists_by_rrf(store: Store) -> None:
    both = memory(content="用户每天早上都要喝一杯咖啡")  # dense best, sparse second
    dense_only = memory(content="用户住在上海")
    sparse_only = memory(content="咖啡要加燕麦奶")  # shorter, so BM25 ranks it first; dense last
    store.put([both, dense_only, memory(content="用户养了一只猫"), sparse_only],
              [blend(1.0), blend(0.8), blend(0.6), blend(0.0)])
    flt, query = MemoryFilter("alice"), {"limit": 3, "dense": axis(0), "text": "咖啡"}
    dense = ids(store.query(flt, mode="dense", **query))
    sparse = ids(store.query(flt, mode="sparse", **query))
    assert sparse_only.id not in dense  # so finding it below takes the sparse list
    expected = {i: sum(1 / (rank.index(i) + RRF_K) for rank in (dense, sparse) if i in rank)
                for i in set(dense) | set(sparse)}
    hits = store.query(flt, mode="hybrid", **query)
    assert ids(hits) == [both.id, sparse_only.id, dense_only.id]
    assert [h.score for h in hits] == pytest.approx([expected[h.memory.id] for h in hits])


def test_query_refuses_a_mode_without_its_input(store: Store) -> None:
    with pytest.raises(ValueError):
        store.query(MemoryFilter("alice"), mode="hybrid", limit=3, dense=axis(0))
    with pytest.raises(ValueError):
        store.query(MemoryFilter("alice"), mode="dense", limit=3, text="冗长")


def test_query_many_answers_each_query_as_query_does(store: Store) -> None:
    """A batch is one engine call; each of its answers is what `query` alone returns, in order."""
    coffee = memory(content="用户每天早上都要喝一杯咖啡", dir=Dir.general)
    milk = memory(content="咖啡要加燕麦奶")
    city = memory(content="用户住在上海", status=Status.superseded)
    store.put([coffee, milk, city, memory("bob", "咖啡")], [blend(1.0), blend(0.0), blend(0.8), blend(1.0)])
    asked = [Query(MemoryFilter("alice"), "dense", 3, dense=axis(0)),
             Query(MemoryFilter("alice", dirs=[Dir.preferences]), "sparse", 3, text="咖啡"),
             Query(MemoryFilter("alice", statuses=[Status.active]), "hybrid", 3, dense=axis(0), text="燕麦"),
             Query(MemoryFilter("carol"), "dense", 3, dense=axis(0))]
    answers = store.query_many(asked)
    alone = [store.query(q.flt, mode=q.mode, limit=q.limit, dense=q.dense, text=q.text) for q in asked]
    assert [ids(a) for a in answers] == [ids(a) for a in alone]
    assert [[h.score for h in a] for a in answers] == [pytest.approx([h.score for h in a]) for a in alone]
    assert [ids(a) for a in answers][:3] == [[coffee.id, city.id, milk.id], [milk.id], [milk.id, coffee.id]]
    assert answers[0][0].memory == coffee and store.query_many([]) == []
    with pytest.raises(ValueError):
        store.query_many([Query(MemoryFilter("alice"), "hybrid", 3, dense=axis(0))])


# -- changing and removing -------------------------------------------------------------


def test_set_fields_changes_payload_and_keeps_vectors(store: Store) -> None:
    old = memory(content="我不喜欢冗长的解释")
    store.put([old], [axis(3)])
    store.set_fields("alice", old.id, {"status": Status.superseded, "superseded_by": "x", "rev": 2,
                              "last_accessed_at": "2026-03-03T10:00:00+00:00"})
    [changed] = store.get(MemoryFilter("alice"))
    assert changed == old.model_copy(update={
        "status": Status.superseded, "superseded_by": "x", "rev": 2,
        "last_accessed_at": datetime(2026, 3, 3, 10, 0, tzinfo=UTC)})
    [dense_hit] = store.query(MemoryFilter("alice"), mode="dense", limit=1, dense=axis(3))
    assert dense_hit.score == pytest.approx(1.0, abs=1e-4)
    assert ids(store.query(MemoryFilter("alice"), mode="sparse", limit=1, text="冗长")) == [old.id]


def test_a_patched_context_is_what_keyword_search_matches(store: Store) -> None:
    """A record is keyword-indexed with the turns beside it; a turn taken out of its context (forgotten, or
    superseded) must stop matching, and the words put in must match: the keyword vector follows the payload."""
    record = memory(content="Sounds fun!", context="I live in Lyon\nI play squash on Thursdays", mtype=MType.episode)
    store.put([record], [axis(2)])
    assert ids(store.query(MemoryFilter("alice"), mode="sparse", limit=1, text="Lyon")) == [record.id]
    store.set_fields("alice", record.id, {"context": "I play squash on Thursdays", "rev": 2}, if_rev=1)
    assert store.query(MemoryFilter("alice"), mode="sparse", limit=1, text="Lyon") == []
    assert ids(store.query(MemoryFilter("alice"), mode="sparse", limit=1, text="squash")) == [record.id]
    [dense_hit] = store.query(MemoryFilter("alice"), mode="dense", limit=1, dense=axis(2))  # the meaning stays
    assert dense_hit.score == pytest.approx(1.0, abs=1e-4)


def test_set_fields_refuses_what_would_break_the_payload(store: Store) -> None:
    kept = memory()
    store.put([kept], [axis(0)])
    for bad in ({"colour": "red"}, {"subject": "bob"}, {"status": "gone"}, {"confidence": 2.0}):
        with pytest.raises(ValueError):
            store.set_fields("alice", kept.id, bad)
    assert store.get(MemoryFilter("alice")) == [kept]


def test_set_fields_on_a_missing_point_is_a_key_error(store: Store) -> None:
    with pytest.raises(KeyError):
        store.set_fields("alice", str(uuid.uuid4()), {"rev": 2})


def test_an_id_another_subject_holds_is_never_reached_through_a_write_naming_this_subject(store: Store) -> None:
    """Issue 38: a point is addressed by subject and id everywhere. Another subject's point under the same id is
    neither replaced by a put (plain or insert-only), nor patched, deleted or read (vectors) through a call that
    names this subject; where the engine keeps both (two shards), each call reaches its own subject's alone."""
    for victim, planter in (("alice", "mallory"), ("mallory", "alice")):
        theirs = memory(victim, f"{victim}'s own words", key=f"k.{planter}")
        store.put([theirs], [axis(0)])
        planted = memory(planter, "planted words", key=f"k.{planter}").model_copy(update={"id": theirs.id})
        store.put([planted], [axis(1)])
        store.put([planted], [axis(1)], new_only=True)
        held = store.get(MemoryFilter(planter, ids=[theirs.id]))
        assert held in ([], [planted])  # one point per id in a shard: the victim's stays; two shards: both
        if not held:
            with pytest.raises(KeyError):
                store.set_fields(planter, theirs.id, {"content": "patched"})
            assert store.vectors(planter, [theirs.id]) == {}  # type: ignore[attr-defined]
        store.set_fields(planter, theirs.id, {"content": "patched at rev 1"}, if_rev=1)
        store.delete(planter, [theirs.id])
        assert store.get(MemoryFilter(victim)) == [theirs]
        [kept] = store.vectors(victim, [theirs.id]).values()  # type: ignore[attr-defined]
        assert kept == pytest.approx(axis(0))
        assert store.get(MemoryFilter(planter, ids=[theirs.id])) == []
        store.delete(victim, [theirs.id])


def test_delete_removes_points(store: Store) -> None:
    gone, kept = memory(), memory()
    store.put([gone, kept], [axis(0), axis(1)])
    store.delete("alice", [gone.id])
    store.delete("alice", [])
    assert ids(store.get(MemoryFilter("alice"))) == [kept.id]
    assert ids(store.query(MemoryFilter("alice"), mode="dense", limit=5, dense=axis(0))) == [kept.id]


def test_count_per_subject_and_in_all(store: Store) -> None:
    store.put([memory("alice"), memory("alice"), memory("bob")], [axis(0)] * 3)
    assert (store.count("alice"), store.count("bob"), store.count("carol"), store.count()) == (2, 1, 0, 3)


# -- engine-specific ---------------------------------------------------------------------


def test_edge_shard_keeps_data_after_reopen(tmp_path: Path) -> None:
    kept = memory(content="我不喜欢冗长的解释")
    first = EdgeStore(tmp_path / "shard", DIM)
    first.ensure()
    first.put([kept], [axis(0)])
    first.close()
    first.close()  # a second close is harmless
    again = EdgeStore(tmp_path / "shard", DIM)
    again.ensure()
    assert again.get(MemoryFilter("alice")) == [kept]
    hits = again.query(MemoryFilter("alice"), mode="hybrid", limit=1, dense=axis(0), text="冗长")
    assert ids(hits) == [kept.id]
    again.close()


def test_edge_refuses_a_shard_of_another_dimension(tmp_path: Path) -> None:
    EdgeStore(tmp_path / "shard", DIM).close()
    with pytest.raises(ValueError, match="expected vector size"):
        EdgeStore(tmp_path / "shard", DIM * 2)


def test_edge_disk_failure_is_store_unavailable(tmp_path: Path) -> None:
    shard = EdgeStore(tmp_path / "shard", DIM)
    shard.put([memory()], [axis(0)])
    shutil.rmtree(tmp_path / "shard")  # the segment files vanish under the engine
    with pytest.raises(StoreUnavailable):
        shard.close()


def test_unreachable_server_is_store_unavailable() -> None:
    client = QdrantClient(url="http://127.0.0.1:1", timeout=1)  # nothing listens on port 1
    with pytest.raises(StoreUnavailable):
        ServerStore(client, "memflow", DIM).count()


def test_open_store_without_a_url_is_edge_shards(tmp_path: Path) -> None:
    settings = Settings(qdrant_url=None, data_dir=tmp_path, collection="c1", edge_shards=3)
    opened = open_store(settings, Identity("test:axes", DIM))
    try:
        assert isinstance(opened, ShardedStore) and len(opened.parts) == 3
        record = json.loads((tmp_path / "qdrant" / "c1.json").read_text())
        assert record["model_id"] == "test:axes" and record["dim"] == DIM
        index = tmp_path / "qdrant" / record["index"]
        assert json.loads((index / "shards.json").read_text()) == {"shards": 3}
        assert all((index / f"part-{k:02d}" / "edge_config.json").exists() for k in range(3))
    finally:
        opened.close()


def test_resolve_sees_every_version_of_a_key_beyond_the_top_k(store: Store) -> None:
    """With more versions of a key than a top-k query returns, the live one and the highest version
    are still among the neighbours (the kill storm's 600 updates of one key found two active memories)."""
    from memflow.pipeline.models import Candidate
    from memflow.workers.resolve import NEIGHBOURS, find_neighbours

    n = NEIGHBOURS + 5
    versions = [memory(content=f"locker is {v}", key="fact.locker", mtype=MType.fact, version=v,
                       status=Status.active if v == 1 else Status.superseded) for v in range(1, n + 1)]
    # The live version is the one least like the newcomer: a top-k query leaves it out.
    store.put(versions, [blend(0.1 if v.status is Status.active else 0.9) for v in versions])
    newcomer = Candidate(subject="alice", mtype=MType.fact, dir=Dir.preferences, key="fact.locker",
                         content="locker is 99", confidence=0.9, source=Source.explicit, source_event_ids=["e99"],
                         ts=T0 + timedelta(days=1))
    found = find_neighbours(store, newcomer, axis(0), threshold=0.7)
    assert {n.memory.version for n in found if n.memory.key == "fact.locker"} == set(range(1, n + 1))



def test_edge_counts_what_changed_until_an_optimize_builds_it(tmp_path: Path) -> None:
    """What the index job asks (workers/jobs.py): points written, patched or removed since the last build; after
    a reopen every point, since this process cannot know which of them an earlier one indexed."""
    shard = EdgeStore(tmp_path / "shard", DIM)
    shard.ensure()
    assert shard.changed_since_optimize() == 0
    kept, gone = memory(), memory()
    shard.put([kept, gone, memory()], [axis(0), axis(1), axis(2)])
    shard.set_fields("alice", kept.id, {"rev": 2})
    shard.delete("alice", [gone.id])
    assert shard.changed_since_optimize() == 5
    assert shard.optimize() in (True, False) and shard.changed_since_optimize() == 0
    assert ids(shard.query(MemoryFilter("alice"), mode="dense", limit=1, dense=axis(0))) == [kept.id]
    shard.close()
    again = EdgeStore(tmp_path / "shard", DIM)
    assert again.changed_since_optimize() == 2
    again.close()


def test_edge_reads_a_point_found_again_once_and_a_changed_one_again(tmp_path: Path) -> None:
    """Searches keep validated payloads by (point id, version): a point found again unchanged is the same
    memory, one written since is read anew, however the write went (patch, put, a reopen)."""
    shard = EdgeStore(tmp_path / "shard", DIM)
    shard.ensure()
    kept, patched = memory(content="咖啡要加燕麦奶"), memory(content="用户住在上海")
    shard.put([kept, patched], [axis(0), blend(0.9)])
    ask = [Query(MemoryFilter("alice"), "dense", 5, dense=axis(0))]
    [first] = shard.query_many(ask)
    shard.set_fields("alice", patched.id, {"content": "用户住在北京", "rev": 2})
    [second] = shard.query_many(ask)
    assert second[0].memory is first[0].memory and second[0].memory == kept
    assert second[1].memory.content == "用户住在北京" and second[1].memory.rev == 2
    shard.put([kept.model_copy(update={"confidence": 0.5})], [axis(0)])
    [third] = shard.query_many(ask)
    assert third[0].memory.confidence == 0.5
    shard.close()
