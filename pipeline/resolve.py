"""Resolve: what a candidate does to what is already known (docs/write-path.md#resolve).

`decide` is pure: the resolve worker reads the neighbours and attaches the vector. It
must be given, besides the dense neighbours, every memory with the candidate's key
whatever its status (superseded ones too), so that a new version never reuses the id of
an old one. Nothing is deleted: a replaced memory is patched `superseded` and linked.

Idempotency: a redelivered candidate whose first batch was applied finds its own
memory (same key, same content) and yields `duplicate` with no ops; one whose batch was
not applied yields the same batch again (deterministic ids).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from memflow.pipeline.clauses import ended, ends, same_speaker
from memflow.pipeline.drafts import REPEATED_CONFIDENCE
from memflow.pipeline.gate import untrusted_directive
from memflow.pipeline.ids import PUBLIC, IdSpace, NextVersion, is_keyed, starting_tier
from memflow.pipeline.lifecycle import MAX_REVISIONS, provenance, retires_record, superseded, support
from memflow.pipeline.llm_judge import Verdict
from memflow.pipeline.models import (
    SEARCHABLE_STATUSES,
    Action,
    Candidate,
    Dir,
    Memory,
    MType,
    PatchOp,
    PutOp,
    Revision,
    Source,
    Status,
    WriteBatch,
    WriteOp,
)
from memflow.pipeline.records import unsaid
from memflow.pipeline.statements import coverage, negations, normal, overlap
from memflow.pipeline.topics import MAX_KEY_CHARS, normalize_key, salient_words

# Used more than this many times: only an explicit correction replaces it (docs/write-path.md#stubbornness).
PROTECTED_USES = 5
# stubbornness = confidence × min(1, uses / 3); a newcomer must beat it by 20 % (docs/write-path.md#stubbornness).
STUBBORNNESS_USES = 3.0
STUBBORNNESS_MARGIN = 1.2
# The default embedding scores a sentence and its negation 0.93 and unrelated Chinese
# 0.5–0.8 (docs/architecture.md#what-the-vectors-cannot-tell): a dense match is a duplicate only if the words agree too.
LEXICAL_DUPLICATE = 0.8
# Close enough to be about the same thing, for the pinned/system contradiction check.
CONTRADICTION_SIMILARITY = 0.8
CONTRADICTION_OVERLAP = 0.3
# An archived memory brought back by a later mention had faded once: trust it a little less.
REACTIVATION_DISCOUNT = 0.8

# What the rules cannot place and a judge may (docs/write-path.md#the-llm-judge): a new value of a fact or a decision on
# its key that is no correction (preferences: the newest wins), and a close statement of these types
# under another key. At most this many close statements are judged per candidate.
JUDGED_SAME_KEY = frozenset({MType.fact, MType.decision})
JUDGED_NEARBY = frozenset({MType.fact, MType.decision, MType.preference})
MAX_JUDGED = 3

# A judge: the relation of the candidate to a known memory, or None when it cannot tell (the rules decide).
Judge = Callable[[Memory], Verdict | None]

# A candidate may already be one of these (a redelivery after a `review` put included).
_HELD = frozenset({*SEARCHABLE_STATUSES, Status.pending_review})
_PREFERENCES = frozenset({MType.preference, MType.temp_preference})
# Fields a patch may never set: identity, provenance (only grown by union) and revision.
_FROZEN_FIELDS = frozenset({"id", "subject", "rev", "created_at", "source_event_ids", "session_ids"})


@dataclass(frozen=True)
class Neighbour:
    memory: Memory
    similarity: float  # dense cosine with the candidate, -1..1


def decide(candidate: Candidate, neighbours: Sequence[Neighbour], *, duplicate_threshold: float = 0.92,
           records: Sequence[Memory] = (), judge: Judge | None = None, space: IdSpace = PUBLIC) -> WriteBatch:
    """The write batch for one candidate (vector left None: the worker attaches it), its new memories named in
    `space` (the deployment's: shared/redisdb/keys.py `id_space`).

    `records` are the episodes of the events the same-key rivals came from (see `retire_records`).
    `judge` is asked about each memory the rules cannot place (an LLM, through the resolve worker);
    without one, or when it answers None, the rules decide as they always have.
    """
    # Only what is known of the same person: a fact about the wife is no duplicate, rival or contradiction
    # of the user's own on the topic (pipeline/holders.py), however close the words.
    mine = [n for n in neighbours if n.memory.subject == candidate.subject and n.memory.about == candidate.about]
    # Its forms: under its key, under a key of its own (kept apart), or as a complement beside its key.
    forms = [candidate, own_key(candidate), *([] if judge is None else [_aside(candidate)])]
    if any(_recorded(f, n, duplicate_threshold) for n in mine for f in forms):
        return _batch(candidate, Action.duplicate, "already recorded from these events: a replay", [])
    same = next((n.memory for n in mine if any(_restates(f, n.memory) for f in forms)), None)
    if same is not None:
        return _duplicate(candidate, same, "same key and same content")
    if _collides(candidate, mine):
        candidate = own_key(candidate)
    version = NextVersion(1 + max((n.memory.version for n in mine if n.memory.key == candidate.key), default=0), space)
    replacing = _replacing(candidate, mine, version, judge, records)
    if replacing is not None:
        return replacing
    near = next((n.memory for n in mine if _near_duplicate(candidate, n, duplicate_threshold)), None)
    if near is not None:
        return _duplicate(candidate, near, f"dense similarity ≥ {duplicate_threshold} and the same wording")
    held = {n.memory.key for n in mine if n.memory.status in SEARCHABLE_STATUSES}
    faded = next((n.memory for n in mine if n.memory.key not in held and _revives(candidate, n, duplicate_threshold)),
                 None)
    if faded is not None:
        return _reactivate(candidate, faded)
    guarded = [n.memory for n in mine if _contradicts_guarded(candidate, n)]
    if guarded:
        return _review(candidate, guarded, version, "contradicts a pinned or system memory")
    if _unconfirmed_rule(candidate):
        return _review(candidate, [], version, f"a {candidate.source.value} rule waits for review")
    judged = _judged(candidate, mine, version, judge)
    if judged is not None:
        return retire_records(judged, _retired(judged, mine), records)
    return _put(candidate, Action.add, "nothing known on this topic", version)


def _replacing(c: Candidate, mine: Sequence[Neighbour], version: NextVersion, judge: Judge | None,
               records: Sequence[Memory]) -> WriteBatch | None:
    """What the candidate does to the values it may replace: its key's live memories (settled), else the
    statements it says are over (superseded); None when it replaces nothing. Their records go with them."""
    rivals = [n.memory for n in mine if _rivals(c, n.memory)]
    if rivals:
        return retire_records(_settle(c, rivals, version, judge), rivals, records)
    over = [n.memory for n in mine if _ends(c, n.memory)]
    if over:
        return retire_records(_supersede(c, over, version, f"said to be over: {ended(c.content)!r}"), over, records)
    return None


def first_per_key(candidates: Sequence[Candidate]) -> list[bool]:
    """Which candidates of a batch to decide now: the earliest of each keyed (subject, key), and every
    unkeyed one, unless it says an earlier one of the batch is over. The others wait for a later batch.

    Candidates decided in one batch all see the store as it was, so k statements on one key would
    cost k rounds of stale writes sent back by upsert, each spending a retry of every one still
    waiting: a burst on one key (a backlog after an outage) ended in the dead-letter stream. And
    "I don't drink oolong anymore" decided beside "I drink oolong tea every morning" would not see it
    to replace it: it waits until that one is stored.
    """
    first: dict[tuple[str, str], int] = {}
    for i, c in enumerate(candidates):
        if is_keyed(c.mtype):
            seen = first.get((c.subject, c.key))
            if seen is None or (c.ts, i) < (candidates[seen].ts, seen):
                first[(c.subject, c.key)] = i
    now = set(first.values())
    return [(not is_keyed(c.mtype) or i in now) and not _ends_any(c, candidates) for i, c in enumerate(candidates)]


def _ends_any(c: Candidate, batch: Sequence[Candidate]) -> bool:
    what = ended(c.content)
    return what is not None and any(
        d.subject == c.subject and d.about == c.about and d.ts < c.ts and d.mtype is not MType.episode
        and same_speaker(c.content, d.content) and ended(d.content) is None and ends(what, d.content) for d in batch)


def record_sources(rivals: Iterable[Memory]) -> list[str]:
    """The events whose episodes a supersession of `rivals` may retire."""
    return list(dict.fromkeys(e for m in rivals for e in m.source_event_ids))


def retire_records(batch: WriteBatch, rivals: Sequence[Memory], records: Sequence[Memory]) -> WriteBatch:
    """A superseded statement takes the verbatim episodes it was read from along, and their words leave the
    context of the records beside them.

    Otherwise "我住在北京" keeps answering "where do I live?" after "更正一下，我已经搬到上海了":
    the episode is the same words as the retired fact. Only episodes wholly made of the rivals' events, and
    none of the newcomer's, are retired; they stay in the store (history). A record is keyword-indexed with the
    turns beside it, so the next turn ("I prefer short answers", said after "I live in Lyon…") kept matching
    "where do I live?" by the old city's words: those records are given `records` too, and lose the retired
    turns from their context (`records.unsaid`, as for a forgotten turn, but logged: see below).
    """
    put = next((op for op in batch.ops if isinstance(op, PutOp)), None)
    if batch.action is not Action.supersede or put is None or put.memory.status is not Status.active:
        return batch  # a statement older than the current value is history: it retires nothing
    sources, own = set(record_sources(rivals)), set(batch.candidate.source_event_ids)
    retire = superseded(put.memory.id, batch.candidate.ts)
    retired = [r for r in records if retires_record(r, sources, own)]
    patches = [PatchOp(id=r.id, expected_rev=r.rev, set=retire, why=f"its statement was superseded: {batch.why}")
               for r in retired]
    # Not quiet: two statements of one batch that each retire a turn beside the same record would both rewrite its
    # context from the same read, and the second would put back what the first took out; a revision makes the
    # second stale, so it is decided again on what the first wrote. (A superseded turn's words stay in history.)
    beside = unsaid([r for r in records if r not in retired and r.mtype is MType.episode], retired,
                    why="a turn beside it was superseded", quiet=False)
    return batch.model_copy(update={"ops": [*batch.ops, *patches, *beside]}) if patches else batch


def own_key(c: Candidate) -> Candidate:
    """The candidate under a key of its own: its key and a digest of its wording. Another statement
    that shares a words key is kept beside the one holding it, never in its place."""
    return c.model_copy(update={"key": _suffixed(c.key, c.content)})


def forms_keys(c: Candidate) -> list[str]:
    """Every key a candidate may have been stored under (resolve looks each up)."""
    return list(dict.fromkeys([c.key, own_key(c).key, _aside(c).key]))


def _suffixed(key: str, content: str) -> str:
    digest = hashlib.sha256(normal(content).encode()).hexdigest()[:8]
    return f"{key[:MAX_KEY_CHARS - len(digest) - 1]}.{digest}"


def _recorded(c: Candidate, n: Neighbour, threshold: float) -> bool:
    """`n` is this statement, written from these very events (in any status since): a replay, a DLQ
    re-drive or a publisher's retry of what was written before. It changes nothing. Either stored under its key, or
    merged into `n` as its near-duplicate (`_near_duplicate` then, whatever `n`'s status now)."""
    m = n.memory
    if not set(c.source_event_ids) <= set(m.source_event_ids):
        return False
    if m.key == c.key:
        return normal(m.content) == normal(c.content)
    return (c.mtype is not MType.episode and m.mtype is c.mtype and n.similarity >= threshold
            and _same_wording(c.content, m.content))


def _collides(c: Candidate, mine: Sequence[Neighbour]) -> bool:
    """Other statements hold the candidate's key, and nothing says they are values of one thing: the
    key was made of words they share by chance (`Candidate.slot`). No supersession then, nor contest."""
    same_key = [n.memory for n in mine if _rivals(c, n.memory) and normal(n.memory.content) != normal(c.content)]
    return bool(same_key) and not any(_same_slot(c, m) for m in same_key)


def _same_slot(c: Candidate, m: Memory) -> bool:
    """Evidence that two statements on one key are values of one single-valued thing: both keys name a
    topic or an attribute, or the user says it is a correction."""
    return c.source is Source.explicit_correction or (c.slot and m.slot)


def _restates(c: Candidate, m: Memory) -> bool:
    return m.key == c.key and m.status in _HELD and normal(m.content) == normal(c.content)


def _rivals(c: Candidate, m: Memory) -> bool:
    return is_keyed(c.mtype) and m.key == c.key and m.status in SEARCHABLE_STATUSES


def _ends(c: Candidate, m: Memory) -> bool:
    """`c` says what `m` states is over ("I don't drink oolong anymore" and "I drink oolong tea every morning"):
    an earlier live statement of the same person, under any key, that holds the words `c` ends and does not
    end them itself. A rule, a pinned or a system memory is never ended in passing."""
    what = ended(c.content)
    if what is None or not is_keyed(c.mtype) or m.mtype is MType.episode or _guarded(m):
        return False
    live = m.status in SEARCHABLE_STATUSES and m.created_at <= c.ts and same_speaker(c.content, m.content)
    return live and ended(m.content) is None and ends(what, m.content)


def _revives(c: Candidate, n: Neighbour, threshold: float) -> bool:
    """A later mention of an archived memory: same key and words, the same wording nearby, or a
    nearby statement that the archived one says in full ("I love sea kayaking" brings back "I love
    sea kayaking around the San Juan Islands", details and all). Not for episodes: a new turn is a
    record of its own."""
    m = n.memory
    if m.status is not Status.archived or m.mtype is not c.mtype:
        return False
    if m.key == c.key and normal(m.content) == normal(c.content):
        return True
    if n.similarity >= threshold and _same_wording(c.content, m.content):
        return True
    return m.mtype is not MType.episode and _said_within(c.content, m.content)


def _unconfirmed_rule(c: Candidate) -> bool:
    """Rules and system items nobody stated (inferred, or found by consolidation) wait for review, and so does
    one that orders the assistant about others than the user, whoever stated it (issue 30: text is data)."""
    binding = c.mtype is MType.rule or c.dir is Dir.system
    return binding and (c.source in (Source.inferred, Source.derived) or untrusted_directive(c.content) is not None)


def _near_duplicate(c: Candidate, n: Neighbour, threshold: float) -> bool:
    """Close in meaning and wording to a live memory of its type. Never for episodes: a turn is a record of its own,
    with its time and the turns around it. Merged into an earlier turn's record, whether it was merged depended on
    whether the two were decided in one batch (each sees the store as it was), and once the earlier record was
    retired (superseded: not a neighbour any more), a replay of the turn wrote a record the first pass had not
    (tests/test_write_path.py's property, under load)."""
    m = n.memory
    if c.mtype is MType.episode or m.status not in SEARCHABLE_STATUSES or m.mtype is not c.mtype \
            or n.similarity < threshold:
        return False
    return _same_wording(c.content, m.content)


def _contradicts_guarded(c: Candidate, n: Neighbour) -> bool:
    m = n.memory
    if not is_keyed(c.mtype) or m.status not in SEARCHABLE_STATUSES or not _guarded(m):
        return False
    close = n.similarity >= CONTRADICTION_SIMILARITY and overlap(c.content, m.content) >= CONTRADICTION_OVERLAP
    return close and negations(c.content) % 2 != negations(m.content) % 2


def _guarded(m: Memory) -> bool:
    return m.pinned or m.dir is Dir.system or m.mtype is MType.rule


def _settle(c: Candidate, rivals: list[Memory], version: NextVersion, judge: Judge | None = None) -> WriteBatch:
    """Same key, other content: sit beside, arrive too late, correct, hold for review, or weigh."""
    old = max(rivals, key=lambda m: (m.version, m.updated_at))
    if c.source is Source.tool and old.source is not Source.tool:
        return _put(c, Action.complement, "tool output is kept apart from what was said", version)
    newest = max(rivals, key=lambda m: (m.created_at, m.version))
    if newest.created_at > c.ts:
        return _late(c, newest, version)
    if c.source is Source.explicit_correction:
        return _supersede(c, rivals, version, "explicit correction")
    if any(_guarded(m) for m in rivals):
        return _review(c, rivals, version, "would override a pinned or system memory")
    verdict = judge(old) if judge is not None and c.mtype in JUDGED_SAME_KEY else None
    if verdict is not None:
        return _by_verdict(c, old, rivals, version, verdict)
    return _weigh(c, old, rivals, version)


def _by_verdict(c: Candidate, old: Memory, rivals: list[Memory], version: NextVersion, verdict: Verdict) -> WriteBatch:
    """Same key, the judge's reading: a newer version (the newest wins, unless protected), another
    aspect (both stand: the newcomer under a key of its own) or a contradiction (both contested)."""
    why = f"judged {verdict}"
    if verdict == "complementary":
        return _put(_aside(c), Action.complement, why, version.first())
    if verdict == "contradiction":
        return _contest(c, rivals, version, why)
    if old.access_count > PROTECTED_USES:
        return _contest(c, rivals, version, f"{why}, but used {old.access_count} times: only a correction replaces it")
    if c.source is Source.inferred and old.source is not Source.inferred:
        return _contest(c, rivals, version, f"{why}, but an inference does not override what was said")
    return _supersede(c, rivals, version, why)


def _aside(c: Candidate) -> Candidate:
    """The candidate under a key of its own, beside the key it shares with another aspect: one key
    never holds two active memories. The digest of its wording keeps two complements apart."""
    words = ".".join(salient_words(c.content)[:3]) or "more"
    return c.model_copy(update={"key": _suffixed(normalize_key(f"{c.key}.{words}"), c.content)})


def _judged(c: Candidate, mine: Sequence[Neighbour], version: NextVersion, judge: Judge | None) -> WriteBatch | None:
    """A close statement under another key, as the judge reads it: a newer version supersedes it, a
    contradiction contests it; complementary (or no judge) adds the newcomer beside it."""
    if judge is None or c.mtype not in JUDGED_NEARBY or c.source in (Source.explicit_correction, Source.tool):
        return None
    close = [n.memory for n in mine if _judgeable(c, n)][:MAX_JUDGED]
    verdicts = {m.id: judge(m) for m in close}
    against = [m for m in close if verdicts[m.id] == "contradiction"]
    if against:
        return _contest(c, against, version, "judged contradiction")
    older = [m for m in close if verdicts[m.id] == "version_update" and m.access_count <= PROTECTED_USES]
    return _supersede(c, older, version, "judged version_update") if older else None


def _retired(batch: WriteBatch, mine: Sequence[Neighbour]) -> list[Memory]:
    """The memories a batch supersedes (their records may go with them)."""
    patched = {op.id for op in batch.ops if isinstance(op, PatchOp)}
    return [n.memory for n in mine if n.memory.id in patched]


def _judgeable(c: Candidate, n: Neighbour) -> bool:
    m = n.memory
    return (m.mtype is c.mtype and m.key != c.key and m.status is Status.active and not _guarded(m)
            and m.created_at <= c.ts and m.source is not Source.tool)


def _weigh(c: Candidate, old: Memory, rivals: list[Memory], version: NextVersion) -> WriteBatch:
    if old.access_count > PROTECTED_USES:
        return _contest(c, rivals, version, f"used {old.access_count} times: only an explicit correction replaces it")
    if c.source is Source.inferred and old.source is not Source.inferred:
        return _contest(c, rivals, version, "an inference does not override what was said")
    if c.mtype in _PREFERENCES and old.mtype in _PREFERENCES:
        return _supersede(c, rivals, version, "the newest preference wins")
    stubbornness = old.confidence * min(1.0, old.access_count / STUBBORNNESS_USES)
    if c.confidence > STUBBORNNESS_MARGIN * stubbornness:
        return _supersede(c, rivals, version, f"confidence {c.confidence:.2f} > 1.2 × stubbornness {stubbornness:.2f}")
    return _contest(c, rivals, version, f"confidence {c.confidence:.2f} ≤ 1.2 × stubbornness {stubbornness:.2f}")


def _duplicate(c: Candidate, m: Memory, why: str) -> WriteBatch:
    """A repeat: the memory gains the candidate's provenance, or nothing if it has it already."""
    events, sessions = _new_provenance(c, m)
    if not events and not sessions:
        return _batch(c, Action.duplicate, f"{why}; already recorded", [])
    repeated = bool(sessions) and m.source is Source.inferred and c.source is not Source.tool
    fields: dict[str, object] = (
        {"source": Source.repeated.value, "confidence": max(m.confidence, REPEATED_CONFIDENCE)} if repeated else {}
    )
    op = PatchOp(
        id=m.id, expected_rev=m.rev, set=fields, add_source_event_ids=events, add_session_ids=sessions, why=why
    )
    return _batch(c, Action.duplicate, why, [op])


def _reactivate(c: Candidate, m: Memory) -> WriteBatch:
    """Back from the archive, a little less trusted: it had faded once (docs/write-path.md#reactivation)."""
    events, sessions = _new_provenance(c, m)
    fields = {"status": Status.active.value, "tier": starting_tier(c).value, "strength": 1.0, "strength_at": None,
              "confidence": round(m.confidence * REACTIVATION_DISCOUNT, 4)}
    why = f"mentioned again after it was archived: back with confidence × {REACTIVATION_DISCOUNT}"
    op = PatchOp(id=m.id, expected_rev=m.rev, set=fields, add_source_event_ids=events, add_session_ids=sessions,
                 why=why)
    return _batch(c, Action.reactivate, why, [op])


def _supersede(c: Candidate, rivals: list[Memory], version: NextVersion, why: str) -> WriteBatch:
    newest = max(rivals, key=lambda m: (m.version, m.updated_at))
    new = version.memory(c, supersedes=newest.id)
    retire = superseded(new.id, c.ts)
    patches = [PatchOp(id=m.id, expected_rev=m.rev, set=retire, why=why) for m in rivals]
    return _batch(c, Action.supersede, why, [PutOp(memory=new), *patches])


def _late(c: Candidate, newer: Memory, version: NextVersion) -> WriteBatch:
    """A statement that arrives after a newer one on its key (a session's end is processed after a
    realtime correction made later): it is history at once, never the current value. Event time, not
    arrival order, decides what is current."""
    old = version.memory(c, status=Status.superseded)
    old = old.model_copy(update={"superseded_by": newer.id, "valid_to": newer.created_at})
    return _batch(c, Action.supersede, f"older than the current memory ({newer.created_at.isoformat()})",
                  [PutOp(memory=old)])


def _contest(c: Candidate, rivals: list[Memory], version: NextVersion, why: str) -> WriteBatch:
    """Both stand, both flagged: neither is served as a settled fact until review, which weighs
    the support each gathers from now on (what each has now is noted)."""
    new = version.memory(c, status=Status.contested, conflicts_with=[m.id for m in rivals])
    new = new.model_copy(update={"contested_support": support(new)})
    patches = [
        PatchOp(
            id=m.id,
            expected_rev=m.rev,
            why=why,
            set={"status": Status.contested.value, "conflicts_with": _union(m.conflicts_with, [new.id]),
                 **({} if m.status is Status.contested else {"contested_support": support(m)})},
        )
        for m in rivals
    ]
    return _batch(c, Action.contest, why, [PutOp(memory=new), *patches])


def _review(c: Candidate, against: list[Memory], version: NextVersion, why: str) -> WriteBatch:
    new = version.memory(c, status=Status.pending_review, conflicts_with=[m.id for m in against])
    return _batch(c, Action.review, why, [PutOp(memory=new)])


def _put(c: Candidate, action: Action, why: str, version: NextVersion) -> WriteBatch:
    return _batch(c, action, why, [PutOp(memory=version.memory(c))])


def _batch(c: Candidate, action: Action, why: str, ops: list[WriteOp]) -> WriteBatch:
    return WriteBatch(subject=c.subject, action=action, why=why, candidate=c, ops=ops)


def apply_patch(memory: Memory, op: PatchOp, at: datetime) -> Memory:
    """The payload after `op`: fields set, provenance unions, rev + 1, updated_at = `at`.

    Raises ValueError if the patch was built on another revision (the caller sends the
    candidate back to resolve) or names another memory or a field a patch may not set.
    """
    if op.id != memory.id:
        raise ValueError(f"patch for {op.id} applied to {memory.id}")
    if op.expected_rev != memory.rev:
        raise ValueError(f"stale patch for {memory.id}: built on rev {op.expected_rev}, memory is at rev {memory.rev}")
    frozen = sorted(_FROZEN_FIELDS & op.set.keys())
    if frozen:
        raise ValueError(f"a patch may not set {', '.join(frozen)}")
    data = memory.model_dump()
    data.update(op.set)
    data["source_event_ids"] = provenance(_union(memory.source_event_ids, op.add_source_event_ids))
    data["session_ids"] = provenance(_union(memory.session_ids, op.add_session_ids))
    data["rev"] = memory.rev + 1
    data["updated_at"] = at
    after = Memory.model_validate(data)
    before = changed_fields(memory, after, op.set)
    if not before:
        return after
    revision = Revision(rev=after.rev, at=at, why=op.why, before=before)
    return after.model_copy(update={"revisions": [*memory.revisions, revision][-MAX_REVISIONS:]})


def changed_fields(before: Memory, after: Memory, names: Iterable[str]) -> dict[str, Any]:
    """The old JSON values of the fields among `names` that differ between the two."""
    old, new = before.model_dump(mode="json"), after.model_dump(mode="json")
    return {name: old[name] for name in names if old.get(name) != new.get(name)}


def _new_provenance(c: Candidate, m: Memory) -> tuple[list[str], list[str]]:
    """The candidate's events and session that `m` does not name yet."""
    events = [e for e in dict.fromkeys(c.source_event_ids) if e not in m.source_event_ids]
    sessions = [c.session_id] if c.session_id and c.session_id not in m.session_ids else []
    return events, sessions


def _union(old: Iterable[str], new: Iterable[str]) -> list[str]:
    return list(dict.fromkeys([*old, *new]))


def _said_within(part: str, whole: str) -> bool:
    """`part` is (nearly) all words of `whole`, with its polarity and none of its own numbers."""
    same_polarity = negations(part) % 2 == negations(whole) % 2
    new_numbers = set(re.findall(r"\d+", part)) - set(re.findall(r"\d+", whole))
    return same_polarity and not new_numbers and coverage(whole, part) >= LEXICAL_DUPLICATE


def _same_wording(a: str, b: str) -> bool:
    """Close wording, same polarity, same numbers: "PostgreSQL 15" is no duplicate of "PostgreSQL 16"."""
    digits_a, digits_b = re.findall(r"\d+", a), re.findall(r"\d+", b)
    same_polarity = negations(a) % 2 == negations(b) % 2
    return same_polarity and digits_a == digits_b and overlap(a, b) >= LEXICAL_DUPLICATE
