"""Pending memories ranked with the stored ones: what a search adds from the read-your-writes layer
(shared/unstored/pending.py holds the entries; pipeline/pending.py decides what each becomes)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from threading import Lock
from typing import Generic, TypeVar

import numpy as np
import numpy.typing as npt

from memflow.pipeline.models import Candidate
from memflow.pipeline.pending import (
    Pending,
    Said,
    about_to_write,
    close_wording,
    drafts,
    estimated_idf,
    keyword_score,
    landed,
    newest_per_slot,
)
from memflow.pipeline.resolve import Neighbour
from memflow.pipeline.score import Found, Scored
from memflow.shared.inference.embedder import Embedder
from memflow.shared.storage import sparse

K = TypeVar("K")
V = TypeVar("V")


@dataclass
class Shown:
    """The pending memories one search ranks, by their ids, with their vectors."""

    by_id: dict[str, Pending] = field(default_factory=dict)
    vectors: dict[str, Unit] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.by_id)


class Kept(Generic[K, V]):
    """A bounded LRU shared by the query worker's threads: what a search works out from pending entries, kept
    because a live session's entries come back search after search until they land."""

    def __init__(self, size: int) -> None:
        self._kept: OrderedDict[K, V] = OrderedDict()
        self._size, self._lock = size, Lock()

    def get(self, keys: Iterable[K]) -> dict[K, V]:
        """The values kept for these keys (each one used now)."""
        with self._lock:
            found = {k: self._kept[k] for k in keys if k in self._kept}
            for k in found:
                self._kept.move_to_end(k)
        return found

    def put(self, values: Mapping[K, V]) -> None:
        with self._lock:
            self._kept.update(values)
            while len(self._kept) > self._size:
                self._kept.popitem(last=False)


# The rules' reading of each entry (pure): by subject, event and text.
_DRAFTS: Kept[tuple[str, str, str], list[Candidate]] = Kept(4096)
# Passage vectors as `Unit`s, by model and text: the embedder's own cache hands back lists, and turning 40 of
# them into arrays again each search cost more than the rest of the layer.
_UNITS: Kept[tuple[str, str], Unit] = Kept(8192)


def kept_drafts(subject: str, entry: Said) -> list[Candidate]:
    """`pipeline.pending.drafts`, kept."""
    key = (subject, entry.turn.event_id, entry.turn.text)
    kept = _DRAFTS.get([key])
    if key in kept:
        return kept[key]
    found = drafts(subject, entry)
    _DRAFTS.put({key: found})
    return found


# Stored memories a pending one is checked against besides its own key's: the best of the dense lists
# (the near-duplicates resolve would skip it for are among them).
NEAR = 10


def about_to_be_written(entries: Sequence[Said], subject: str, found: Sequence[Found], embedder: Embedder, *,
                        query: str, query_vector: Sequence[float], keep: int, duplicate_threshold: float) -> Shown:
    """The pending memories a search shows: each entry's candidates that no stored memory among `found` was
    written from, as resolve would decide them against the stored memories around them, the newest of several
    values of one key.

    Only the `keep` most relevant by meaning and the `keep` most relevant by words are decided (a live session
    may hold dozens of entries, and what ranks below the k served cannot be shown), against the best stored
    candidates and those of their own key; a similarity is computed only where the wording is close enough
    for it to matter (`pipeline.pending.close_wording`: resolve's duplicate and contradiction rules need both)."""
    stored = {m.id: m for f in found for m, _ in (*f.keyword, *f.dense)}
    done = landed([s.turn.event_id for s in entries], stored.values())
    wanted = [(s.turn.event_id, n, c) for s in entries if s.turn.event_id not in done
              for n, c in enumerate(kept_drafts(subject, s))]
    if not wanted:
        return Shown()
    vectors = _vectors_for(embedder, wanted, query)
    wanted = _most_relevant([w for w in wanted if w[2].content in vectors], vectors, query, unit(query_vector), keep)
    keys = {c.key for _, _, c in wanted}
    best = {m.id: m for f in found for pairs in (f.dense, f.keyword) for m, _ in list(pairs)[:NEAR]}
    around = list({**best, **{i: m for i, m in stored.items() if m.key in keys}}.values())
    close = {(c.content, m.content) for _, _, c in wanted for m in around if close_wording(c.content, m.content)}
    vectors |= _encoded(embedder, [m for _, m in close if m not in vectors])
    made: list[Pending] = []
    slotted: dict[str, bool] = {}
    for event_id, n, c in wanted:
        # Only what resolve's rules can act on: its own key's memories, and the closely worded ones.
        neighbours = [Neighbour(m, _dot(vectors[c.content], vectors[m.content]) if (c.content, m.content) in close
                                else 0.0) for m in around if m.key == c.key or (c.content, m.content) in close]
        p = about_to_write(event_id, n, c, neighbours, duplicate_threshold=duplicate_threshold)
        if p is not None:
            made.append(p)
            slotted[p.memory.id] = c.slot and p.memory.key == c.key
    kept = newest_per_slot(made, slotted)
    return Shown({p.memory.id: p for p in kept}, {p.memory.id: vectors[p.memory.content] for p in kept})


# Pending statements a search encodes at most (the rest wait for the next search): a session of dozens of turns no
# search has seen would otherwise cost its first search as many model calls (seconds on a CPU).
ENCODE_PER_SEARCH = 8


def _vectors_for(embedder: Embedder, wanted: Sequence[tuple[str, int, Candidate]], query: str) -> dict[str, Unit]:
    """The vectors of the wanted statements that are kept, and of at most `ENCODE_PER_SEARCH` more: those that
    share most of the query's words first, then the newest. A statement left out this time is encoded by a
    later search; until then it is not served early (it is still written)."""
    texts = [c.content for _, _, c in wanted]
    known = _kept_units(embedder, texts)
    terms, _ = sparse.embed_query(query)
    order = sorted(range(len(wanted)), key=lambda i: (-keyword_score(sparse.text_terms(texts[i]), terms, {}), -i))
    new = list(dict.fromkeys(texts[i] for i in order if texts[i] not in known))[:ENCODE_PER_SEARCH]
    return known | _encoded(embedder, new)


def _kept_units(embedder: Embedder, texts: Sequence[str]) -> dict[str, Unit]:
    """The vectors of these texts kept already (none is encoded)."""
    return {t: v for (_, t), v in _UNITS.get((embedder.model_id, t) for t in texts).items()}


def _encoded(embedder: Embedder, texts: Sequence[str]) -> dict[str, Unit]:
    """These texts' vectors: the kept ones, and the others encoded in one call (and kept)."""
    unique = list(dict.fromkeys(texts))
    known = _kept_units(embedder, unique)
    new = [t for t in unique if t not in known]
    made = dict(zip(new, map(unit, embedder.encode_passages(new)), strict=True)) if new else {}
    _UNITS.put({(embedder.model_id, t): v for t, v in made.items()})
    return known | made


def _most_relevant(wanted: list[tuple[str, int, Candidate]], vectors: Mapping[str, Unit], query: str,
                   query_vector: Unit, keep: int) -> list[tuple[str, int, Candidate]]:
    """The `keep` best by cosine with the query and the `keep` best by the query's words, in their order."""
    if len(wanted) <= keep:
        return wanted
    terms, _ = sparse.embed_query(query)
    by_meaning = sorted(range(len(wanted)), key=lambda i: -_dot(vectors[wanted[i][2].content], query_vector))
    by_words = sorted(range(len(wanted)),
                      key=lambda i: -keyword_score(sparse.text_terms(wanted[i][2].content), terms, {}))
    chosen = set(by_meaning[:keep]) | set(by_words[:keep])
    return [w for i, w in enumerate(wanted) if i in chosen]


def with_pending(found: Found, route_text: str, dense: Sequence[float] | None, admitted: Sequence[Pending],
                 vectors: Mapping[str, Unit]) -> Found:
    """A route's candidates with the pending memories its filter admits, scored as the store scores: BM25 on
    the route's text (with the IDF the store applied to this route's keyword hits) and the cosine with the
    route's dense vector when it searches by meaning."""
    if not admitted:
        return found
    terms, _ = sparse.embed_query(route_text)
    idf = estimated_idf(terms, [(sparse.memory_terms(m), score) for m, score in found.keyword])
    keyword = [(p.memory, keyword_score(sparse.memory_terms(p.memory), terms, idf)) for p in admitted]
    toward = None if dense is None else unit(dense)
    meaning = [] if toward is None else [(p.memory, _dot(vectors[p.memory.id], toward)) for p in admitted]
    return replace(found, keyword=_merged(found.keyword, [(m, s) for m, s in keyword if s > 0]),
                   dense=_merged(found.dense, meaning) if found.dense or meaning else found.dense)


def _merged(a: Sequence[Scored], b: Sequence[Scored]) -> list[Scored]:
    return sorted([*a, *b], key=lambda pair: pair[1], reverse=True)


# A vector scaled to length 1, as a numpy array: the cosine of two is their dot product, as the store's Cosine
# distance computes it (made once per vector: a search compares each with dozens).
Unit = npt.NDArray[np.float64]


def unit(vector: Sequence[float]) -> Unit:
    v = np.asarray(vector, dtype=np.float64)
    norm = float(np.linalg.norm(v))
    return v / norm if norm else v


def _dot(a: Unit, b: Unit) -> float:
    return float(a @ b)
