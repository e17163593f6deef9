"""What a forget reaches beyond the memories it names, and how its proof recognises their words
(docs/write-path.md#forgetting).

A memory is distilled from a turn, and the turn is kept beside it: verbatim, as its record (an episode,
pipeline/records.py), and quoted in the `context` of the records of the turns around it. Forgetting the
memory and keeping those would keep its words, searchable. So a forget reaches:

- the **records of the turns it was distilled from** (they share a source event) **that hold its words**:
  forgotten whole, with it. Not redacted: the other facts of the turn stay as their own memories, a record
  that misquotes its turn is no record, and the turn's raw copies in Redis go with its event anyway
  (workers/forgetting.py `scrub`). A record of those turns that does not hold the words stays.
- the **context of the records around those turns**: the forgotten turns taken out (`records.unsaid`).

What still holds the words after that (a memory not named that says the same, a record of another turn
quoting them) is not forgotten unasked: it is named (`still_held`), so the caller knows.

"Holds the words": one of the memory's wordings — each sentence of its content and of its evidence (the span
it was read from), normalised (`statements.normal`: no case, no punctuation, no spaces) — is found inside a
point's content, evidence or a line of its context, normalised the same way.

The proof (`verify`) runs later, without the words: a receipt keeps only SHA-256 `fingerprints` of normalised
sentences — the memory's wordings and every sentence found holding them when it was forgotten — and a point
still holds the words when one of its own sentences (or a whole text) has one of those fingerprints.

Pure: workers/forgetting.py reads the points and applies what this decides.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field

from memflow.pipeline.models import Memory, MType, PatchOp, Status
from memflow.pipeline.records import unsaid
from memflow.pipeline.statements import normal, split_sentences

# A wording shorter than this (normalised characters) is not looked for: "ok" or "yes" is in everything.
# Four holds a whole Chinese statement ("我养猫了" is four).
MIN_WORDING = 4

# A forget reads every point of a subject once: `normal`'s cache is sized for resolve's repeated comparisons,
# and these texts would only push its entries out.
_normal = normal.__wrapped__


@dataclass(frozen=True)
class Reach:
    """What forgetting some named memories reaches besides them."""

    # The records of the turns they were distilled from that hold their words: forgotten with them.
    records: list[Memory] = field(default_factory=list)
    # The forgotten turns taken out of the context of the records around them.
    unsaid: list[PatchOp] = field(default_factory=list)
    # Ids of the points that still hold the forgotten words afterwards (not forgotten unasked).
    still_held: list[str] = field(default_factory=list)
    # Per forgotten id (named or reached): the fingerprints of the words it was forgotten for (its receipt's).
    fingerprints: dict[str, list[str]] = field(default_factory=dict)


def reach(named: Sequence[Memory], points: Sequence[Memory], contains: str | None = None) -> Reach:
    """What forgetting `named` reaches among `points` (the subject's points, any status; `named` may be
    among them). `contains`: the words a forget by text named, looked for as they are (the caller chose them).
    Linear in points × wordings: each point's texts are normalised once."""
    texts = _Texts()
    gone = {m.id for m in named}
    words = {m.id: _asked(m, contains) for m in named}
    records = [p for p in points if p.id not in gone and _reached_by(p, named, words, texts)]
    forgotten = [*named, *records]
    patches = unsaid([p for p in points if p.mtype is MType.episode], forgotten)
    after = _patched(points, patches)
    gone |= {r.id for r in records}
    everything = frozenset[str]().union(*words.values())
    held = [p for p in after if p.id not in gone and p.status is not Status.deleted and texts.hold(p, everything)]
    still = _to_forget(held, lambda text: any(w in texts.of(text) for w in everything))
    return Reach(records, patches, still, _fingerprints(named, records, words, [*named, *points], texts))


def wordings(memory: Memory) -> frozenset[str]:
    """A memory's words as what `holds` looks for: each sentence of its content and evidence, normalised."""
    found = (_normal(s) for text in (memory.content, memory.evidence) for s in split_sentences(text))
    return frozenset(w for w in found if len(w) >= MIN_WORDING)


def holds(point: Memory, words: Iterable[str]) -> bool:
    """Whether one of `words` (normalised) is in the point's content, evidence or a line of its context."""
    return _Texts().hold(point, words)


def fingerprint(wording: str) -> str:
    """How a receipt names a normalised sentence without keeping it."""
    return hashlib.sha256(wording.encode()).hexdigest()


def still_holding(points: Iterable[Memory], fingerprints: set[str]) -> list[str]:
    """The proof's check, without the words: the ids of the points one of whose sentences (or whole texts),
    normalised, has one of these fingerprints."""
    if not fingerprints:
        return []
    seen: dict[str, bool] = {}  # a turn is its record's content, evidence and its neighbours' context lines

    def holding(text: str) -> bool:
        found = seen.get(text)
        if found is None:
            found = seen[text] = any(fingerprint(u) in fingerprints for u in _units_of(text))
        return found

    return _to_forget([p for p in points if p.status is not Status.deleted and any(map(holding, _texts(p)))],
                      holding)


def _to_forget(held: Sequence[Memory], holding: Callable[[str], bool]) -> list[str]:
    """The ids of the points to forget to take the words out of `held`: a record that holds them only by
    quoting, in its context, the turn of another record held goes with it (`records.unsaid`) and is not named."""
    quoted = {p.content for p in held if p.mtype is MType.episode}
    return [p.id for p in held if any(holding(t) for t in (p.content, p.evidence) if t)
            or any(holding(line) and line not in quoted - {p.content} for line in p.context.split("\n") if line)]


class _Texts:
    """Each text normalised once for the whole forget (a turn is the content of its record and a line of its
    neighbours' context: the same text several times)."""

    def __init__(self) -> None:
        self._normal: dict[str, str] = {}

    def of(self, text: str) -> str:
        found = self._normal.get(text)
        if found is None:
            found = self._normal[text] = _normal(text)
        return found

    def hold(self, point: Memory, words: Iterable[str]) -> bool:
        """`holds`, with the texts normalised once."""
        texts = [self.of(t) for t in _texts(point)]
        return any(w in t for w in words for t in texts)


def _asked(memory: Memory, contains: str | None) -> frozenset[str]:
    """The words a forget asked to forget of `memory`: all of them when it was named by id; by text, the
    phrase and the sentences of the memory holding it (a record found by "oolong" does not make its turn's
    other sentences forgotten words)."""
    own = wordings(memory)
    phrase = _normal(contains) if contains else ""
    if not phrase:
        return own
    return frozenset({phrase, *(w for w in own if phrase in w)})


def _reached_by(point: Memory, named: Sequence[Memory], words: dict[str, frozenset[str]], texts: _Texts) -> bool:
    """Whether `point` is the record of a turn one of `named` was distilled from, holding its words. A record
    named is not distilled from anything: it reaches nothing."""
    if point.mtype is not MType.episode or point.status is Status.deleted:
        return False
    said = set(point.source_event_ids)
    return any(m.mtype is not MType.episode and said & set(m.source_event_ids) and texts.hold(point, words[m.id])
               for m in named)


def _patched(points: Sequence[Memory], patches: Sequence[PatchOp]) -> list[Memory]:
    """The points as they are once the context patches are written."""
    changed = {p.id: p.set for p in patches}
    return [p.model_copy(update=changed[p.id]) if p.id in changed else p for p in points]


def _fingerprints(named: Sequence[Memory], records: Sequence[Memory], words: dict[str, frozenset[str]],
                  points: Sequence[Memory], texts: _Texts) -> dict[str, list[str]]:
    """Per forgotten id, the fingerprints of its words and of every sentence found holding them: a record
    reached is forgotten for the words of the memories that reached it, not for its whole turn (the turn's other
    facts stay, and must not read as holding forgotten words)."""
    own = {m.id: words[m.id] | set(_enclosing(points, words[m.id], texts)) for m in named}
    by_record = {r.id: frozenset[str]().union(*(own[m.id] for m in named if _reached_by(r, [m], words, texts)))
                 for r in records}
    return {i: sorted({fingerprint(w) for w in ws}) for i, ws in (own | by_record).items()}


def _enclosing(points: Sequence[Memory], words: frozenset[str], texts: _Texts) -> Iterator[str]:
    """The normalised sentences of `points` that hold one of `words` (a sentence, or a whole text where the
    words straddle sentences)."""
    for p in points:
        for text in _texts(p):
            if not any(w in texts.of(text) for w in words):
                continue
            inside = [s for s in map(texts.of, split_sentences(text)) if any(w in s for w in words)]
            yield from inside or [texts.of(text)]


def _texts(point: Memory) -> list[str]:
    return [t for t in (point.content, point.evidence, *point.context.split("\n")) if t]


def _units_of(text: str) -> list[str]:
    """A text and each of its sentences, normalised: what the proof compares by fingerprint. The sentences
    hold every word character of the text (what they leave out is space and punctuation), so the whole
    text's normal form is theirs joined."""
    sentences = [_normal(s) for s in split_sentences(text)]
    return ["".join(sentences), *sentences]
