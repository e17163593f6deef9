"""The store over a Qdrant server (or cluster) through qdrant-client.

Same points as the Edge shard: payload = a `Memory`, dense vector "dense" (cosine),
sparse vector "bm25" (IDF modifier, terms from `shared.storage.sparse`, not fastembed, so both
engines tokenise alike), keyword indexes on INDEXED_FIELDS, RRF fusion in the engine.

Durability: every write passes `wait=True`, so it returns only once the server has
applied the operation and appended it to its WAL; an acknowledged Redis message is
backed by a write the server already holds.

`QdrantClient(":memory:")` runs this code path without a server (the tests do); that
local mode ignores payload indexes and is far too slow past a few thousand points.

`ServerCatalog` keeps the collections of one memflow collection — one per embedding
model — and which is current, in collection metadata and aliases (Qdrant ≥ 1.16 for
metadata).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, cast

import grpc
import httpx
from qdrant_client import QdrantClient, models
from qdrant_client.http.exceptions import ResponseHandlingException, UnexpectedResponse

from memflow.pipeline.models import Memory
from memflow.shared.errors import IndexRetired, StoreUnavailable
from memflow.shared.storage import sparse
from memflow.shared.storage.store import (
    DENSE,
    INDEX_SEPARATOR,
    INDEXED_FIELDS,
    KEYWORD_FIELDS,
    MAX_SUBJECTS,
    RRF_K,
    SPARSE,
    Identity,
    Index,
    MemoryFilter,
    Progress,
    Query,
    Scored,
    SearchMode,
    Store,
    index_name,
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
# Collection metadata keys: the model that made an index's vectors, and a reindex's progress into it.
MODEL_KEY, DIM_KEY, PROGRESS_KEY = "memflow_model_id", "memflow_dim", "memflow_reindex"
# What serving processes write and read an index through: `fence` deletes the first, `drop` both.
WRITES_SUFFIX, READS_SUFFIX = "_writes", "_reads"


class ServerStore:
    """`Store` on collection `collection` of the Qdrant behind `client`; reads through `reads` when given
    (a serving process: writes and reads go through two aliases that a reindex retires apart)."""

    def __init__(self, client: QdrantClient, collection: str, dim: int, *,
                 metadata: dict[str, Any] | None = None, reads: str | None = None) -> None:
        self._client = client
        self._collection = collection
        self._reads = reads or collection
        self._dim = dim
        self._metadata = metadata  # recorded on the collection if `ensure` creates it

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

    def put(self, memories: Sequence[Memory], vectors: Sequence[Sequence[float]], *, new_only: bool = False) -> None:
        """Upsert whole points (`new_only`: insert only); returns once the server holds them (wait=True)."""
        by_subject: dict[str, list[models.PointStruct]] = {}
        for m, v in zip(memories, vectors, strict=True):
            by_subject.setdefault(m.subject, []).append(_point(m, v))
        mode = models.UpdateMode.INSERT_ONLY if new_only else None
        for subject, points in by_subject.items():  # a point of another subject under the same id stays as it is
            with _server_errors("upsert"):
                self._client.upsert(self._collection, points, wait=True, update_mode=mode,
                                    update_filter=models.Filter(must=[_subject(subject)]))

    def set_fields(self, subject: str, memory_id: str, fields: dict[str, Any], *, if_rev: int | None = None) -> None:
        """Overwrite some payload fields of `subject`'s point, keeping the vectors. KeyError if the subject has no
        such point (unconditional writes only: a conditional one that finds no point at `if_rev` writes nothing).
        Either way the server writes only where the point's subject is `subject`."""
        payload = patch_payload(fields)
        if if_rev is None and memory_id not in self._owned(subject, [memory_id]):
            raise KeyError(f"no point {memory_id} of {subject}")
        rev = [] if if_rev is None else [models.FieldCondition(key="rev", match=models.MatchValue(value=if_rev))]
        target = models.FilterSelector(filter=models.Filter(must=[
            _subject(subject), models.HasIdCondition(has_id=[memory_id]), *rev]))
        with _server_errors("set_payload"):
            self._client.set_payload(self._collection, payload, points=target, wait=True)
        if KEYWORD_FIELDS & fields.keys():  # the keyword vector follows the words it indexes (store.KEYWORD_FIELDS)
            for memory in self.get(MemoryFilter(subject, ids=[memory_id])):
                indices, values = sparse.embed_document(sparse.indexed_text(memory))
                terms = models.SparseVector(indices=indices, values=values)
                with _server_errors("update_vectors"):
                    self._client.update_vectors(self._collection, [models.PointVectors(id=memory_id,
                                                                                       vector={SPARSE: terms})],
                                                wait=True)

    def get(self, flt: MemoryFilter, *, between: Callable[[], object] | None = None) -> list[Memory]:
        found: list[Memory] = []
        server_filter = _filter(flt)
        offset: Any = None
        while True:
            with _server_errors("scroll"):
                records, offset = self._client.scroll(
                    self._reads, scroll_filter=server_filter, limit=_PAGE, offset=offset,
                    with_payload=True,
                )
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
        with _server_errors("query"):
            response = self._client.query_points(
                self._reads, limit=limit, with_payload=True,
                **_query_args(_filter(flt), mode, limit, dense, text),
            )
        return [Scored(Memory.model_validate(p.payload), p.score) for p in response.points]

    def query_many(self, queries: Sequence[Query]) -> list[list[Scored]]:
        """Each query's `query` answer, in order, from one `query_batch_points` call (one round trip)."""
        for q in queries:
            require_inputs(q.mode, q.dense, q.text)
        if not queries:
            return []
        requests = [models.QueryRequest(limit=q.limit, with_payload=True,
                                        **_request_args(_filter(q.flt), q.mode, q.limit, q.dense, q.text))
                    for q in queries]
        with _server_errors("query"):
            responses = self._client.query_batch_points(self._reads, requests=requests)
        read: dict[str, Memory] = {}  # a point in several answers is validated once
        return [[Scored(_read(p, read), p.score) for p in response.points] for response in responses]

    def delete(self, subject: str, memory_ids: Sequence[str]) -> None:
        """Remove `subject`'s points of these ids; a point of another subject under one of them stays."""
        if memory_ids:
            selector = models.FilterSelector(filter=models.Filter(must=[
                _subject(subject), models.HasIdCondition(has_id=list(memory_ids))]))
            with _server_errors("delete"):
                self._client.delete(self._collection, points_selector=selector, wait=True)

    def vectors(self, subject: str, memory_ids: Sequence[str]) -> dict[str, list[float]]:
        """The dense vector of each of `memory_ids` that is a point of `subject`, as stored (cosine: normalised)."""
        return {str(r.id): list(cast(dict[str, list[float]], r.vector)[DENSE])
                for r in self._retrieve(subject, memory_ids, with_vectors=True)}

    def _owned(self, subject: str, memory_ids: Sequence[str]) -> set[str]:
        return {str(r.id) for r in self._retrieve(subject, memory_ids, with_vectors=False)}

    def _retrieve(self, subject: str, memory_ids: Sequence[str], *, with_vectors: bool) -> list[models.Record]:
        """The points of these ids that are `subject`'s (retrieved by id, kept by the subject their payload names)."""
        if not memory_ids:
            return []
        with _server_errors("retrieve"):
            records = self._client.retrieve(self._reads, list(dict.fromkeys(memory_ids)), with_payload=["subject"],
                                            with_vectors=[DENSE] if with_vectors else False)
        return [r for r in records if (r.payload or {}).get("subject") == subject]

    def count(self, subject: str | None = None) -> int:
        flt = None if subject is None else models.Filter(must=[_subject(subject)])
        with _server_errors("count"):
            return self._client.count(self._reads, count_filter=flt, exact=True).count

    def page(self, offset: str | None, limit: int) -> tuple[list[Memory], str | None]:
        with _server_errors("scroll"):
            records, after = self._client.scroll(self._reads, limit=limit, offset=offset, with_payload=True)
        return [Memory.model_validate(r.payload) for r in records], None if after is None else str(after)

    def subjects(self) -> list[str]:
        with _server_errors("facet"):
            found = self._client.facet(self._reads, key="subject", limit=MAX_SUBJECTS, exact=True)
        return sorted(str(hit.value) for hit in found.hits)

    def close(self) -> None:
        self._client.close()

    def _create_collection(self) -> None:
        try:
            self._client.create_collection(
                self._collection,
                vectors_config={DENSE: models.VectorParams(size=self._dim, distance=models.Distance.COSINE)},
                sparse_vectors_config={SPARSE: models.SparseVectorParams(modifier=models.Modifier.IDF)},
                metadata=self._metadata,
            )
        except UnexpectedResponse as exc:
            if exc.status_code != 409:  # 409: another process created it first, which is fine
                raise


class ServerCatalog:
    """The collections of memflow collection `collection` on the server behind `client`.

    - Each index is a collection `<collection>__<model>` whose metadata records the model and dimension
      of its vectors (and, while a reindex fills it, its progress).
    - The alias `<collection>` names the current index: the record of which one searches use, switched
      atomically (one alias operation), and what other tools should read.
    - Serving processes write to the current index through the alias `<index>_writes`, which `fence`
      deletes, and read through `<index>_reads`, which goes with the index when it is dropped after the
      switch. The server resolves an alias per request, so once the fence is up no serving process's
      write reaches the old index (no check of ours on the write path) while searches still answer from
      it; a process still on the old model then gets IndexRetired — Retryable: its writes wait in their
      streams — until restarted with the new model.
    - A plain collection named `<collection>` predates the record; it is adopted (metadata, aliases)
      by the first process whose dimension matches, and dropped by its first reindex.
    """

    def __init__(self, client: QdrantClient, collection: str) -> None:
        self.collection = collection
        self._client = client

    def current(self) -> Index | None:
        with _server_errors("read the current index"):
            name = self._aliases().get(self.collection) or self._unaliased()
            return None if name is None else self._index(name)

    def names(self) -> list[str]:
        with _server_errors("list collections"):
            return sorted(n for n in self._collections() if n == self.collection or self._made_by_us(n))

    def create(self, identity: Identity) -> Index:
        index = Index(index_name(self.collection, identity), identity.dim, identity)
        ServerStore(self._client, index.name, index.dim, metadata=_record(identity)).ensure()
        return index

    def adopt(self, index: Index, identity: Identity) -> Index:
        with _server_errors("adopt"):
            self._client.update_collection(index.name, metadata=_record(identity))
            self._set_aliases(_serving(index.name))
        return Index(index.name, index.dim, identity)

    def open(self, index: Index) -> Store:
        return ServerStore(self._client, index.name, index.dim)

    def serve(self, index: Index) -> Store:
        ServerStore(self._client, index.name, index.dim).ensure()  # payload indexes added since it was made
        with _server_errors("read aliases"):
            if _writes(index.name) not in self._aliases():
                raise IndexRetired(f"qdrant: index {index.name} is fenced: a `memflow reindex` is switching "
                                   f"{self.collection!r} to another model (run it again if it was interrupted)")
        return ServerStore(self._client, _writes(index.name), index.dim, reads=_reads(index.name))

    def fence(self, index: Index) -> None:
        with _server_errors("fence"):
            if _writes(index.name) in self._aliases():
                self._change_aliases([_delete_alias(_writes(index.name))])

    def switch(self, index: Index) -> None:
        with _server_errors("switch"):
            if self.collection in self._collections():
                self._replace_unrecorded(index)
            else:  # one request: the server applies the alias changes atomically
                self._set_aliases({self.collection: index.name, **_serving(index.name)})

    def drop(self, name: str) -> None:
        with _server_errors("drop"):
            if name in self._collections():
                self._client.delete_collection(name)

    def progress(self, index: Index) -> Progress | None:
        with _server_errors("read progress"):
            if index.name not in self._collections():
                return None
            saved = (self._client.get_collection(index.name).config.metadata or {}).get(PROGRESS_KEY)
        return None if saved is None else Progress.model_validate(saved)

    def save_progress(self, index: Index, progress: Progress | None) -> None:
        # Metadata updates merge key by key; null removes the key.
        saved = None if progress is None else progress.model_dump()
        with _server_errors("save progress"):
            self._client.update_collection(index.name, metadata={PROGRESS_KEY: saved})

    def close(self) -> None:
        self._client.close()

    def _replace_unrecorded(self, index: Index) -> None:
        # The alias cannot take the name of a collection that still exists: the old collection goes
        # first. A process opening the store in between finds no alias and no such collection, and
        # `_unaliased` points the alias at the one index there is — this one — rather than start empty.
        self._set_aliases(_serving(index.name))
        self._client.delete_collection(self.collection)
        self._set_aliases({self.collection: index.name})

    def _unaliased(self) -> str | None:
        names = self._collections()
        if self.collection in names:
            return self.collection
        ours = [n for n in names if self._made_by_us(n)]
        if len(ours) != 1:
            return None
        self._set_aliases({self.collection: ours[0]})
        return ours[0]

    def _index(self, name: str) -> Index:
        info = self._client.get_collection(name)
        recorded = info.config.metadata or {}
        identity = Identity(str(recorded[MODEL_KEY]), int(recorded[DIM_KEY])) if MODEL_KEY in recorded else None
        return Index(name, _dense_size(info) or 0, identity)

    def _made_by_us(self, name: str) -> bool:
        if not name.startswith(self.collection + INDEX_SEPARATOR):
            return False
        return MODEL_KEY in (self._client.get_collection(name).config.metadata or {})

    def _collections(self) -> set[str]:
        return {c.name for c in self._client.get_collections().collections}

    def _aliases(self) -> dict[str, str]:
        return {a.alias_name: a.collection_name for a in self._client.get_aliases().aliases}

    def _set_aliases(self, wanted: dict[str, str]) -> None:
        # Deleting an alias that does not exist, or creating one that does, is an error on some
        # servers: each is replaced explicitly, in the same atomic request.
        existing = self._aliases()
        self._change_aliases([*(_delete_alias(a) for a in wanted if a in existing),
                              *(_create_alias(a, c) for a, c in wanted.items())])

    def _change_aliases(self, operations: list[Any]) -> None:
        self._client.update_collection_aliases(change_aliases_operations=operations)


def _writes(name: str) -> str:
    return f"{name}{WRITES_SUFFIX}"


def _reads(name: str) -> str:
    return f"{name}{READS_SUFFIX}"


def _serving(name: str) -> dict[str, str]:
    return {_writes(name): name, _reads(name): name}


def _record(identity: Identity) -> dict[str, Any]:
    return {MODEL_KEY: identity.model_id, DIM_KEY: identity.dim}


def _create_alias(alias: str, collection: str) -> models.CreateAliasOperation:
    return models.CreateAliasOperation(create_alias=models.CreateAlias(collection_name=collection, alias_name=alias))


def _delete_alias(alias: str) -> models.DeleteAliasOperation:
    return models.DeleteAliasOperation(delete_alias=models.DeleteAlias(alias_name=alias))


def _dense_size(info: models.CollectionInfo) -> int | None:
    vectors = info.config.params.vectors
    return vectors[DENSE].size if isinstance(vectors, dict) and DENSE in vectors else None


def _check_dim(info: models.CollectionInfo, collection: str, dim: int) -> None:
    size = _dense_size(info)
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


def _read(point: models.ScoredPoint, read: dict[str, Memory]) -> Memory:
    key = str(point.id)
    if key not in read:
        read[key] = Memory.model_validate(point.payload)
    return read[key]


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
    # query_points names the filter `query_filter`; a QueryRequest of a batch names it `filter`.
    args = _request_args(flt, mode, limit, dense, text)
    if "filter" in args:
        args["query_filter"] = args.pop("filter")
    return args


def _request_args(
    flt: models.Filter, mode: SearchMode, limit: int, dense: Sequence[float] | None, text: str | None
) -> dict[str, Any]:
    if mode == "dense":
        return {"query": _dense(dense), "using": DENSE, "filter": flt}
    if mode == "sparse":
        return {"query": _sparse(text), "using": SPARSE, "filter": flt}
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


_LOCAL_MISSING = re.compile(r"Collection \S+ not found")


def _retired(action: str, message: str) -> IndexRetired:
    # What a serving process sees once `memflow reindex` fenced its index (or someone deleted it).
    return IndexRetired(f"qdrant: {action}: {message} — if `memflow reindex` moved the store to another model, "
                        "restart with that model")


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
        if exc.status_code == 404 and b"Collection" in exc.content:
            raise _retired(action, exc.content.decode(errors="replace")) from exc
        raise
    except ValueError as exc:
        # The local mode's word for a missing collection (the server's is a 404, above).
        if _LOCAL_MISSING.fullmatch(str(exc)):
            raise _retired(action, str(exc)) from exc
        raise
    except grpc.RpcError as exc:
        if exc.code() in _TRANSIENT_GRPC:  # raised errors are also grpc.Call, which has code()
            raise StoreUnavailable(f"qdrant: {action}: {exc}") from exc
        raise
