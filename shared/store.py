"""The store seam: one small interface, two engines behind it.

`EdgeStore` (shared/edge_store.py) runs the Qdrant engine in-process on an EdgeShard;
`ServerStore` (shared/server_store.py) talks to a Qdrant server through qdrant-client.
Both keep the same payload (a `Memory`), the same two named vectors ("dense": cosine,
"bm25": sparse with the IDF modifier, produced by `qdrant_edge.Bm25` with the
Multilingual tokenizer in both modes) and the same keyword payload indexes, and both
fuse dense and sparse prefetches with RRF inside the engine.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import Enum
from typing import TYPE_CHECKING, Annotated, Any, Literal, Protocol, cast

from pydantic import TypeAdapter

from pipeline.models import Dir, Memory, MType, Status
from pipeline.score import RRF_K as RRF_K  # the adapters fuse with the read path's constant

if TYPE_CHECKING:
    from shared.settings import Settings

DENSE = "dense"
SPARSE = "bm25"
# Facets are answered in one call: past this many subjects, jobs that walk them need paging.
MAX_SUBJECTS = 1_000_000
INDEXED_FIELDS = ("subject", "dir", "status", "tier", "mtype", "key")
SearchMode = Literal["dense", "sparse", "hybrid"]


@dataclass(frozen=True)
class MemoryFilter:
    """Which points an operation may touch. `subject` is not optional: no call crosses tenants."""

    subject: str
    dirs: Sequence[Dir] | None = None
    statuses: Sequence[Status] | None = None
    mtypes: Sequence[MType] | None = None
    keys: Sequence[str] | None = None
    ids: Sequence[str] | None = None


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

    def put(self, memories: Sequence[Memory], vectors: Sequence[Sequence[float]]) -> None:
        """Write whole points (payload + dense vector; the BM25 vector is made from content).

        Same id twice is one point: the second write replaces the first.
        """

    def set_fields(self, memory_id: str, fields: dict[str, Any]) -> None:
        """Overwrite some payload fields of one point, keeping its vectors."""

    def get(self, flt: MemoryFilter) -> list[Memory]:
        """Every point matching the filter (scrolls through all pages)."""

    def query(
        self, flt: MemoryFilter, *, mode: SearchMode, limit: int,
        dense: Sequence[float] | None = None, text: str | None = None,
    ) -> list[Scored]:
        """Best `limit` points matching `flt`, best first. dense needs `dense`, sparse needs `text`."""

    def delete(self, memory_ids: Sequence[str]) -> None:
        """Remove points from the index for good (the purge after a soft delete)."""

    def count(self, subject: str | None = None) -> int:
        """Number of points, of one subject or in all."""
        ...

    def subjects(self) -> list[str]:
        """Every subject with at least one point (for jobs that walk all subjects), sorted."""

    def close(self) -> None:
        """Flush and release the engine."""


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
    wanted = {"dir": flt.dirs, "status": flt.statuses, "mtype": flt.mtypes, "key": flt.keys}
    return {name: [_plain(v) for v in values] for name, values in wanted.items() if values is not None}


def _plain(value: str | Enum) -> str:
    # A str-Enum's str() is "Dir.preferences" on 3.11; the payload holds the value.
    return str(value.value) if isinstance(value, Enum) else value


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


def open_store(settings: Settings, dim: int) -> Store:
    """The store this deployment uses, ready to write: a Qdrant server when
    `settings.qdrant_url` is set, else an Edge shard under `settings.data_dir`."""
    store = _connect(settings, dim)
    try:
        store.ensure()
    except BaseException:
        store.close()  # an Edge shard holds a lock on its directory until closed
        raise
    return store


def _connect(settings: Settings, dim: int) -> Store:
    # Imported here so that an embedded deployment never imports qdrant-client.
    if settings.qdrant_url:
        from qdrant_client import QdrantClient

        from shared.server_store import ServerStore

        key = settings.qdrant_api_key.get_secret_value() if settings.qdrant_api_key else None
        return ServerStore(QdrantClient(url=settings.qdrant_url, api_key=key), settings.collection, dim)
    from shared.edge_store import EdgeStore

    return EdgeStore(settings.data_dir / "qdrant" / settings.collection, dim)
