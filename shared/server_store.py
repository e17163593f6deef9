"""The store over a Qdrant server (or cluster) through qdrant-client.

Same points as the Edge shard: payload = a `Memory`, dense vector "dense" (cosine),
sparse vector "bm25" (IDF modifier, terms from `shared.sparse`, not fastembed, so both
engines tokenise alike), keyword indexes on INDEXED_FIELDS, RRF fusion in the engine.

Durability: every write passes `wait=True`, so it returns only once the server has
applied the operation and appended it to its WAL; an acknowledged Redis message is
backed by a write the server already holds.

`QdrantClient(":memory:")` runs this code path without a server (the tests do); that
local mode ignores payload indexes and is far too slow past a few thousand points.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import grpc
import httpx
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

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
# Statuses a retry can outlive: timeouts, overload, a node restarting or rebalancing.
_TRANSIENT_HTTP = frozenset({408, 429, 500, 502, 503, 504})
_TRANSIENT_GRPC = frozenset({
    grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
    grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.ABORTED,
})


class ServerStore:
    """`Store` on collection `collection` of the Qdrant behind `client`."""

    def __init__(self, client: QdrantClient, collection: str, dim: int) -> None:
        self._client = client
        self._collection = collection
        self._dim = dim

    def ensure(self) -> None:
        """Create the collection and any missing payload index; refuse a collection of another dim."""
        with _server_errors("ensure"):
            if not self._client.collection_exists(self._collection):
                self._create_collection()
            info = self._client.get_collection(self._collection)
            _check_dim(info, self._collection, self._dim)
            for name in INDEXED_FIELDS:
                if name not in info.payload_schema:
                    self._client.create_payload_index(self._collection, name, _index_schema(name))

    def put(self, memories: Sequence[Memory], vectors: Sequence[Sequence[float]]) -> None:
        """Upsert whole points; returns once the server holds them (wait=True)."""
        points = [_point(m, v) for m, v in zip(memories, vectors, strict=True)]
        if points:
            with _server_errors("upsert"):
                self._client.upsert(self._collection, points, wait=True)

    def set_fields(self, memory_id: str, fields: dict[str, Any]) -> None:
        """Overwrite some payload fields, keeping the vectors. KeyError if the point is missing."""
        payload = patch_payload(fields)
        with _server_errors("set_payload"):
            self._client.set_payload(self._collection, payload, points=[memory_id], wait=True)

    def get(self, flt: MemoryFilter) -> list[Memory]:
        found: list[Memory] = []
        server_filter = _filter(flt)
        offset: Any = None
        while True:
            with _server_errors("scroll"):
                records, offset = self._client.scroll(
                    self._collection, scroll_filter=server_filter, limit=_PAGE, offset=offset,
                    with_payload=True,
                )
            found.extend(Memory.model_validate(r.payload) for r in records)
            if offset is None:
                return found

    def query(
        self, flt: MemoryFilter, *, mode: SearchMode, limit: int,
        dense: Sequence[float] | None = None, text: str | None = None,
    ) -> list[Scored]:
        """Best first. Scores: cosine ("dense"), BM25 with IDF ("sparse"), RRF ("hybrid")."""
        require_inputs(mode, dense, text)
        with _server_errors("query"):
            response = self._client.query_points(
                self._collection, limit=limit, with_payload=True,
                **_query_args(_filter(flt), mode, limit, dense, text),
            )
        return [Scored(Memory.model_validate(p.payload), p.score) for p in response.points]

    def delete(self, memory_ids: Sequence[str]) -> None:
        if memory_ids:
            selector = models.PointIdsList(points=list(memory_ids))
            with _server_errors("delete"):
                self._client.delete(self._collection, points_selector=selector, wait=True)

    def count(self, subject: str | None = None) -> int:
        flt = None if subject is None else models.Filter(must=[_subject(subject)])
        with _server_errors("count"):
            return self._client.count(self._collection, count_filter=flt, exact=True).count

    def subjects(self) -> list[str]:
        with _server_errors("facet"):
            found = self._client.facet(self._collection, key="subject", limit=MAX_SUBJECTS, exact=True)
        return sorted(str(hit.value) for hit in found.hits)

    def close(self) -> None:
        self._client.close()

    def _create_collection(self) -> None:
        try:
            self._client.create_collection(
                self._collection,
                vectors_config={DENSE: models.VectorParams(size=self._dim, distance=models.Distance.COSINE)},
                sparse_vectors_config={SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)},
            )
        except UnexpectedResponse as exc:
            if exc.status_code != 409:  # 409: another process created it first, which is fine
                raise


def _check_dim(info: models.CollectionInfo, collection: str, dim: int) -> None:
    vectors = info.config.params.vectors
    size = vectors[DENSE].size if isinstance(vectors, dict) and DENSE in vectors else None
    if size != dim:
        raise ValueError(f"collection {collection!r} holds dense vectors of size {size}; "
                         f"the embedder makes {dim}")


def _index_schema(name: str) -> models.PayloadSchemaType | models.KeywordIndexParams:
    # Every query filters on subject: as a tenant key the server co-locates each
    # subject's points, so a filtered search reads one subject's data, not everyone's.
    if name == "subject":
        return models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, is_tenant=True)
    return models.PayloadSchemaType.KEYWORD


def _point(memory: Memory, vector: Sequence[float]) -> models.PointStruct:
    indices, values = sparse.embed_document(sparse.indexed_text(memory))
    terms = models.SparseVector(indices=indices, values=values)
    vectors: dict[str, Any] = {DENSE: list(vector), SPARSE: terms}
    return models.PointStruct(id=memory.id, vector=vectors, payload=memory.model_dump(mode="json"))


def _subject(subject: str) -> models.FieldCondition:
    return models.FieldCondition(key="subject", match=models.MatchValue(value=subject))


def _filter(flt: MemoryFilter) -> models.Filter:
    must: list[Any] = [_subject(flt.subject)]
    must += [models.FieldCondition(key=name, match=models.MatchAny(any=values))
             for name, values in match_terms(flt).items()]
    if flt.ids is not None:
        must.append(models.HasIdCondition(has_id=list(flt.ids)))
    return models.Filter(must=must)


def _query_args(
    flt: models.Filter, mode: SearchMode, limit: int, dense: Sequence[float] | None, text: str | None
) -> dict[str, Any]:
    if mode == "dense":
        return {"query": _dense(dense), "using": DENSE, "query_filter": flt}
    if mode == "sparse":
        return {"query": _sparse(text), "using": SPARSE, "query_filter": flt}
    prefetch = [
        models.Prefetch(query=_dense(dense), using=DENSE, filter=flt, limit=limit),
        models.Prefetch(query=_sparse(text), using=SPARSE, filter=flt, limit=limit),
    ]
    # RrfQuery, not FusionQuery(RRF): the plain fusion uses Qdrant's default k (2).
    return {"prefetch": prefetch, "query": models.RrfQuery(rrf=models.Rrf(k=RRF_K))}


def _dense(dense: Sequence[float] | None) -> list[float]:
    assert dense is not None  # checked by require_inputs
    return list(dense)


def _sparse(text: str | None) -> models.SparseVector:
    assert text is not None  # checked by require_inputs
    indices, values = sparse.embed_query(text)
    return models.SparseVector(indices=indices, values=values)


@contextmanager
def _server_errors(action: str) -> Iterator[None]:
    """Network faults and retryable statuses become StoreUnavailable; a missing point
    KeyError; a rejected request (4xx: a bug in the call) surfaces as it is."""
    try:
        yield
    except (ResponseHandlingException, httpx.TransportError, ConnectionError, TimeoutError) as exc:
        raise StoreUnavailable(f"qdrant: {action}: {exc}") from exc
    except UnexpectedResponse as exc:
        if exc.status_code is None or exc.status_code in _TRANSIENT_HTTP:
            raise StoreUnavailable(f"qdrant: {action}: {exc}") from exc
        if exc.status_code == 404 and b"No point with id" in exc.content:
            raise KeyError(exc.content.decode(errors="replace")) from exc
        raise
    except grpc.RpcError as exc:
        if exc.code() in _TRANSIENT_GRPC:  # raised errors are also grpc.Call, which has code()
            raise StoreUnavailable(f"qdrant: {action}: {exc}") from exc
        raise
