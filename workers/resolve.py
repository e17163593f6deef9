"""resolve: `resolve` → `upsert`. Places a candidate against what the subject already has.

Embeds the batch once, reads every candidate's neighbours (same key, or same dir and dense
similarity ≥ NEIGHBOUR_THRESHOLD) in one engine call, and lets `pipeline.resolve.decide` choose:
duplicate, add, supersede, contest or review. It writes nothing itself.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import redis

from memflow.pipeline import llm_judge
from memflow.pipeline.clauses import ended
from memflow.pipeline.extract import CONTEXT_BEFORE
from memflow.pipeline.fates import FORGOTTEN_IN_FLIGHT, FateState
from memflow.pipeline.ids import IdSpace, episode_key, is_keyed
from memflow.pipeline.llm_judge import Verdict
from memflow.pipeline.models import Candidate, Memory, MType, PatchOp, Status
from memflow.pipeline.resolve import Neighbour, decide, first_per_key, forms_keys, record_sources
from memflow.shared.errors import EmbedderRejected
from memflow.shared.inference.embedder import Embedder
from memflow.shared.inference.llm import LLM, Reading
from memflow.shared.redisdb.keys import Keys
from memflow.shared.settings import WriteSettings
from memflow.shared.storage.store import MemoryFilter, Query, Scored, Store
from memflow.shared.streaming.consumer import StreamConsumer
from memflow.shared.streaming.handlers import Emit, Outcome, progress
from memflow.shared.unstored import fates, pending
from memflow.shared.unstored.pending import settled_by
from memflow.workers import forgetting
from memflow.workers.runtime import Context

# What a newcomer is compared with: history (superseded, archived, deleted) is not.
LIVE = (Status.active, Status.contested, Status.pending_review)
# ...and what a later mention may bring back from the archive (pipeline.resolve._revives).
NEARBY = (*LIVE, Status.archived)
NEIGHBOURS = 10
# The dense similarity at which a memory of the candidate's dir counts as its neighbour (shown to the rules
# and the judge). Set in the first commit (46548a2) and not tuned on a benchmark since; it was
# MEMFLOW_NEIGHBOUR_THRESHOLD.
NEIGHBOUR_THRESHOLD = 0.7
# Under load a short batch waits this long for more candidates, so that one embedding call serves many: with
# 256 entries a read (shared/streaming/consumer.READ_COUNT) it took bench perf's ingest from 0.29x to 0.438x of the raw
# encode, against 20 ms and 64 (bench/RESULTS.md, "Ingest history"). It was MEMFLOW_RESOLVE_LINGER_MS.
RESOLVE_LINGER_MS = 50


@dataclass(frozen=True)
class Resolver:
    """What the resolve stage touches: the store it reads neighbours from, the embedder of the statements, the
    write settings (the duplicate threshold), the LLM judge (None: the rules decide alone), and Redis for the forget
    ledger, the pending layer and the upsert streams."""

    client: redis.Redis
    keys: Keys
    store: Store
    embedder: Embedder
    write: WriteSettings
    judge: LLM | None
    space: IdSpace  # how new memories are named (pipeline/ids.py)

    @classmethod
    def of(cls, ctx: Context) -> Resolver:
        return cls(ctx.client, ctx.keys, ctx.store, ctx.embedder, ctx.settings.write,
                   ctx.llm if ctx.settings.llm.judge else None, ctx.id_space)


def build(ctx: Context) -> StreamConsumer[Candidate]:
    config = ctx.consumer_config()
    config.linger_ms = RESOLVE_LINGER_MS
    # Unpacked per batch, as the context opens its store and loads its model when first used.
    return StreamConsumer(ctx.client, ctx.keys, "resolve", Candidate,
                          lambda candidates: handle(Resolver.of(ctx), candidates), config)


def handle(stage: Resolver, candidates: Sequence[Candidate]) -> list[Outcome]:
    plan = _dispositions(stage.client, stage.keys, candidates)
    deciding = [c for c, go in zip(candidates, plan, strict=True) if go == "now"]
    try:
        # A passage: the vector is stored with the memory, and compared with stored ones (neighbours).
        vectors = passage_vectors(stage.embedder, [c.content for c in deciding])
    except Exception as exc:  # noqa: BLE001 - the whole batch is retried, nothing is lost
        return [exc for _ in candidates]
    places = iter(zip(vectors, neighbourhoods(stage.store, NEIGHBOUR_THRESHOLD, deciding, vectors),
                      strict=True))
    outcomes: list[Outcome] = []
    for candidate, go in zip(candidates, plan, strict=True):
        if go == "drop":  # read only from words forgotten while in flight: never written back
            pending.settle(stage.client, stage.keys, settled_by([candidate]))
            fates.record(stage.client, stage.keys, candidate.subject, FateState.dropped, candidate.source_event_ids,
                         FORGOTTEN_IN_FLIGHT)
            outcomes.append([])
        elif go == "later":  # a later statement on a key decided in this batch: back of the queue, no retry spent
            outcomes.append([Emit(stage.keys.work("resolve", candidate.subject), candidate)])
        else:
            outcomes.append(_resolved(stage, candidate, *next(places)))
            progress()  # one judge call each at most: a batch of many keeps its partitions while it moves on
    return outcomes


def passage_vectors(embedder: Embedder, texts: list[str]) -> list[list[float] | EmbedderRejected]:
    """One call for the batch; when the endpoint refuses it, one call per text, so that only the
    text it refuses goes to the DLQ, not the batch around it."""
    try:
        return list(embedder.encode_passages(texts))
    except EmbedderRejected:
        if len(texts) < 2:
            raise
        return [_passage_vector(embedder, text) for text in texts]


def _passage_vector(embedder: Embedder, text: str) -> list[float] | EmbedderRejected:
    try:
        return embedder.encode_passages([text])[0]
    except EmbedderRejected as exc:
        return exc


def _resolved(stage: Resolver, candidate: Candidate, vector: list[float] | EmbedderRejected,
              neighbours: list[Neighbour] | Exception) -> Outcome:
    if isinstance(vector, EmbedderRejected):
        return vector
    if isinstance(neighbours, Exception):
        return neighbours
    try:
        return resolve_one(stage, candidate, vector, neighbours)
    except Exception as exc:  # noqa: BLE001 - kept, retried, then dead-lettered by the loop
        return exc


def neighbourhoods(store: Store, threshold: float, candidates: Sequence[Candidate],
                   vectors: Sequence[list[float] | EmbedderRejected]) -> list[list[Neighbour] | Exception]:
    """Each candidate's neighbours (`find_neighbours`), every query of the batch in one engine call: the
    candidates of a batch all see the store as it was (upsert writes after), so asking at once changes
    nothing they are shown, and saves a call per query (a round trip each on a Qdrant server). A failed
    call fails each candidate that asked, to be retried; a candidate without a vector asks nothing."""
    asking = [(i, v) for i, v in enumerate(vectors) if not isinstance(v, EmbedderRejected)]
    found: list[list[Neighbour] | Exception] = [[] for _ in candidates]
    try:
        asked = [(i, neighbour_queries(candidates[i], v)) for i, v in asking]
        answers = iter(store.query_many([q for _, qs in asked for q in qs]) if asked else [])
        for i, qs in asked:
            found[i] = neighbours_of(store, candidates[i], *(next(answers) for _ in qs), threshold=threshold)
    except Exception as exc:  # noqa: BLE001 - the loop retries, then dead-letters, each that asked
        return [exc for _ in candidates]
    return found


def _dispositions(client: redis.Redis, keys: Keys, candidates: Sequence[Candidate]) -> list[str]:
    """Per candidate: "now" (decide it), "later" (another on its key goes first) or "drop" (forgotten)."""
    allowed = forgetting.unforgotten(client, keys, candidates)
    first = iter(first_per_key([c for c, ok in zip(candidates, allowed, strict=True) if ok]))
    return [("now" if next(first) else "later") if ok else "drop" for ok in allowed]


def resolve_one(stage: Resolver, candidate: Candidate, vector: list[float],
                neighbours: list[Neighbour]) -> list[Emit]:
    judging = stage.judge is not None
    # A judge, or a statement that something is over, may retire memories under other keys, and their records.
    records = find_records(stage.store, candidate, neighbours, nearby=judging or ended(candidate.content) is not None)
    place = partial(decide, candidate, neighbours, duplicate_threshold=stage.write.duplicate_threshold,
                    space=stage.space)
    # The rules first, noting what they could not place; a judge only for those (an LLM call per candidate at most).
    unsure: list[Memory] = []
    verdicts: dict[str, Verdict] = {}
    batch = place(records=records, judge=lambda m: unsure.append(m)) if judging else place(records=records)
    if unsure and stage.judge is not None:
        verdicts = judge(stage.judge, candidate, list({m.id: m for m in unsure}.values()))
        batch = place(records=records, judge=lambda m: verdicts.get(m.id)) if verdicts else batch
    retired = {op.id for op in batch.ops if isinstance(op, PatchOp)} & {r.id for r in records}
    if retired:  # only then are the records beside them read (a scan of the subject), and the same answer given
        beside = records_beside(stage.store, candidate.subject, [r for r in records if r.id in retired])
        batch = place(records=[*records, *beside], judge=(lambda m: verdicts.get(m.id)) if verdicts else None)
    if not batch.ops:  # a replay of what is stored: its pending entry is answered by the stored memory
        pending.settle(stage.client, stage.keys, settled_by([candidate]))
        fates.stored(stage.client, stage.keys, candidate.subject, holding(candidate, neighbours))
        return []
    made = {"vector": vector, "vector_model": stage.embedder.model_id}
    return [Emit(stage.keys.work("upsert", batch.subject), batch.model_copy(update=made))]


def holding(candidate: Candidate, neighbours: Sequence[Neighbour]) -> dict[str, list[str]]:
    """Per event of `candidate`, the stored memories already read from it (what a replay repeats); an event none
    names is left out (its fate is what the write that stored it said)."""
    found = {e: [n.memory.id for n in neighbours if e in n.memory.source_event_ids] for e in candidate.source_event_ids}
    return {e: ids for e, ids in found.items() if ids}


def judge(llm: LLM, candidate: Candidate, known: list[Memory]) -> dict[str, Verdict]:
    """The LLM's verdict per memory; {} when it cannot be asked (the rules stand, counted and traced).
    An unreadable answer is a contradiction (`pipeline.llm_judge`)."""

    def read(reply: str) -> Reading[dict[str, Verdict]]:
        verdicts, unreadable = llm_judge.read_reply(reply, known)
        return Reading(verdicts, items=len(verdicts), counts={"unreadable_verdicts": unreadable},
                       note=f"{unreadable} unreadable, read as contradiction" if unreadable else None)

    return llm.ask(candidate.subject, "judge", llm_judge.prompt(candidate, known), read=read,
                   fallback=lambda: Reading[dict[str, Verdict]]({}), session_id=candidate.session_id).value


def find_neighbours(store: Store, candidate: Candidate, vector: list[float], threshold: float) -> list[Neighbour]:
    """What a stored memory of the subject may be to `candidate`: every version of its key, and the live ones
    of its dir at dense similarity ≥ `threshold`."""
    return neighbours_of(store, candidate, *store.query_many(neighbour_queries(candidate, vector)), threshold=threshold)


def neighbour_queries(candidate: Candidate, vector: list[float]) -> list[Query]:
    """The questions `find_neighbours` asks the store: the same key (its forms), the same dir, and for a
    statement that says something is over ("I don't drink oolong anymore"), the live statements holding those
    words under any key and dir (found by the words: pipeline/resolve.py decides by them)."""
    keys = forms_keys(candidate)  # its key, and the keys of its own it may have been kept under
    asked = [Query(MemoryFilter(candidate.subject, keys=keys), "dense", NEIGHBOURS, dense=vector),
             Query(MemoryFilter(candidate.subject, dirs=[candidate.dir], statuses=NEARBY), "dense", NEIGHBOURS,
                   dense=vector),
             # What its events were already read into, in any status and under any key: a replay of a statement
             # merged into another key's memory (a near-duplicate) that has been superseded since is no live
             # neighbour, and its own key holds nothing: without this it was written anew, alive again.
             Query(MemoryFilter(candidate.subject, mtypes=[candidate.mtype], sources=candidate.source_event_ids),
                   "dense", NEIGHBOURS, dense=vector)]
    what = ended(candidate.content)
    if what is not None:  # by its words, and by meaning ("可乐" alone is no keyword the segmenter keeps)
        live = MemoryFilter(candidate.subject, statuses=LIVE)
        asked += [Query(live, "sparse", NEIGHBOURS, text=what), Query(live, "dense", NEIGHBOURS, dense=vector)]
    return asked


def neighbours_of(store: Store, candidate: Candidate, same_key: Sequence[Scored], near: Sequence[Scored],
                  read_from: Sequence[Scored], *over: Sequence[Scored], threshold: float) -> list[Neighbour]:
    # Every version of the key, history included: decide() numbers the next version from them and
    # must see every live one. A top-k query missed both once a key had more than k versions (two
    # active memories on one key, an old version's id reused: the kill storm's 600 updates per key).
    every = store.get(MemoryFilter(candidate.subject, keys=forms_keys(candidate))) if len(same_key) >= NEIGHBOURS \
        else []
    found = {s.memory.id: Neighbour(s.memory, s.score) for s in same_key}
    for m in every:  # beyond the top k: no similarity needed to rival or to number the next version
        found.setdefault(m.id, Neighbour(m, 0.0))
    for s in near:
        if s.score >= threshold:
            found.setdefault(s.memory.id, Neighbour(s.memory, s.score))
    for s in read_from:  # whatever the similarity: decide() asks of these only whether they are a replay's
        found.setdefault(s.memory.id, Neighbour(s.memory, s.score))
    for s in (s for found_over in over for s in found_over):  # judged by their words only (pipeline/resolve.py
        found.setdefault(s.memory.id, Neighbour(s.memory, 0.0))  # `_ends`), as the key's versions beyond the top k
    return sorted(found.values(), key=lambda n: n.similarity, reverse=True)


def find_records(store: Store, candidate: Candidate, neighbours: Sequence[Neighbour],
                 nearby: bool = False) -> list[Memory]:
    """The episodes of the events the live same-key memories came from (read by key, no search); with
    `nearby`, of the close ones under other keys too (a judge may find the newcomer supersedes them)."""
    rivals = [n.memory for n in neighbours if (nearby or n.memory.key == candidate.key) and n.memory.status in LIVE]
    if not rivals or not is_keyed(candidate.mtype):
        return []
    # By key, not id: an episode recorded before the deployment's id secret has an id of the old naming.
    keys = [episode_key(e) for e in record_sources(rivals)]
    return [m for m in store.get(MemoryFilter(candidate.subject, keys=keys)) if m.mtype is MType.episode]


def records_beside(store: Store, subject: str, records: list[Memory]) -> list[Memory]:
    """The live records whose context may hold `records`' turns (pipeline/resolve.py retire_records). A context
    holds up to CONTEXT_BEFORE turns before its own but names only the nearest (`context_event_ids`), so the
    records naming those are read too."""
    seen, edge, found = {r.id for r in records}, records, []
    for _ in range(CONTEXT_BEFORE):
        events = list(dict.fromkeys(e for m in edge for e in m.source_event_ids))
        near = store.get(MemoryFilter(subject, mtypes=[MType.episode], statuses=list(LIVE), context_events=events))
        edge = [m for m in near if m.id not in seen]
        seen |= {m.id for m in edge}
        found += edge
    return found
