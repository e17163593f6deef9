"""The store over a Qdrant Edge shard: the real Qdrant engine, in this process, on disk.

Durability. `put`, `set_fields` and `delete` return once the operation is in the
shard's write-ahead log, which lives in memory-mapped files. That survives the process
dying at any instant, so a Redis message acknowledged after `put` returns is never
lost to a crash or `kill -9`. Checked: a writer killed with SIGKILL right after its
acknowledgements, five times at random points (6045 acknowledged upserts, each followed
by a set_payload); after reopening every one was there with its patched payload. It
does not cover an OS crash or power loss before the kernel writes those pages back;
`flush()` would (fsync of segments), but it costs ~6 ms against ~0.05 ms per upsert, so
it runs only in `close()`.

Threads. One EdgeStore may be shared by the threads of one process (resolve, upsert,
query) with no lock of ours: the binding (PyO3 0.29) requires the shard to be Sync,
and its calls hold the GIL for their whole duration (measured for query, scroll and
optimize), so they run one at a time.
Stress-tested with 4 writer and 4 reader threads (8000 upserts with patches, 24000
fused queries, scrolls and counts): no error, no lost point. The flip side: a long call
stalls every Python thread of the process.

Indexes. The engine builds a segment's HNSW graph only in `optimize()`; until then its
points are searched by brute force, which grows with the subject (measured on a busy
2-core machine: a dense query filtered to one subject of 100k points took ~100 ms, ~7 ms
once indexed). The engine's `optimize()` holds the GIL for the whole build (a 5 ms ticker
thread stalled for all of the 22 s an optimize of 20k 768-dim points took), so no search
ever calls it, and neither does this process: `EdgeStore.optimize` (the `index` job,
workers/jobs.py) builds a copy of the shard in a child process and hands the result over
(shared/storage/edge_build.py), and the threads of this process wait only for the copy (writes)
and the handover's load (everyone: ~0.25 s at 20k points).

One process per shard: a second `EdgeShard.load` of the same directory fails on the
WAL lock.

An index is N of these shards keyed by subject hash (shared/storage/edge_shards.py, which also holds `EdgeCatalog`);
one EdgeStore is one shard, and a directory written before shards is one EdgeStore.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import qdrant_edge as qe

from memflow.pipeline.models import Memory
from memflow.shared.errors import StoreUnavailable
from memflow.shared.storage import edge_build, sparse
from memflow.shared.storage.store import (
    DENSE,
    INDEXED_FIELDS,
    KEYWORD_FIELDS,
    MAX_SUBJECTS,
    RRF_K,
    SPARSE,
    MemoryFilter,
    Query,
    Scored,
    SearchMode,
    match_terms,
    patch_payload,
    require_inputs,
)

log = logging.getLogger(__name__)

_PAGE = 512
# A read in steps (`get(between=...)`: a maintenance job's) scrolls this many points at a time: the scroll, the
# payloads read out of the engine and validated hold the interpreter lock ~19 ms per 512 points (measured at 20k
# memories), which a search arriving waited on; ~5 ms per 128. The reads of a search keep _PAGE.
STEP_PAGE = 128
# Each step of an index build, logged at DEBUG as it ends (`memflow bench jobs` matches slow searches to them).
STEP_LOG = "index build of %s: %s took %.3f s"
# Validated payloads kept for searches (`_Recent`): a few hundred subjects' worth of hits, some MB.
RECENT_PAYLOADS = 8192
# The engine raises bare `Exception` carrying Qdrant's error text, so the text is all
# there is to tell a passing fault (disk, lock, memory, time) from a bug in the call.
_TRANSIENT = ("IO Error", "io error", "os error", "Timeout error", "Out of memory", "WouldBlock")
_MISSING_POINT = "No point with id"
_INCOMPATIBLE = "config is incompatible"
# The engine's own description of a shard, written when it is created.
EDGE_CONFIG = "edge_config.json"


class EdgeStore:
    """`Store` on an EdgeShard in `path` (created on first use, reopened after)."""

    def __init__(self, path: Path, dim: int) -> None:
        self._closed, self._path, self._config = False, path, _config(dim)
        edge_build.recover(path)  # an index build a crash interrupted
        with _engine_errors(f"open {path}"):
            self._shard = _open(path, self._config)
            # What this process wrote is all it knows of: after a start, every point may be unindexed.
            self._changed = self._shard.info().points_count
        self._counting = threading.Lock()
        # Every write holds it; an index build too, while it copies the shard and while it hands the new one over.
        self._writing = threading.Lock()
        # The writes since the copy an index build is building, replayed on its result before it serves.
        self._journal: list[qe.UpdateOperation] | None = None
        self._readers = _Readers()
        self._recent = _Recent()

    def ensure(self) -> None:
        with self._readers.reading(), _engine_errors("read shard info"):
            existing = self._shard.info().payload_schema
        for name in INDEXED_FIELDS:
            if name not in existing:
                self._update(qe.UpdateOperation.create_field_index(name, _index_schema(name)))

    def put(self, memories: Sequence[Memory], vectors: Sequence[Sequence[float]], *, new_only: bool = False) -> None:
        """Upsert whole points (`new_only`: insert only). Durable against a process crash once it returns. A point
        of another subject under the same id is left as it is (the engine's conditional upsert: only a point of
        the memory's own subject is replaced), so no write crosses tenants whatever id it carries."""
        by_subject: dict[str, list[qe.Point]] = {}
        for m, v in zip(memories, vectors, strict=True):
            by_subject.setdefault(m.subject, []).append(_point(m, v))
        for subject, points in by_subject.items():
            mode = qe.UpdateMode.InsertOnly if new_only else None
            owned = qe.Filter(must=[_subject(subject)])
            self._update(qe.UpdateOperation.upsert_points(points, condition=owned, update_mode=mode))
            self._count(len(points))

    def set_fields(self, subject: str, memory_id: str, fields: dict[str, Any], *, if_rev: int | None = None) -> None:
        """Overwrite some payload fields of `subject`'s point, keeping the vectors. KeyError if the subject has no
        such point (unconditional writes only: a conditional one that finds no point at `if_rev` writes
        nothing). Either way the engine writes only where the point's subject is `subject`."""
        payload = patch_payload(fields)
        if if_rev is None and memory_id not in self._owned(subject, [memory_id]):
            raise KeyError(f"{_MISSING_POINT} {memory_id} of {subject}")
        rev = [] if if_rev is None else [qe.FieldCondition("rev", match=qe.MatchValue(if_rev))]
        target = qe.Filter(must=[_subject(subject), qe.HasIdCondition({memory_id}), *rev])
        self._update(qe.UpdateOperation.set_payload_by_filter(target, payload))
        self._count(1)  # a point patched in an indexed segment moves to the appendable one
        if KEYWORD_FIELDS & fields.keys():
            for memory in self.get(MemoryFilter(subject, ids=[memory_id])):
                indices, values = sparse.embed_document(sparse.indexed_text(memory))  # as `_point` makes it
                vectors = qe.PointVectors(memory_id, {SPARSE: qe.SparseVector(indices, values)})
                self._update(qe.UpdateOperation.update_vectors([vectors]))

    def get(self, flt: MemoryFilter, *, between: Callable[[], object] | None = None) -> list[Memory]:
        found: list[Memory] = []
        engine_filter = _filter(flt)
        offset: Any = None
        page = _PAGE if between is None else STEP_PAGE
        while True:
            request = qe.ScrollRequest(offset=offset, limit=page, filter=engine_filter, with_payload=True)
            with self._readers.reading(), _engine_errors("scroll"):
                records, offset = self._shard.scroll(request)
            found.extend(Memory.model_validate(r.payload) for r in records)
            if offset is None:
                return found
            if between is not None:
                between()

    def query(
        self, flt: MemoryFilter, *, mode: SearchMode, limit: int,
        dense: Sequence[float] | None = None, text: str | None = None,
    ) -> list[Scored]:
        """Best first. Scores: cosine ("dense"), BM25 with IDF ("sparse"), RRF ("hybrid")."""
        require_inputs(mode, dense, text)
        with self._readers.reading(), _engine_errors("query"):
            points = self._shard.query(_request(_filter(flt), mode, limit, dense, text))
        return [Scored(Memory.model_validate(p.payload), p.score) for p in points]

    def query_many(self, queries: Sequence[Query]) -> list[list[Scored]]:
        """Each query's `query` answer, in order, from one `query_batch` of the engine."""
        for q in queries:
            require_inputs(q.mode, q.dense, q.text)
        if not queries:
            return []
        batch = qe.QueryBatchRequest([_request(_filter(q.flt), q.mode, q.limit, q.dense, q.text) for q in queries])
        with self._readers.reading(), _engine_errors("query"):
            answers = self._shard.query_batch(batch)
        return [[Scored(self._recent.memory(p), p.score) for p in points] for points in answers]

    def delete(self, subject: str, memory_ids: Sequence[str]) -> None:
        """Remove `subject`'s points of these ids; a point of another subject under one of them stays."""
        if memory_ids:
            owned = qe.Filter(must=[_subject(subject), qe.HasIdCondition(set(memory_ids))])
            self._update(qe.UpdateOperation.delete_points_by_filter(owned))
            self._count(len(memory_ids))

    def count(self, subject: str | None = None) -> int:
        flt = None if subject is None else qe.Filter(must=[_subject(subject)])
        with self._readers.reading(), _engine_errors("count"):
            return self._shard.count(qe.CountRequest(exact=True, filter=flt))

    def page(self, offset: str | None, limit: int) -> tuple[list[Memory], str | None]:
        request = qe.ScrollRequest(offset=offset, limit=limit, with_payload=True)
        with self._readers.reading(), _engine_errors("scroll"):
            records, after = self._shard.scroll(request)
        return [Memory.model_validate(r.payload) for r in records], None if after is None else str(after)

    def subjects(self) -> list[str]:
        with self._readers.reading(), _engine_errors("facet"):
            found = self._shard.facet(qe.FacetRequest("subject", limit=MAX_SUBJECTS, exact=True))
        return sorted(str(hit.value) for hit in found.hits)

    def changed_since_optimize(self) -> int:
        return self._changed

    def vectors(self, subject: str, memory_ids: Sequence[str]) -> dict[str, list[float]]:
        """The dense vector of each of `memory_ids` that is a point of `subject`, as stored (cosine: normalised)."""
        return {str(r.id): _dense_of(r.vector) for r in self._retrieve(subject, memory_ids, with_vectors=True)}

    def _owned(self, subject: str, memory_ids: Sequence[str]) -> set[str]:
        return {str(r.id) for r in self._retrieve(subject, memory_ids, with_vectors=False)}

    def _retrieve(self, subject: str, memory_ids: Sequence[str], *, with_vectors: bool) -> list[qe.Record]:
        """The points of these ids that are `subject`'s: retrieved by id, kept by the subject their payload names."""
        if not memory_ids:
            return []
        with self._readers.reading(), _engine_errors("retrieve"):
            records = self._shard.retrieve(list(dict.fromkeys(memory_ids)), True, with_vectors)
        return [r for r in records if isinstance(r.payload, dict) and r.payload.get("subject") == subject]

    def page_records(self, offset: str | None, limit: int) -> list[Memory]:
        """`page` without its next offset: up to `limit` points in id order from `offset`."""
        request = qe.ScrollRequest(offset=offset, limit=limit, with_payload=True)
        with self._readers.reading(), _engine_errors("scroll"):
            records, _ = self._shard.scroll(request)
        return [Memory.model_validate(r.payload) for r in records]

    def optimize(self, between: Callable[[], object] | None = None) -> bool:
        """Build what the engine's optimizer plans (HNSW graphs, merges, vacuum) in a process of its own, and
        serve the result; True if anything changed. Writes wait while the shard is copied and while the result
        is handed over; searches only for its load and the old shard's close, each of which holds the interpreter
        lock: `between` is called before each (a job steps aside there for the searches in flight)."""
        with self._counting:
            changed, self._changed = self._changed, 0
        try:
            return self._build_elsewhere(between or _nothing)
        except BaseException:
            self._count(changed)  # not built: still to do
            raise

    def flush(self) -> None:
        """Write every segment to disk (fsync): what `close` does, for a point that must survive power loss."""
        with self._writing, _engine_errors("flush"):  # never while an index build copies the shard
            self._shard.flush()

    def close(self) -> None:
        """Flush segments to disk and release the directory lock. Safe to call twice."""
        with self._writing:
            if self._closed:
                return
            with _engine_errors("close"):
                try:
                    self._shard.flush()
                finally:
                    self._closed = True
                    self._shard.close()

    def _update(self, operation: qe.UpdateOperation) -> None:
        with self._writing:
            with _engine_errors("update"):
                self._shard.update(operation)
            if self._journal is not None:  # an index build is building a copy: its result gets this write too
                self._journal.append(operation)

    def _build_elsewhere(self, between: Callable[[], object]) -> bool:
        steps = _Steps(self._path.name)
        with self._writing:  # a copy of one instant: no write halfway through it
            built = edge_build.copy(self._path)
            self._journal = []
        steps.done("copy (writes held)")
        try:
            changed = edge_build.build(built)
            steps.done("build (child process)" if changed else "build (child process, nothing to build)")
            if changed:
                self._hand_over(built, between, steps)
                log.info("index build of %s: %s", self._path.name, steps)
            return changed
        finally:
            with self._writing:
                self._journal = None
            edge_build.recover(self._path)  # a build that failed or found nothing to build: its copy
            steps.done("drop the copy")

    def _hand_over(self, built: Path, between: Callable[[], object], steps: _Steps) -> None:
        """Serve the built shard, with every write made since its copy (shared/storage/edge_build.py, step 3)."""
        edge_build.warm(built)
        steps.done("warm the page cache")
        between()
        steps.done("step aside")
        with self._writing:
            edge_build.swap_in(self._path, built)
            fresh = self._caught_up(self._journal or [])
            retired = edge_build.commit(self._path)
            with self._readers.alone():
                old, self._shard, self._recent = self._shard, fresh, _Recent()  # point versions start anew
        steps.done("load and replay (lock held)")
        edge_build.write_back(retired)
        steps.done("write back the retired shard")
        between()
        steps.done("step aside")
        with _engine_errors("close the retired shard"):
            old.close()
        steps.done("close (lock held)")
        shutil.rmtree(retired, ignore_errors=True)

    def _caught_up(self, journal: Sequence[qe.UpdateOperation]) -> qe.EdgeShard:
        """The built shard, loaded where the shard lives, with the journal replayed; on any failure the old
        shard is put back (`recover`) and the build dropped."""
        try:
            with _engine_errors("load the built shard"):
                fresh = _open(self._path, self._config)
        except BaseException:
            edge_build.recover(self._path)
            raise
        try:
            with _engine_errors("replay the writes made during the build"):
                for operation in journal:
                    fresh.update(operation)
        except BaseException:
            fresh.close()
            edge_build.recover(self._path)
            raise
        return fresh

    def _count(self, points: int) -> None:
        with self._counting:  # writers of several threads
            self._changed += points


class _Steps:
    """How long each step of an index build took, logged once it is served: the per-shard rates that size the
    stalls a handover puts on searches (bench/RESULTS.md, "Jobs beside searches")."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._took: list[str] = []
        self.restart()

    def restart(self) -> None:
        self._since = time.perf_counter()

    def done(self, step: str) -> None:
        took = time.perf_counter() - self._since
        self._took.append(f"{step} {took:.3f} s")
        log.debug(STEP_LOG, self._name, step, took)
        self.restart()

    def __str__(self) -> str:
        return ", ".join(self._took)


def _nothing() -> None:
    return None


def _config(dim: int) -> qe.EdgeConfig:
    return qe.EdgeConfig(
        vectors={DENSE: qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine)},
        sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
    )


def _open(path: Path, config: qe.EdgeConfig) -> qe.EdgeShard:
    # Loading with the config makes a shard built for another dimension fail loudly.
    if (path / EDGE_CONFIG).exists():
        return qe.EdgeShard.load(str(path), config)
    return qe.EdgeShard.create(str(path), config)


def _index_schema(name: str) -> qe.PayloadSchemaType | qe.KeywordIndexParams:
    # Every query filters on subject: as a tenant key the engine keeps each subject's
    # points together, so a filtered search reads one subject's data, not everyone's.
    return qe.KeywordIndexParams(is_tenant=True) if name == "subject" else qe.PayloadSchemaType.Keyword


def _dense_of(vector: object) -> list[float]:
    """The dense part of a retrieved point's vectors (named: a dict of them)."""
    if not isinstance(vector, dict) or not isinstance(vector.get(DENSE), list):
        raise StoreUnavailable(f"the engine returned no {DENSE} vector for a point")
    return [float(x) for x in vector[DENSE]]


def _point(memory: Memory, vector: Sequence[float]) -> qe.Point:
    indices, values = sparse.embed_document(sparse.indexed_text(memory))
    vectors: dict[str, list[float] | qe.SparseVector | list[list[float]]] = {
        DENSE: list(vector), SPARSE: qe.SparseVector(indices, values)}
    return qe.Point(memory.id, vectors, memory.model_dump(mode="json"))


class _Readers:
    """The reads in flight, so that a shard handed over (`EdgeStore._hand_over`) is closed only once no read uses
    it: a read takes the shard inside `reading`, the swap happens inside `alone` (new reads wait that long)."""

    def __init__(self) -> None:
        self._changed = threading.Condition()
        self._reads = 0

    @contextmanager
    def reading(self) -> Iterator[None]:
        with self._changed:
            self._reads += 1
        try:
            yield
        finally:
            with self._changed:
                self._reads -= 1
                if self._reads == 0:
                    self._changed.notify_all()

    @contextmanager
    def alone(self) -> Iterator[None]:
        with self._changed:
            self._changed.wait_for(lambda: self._reads == 0)
            yield


class _Recent:
    """The payloads of points searches found lately, validated, by (point id, version). The engine gives a point
    a new version with every write to it, so a payload found again under the same version is the one validated
    before: the hits of one subject come back search after search, and validating a payload (and reading it out
    of the engine) is most of what reading a hit costs. The memories are shared: nothing may change them."""

    def __init__(self, size: int = RECENT_PAYLOADS) -> None:
        self._found: OrderedDict[tuple[str, int], Memory] = OrderedDict()
        self._size = size
        self._lock = threading.Lock()  # searches of several threads

    def memory(self, point: qe.ScoredPoint) -> Memory:
        key = (str(point.id), point.version)
        with self._lock:
            found = self._found.get(key)
            if found is not None:
                self._found.move_to_end(key)
                return found
        found = Memory.model_validate(point.payload)
        with self._lock:
            self._found[key] = found
            if len(self._found) > self._size:
                self._found.popitem(last=False)
        return found


def _subject(subject: str) -> qe.FieldCondition:
    return qe.FieldCondition("subject", match=qe.MatchValue(subject))


def _filter(flt: MemoryFilter) -> qe.Filter:
    must: list[Any] = [_subject(flt.subject)]
    must += [qe.FieldCondition(name, match=qe.MatchAny(values)) for name, values in match_terms(flt).items()]
    if flt.ids is not None:
        must.append(qe.HasIdCondition(set(flt.ids)))
    return qe.Filter(must=must)


def _request(
    flt: qe.Filter, mode: SearchMode, limit: int, dense: Sequence[float] | None, text: str | None
) -> qe.QueryRequest:
    if mode == "dense":
        return qe.QueryRequest(limit=limit, query=_nearest_dense(dense), filter=flt, with_payload=True)
    if mode == "sparse":
        return qe.QueryRequest(limit=limit, query=_nearest_sparse(text), filter=flt, with_payload=True)
    prefetches = [
        qe.Prefetch(limit=limit, query=_nearest_dense(dense), filter=flt),
        qe.Prefetch(limit=limit, query=_nearest_sparse(text), filter=flt),
    ]
    fused = qe.Fusion.Rrf(k=RRF_K)
    # The stub types Fusion's variants apart from Fusion itself; the engine takes them.
    return qe.QueryRequest(limit=limit, prefetches=prefetches, query=fused, with_payload=True)  # type: ignore[arg-type]


def _nearest_dense(dense: Sequence[float] | None) -> qe.Query:
    assert dense is not None  # checked by require_inputs
    return qe.Query.Nearest(list(dense), using=DENSE)


def _nearest_sparse(text: str | None) -> qe.Query:
    assert text is not None  # checked by require_inputs
    indices, values = sparse.embed_query(text)
    return qe.Query.Nearest(qe.SparseVector(indices, values), using=SPARSE)


@contextmanager
def _engine_errors(action: str) -> Iterator[None]:
    """Passing faults become StoreUnavailable; the rest surfaces, some as a plainer type."""
    try:
        yield
    except OSError as exc:
        raise StoreUnavailable(f"edge shard: {action}: {exc}") from exc
    except Exception as exc:
        if type(exc) is not Exception:  # ValueError, TypeError...: a bug in the call
            raise
        raise _translate(action, str(exc)) from exc


def _translate(action: str, message: str) -> Exception:
    if any(marker in message for marker in _TRANSIENT):
        return StoreUnavailable(f"edge shard: {action}: {message}")
    if message.startswith(_MISSING_POINT):
        return KeyError(message)
    if _INCOMPATIBLE in message:  # e.g. reopened with another embedding dimension
        return ValueError(f"edge shard: {action}: {message}")
    return RuntimeError(f"edge shard: {action}: {message}")
