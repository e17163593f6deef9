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
stalls every Python thread of the process (`optimize()` held the GIL for 4.5 s on 20k
points), which is why nothing here calls it.

One process per shard: a second `EdgeShard.load` of the same directory fails on the
WAL lock.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import qdrant_edge as qe

from pipeline.models import Memory
from shared import sparse
from shared.errors import StoreUnavailable
from shared.store import (
    DENSE,
    INDEXED_FIELDS,
    MAX_SUBJECTS,
    RRF_K,
    SPARSE,
    MemoryFilter,
    Scored,
    SearchMode,
    match_terms,
    patch_payload,
    require_inputs,
)

_PAGE = 512
# The engine raises bare `Exception` carrying Qdrant's error text, so the text is all
# there is to tell a passing fault (disk, lock, memory, time) from a bug in the call.
_TRANSIENT = ("IO Error", "io error", "os error", "Timeout error", "Out of memory", "WouldBlock")
_MISSING_POINT = "No point with id"
_INCOMPATIBLE = "config is incompatible"


class EdgeStore:
    """`Store` on an EdgeShard in `path` (created on first use, reopened after)."""

    def __init__(self, path: Path, dim: int) -> None:
        self._closed = False
        with _engine_errors(f"open {path}"):
            self._shard = _open(path, _config(dim))

    def ensure(self) -> None:
        with _engine_errors("read shard info"):
            existing = self._shard.info().payload_schema
        for name in INDEXED_FIELDS:
            if name not in existing:
                self._update(qe.UpdateOperation.create_field_index(name, _index_schema(name)))

    def put(self, memories: Sequence[Memory], vectors: Sequence[Sequence[float]]) -> None:
        """Upsert whole points. Durable against a process crash once it returns (see module doc)."""
        points = [_point(m, v) for m, v in zip(memories, vectors, strict=True)]
        if points:
            self._update(qe.UpdateOperation.upsert_points(points))

    def set_fields(self, memory_id: str, fields: dict[str, Any]) -> None:
        """Overwrite some payload fields, keeping the vectors. KeyError if the point is missing."""
        self._update(qe.UpdateOperation.set_payload([memory_id], patch_payload(fields)))

    def get(self, flt: MemoryFilter) -> list[Memory]:
        found: list[Memory] = []
        engine_filter = _filter(flt)
        offset: Any = None
        while True:
            request = qe.ScrollRequest(offset=offset, limit=_PAGE, filter=engine_filter, with_payload=True)
            with _engine_errors("scroll"):
                records, offset = self._shard.scroll(request)
            found.extend(Memory.model_validate(r.payload) for r in records)
            if offset is None:
                return found

    def query(
        self, flt: MemoryFilter, *, mode: SearchMode, limit: int,
        dense: Sequence[float] | None = None, text: str | None = None,
    ) -> list[Scored]:
        """Best first. Scores: cosine ("dense"), BM25 with IDF ("sparse"), RRF ("hybrid")."""
        require_inputs(mode, dense, text)
        with _engine_errors("query"):
            points = self._shard.query(_request(_filter(flt), mode, limit, dense, text))
        return [Scored(Memory.model_validate(p.payload), p.score) for p in points]

    def delete(self, memory_ids: Sequence[str]) -> None:
        if memory_ids:
            self._update(qe.UpdateOperation.delete_points(list(memory_ids)))

    def count(self, subject: str | None = None) -> int:
        flt = None if subject is None else qe.Filter(must=[_subject(subject)])
        with _engine_errors("count"):
            return self._shard.count(qe.CountRequest(exact=True, filter=flt))

    def subjects(self) -> list[str]:
        with _engine_errors("facet"):
            found = self._shard.facet(qe.FacetRequest("subject", limit=MAX_SUBJECTS, exact=True))
        return sorted(str(hit.value) for hit in found.hits)

    def close(self) -> None:
        """Flush segments to disk and release the directory lock. Safe to call twice."""
        if self._closed:
            return
        with _engine_errors("close"):
            try:
                self._shard.flush()
            finally:
                self._closed = True
                self._shard.close()

    def _update(self, operation: qe.UpdateOperation) -> None:
        with _engine_errors("update"):
            self._shard.update(operation)


def _config(dim: int) -> qe.EdgeConfig:
    return qe.EdgeConfig(
        vectors={DENSE: qe.EdgeVectorParams(size=dim, distance=qe.Distance.Cosine)},
        sparse_vectors={SPARSE: qe.EdgeSparseVectorParams(modifier=qe.Modifier.Idf)},
    )


def _open(path: Path, config: qe.EdgeConfig) -> qe.EdgeShard:
    # Loading with the config makes a shard built for another dimension fail loudly.
    if (path / "edge_config.json").exists():
        return qe.EdgeShard.load(str(path), config)
    return qe.EdgeShard.create(str(path), config)


def _index_schema(name: str) -> qe.PayloadSchemaType | qe.KeywordIndexParams:
    # Every query filters on subject: as a tenant key the engine keeps each subject's
    # points together, so a filtered search reads one subject's data, not everyone's.
    return qe.KeywordIndexParams(is_tenant=True) if name == "subject" else qe.PayloadSchemaType.Keyword


def _point(memory: Memory, vector: Sequence[float]) -> qe.Point:
    indices, values = sparse.embed_document(sparse.indexed_text(memory))
    vectors: dict[str, list[float] | qe.SparseVector | list[list[float]]] = {
        DENSE: list(vector), SPARSE: qe.SparseVector(indices, values)}
    return qe.Point(memory.id, vectors, memory.model_dump(mode="json"))


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
