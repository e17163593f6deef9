"""The store seam: one small interface, two engines behind it.

`EdgeStore` (shared/storage/edge_store.py) runs the Qdrant engine in-process on an EdgeShard;
`ServerStore` (shared/storage/server_store.py) talks to a Qdrant server through qdrant-client.
Both keep the same payload (a `Memory`), the same two named vectors ("dense": cosine,
"bm25": sparse with the IDF modifier, produced by `qdrant_edge.Bm25` with the
Multilingual tokenizer in both modes) and the same keyword payload indexes, and both
fuse dense and sparse prefetches with RRF inside the engine.
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol, cast, runtime_checkable

from pydantic import BaseModel, ConfigDict, TypeAdapter

from memflow.pipeline.models import Dir, Memory, MType, Status
from memflow.pipeline.score import RRF_K as RRF_K  # the adapters fuse with the read path's constant
from memflow.shared.errors import ModelMismatch

if TYPE_CHECKING:
    from memflow.shared.settings import Settings

log = logging.getLogger(__name__)

DENSE = "dense"
SPARSE = "bm25"
# Facets are answered in one call: past this many subjects, jobs that walk them need paging.
MAX_SUBJECTS = 1_000_000
INDEXED_FIELDS = ("subject", "dir", "status", "tier", "mtype", "key", "about", "source_event_ids")
SearchMode = Literal["dense", "sparse", "hybrid"]
# An index of collection "memflow" made by one model is "memflow__<model>"; names of that form are memflow's.
INDEX_SEPARATOR = "__"


@dataclass(frozen=True)
class MemoryFilter:
    """Which points an operation may touch. `subject` is not optional: no call crosses tenants."""

    subject: str
    dirs: Sequence[Dir] | None = None
    statuses: Sequence[Status] | None = None
    mtypes: Sequence[MType] | None = None
    keys: Sequence[str] | None = None
    ids: Sequence[str] | None = None
    # Whom the memories are about (pipeline/holders.py): "self", "mother", "friend:小李".
    abouts: Sequence[str] | None = None
    # Records indexed with any of these events' turns beside them (`Memory.context_event_ids`; not an indexed
    # field: the subject's points are read through, so only for what is rare, a supersession's retirements).
    context_events: Sequence[str] | None = None
    # Memories read from any of these events (`Memory.source_event_ids`, indexed): what a replay of them repeats.
    sources: Sequence[str] | None = None


@dataclass(frozen=True)
class Query:
    """One search of a batch (`Store.query_many`): what `Store.query` is asked, as one value."""

    flt: MemoryFilter
    mode: SearchMode
    limit: int
    dense: Sequence[float] | None = None
    text: str | None = None


@dataclass(frozen=True)
class Scored:
    memory: Memory
    # Higher is better. "dense": cosine similarity in [-1, 1]; "sparse": BM25 score;
    # "hybrid": the RRF score of the fused ranks.
    score: float
    extra: dict[str, Any] = field(default_factory=dict)


class Store(Protocol):
    def ensure(self) -> None:
        """Create the collection/shard and its payload indexes if missing. Idempotent."""

    def put(self, memories: Sequence[Memory], vectors: Sequence[Sequence[float]], *, new_only: bool = False) -> None:
        """Write whole points (payload + dense vector; the BM25 vector is made from content).

        Same id twice is one point: the second write replaces the first, but only a point of the memory's own
        subject (checked by the engine in the same step): one of another subject under that id stays as it is.
        `new_only`: a conditional insert, the engine leaves a point already there as it is (the applier's
        compare-and-write, docs/write-path.md).
        """

    def set_fields(self, subject: str, memory_id: str, fields: dict[str, Any], *, if_rev: int | None = None) -> None:
        """Overwrite some payload fields of `subject`'s point `memory_id`, keeping its vectors. `if_rev`: only if
        the point is at that revision. Both conditions are checked by the engine in the same step as the write
        (compare-and-write; otherwise nothing is written): an id never reaches a point of another subject."""

    def get(self, flt: MemoryFilter, *, between: Callable[[], object] | None = None) -> list[Memory]:
        """Every point matching the filter (scrolls through all pages). `between`: called before each page after
        the first (a maintenance job steps aside there for the searches of its process: shared/search/foreground.py)."""

    def query(
        self, flt: MemoryFilter, *, mode: SearchMode, limit: int,
        dense: Sequence[float] | None = None, text: str | None = None,
    ) -> list[Scored]:
        """Best `limit` points matching `flt`, best first. dense needs `dense`, sparse needs `text`."""

    def query_many(self, queries: Sequence[Query]) -> list[list[Scored]]:
        """What `query` answers to each of `queries`, in order, from one engine call: the engine plans the
        batch as a whole (one pass over the segments), and a point found by several queries is read once."""
        ...

    def delete(self, subject: str, memory_ids: Sequence[str]) -> None:
        """Remove `subject`'s points of these ids from the index for good (the purge after a soft delete)."""

    def count(self, subject: str | None = None) -> int:
        """Number of points, of one subject or in all."""
        ...

    def page(self, offset: str | None, limit: int) -> tuple[list[Memory], str | None]:
        """Up to `limit` points of every subject and status, in id order from `offset` (None: the first),
        and the offset of the next page (None after the last). Whole-store maintenance only (reindex):
        it crosses tenants, so no request of an agent reaches it."""
        ...

    def subjects(self) -> list[str]:
        """Every subject with at least one point (for jobs that walk all subjects), sorted."""

    def close(self) -> None:
        """Flush and release the engine."""


@runtime_checkable
class Optimizable(Protocol):
    """A store whose search indexes (HNSW) are built when asked, not as points arrive: an Edge shard. A Qdrant
    server builds its own in the background. The `index` job (workers/jobs.py) asks, never a search."""

    def changed_since_optimize(self) -> int:
        """Points written or removed since the last `optimize` of this process (all of them after it starts)."""
        ...

    def optimize(self, between: Callable[[], object] | None = None) -> bool:
        """Build whatever the engine's optimizer plans (HNSW graphs of segments past its indexing threshold,
        merges, vacuum); True if anything changed. Blocks until done. `between`: called before each step that
        holds the interpreter lock (a job steps aside there for the searches of its process)."""
        ...


@runtime_checkable
class PointLookup(Protocol):
    """A store that reads a subject's points' vectors by id (every engine here): an export with vectors
    (workers/transfer.py)."""

    def vectors(self, subject: str, memory_ids: Sequence[str]) -> dict[str, list[float]]:
        """The dense vector of each of `memory_ids` that is a point of `subject`, as stored."""
        ...


# ---------------------------------------------------------------------------
# What both adapters share, so the two engines cannot drift apart.

# The RRF constant is the read path's (pipeline.score.RRF_K), set explicitly on both engines
# so that their fused scores are equal (Qdrant's own default k=2 lets one list's top hit dominate).

# Fields a patch may not touch: the payload id must stay the point id, and moving a
# memory to another subject would cross tenants.
_FIXED_FIELDS = frozenset({"id", "subject"})
_FIELD_ADAPTERS: dict[str, TypeAdapter[Any]] = {
    # The FieldInfo as metadata carries the field's constraints (ge/le, patterns).
    name: TypeAdapter(cast(Any, Annotated[info.annotation, info]))
    for name, info in Memory.model_fields.items()
    if name not in _FIXED_FIELDS
}


def match_terms(flt: MemoryFilter) -> dict[str, list[str]]:
    """Payload field → allowed values, for each keyword constraint the filter sets.

    `subject` (always required) and `ids` (not a payload field) are left to the caller.
    An empty list is kept: it matches nothing, on both engines.
    """
    wanted = {"dir": flt.dirs, "status": flt.statuses, "mtype": flt.mtypes, "key": flt.keys, "about": flt.abouts,
              "context_event_ids": flt.context_events, "source_event_ids": flt.sources}
    return {name: [_plain(v) for v in values] for name, values in wanted.items() if values is not None}


def admits(flt: MemoryFilter, memory: Memory) -> bool:
    """Whether `flt` lets `memory` through, as both engines' filters do (`match_terms`, and `ids` by point id)."""
    fields: dict[str, Sequence[str | Enum]] = {
        "dir": [memory.dir], "status": [memory.status], "mtype": [memory.mtype], "key": [memory.key],
        "about": [memory.about], "context_event_ids": memory.context_event_ids,
        "source_event_ids": memory.source_event_ids}
    if memory.subject != flt.subject or (flt.ids is not None and memory.id not in flt.ids):
        return False
    return all(any(_plain(v) in allowed for v in fields[name]) for name, allowed in match_terms(flt).items())


def narrowed(found: Sequence[Scored], flt: MemoryFilter, limit: int, *, complete: bool) -> list[Scored] | None:
    """What a dense or sparse `query(flt, limit=limit)` answers, read off `found` — the same query's answer over
    a wider filter, best first — when that is certain; None when it is not.

    Certain when `found` holds `limit` points that `flt` admits (every other point it admits ranks below
    all of `found`), or when `found` is `complete` (the wider query returned every point it matched). Scores
    are the same either way: a cosine, or BM25 with the IDF of the whole shard, neither depends on the filter.
    Points tied with the last one kept may be other points of that score than the engine would keep: its
    choice among equal scores is its own (it changes with the limit asked). Not for "hybrid": a fused score
    depends on the ranks within the filter.
    """
    kept = [hit for hit in found if admits(flt, hit.memory)]
    return kept[:limit] if complete or len(kept) >= limit else None


def _plain(value: str | Enum) -> str:
    # A str-Enum's str() is "Dir.preferences" on 3.11; the payload holds the value.
    return str(value.value) if isinstance(value, Enum) else value


# What keyword search reads of a point (`sparse.indexed_text`): a patch of either rebuilds its keyword vector, or the
# words taken out of a record's context (a forgotten or superseded turn beside it) would still be matched.
KEYWORD_FIELDS = frozenset({"content", "context"})


def patch_payload(fields: dict[str, Any]) -> dict[str, Any]:
    """Validate a partial payload against `Memory` and return it JSON-ready.

    A point whose payload no longer validates (unknown field, bad status) would break
    every later read of its subject, so a bad patch is refused here (ValueError).
    """
    unknown = set(fields) - set(_FIELD_ADAPTERS)
    if unknown:
        raise ValueError(f"set_fields cannot set {sorted(unknown)}: not a patchable Memory field")
    return {name: _json_value(name, value) for name, value in fields.items()}


def _json_value(name: str, value: Any) -> Any:
    adapter = _FIELD_ADAPTERS[name]
    return adapter.dump_python(adapter.validate_python(value), mode="json")


def require_inputs(mode: SearchMode, dense: Sequence[float] | None, text: str | None) -> None:
    """Refuse a query that lacks what its mode searches with (a caller bug, not a miss)."""
    if mode not in ("dense", "sparse", "hybrid"):
        raise ValueError(f"unknown search mode {mode!r}")
    if mode in ("dense", "hybrid") and dense is None:
        raise ValueError(f"mode {mode!r} needs a dense vector")
    if mode in ("sparse", "hybrid") and text is None:
        raise ValueError(f"mode {mode!r} needs a text")


# ---------------------------------------------------------------------------
# Which model made the vectors: the store records it, and refuses another (docs/architecture.md#the-store).


@dataclass(frozen=True)
class Identity:
    """The model that makes an index's dense vectors. Two models' vectors are never mixed in one
    index: a cosine between them means nothing, and nothing would say so."""

    model_id: str
    dim: int

    def __str__(self) -> str:
        return f"{self.model_id} ({self.dim} dims)"


@dataclass(frozen=True)
class Index:
    """One physical index of the collection: an Edge shard directory or a server collection."""

    name: str
    dim: int
    # None: made before memflow recorded models; the first process whose dimension matches adopts it.
    identity: Identity | None = None


class Progress(BaseModel):
    """How far a reindex into an index has come; saved with that index after every page (shared/writer/reindex.py)."""

    model_config = ConfigDict(extra="forbid")

    source: str  # the index being copied
    offset: str | None = None  # the first id of the next page to copy
    copied: int = 0
    done: bool = False  # every page copied: only the catch-up and the switch remain


class Catalog(Protocol):
    """The indexes of one collection on one engine, and which of them is current.

    `EdgeCatalog` keeps the record in a JSON file beside the shards; `ServerCatalog` in collection
    metadata and aliases. `open_current` (serving processes) and `shared.writer.reindex` (the migration)
    are written against this alone.
    """

    collection: str

    def current(self) -> Index | None:
        """The index searches use now; None before the first process opened the collection."""

    def names(self) -> list[str]:
        """Every index of this collection that memflow made, current or not (leftovers included)."""

    def create(self, identity: Identity) -> Index:
        """The index for this model (named after it), made empty if missing. Not current until `switch`."""

    def adopt(self, index: Index, identity: Identity) -> Index:
        """Record `identity` as the maker of an index made before models were recorded."""

    def open(self, index: Index) -> Store:
        """The index itself, as a reindex reads and fills it (still readable once fenced)."""

    def serve(self, index: Index) -> Store:
        """The current index as serving processes use it: what `fence` cuts off."""

    def fence(self, index: Index) -> None:
        """From now on no serving process writes to `index` (their writes fail with IndexRetired)."""

    def switch(self, index: Index) -> None:
        """Make `index` current, atomically."""

    def drop(self, name: str) -> None:
        """Delete an index that is not current, and its progress. Nothing if it does not exist."""

    def progress(self, index: Index) -> Progress | None:
        """The saved progress of a reindex into `index`, if one was started."""

    def save_progress(self, index: Index, progress: Progress | None) -> None:
        """Persist (None: forget) the progress of a reindex into `index`; durable when it returns."""

    def close(self) -> None:
        """Release the engine (an Edge shard's directory lock)."""


def index_name(collection: str, identity: Identity) -> str:
    """The index one model's vectors live in: readable, distinct for any two identities, and made of
    the characters both engines accept in a name."""
    readable = re.sub(r"[^a-z0-9]+", "-", identity.model_id.lower()).strip("-")[:48]
    digest = hashlib.sha256(identity.model_id.encode()).hexdigest()[:8]
    return f"{collection}{INDEX_SEPARATOR}{readable}-{identity.dim}-{digest}"


def is_index_of(name: str, collection: str) -> bool:
    return name == collection or name.startswith(collection + INDEX_SEPARATOR)


def open_store(settings: Settings, identity: Identity) -> Store:
    """The store this deployment uses, ready to write: a Qdrant server when `settings.qdrant_url` is
    set, else an Edge shard under `settings.data_dir`. ModelMismatch if another model made its vectors."""
    catalog = catalog_for(settings)
    try:
        return open_current(catalog, identity)
    except BaseException:
        catalog.close()  # an Edge shard holds a lock on its directory until closed
        raise


def open_current(catalog: Catalog, identity: Identity) -> Store:
    """The current index for a process whose embedder is `identity`: made if there is none, adopted if
    it predates the record and its dimension matches, refused if another model made it."""
    index = catalog.current()
    if index is None:
        index = catalog.create(identity)
        catalog.switch(index)
    elif index.identity is None:
        index = _adopt(catalog, index, identity)
    elif index.identity != identity:
        raise ModelMismatch(mismatch_message(catalog.collection, index, identity))
    return catalog.serve(index)


def _adopt(catalog: Catalog, index: Index, identity: Identity) -> Index:
    if index.dim != identity.dim:
        raise ModelMismatch(mismatch_message(catalog.collection, index, identity))
    log.warning("collection %s: index %s predates the model record; its %d-dim vectors are taken as %s's "
                "(same dimension: nothing else can tell)", catalog.collection, index.name, index.dim,
                identity.model_id)
    return catalog.adopt(index, identity)


def mismatch_message(collection: str, index: Index, wanted: Identity) -> str:
    made = f"vectors of {index.identity}" if index.identity else f"{index.dim}-dim vectors of an unrecorded model"
    held = index.identity.model_id if index.identity else "the old model"
    return (f"collection {collection!r} holds {made}, but the embedder is {wanted}: run `memflow reindex` with "
            f"this embedder configured to re-embed every memory with it (searches keep using {held} until it "
            f"switches), or configure {held} again")


def catalog_for(settings: Settings) -> Catalog:
    # Imported here so that an embedded deployment never imports qdrant-client.
    if settings.store.qdrant_url:
        from qdrant_client import QdrantClient

        from memflow.shared.storage.server_store import ServerCatalog

        key = settings.store.qdrant_api_key.get_secret_value() if settings.store.qdrant_api_key else None
        return ServerCatalog(QdrantClient(url=settings.store.qdrant_url, api_key=key), settings.store.collection)
    from memflow.shared.storage.edge_shards import EdgeCatalog

    return EdgeCatalog(settings.store.data_dir / "qdrant", settings.store.collection, settings.store.edge_shards)
