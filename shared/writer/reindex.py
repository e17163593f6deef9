"""Re-embed every memory with another model (`memflow reindex`) while searches keep using the old vectors.

The store records which model made its vectors (shared/storage/store.py: `Identity`, `Catalog`). A reindex
builds a second index, named after the new model, beside the current one, and switches when it is whole:

1. copy: the current index is paged through in id order with its own scroll (`Store.page`: every
   subject, every status — history is re-embedded too). Each page is encoded with the new model and
   written with its payload unchanged; the BM25 vector is rebuilt from that payload by the function that
   made it (`shared.storage.sparse`), so it is the same vector. After each page the offset of the next is saved
   with the new index: a killed reindex resumes there. The page in hand when it died is written again,
   under the same ids, so nothing is doubled.
2. catch up: writes go on during the copy. What the current index gained, changed or lost since its
   page was copied is found by comparing the two indexes point by point (digests of each payload and of
   the texts the vectors are made from; no vectors read) and applied: new or reworded memories are
   encoded, other changes copied as payload, deleted ones deleted (a memory forgotten meanwhile stays
   forgotten).
3. fence, then catch up again: from the fence on no serving process writes to the old index (the server
   deletes the alias they use; an Edge shard has no other user), so this pass is the last word.
4. switch: the new index becomes current in one atomic step (server: an alias operation; Edge: the
   record file replaced), then the old one is dropped. A kill in between leaves a leftover that the next
   `memflow reindex` drops.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

import orjson

from memflow.pipeline.models import Memory
from memflow.shared.errors import MemflowError
from memflow.shared.storage.sparse import indexed_text
from memflow.shared.storage.store import Catalog, Identity, Index, Progress, Store, index_name
from memflow.shared.writer.applier import copy_fields, copy_points, drop_points

log = logging.getLogger(__name__)

DEFAULT_BATCH = 128
# Set through `set_fields` when only the payload changed: the point keeps its new vectors.
_FIXED = ("id", "subject")


class Encoder(Protocol):
    """What a reindex needs of an embedder (shared.inference.embedder.Embedder): what is stored is a passage."""

    @property
    def model_id(self) -> str: ...

    @property
    def dim(self) -> int: ...

    def encode_passages(self, texts: Sequence[str]) -> list[list[float]]: ...


# "catch-up" runs while serving processes still write; "final" after the fence, when they cannot.
Phase = Literal["copy", "catch-up", "final", "switch"]


@dataclass(frozen=True)
class Step:
    """Where a reindex is: `done` of `total` points of its phase."""

    phase: Phase
    done: int
    total: int


@dataclass
class Report:
    collection: str
    source: str  # the model the store held
    target: str  # the model it holds after the switch
    already: bool = False  # the store already held the target model's vectors: nothing was done
    resumed_at: int = 0  # points an interrupted run had copied before this one
    copied: int = 0  # points this run copied (encoded and written)
    refreshed: int = 0  # changed in the old index after their page was copied, copied again
    removed: int = 0  # deleted from the old index after their page was copied
    switched: bool = False
    points: int = 0  # in the store when the run ended
    seconds: float = 0.0


def reindex(catalog: Catalog, encoder: Encoder, *, batch: int = DEFAULT_BATCH,
            on_step: Callable[[Step], None] | None = None, stop_after: int | None = None) -> Report:
    """Move the store to `encoder`'s model; returns once switched. With `stop_after` it stops after that
    many pages, progress saved, as a kill would leave it (the next call resumes)."""
    started = time.perf_counter()
    current = catalog.current()
    if current is None:
        raise MemflowError(f"collection {catalog.collection!r} does not exist yet: nothing to reindex")
    wanted = Identity(encoder.model_id, encoder.dim)
    report = Report(catalog.collection, str(current.identity or f"an unrecorded model ({current.dim} dims)"),
                    str(wanted))
    if current.identity == wanted:
        _tidy(catalog, current)
        report.already = True
    else:
        run = _Run.start(catalog, encoder, current, wanted, batch, on_step or _quiet, report)
        if run.copy(stop_after):
            run.finish()
    report.points = catalog.open(catalog.current() or current).count()
    report.seconds = time.perf_counter() - started
    return report


class _Run:
    """One reindex from `current` into `target`: the two stores and the saved progress."""

    def __init__(self, catalog: Catalog, encoder: Encoder, current: Index, target: Index, progress: Progress,
                 batch: int, on_step: Callable[[Step], None], report: Report) -> None:
        self.catalog, self.encoder, self.current, self.target = catalog, encoder, current, target
        self.progress, self.batch, self.on_step, self.report = progress, batch, on_step, report
        self.source = catalog.open(current)
        self.dest = catalog.open(target)

    @classmethod
    def start(cls, catalog: Catalog, encoder: Encoder, current: Index, wanted: Identity, batch: int,
              on_step: Callable[[Step], None], report: Report) -> _Run:
        target = Index(index_name(catalog.collection, wanted), wanted.dim, wanted)
        _drop_leftovers(catalog, keep={current.name, target.name})
        progress = catalog.progress(target)
        if progress is None or progress.source != current.name:
            catalog.drop(target.name)  # never started, or built from an index that is no longer current
            progress = Progress(source=current.name)
        catalog.create(wanted)
        catalog.save_progress(target, progress)
        report.resumed_at = progress.copied
        if progress.copied:
            log.info("reindex into %s resumes after %d points", target.name, progress.copied)
        return cls(catalog, encoder, current, target, progress, batch, on_step, report)

    def copy(self, stop_after: int | None) -> bool:
        """Copy page after page from the saved offset; False if stopped after `stop_after` pages."""
        total, pages = self.source.count(), 0
        self.on_step(Step("copy", self.progress.copied, max(total, self.progress.copied)))
        while not self.progress.done:
            if stop_after is not None and pages >= stop_after:
                return False
            memories, after = self.source.page(self.progress.offset, self.batch)
            self._write(memories)
            copied = self.progress.copied + len(memories)
            self.progress = Progress(source=self.current.name, offset=after, copied=copied, done=after is None)
            self.catalog.save_progress(self.target, self.progress)
            pages += 1
            self.report.copied += len(memories)
            self.on_step(Step("copy", self.progress.copied, max(total, self.progress.copied)))
        return True

    def finish(self) -> None:
        self.catch_up("catch-up")
        self.catalog.fence(self.current)
        self.catch_up("final")
        self.on_step(Step("switch", 0, 1))
        self.catalog.switch(self.target)
        self.catalog.save_progress(self.target, None)
        self.catalog.drop(self.current.name)
        self.report.switched = True
        self.on_step(Step("switch", 1, 1))
        log.info("collection %s now holds vectors of %s (index %s)", self.catalog.collection,
                 self.target.identity, self.target.name)

    def catch_up(self, phase: Phase) -> None:
        """Make the new index hold what the old one holds now, point by point."""
        held: dict[str, bytes] = {}
        owners: dict[str, str] = {}  # a point's subject: a write by id names it (shared/storage/store.py)
        for memory in _every(self.dest, self.batch):
            held[memory.id], owners[memory.id] = _digest(memory), memory.subject
        total, seen = self.source.count(), 0
        for memories in _pages(self.source, self.batch):
            reworded, changed = _stale(memories, held)
            self._write(reworded)
            for memory in changed:
                copy_fields(self.dest, memory, _patch(memory))
            self.report.refreshed += len(reworded) + len(changed)
            seen += len(memories)
            self.on_step(Step(phase, seen, max(total, seen)))
        drop_points(self.dest, {i: owners[i] for i in held})  # left in `held`: gone from the old index since copied
        self.report.removed += len(held)

    def _write(self, memories: list[Memory]) -> None:
        if not memories:
            return
        vectors = self.encoder.encode_passages([m.content for m in memories])
        if any(len(v) != self.target.dim for v in vectors):
            raise MemflowError(f"the embedder {self.encoder.model_id} made a vector that is not {self.target.dim}-dim")
        copy_points(self.dest, memories, vectors)


def _stale(memories: list[Memory], held: dict[str, bytes]) -> tuple[list[Memory], list[Memory]]:
    """Of a page of the old index, the memories the new one lacks or holds other words of (to encode), and
    those whose payload alone changed (to patch). Each one seen leaves `held`."""
    reworded, changed = [], []
    for memory in memories:
        had, now = held.pop(memory.id, None), _digest(memory)
        if had is None or had[:16] != now[:16]:
            reworded.append(memory)
        elif had != now:
            changed.append(memory)
    return reworded, changed


def _digest(memory: Memory) -> bytes:
    """16 bytes for the texts the vectors are made from, then 16 for the whole payload: ~150 bytes a point
    held in memory during a catch-up, however big the payloads."""
    text = hashlib.blake2b(f"{memory.content}\x00{indexed_text(memory)}".encode(), digest_size=16).digest()
    payload = orjson.dumps(memory.model_dump(mode="json"), option=orjson.OPT_SORT_KEYS)
    return text + hashlib.blake2b(payload, digest_size=16).digest()


def _patch(memory: Memory) -> dict[str, object]:
    return {k: v for k, v in memory.model_dump(mode="json").items() if k not in _FIXED}


def _pages(store: Store, batch: int) -> Iterator[list[Memory]]:
    offset: str | None = None
    while True:
        memories, offset = store.page(offset, batch)
        yield memories
        if offset is None:
            return


def _every(store: Store, batch: int) -> Iterator[Memory]:
    for memories in _pages(store, batch):
        yield from memories


def _tidy(catalog: Catalog, current: Index) -> None:
    """After a run killed between its switch and its drop: the old index and the saved progress go."""
    _drop_leftovers(catalog, keep={current.name})
    catalog.save_progress(current, None)


def _drop_leftovers(catalog: Catalog, keep: set[str]) -> None:
    for name in catalog.names():
        if name not in keep:
            log.info("dropping %s: an index of %s left by an earlier reindex", name, catalog.collection)
            catalog.drop(name)


def _quiet(step: Step) -> None:
    pass
