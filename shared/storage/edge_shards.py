"""An index on Qdrant Edge as N shards keyed by subject hash (issue 29: the index build that does not stall searches).

Why. Everything that hands a built shard over holds the interpreter lock or the shard's writes for a time that grows
with the shard: the engine's load of the built shard, the old one's close, the copy the build starts from (at 100k
points, one shard: 0.53 s, ~0.25 s and 3.8 s, bench/RESULTS.md "Jobs beside searches"). With N shards the `index`
job builds and hands over one shard at a time, so each of those steps covers ~1/N of the points, and the copy holds
only the writes of that shard's subjects.

Routing. Every search, `get` and write of a memory names its subject, and a subject lives in exactly one shard
(`shard_of`: a stable hash, not Python's salted `hash`), so it reads or writes one shard. What names no subject fans
out: `count()`, `subjects()`, `changed_since_optimize()` add up or merge; `page` merges the shards' pages in id
order, so its offset is a point id as before (a reindex's saved progress resumes across the change). A write by id
names the point's subject too (`set_fields`, `delete`, `vectors`): it goes to that subject's shard and touches only
a point of that subject there, so an id another subject holds, in any shard, is never reached through it.

Layout and identity. `<index>/shards.json` records the count, `<index>/part-NN/` are the shards. The count is part
of the index: it is read from the record, never from the setting, once the index exists (another count would route
subjects to shards that do not hold them); a different setting is reported and ignored (a new count takes a
reindex into a new index). A directory written before shards (the engine's files straight in `<index>/`) is read as
one shard in place, N=1, with no migration: it keeps working as it did, and its handover stalls as before.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import orjson

from memflow.pipeline.models import Memory
from memflow.shared.storage import edge_build
from memflow.shared.storage.edge_store import EDGE_CONFIG, EdgeStore
from memflow.shared.storage.store import (
    MAX_SUBJECTS,
    Identity,
    Index,
    MemoryFilter,
    Progress,
    Query,
    Scored,
    SearchMode,
    Store,
    index_name,
    is_index_of,
)

log = logging.getLogger(__name__)

SHARDS_RECORD = "shards.json"


def shard_of(subject: str, shards: int) -> int:
    """The shard a subject lives in: stable across processes and versions (blake2b, not `hash`)."""
    digest = hashlib.blake2b(subject.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") % shards


def recorded_shards(path: Path) -> int | None:
    """The shard count of the index in `path`: 1 for a directory written before shards, None if no index."""
    if (path / EDGE_CONFIG).exists():
        return 1
    record = path / SHARDS_RECORD
    if not record.exists():
        return None
    return int(orjson.loads(record.read_bytes())["shards"])


def index_dim(path: Path) -> int:
    """The vector size the index in `path` was made with, from the engine's description of its first shard."""
    first = path if (path / EDGE_CONFIG).exists() else _part(path, 0)
    config = orjson.loads((first / EDGE_CONFIG).read_bytes())
    return int(config["vectors"]["dense"]["size"])


def open_index(path: Path, dim: int, shards: int) -> EdgeStore | ShardedStore:
    """The store of the index in `path`, created with `shards` shards if there is none yet."""
    # A directory written before shards may be mid-handover (renamed to `<index>.old`, the build not yet in its
    # place): put back first, or it would look like no index and get a new one beside the data.
    edge_build.recover(path)
    recorded = recorded_shards(path)
    if recorded is None:
        if shards < 1:
            raise ValueError(f"an index needs at least one shard, not {shards}")
        path.mkdir(parents=True, exist_ok=True)
        write_json(path / SHARDS_RECORD, {"shards": shards})
        recorded = shards
    elif recorded != shards:
        log.warning("index %s has %d shards (recorded); the setting's %d applies to new indexes only "
                    "(a reindex into a new index changes it)", path.name, recorded, shards)
    if (path / EDGE_CONFIG).exists():
        return EdgeStore(path, dim)  # written before shards: one, in place
    return ShardedStore(path, dim, recorded)


def _part(path: Path, k: int) -> Path:
    return path / f"part-{k:02d}"


class ShardedStore:
    """`Store` (and Optimizable) over N `EdgeStore`s, one per part of the subjects (module docstring)."""

    def __init__(self, path: Path, dim: int, shards: int) -> None:
        self.parts: list[EdgeStore] = []
        try:
            for k in range(shards):
                self.parts.append(EdgeStore(_part(path, k), dim))  # each recovers its own interrupted build
        except BaseException:
            self.close()
            raise

    def part_of(self, subject: str) -> EdgeStore:
        return self.parts[shard_of(subject, len(self.parts))]

    def ensure(self) -> None:
        for part in self.parts:
            part.ensure()

    def put(self, memories: Sequence[Memory], vectors: Sequence[Sequence[float]], *, new_only: bool = False) -> None:
        """Each shard's memories in one write of that shard; not atomic across shards: a batch a crash cut is
        written again by its redelivery (an upsert, or an insert that skips what is there)."""
        grouped: dict[int, tuple[list[Memory], list[Sequence[float]]]] = {}
        for memory, vector in zip(memories, vectors, strict=True):
            group = grouped.setdefault(shard_of(memory.subject, len(self.parts)), ([], []))
            group[0].append(memory)
            group[1].append(vector)
        for k, (some, their_vectors) in grouped.items():
            self.parts[k].put(some, their_vectors, new_only=new_only)

    def set_fields(self, subject: str, memory_id: str, fields: dict[str, Any], *, if_rev: int | None = None) -> None:
        self.part_of(subject).set_fields(subject, memory_id, fields, if_rev=if_rev)

    def get(self, flt: MemoryFilter, *, between: Callable[[], object] | None = None) -> list[Memory]:
        return self.part_of(flt.subject).get(flt, between=between)

    def query(
        self, flt: MemoryFilter, *, mode: SearchMode, limit: int,
        dense: Sequence[float] | None = None, text: str | None = None,
    ) -> list[Scored]:
        return self.part_of(flt.subject).query(flt, mode=mode, limit=limit, dense=dense, text=text)

    def query_many(self, queries: Sequence[Query]) -> list[list[Scored]]:
        """One `query_batch` per shard the queries touch (usually one: a request is one subject's)."""
        by_part: dict[int, list[int]] = {}
        for i, q in enumerate(queries):
            by_part.setdefault(shard_of(q.flt.subject, len(self.parts)), []).append(i)
        answers: list[list[Scored]] = [[] for _ in queries]
        for k, positions in by_part.items():
            for i, answer in zip(positions, self.parts[k].query_many([queries[i] for i in positions]), strict=True):
                answers[i] = answer
        return answers

    def delete(self, subject: str, memory_ids: Sequence[str]) -> None:
        self.part_of(subject).delete(subject, memory_ids)

    def count(self, subject: str | None = None) -> int:
        if subject is not None:
            return self.part_of(subject).count(subject)
        return sum(part.count() for part in self.parts)

    def page(self, offset: str | None, limit: int) -> tuple[list[Memory], str | None]:
        """The shards' pages merged in id order (the engine's order of UUID ids is their text's): the first
        `limit` from `offset`, and the id after them as the next offset, as one shard gives it."""
        merged = sorted((m for part in self.parts for m in part.page_records(offset, limit + 1)), key=_id_order)
        page, rest = merged[:limit], merged[limit:]
        return page, rest[0].id if rest else None

    def subjects(self) -> list[str]:
        return sorted({s for part in self.parts for s in part.subjects()})[:MAX_SUBJECTS]

    def changed_since_optimize(self) -> int:
        return sum(part.changed_since_optimize() for part in self.parts)

    def optimize(self, between: Callable[[], object] | None = None) -> bool:
        """Build and hand over one shard at a time, only those written to since their last build: each step that
        holds searches or writes covers one shard's points (EdgeStore.optimize), and `between` runs between the
        shards too (a job steps aside there for the searches in flight)."""
        changed = False
        for part in self.parts:
            if part.changed_since_optimize() == 0:
                continue
            if between is not None:
                between()
            changed = part.optimize(between) or changed
        return changed

    def flush(self) -> None:
        for part in self.parts:
            part.flush()

    def close(self) -> None:
        _each(self.parts, EdgeStore.close)

    def vectors(self, subject: str, memory_ids: Sequence[str]) -> dict[str, list[float]]:
        return self.part_of(subject).vectors(subject, memory_ids)


def _id_order(memory: Memory) -> str:
    return memory.id.lower()


def _each(parts: Sequence[EdgeStore], action: Callable[[EdgeStore], object]) -> None:
    """`action` on every part, even past one that fails; the first failure raised after."""
    failure: BaseException | None = None
    for part in parts:
        try:
            action(part)
        except BaseException as exc:  # noqa: BLE001 - re-raised below, once the others are done
            failure = failure or exc
    if failure is not None:
        raise failure


class EdgeCatalog:
    """The shards of collection `collection` under `root`: `<collection>__<model>/` per model, and
    `<collection>.json` naming the current one, its model and dimension.

    A file, because the engine keeps no metadata of ours and one process owns it (docs/architecture.md#the-store):
    replaced atomically (write, fsync, rename), it is both the record and the switch. A shard made before
    models were recorded is the directory `<collection>/` with no record beside it. A reindex's progress
    is `<index>.reindex.json`, beside its shard.
    """

    def __init__(self, root: Path, collection: str, shards: int = 1) -> None:
        self.collection = collection
        self.shards = shards  # of an index this catalog creates; one that exists keeps its own
        self._root = root
        self._record = root / f"{collection}.json"
        # One EdgeStore per shard in this process: a second load of a directory fails on its lock.
        self._open: dict[str, EdgeStore | ShardedStore] = {}

    def current(self) -> Index | None:
        record = read_json(self._record)
        if record is not None:
            return Index(record["index"], record["dim"], Identity(record["model_id"], record["dim"]))
        unrecorded = self._root / self.collection
        return Index(self.collection, index_dim(unrecorded)) if recorded_shards(unrecorded) else None

    def names(self) -> list[str]:
        shards = self._root.iterdir() if self._root.is_dir() else iter(())
        return sorted(p.name for p in shards if is_index_of(p.name, self.collection) and recorded_shards(p))

    def create(self, identity: Identity) -> Index:
        index = Index(index_name(self.collection, identity), identity.dim, identity)
        self.open(index)
        return index

    def adopt(self, index: Index, identity: Identity) -> Index:
        adopted = Index(index.name, index.dim, identity)
        self.switch(adopted)
        return adopted

    def open(self, index: Index) -> Store:
        if index.name not in self._open:
            store = open_index(self._root / index.name, index.dim, self.shards)
            try:
                store.ensure()
            except BaseException:
                store.close()
                raise
            self._open[index.name] = store
        return self._open[index.name]

    def serve(self, index: Index) -> Store:
        return self.open(index)

    def fence(self, index: Index) -> None:
        """Nothing to fence: the process that reindexes is the shard's only user (one process per shard,
        and `memflow reindex` refuses to run beside the `memflow up` that holds it)."""

    def switch(self, index: Index) -> None:
        assert index.identity is not None, "only a recorded index can be current"
        if index.name in self._open:
            # Its points sit in the write-ahead log's mapped pages: on disk before the record names it,
            # or a power loss could leave the record pointing at an index missing its last pages.
            self._open[index.name].flush()
        write_json(self._record, {"index": index.name, "model_id": index.identity.model_id, "dim": index.dim})

    def drop(self, name: str) -> None:
        store = self._open.pop(name, None)
        if store is not None:
            store.close()
        shutil.rmtree(self._root / name, ignore_errors=True)
        self._progress_path(name).unlink(missing_ok=True)

    def progress(self, index: Index) -> Progress | None:
        saved = read_json(self._progress_path(index.name))
        return None if saved is None else Progress.model_validate(saved)

    def save_progress(self, index: Index, progress: Progress | None) -> None:
        if progress is None:
            self._progress_path(index.name).unlink(missing_ok=True)
        else:
            write_json(self._progress_path(index.name), progress.model_dump())

    def close(self) -> None:
        while self._open:
            self._open.popitem()[1].close()

    def _progress_path(self, name: str) -> Path:
        return self._root / f"{name}.reindex.json"


def read_json(path: Path) -> Any:
    try:
        return orjson.loads(path.read_bytes())
    except FileNotFoundError:
        return None


def write_json(path: Path, value: Any) -> None:
    """Replace `path` atomically and durably: a reader (or a crash) sees the old file or the new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(path.name + ".tmp")
    with open(scratch, "wb") as f:
        f.write(orjson.dumps(value))
        f.flush()
        os.fsync(f.fileno())
    os.replace(scratch, path)
    directory = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(directory)  # the rename itself survives a power loss
    finally:
        os.close(directory)
