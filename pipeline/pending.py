"""What a subject has said that memflow has not finished writing: the read-your-writes layer (docs/read-your-writes.md).

The write path is asynchronous: a statement published a millisecond ago is still on its way through trigger,
extract, resolve and upsert when the agent's next search runs. Each statement the write path may turn into a
memory is kept as a pending entry (`Said`) from the moment it is published until what it became lands in the
store, and every search also ranks, with the same scoring, the memories memflow is about to write from those
entries: the candidates the rules read in the turn (`drafts`), each as resolve would decide it against the
stored memories the search found (`about_to_write`). What resolve would skip (a duplicate, a replay of a
memory already stored from the same event) is not shown twice; what it would supersede is named.

Pure: the caller reads the entries, the stored candidates and the vectors, and passes `now`.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass

from memflow.pipeline.extract import assemble, read
from memflow.pipeline.gate import GateVerdict
from memflow.pipeline.models import (
    SEARCHABLE_STATUSES,
    Candidate,
    ChatEvent,
    ExtractTask,
    Hit,
    Kind,
    Memory,
    PutOp,
    Role,
    TriggerReason,
    Turn,
    Wire,
)
from memflow.pipeline.resolve import CONTRADICTION_OVERLAP, LEXICAL_DUPLICATE, Neighbour, decide
from memflow.pipeline.statements import overlap

_PENDING_IDS = uuid.UUID("6f0c1d52-3b1e-4f8e-9a57-2d7c4b6a9e10")


class Said(Wire):
    """A pending entry: one turn as the trigger will keep it (gated, redacted), until what it becomes is stored."""

    turn: Turn
    session_id: str
    explicit: bool = False
    external_ref: str | None = None


def said(event: ChatEvent) -> Said | None:
    """The pending entry a published event leaves: a message of the user's, or one written explicitly. None for
    what never becomes a memory: an assistant's or a tool's message, a session's end, feedback.

    Not gated here: the gate costs up to a millisecond or two a message, which a publish does not pay. What a
    search shows of an entry is read from it through the gate (`drafts`, as extraction reads a turn), and the
    trigger, which gates every message anyway, drops the entries of refused turns and redacts the others in
    place (`gated`), milliseconds after the publish: the entry holds the raw words no longer than the events
    stream does."""
    if event.kind is not Kind.message or event.role is None or event.role is Role.system or not event.text.strip():
        return None
    explicit = bool(event.meta.get("explicit"))
    if event.role is not Role.user and not explicit:
        return None
    turn = Turn(event_id=event.event_id, role=event.role, text=event.text, ts=event.ts,
                speaker=event.meta.get("speaker"))
    return Said(turn=turn, session_id=event.session_id, explicit=explicit, external_ref=event.meta.get("external_ref"))


def gated(entry: Said, verdict: GateVerdict) -> Said | None:
    """The entry as the gate left its turn: None when it refused it, else with the redacted text."""
    if not verdict.keep or not verdict.text.strip():
        return None
    return entry.model_copy(update={"turn": entry.turn.model_copy(update={"text": verdict.text.strip()})})


def drafts(subject: str, entry: Said) -> list[Candidate]:
    """What memflow will write from the entry's turn, one entry per thing said: the statements the rules read
    in it, or, when it states nothing they read, its verbatim record (what its session's end writes). Not both:
    a statement is written first, and the record that repeats it only at the session's end. The rules'
    reading: a configured LLM extractor may word the stored memory differently, and the stored one replaces
    this one all the same (by event id)."""
    reason = TriggerReason.explicit_write if entry.explicit else TriggerReason.session_end
    task = ExtractTask(subject=subject, session_id=entry.session_id, reason=reason, turns=[entry.turn],
                       ts=entry.turn.ts, external_ref=entry.external_ref)
    records, statements = read(task)
    return assemble([], statements) or assemble(records, [])


@dataclass(frozen=True)
class Pending:
    """A memory about to be written, as a search shows it: the memory, the event it comes from, and the
    stored memory it is about to supersede (None when it adds to what is known)."""

    memory: Memory
    event_id: str
    superseding: str | None = None


def pending_id(event_id: str, n: int) -> str:
    """The id a pending memory is shown under: its own (the stored memory's id depends on what resolve finds)."""
    return str(uuid.uuid5(_PENDING_IDS, f"{event_id}\x00{n}"))


def about_to_write(event_id: str, n: int, candidate: Candidate, stored: Sequence[Neighbour], *,
                   duplicate_threshold: float) -> Pending | None:
    """What resolve would write for `candidate` against the stored memories around it, as a pending memory;
    None when it would write nothing that a search serves: a duplicate or replay of a stored memory (that one
    answers), a rule that waits for review, or a memory already stored from this very event."""
    batch = decide(candidate, stored, duplicate_threshold=duplicate_threshold)
    put = next((op.memory for op in batch.ops if isinstance(op, PutOp)), None)
    if put is None or put.status not in SEARCHABLE_STATUSES:
        return None
    return Pending(put.model_copy(update={"id": pending_id(event_id, n)}), event_id, put.supersedes)


def landed(entries: Iterable[str], stored: Iterable[Memory]) -> set[str]:
    """The entries (event ids) that a stored memory among `stored` was written from: the memory answers for them."""
    wanted = set(entries)
    return {e for m in stored for e in m.source_event_ids if e in wanted}


# -- the keyword side: BM25 as the store scores it --------------------------------------------------------


def keyword_score(doc: Mapping[int, float], query: Iterable[int], idf: Mapping[int, float]) -> float:
    """A document's BM25 score for a query (weight 1 per distinct term), as the store computes it: the sum over
    the query's terms of the document's term weight × the term's IDF."""
    return sum(doc.get(t, 0.0) * idf.get(t, 0.0) for t in set(query))


def estimated_idf(query: Iterable[int], hits: Sequence[tuple[Mapping[int, float], float]]) -> dict[int, float]:
    """Each query term's IDF, as the store applied it to the keyword hits it returned (document term weights,
    BM25 score). The store keeps its collection statistics to itself; its scores reveal them: a hit matching
    one term of the query gives that term's IDF exactly, and a hit matching more gives one more term's once
    the others are known. Terms left over share what is left of a hit's score; a term no hit contains is at
    least as rare as the rarest one seen (it found nothing to match), so it gets the highest IDF seen, or 1."""
    terms = set(query)
    known: dict[int, float] = {}
    rows = [({t: w for t, w in doc.items() if t in terms and w > 0}, score) for doc, score in hits]
    for _ in range(len(terms)):
        progress = False
        for doc, score in rows:
            unknown = [t for t in doc if t not in known]
            if len(unknown) == 1:
                t = unknown[0]
                rest = score - sum(w * known[u] for u, w in doc.items() if u != t)
                known[t] = max(0.0, rest / doc[t])
                progress = True
        if not progress:
            break
    for doc, score in rows:  # several unknown terms in every hit left: they share the rest evenly
        unknown = [t for t in doc if t not in known]
        if unknown:
            rest = max(0.0, score - sum(w * known[u] for u, w in doc.items() if u in known))
            share = rest / sum(doc[t] for t in unknown)
            for t in unknown:
                known[t] = share
    top = max(known.values(), default=1.0) or 1.0
    return {t: known.get(t, top) for t in terms}


def newest_per_slot(shown: Sequence[Pending], slotted: Mapping[str, bool]) -> list[Pending]:
    """The pending memories a search shows: of several pending values of one single-valued key (`slotted`: a
    memory id → its candidate named one thing), only the newest; the older ones will be history when written."""
    newest: dict[str, Pending] = {}
    for p in shown:
        if slotted.get(p.memory.id):
            held = newest.get(p.memory.key)
            if held is None or (p.memory.created_at, p.event_id) >= (held.memory.created_at, held.event_id):
                newest[p.memory.key] = p
    kept = {id(p) for p in newest.values()}
    return [p for p in shown if not slotted.get(p.memory.id) or id(p) in kept]


def served(hits: Sequence[Hit], pending: Mapping[str, Pending], hit_of: Callable[[Pending], Hit], k: int) -> list[Hit]:
    """The hits as a search returns them: pending ones marked (`pending`, `event_id`, `superseding`), and each
    pending correction ranked right above the stored memory it is about to supersede when that one is among
    the hits (taking a place of the k if the ranking left it out): an agent that reads both never takes the
    old value for the current one."""
    out = [_marked(h, pending.get(h.id)) for h in hits]
    for p in pending.values():
        if p.superseding is None:
            continue
        old = next((i for i, h in enumerate(out) if h.id == p.superseding), None)
        mine = next((i for i, h in enumerate(out) if h.id == p.memory.id), None)
        if old is None or (mine is not None and mine < old):
            continue
        hit = out.pop(mine) if mine is not None else _marked(hit_of(p), p)
        out.insert(old, hit)
    return out[:k]


def _marked(hit: Hit, p: Pending | None) -> Hit:
    if p is None:
        return hit
    return hit.model_copy(update={"pending": True, "event_id": p.event_id, "superseding": p.superseding})


def close_wording(a: str, b: str) -> bool:
    """Whether two statements are worded closely enough for their similarity to change what resolve decides:
    its near-duplicate rule needs the same wording, its contradiction rule a shared share of words."""
    return overlap(a, b) >= min(CONTRADICTION_OVERLAP, LEXICAL_DUPLICATE)
