"""What time alone does to memories: decay, consolidation, review and rollback (docs/write-path.md#lifecycle).

Pure planners. Each takes one subject's memories (every status) and `now`, and returns the
changes a job should make; `workers/jobs.py` applies them. A plan applied and planned again
at the same `now` is empty, so every job is idempotent per (job, date, subject).

- decay: refresh `strength`; below the tier's threshold, or past `expires_at` for an event,
  a memory is archived (kept, never searched). A verbatim record goes with what was
  distilled from it when all of that was transient (a meeting at three, today's draft).
- consolidate: promote what was seen in enough sessions; note topics that keep coming back
  in the last week as patterns; re-read the day's records for durable statements.
- review: re-judge contested memories after a timeout with the evidence gathered since.
- rollback: restore an old version of a keyed memory as a new version (history grows).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from memflow.pipeline.drafts import REPEATED_CONFIDENCE
from memflow.pipeline.extract import extract
from memflow.pipeline.ids import PUBLIC, IdSpace, is_keyed
from memflow.pipeline.models import (
    SEARCHABLE_STATUSES,
    Candidate,
    Dir,
    ExtractTask,
    Memory,
    MType,
    Role,
    Source,
    Status,
    Tier,
    TriggerReason,
    Turn,
)
from memflow.pipeline.score import COLLAPSE_COVERAGE, DEFAULT_TAU_HOURS, strength, touched
from memflow.pipeline.statements import coverage, normal

# Strength below which a memory is archived, per tier (docs/write-path.md#decay). A short-term
# memory goes at 0.1 (a preference unused for ~7 months, session context after ~4.6 days);
# a long-term one has earned its place and goes at 0.01 (a preference unused for ~14 months,
# a fact for ~2 years): "我平时喜欢去海边" must still answer a question a year later.
ARCHIVE_BELOW: dict[str, float] = {Tier.short_term.value: 0.1, Tier.long_term.value: 0.01}
# Kinds of memory that are about the moment: when they fade, the words they came from go too.
TRANSIENT = frozenset({MType.session_context, MType.task_state, MType.temp_preference})
# What consolidation promotes: never a record, an event or a passing state (pipeline.ids).
_NOT_PROMOTED = frozenset({MType.episode, MType.event, MType.pattern, *TRANSIENT})
# What consolidation re-reads the day's records for (docs/write-path.md#consolidation: preferences,
# decisions, lessons, rules).
DURABLE = frozenset({MType.preference, MType.decision, MType.insight, MType.rule})
STRENGTH_SCALE = 1000
# A record goes with what faded only if that repeats this much of its wording (as record collapse).
RECORD_COVERAGE = COLLAPSE_COVERAGE

# What a point's payload keeps of its past (bounded: each change reads and rewrites the payload). Its last
# MAX_REVISIONS revisions (`memflow history` shows them; a rollback restores a version, another point, so
# it needs none of them), and PROVENANCE_MAX of its events and of its sessions (`provenance`).
MAX_REVISIONS = 200
PROVENANCE_MAX = 200
PROVENANCE_FIRST = 20


def provenance(ids: list[str]) -> list[str]:
    """A point's events (or sessions), bounded: the first PROVENANCE_FIRST (where it was first said) and the
    newest of the rest, PROVENANCE_MAX in all. A memory restated every day would otherwise carry every event
    in its payload, read and rewritten by each change. What drops out is old: a redelivery of it (past the work
    streams' retention) is decided against the content, and forget's tombstones name the words too."""
    if len(ids) <= PROVENANCE_MAX:
        return ids
    return ids[:PROVENANCE_FIRST] + ids[len(ids) - (PROVENANCE_MAX - PROVENANCE_FIRST):]



@dataclass(frozen=True)
class Policy:
    """What the lifecycle jobs do. τ and the archive thresholds are a deployment's retention policy
    (MEMFLOW_DECAY_TAU_HOURS, MEMFLOW_ARCHIVE_BELOW); the rest are the jobs' own constants, chosen with them
    (b6e9a41) and not measured on a benchmark (they were MEMFLOW_PROMOTE_SESSIONS, _PATTERN_DAYS,
    _PATTERN_SESSIONS and _REVIEW_AFTER_HOURS). A test passes its own."""

    tau_hours: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_TAU_HOURS))
    archive_below: Mapping[str, float] = field(default_factory=lambda: dict(ARCHIVE_BELOW))
    # Promotion to long-term: the same key seen in this many sessions (docs/write-path.md#consolidation).
    promote_sessions: int = 3
    # Frequency patterns (docs/write-path.md#consolidation): a key in this many sessions within the window.
    pattern_days: int = 7
    pattern_sessions: int = 3
    # Contested memories are re-judged once they have been contested this long.
    review_after_hours: float = 168.0


def superseded(by: str, at: datetime) -> dict[str, Any]:
    """The fields that retire a memory in favour of `by` (kept, linked: history, never deleted)."""
    return {"status": Status.superseded.value, "superseded_by": by, "valid_to": at}


@dataclass(frozen=True)
class Step:
    """One change to one stored memory, and why."""

    memory: Memory
    fields: dict[str, Any]
    why: str


# -- decay ------------------------------------------------------------------------------


def plan_decay(memories: Sequence[Memory], now: datetime, policy: Policy, tier: Tier | None = None) -> list[Step]:
    """Refresh strength and archive what has faded or expired, in one tier or all.

    The stored strength never rises unless the memory was used or restated since it was last
    computed (a run with an earlier `now` lowers nothing and raises nothing).
    """
    steps: dict[str, Step] = {}
    for m in memories:
        if m.status not in SEARCHABLE_STATUSES or (tier is not None and m.tier is not tier) or touched(m) > now:
            continue  # a run as of a time before the memory's last change has nothing to say about it
        kept = stored_strength(m, now, policy.tau_hours)
        threshold = policy.archive_below.get(m.tier.value, 0.0)
        if expired(m, now):
            steps[m.id] = Step(m, archived(kept, now), f"expired at {_iso(m.expires_at)}")
        elif kept < threshold and not dated(m):
            steps[m.id] = Step(m, archived(kept, now), f"strength {kept:.4f} below {threshold} ({m.tier.value})")
        elif _stored(kept) != m.strength:
            steps[m.id] = Step(m, {"strength": _stored(kept), "strength_at": now}, "strength refreshed")
    for record in faded_records(memories, steps, now):
        steps[record.memory.id] = record
    return list(steps.values())


def stored_strength(m: Memory, now: datetime, tau_hours: Mapping[str, float]) -> float:
    fresh = strength(m, now, tau_hours)
    if m.strength_at is not None and touched(m) > m.strength_at:
        return fresh  # used or restated since the last computation: it may rise
    return min(fresh, m.strength)


def dated(m: Memory) -> bool:
    """Something that happened (an event with no end): true of its date for good, so it fades in
    ranking but is never archived by disuse ("when did she go to the support group?", asked a year on)."""
    return m.mtype is MType.event and m.expires_at is None


def expired(m: Memory, now: datetime) -> bool:
    """An event that is over, or a temporary wish past its time."""
    return m.expires_at is not None and m.expires_at <= now


def _stored(kept: float) -> float:
    """Strength as stored: three decimals, rounded down (it never rises by rounding). A refresh is
    written only when that figure moves, not every hour for every memory."""
    return math.floor(kept * STRENGTH_SCALE) / STRENGTH_SCALE


def archived(kept: float, now: datetime) -> dict[str, Any]:
    return {"status": Status.archived.value, "tier": Tier.archive.value, "strength": _stored(kept),
            "strength_at": now}


def faded_records(memories: Sequence[Memory], steps: Mapping[str, Step], now: datetime) -> list[Step]:
    """Episodes whose every distilled memory was transient and is archived (now or before).

    "我正在写第三版方案，今天下午三点要开评审会" is a session context and an event: once both are
    gone, its verbatim record must not keep answering "what should I keep in mind?".
    A record that also yielded a lasting memory, or nothing at all, or that said more than what
    faded ("Great news! I'm off to a pottery class next week — how was your trip?") keeps its own
    decay: what else it said may still be asked about (LoCoMo asks about past plans a year on).
    """
    distilled: dict[str, list[Memory]] = defaultdict(list)
    for m in memories:
        if m.mtype is not MType.episode:
            for event in m.source_event_ids:
                distilled[event].append(m)
    faded = []
    for m in memories:
        if m.mtype is not MType.episode or m.status not in SEARCHABLE_STATUSES or not m.source_event_ids:
            continue
        derived = [d for e in m.source_event_ids for d in distilled.get(e, [])]
        said = " ".join(d.content for d in derived)
        if (derived and all(_transient(d) and _gone(d, steps) for d in derived)
                and coverage(said, m.evidence or m.content) >= RECORD_COVERAGE):
            kept = steps[m.id].fields.get("strength", m.strength) if m.id in steps else m.strength
            faded.append(Step(m, archived(kept, now), "everything distilled from it was transient and has faded"))
    return faded


def _transient(m: Memory) -> bool:
    return m.mtype in TRANSIENT or (m.mtype is MType.event and m.expires_at is not None)


def _gone(m: Memory, steps: Mapping[str, Step]) -> bool:
    step = steps.get(m.id)
    return m.status is Status.archived or (step is not None and step.fields.get("status") == Status.archived.value)


# -- consolidation ----------------------------------------------------------------------


def plan_promotions(memories: Sequence[Memory], policy: Policy) -> list[Step]:
    """Short-term memories whose key was seen in enough sessions become long-term.

    Sessions are counted over the key's live memories only: a superseded (wrong) memory
    never counts towards anything, so it cannot promote itself or its successor.
    """
    sessions: dict[str, set[str]] = defaultdict(set)
    for m in memories:
        if m.status in SEARCHABLE_STATUSES and is_keyed(m.mtype):
            sessions[m.key].update(m.session_ids)
    steps = []
    for m in memories:
        seen = len(sessions.get(m.key, ()))
        if (m.status is Status.active and m.tier is Tier.short_term and m.mtype not in _NOT_PROMOTED
                and is_keyed(m.mtype) and seen >= policy.promote_sessions):
            fields: dict[str, Any] = {"tier": Tier.long_term.value}
            if m.source is Source.inferred:
                fields |= {"source": Source.repeated.value, "confidence": max(m.confidence, REPEATED_CONFIDENCE)}
            steps.append(Step(m, fields, f"seen in {seen} sessions (≥ {policy.promote_sessions})"))
    return steps


def plan_patterns(memories: Sequence[Memory], now: datetime, policy: Policy, space: IdSpace = PUBLIC) -> list[Memory]:
    """Topics that keep coming back: a key stated in enough sessions within the window.

    One pattern memory per topic (named in `space`), made the first time it qualifies (found by its key, and its
    id is fixed, so a re-run writes nothing new, whatever space named the one made before); it then decays like
    any pattern. Superseded memories do not
    count (frequency says what recurs, not what is right: docs/write-path.md#consolidation).
    """
    since = now - timedelta(days=policy.pattern_days)
    recent: dict[str, list[Memory]] = defaultdict(list)
    for m in memories:
        if (m.status in SEARCHABLE_STATUSES and is_keyed(m.mtype) and m.mtype is not MType.pattern
                and since < m.created_at <= now):
            recent[m.key].append(m)
    existing = {m.key for m in memories if m.mtype is MType.pattern}
    found = []
    for key, group in sorted(recent.items()):
        sessions = {s for m in group for s in m.session_ids}
        if len(sessions) < policy.pattern_sessions:
            continue
        if f"pattern.{key}" not in existing:
            found.append(_pattern(key, group, len(sessions), now, policy, space))
    return found


def _pattern(key: str, group: list[Memory], sessions: int, now: datetime, policy: Policy, space: IdSpace) -> Memory:
    latest = max(group, key=lambda m: (m.created_at, m.id))
    pattern_key = f"pattern.{key}"
    content = f"{latest.content} (recurring: {sessions} sessions in the {policy.pattern_days} days to {now.date()})"
    return Memory(
        id=space.memory_id(latest.subject, pattern_key, 1), subject=latest.subject,
        uri=f"mem://{latest.subject}/{Dir.patterns.value}/{pattern_key}", dir=Dir.patterns, mtype=MType.pattern,
        key=pattern_key, content=content, confidence=REPEATED_CONFIDENCE, importance=latest.importance,
        source=Source.derived, created_at=now, updated_at=now, valid_from=now,
        source_event_ids=provenance(list(dict.fromkeys(e for m in group for e in m.source_event_ids))),
        session_ids=sorted({s for m in group for s in m.session_ids}), evidence=latest.content, about=latest.about,
    )


def day_sessions(memories: Sequence[Memory], now: datetime) -> list[ExtractTask]:
    """The last day's records, one extraction task per session, to re-read for durable statements.

    The live path extracts at each session's end; this catches sessions that never ended
    and anything said since. What it finds goes through resolve like any candidate, so a
    statement already known is a duplicate there and changes nothing.
    """
    since = now - timedelta(days=1)
    by_session: dict[str, list[Memory]] = defaultdict(list)
    for m in memories:
        if (m.mtype is MType.episode and m.status in SEARCHABLE_STATUSES and m.session_ids
                and m.source_event_ids and since < m.created_at <= now):
            by_session[m.session_ids[0]].append(m)
    tasks = []
    for session, records in sorted(by_session.items()):
        records.sort(key=lambda m: (m.created_at, m.id))
        turns = [Turn(event_id=m.source_event_ids[0], role=Role.user if m.source is Source.explicit else Role.assistant,
                      text=m.evidence or m.content, ts=m.created_at) for m in records]
        tasks.append(ExtractTask(subject=records[0].subject, session_id=session, reason=TriggerReason.session_end,
                                 turns=turns, ts=records[-1].created_at))
    return tasks


def reread(memories: Sequence[Memory], now: datetime) -> list[Candidate]:
    """The durable statements of the last day's records that are not stored in these words yet
    (in any status: a rejected rule is not proposed again)."""
    known = {(m.key, normal(m.content)) for m in memories}
    found = durable(c for task in day_sessions(memories, now) for c in extract(task))
    return [c for c in found if (c.key, normal(c.content)) not in known]


def durable(candidates: Iterable[Candidate]) -> list[Candidate]:
    """What consolidation keeps of a re-read session. A rule or a system item it found waits for
    review (docs/write-path.md#consolidation: automatically extracted rules never take effect on their own)."""
    kept = []
    for c in candidates:
        if c.mtype not in DURABLE:
            continue
        if c.mtype is MType.rule or c.dir is Dir.system:
            c = c.model_copy(update={"source": Source.derived})
        kept.append(c)
    return kept


# -- review -----------------------------------------------------------------------------


@dataclass(frozen=True)
class Verdict:
    steps: list[Step]
    # Contested memories that are still ambiguous after the timeout, for `memflow review list`.
    undecided: list[Memory]


def plan_review(memories: Sequence[Memory], now: datetime, policy: Policy) -> Verdict:
    """Re-judge each key's contested memories once the newest of them was written longer ago than the
    timeout (a restatement in the meantime is evidence, not a new contest: it does not delay the review).

    Evidence is what was gathered since the contest: sessions that restated it and uses that adopted
    it (`since_contest`). The uses that protected an old memory from being replaced made the contest;
    they decide it only when nothing new does (a grumpy "keep it short" heard once against a wish for
    detail adopted six times). A memory with strictly more evidence than every rival (then strictly
    more support in all) wins: active, rivals superseded; a tie stays contested and is listed.
    """
    due = now - timedelta(hours=policy.review_after_hours)
    groups: dict[tuple[str, str], list[Memory]] = defaultdict(list)
    for m in memories:
        if m.status is Status.contested:  # whom it is about is part of what is contested (pipeline/holders.py)
            groups[(m.about, m.key)].append(m)
    steps: list[Step] = []
    undecided: list[Memory] = []
    for key in sorted(groups):
        group = sorted(groups[key], key=lambda m: (-since_contest(m), -support(m), -m.confidence, m.id))
        if max(m.created_at for m in group) > due:
            continue
        if len(group) > 1 and weight(group[0]) == weight(group[1]):
            undecided.extend(group)
            continue
        winner = group[0]
        runner_up = f" against {_weighed(group[1])}" if len(group) > 1 else ""
        why = f"review: {_weighed(winner)}{runner_up}"
        steps.append(Step(winner, {"status": Status.active.value, "conflicts_with": []}, why))
        steps += [Step(m, superseded(winner.id, now), why)
                  for m in [*group[1:], *records_of(memories, group[1:], winner)]]
    return Verdict(steps, undecided)


def records_of(memories: Iterable[Memory], retired: Sequence[Memory], kept: Memory) -> list[Memory]:
    """The live verbatim records a retired statement was read from, and nothing the kept one was read
    from: "I'd rather get my notifications by email" must not keep answering once Slack has won."""
    sources = {e for m in retired for e in m.source_event_ids}
    return [r for r in memories if retires_record(r, sources, set(kept.source_event_ids))]


def retires_record(record: Memory, sources: set[str], own: set[str]) -> bool:
    """An episode wholly made of the retired statements' events (`sources`) and none of `own`."""
    events = set(record.source_event_ids)
    return (record.mtype is MType.episode and record.status in SEARCHABLE_STATUSES and bool(events)
            and events <= sources and not events & own)


def support(m: Memory) -> int:
    """Sessions that stated it and uses that adopted it."""
    return len(m.session_ids) + m.access_count


def since_contest(m: Memory) -> int:
    """The support it gathered since it was drawn into its contest."""
    return max(0, support(m) - m.contested_support)


def weight(m: Memory) -> tuple[int, int]:
    """What review weighs, first to last: the evidence since the contest, then the support in all."""
    return since_contest(m), support(m)


def _weighed(m: Memory) -> str:
    return f"{since_contest(m)} sessions and uses since the contest ({support(m)} in all)"


# -- decisions by hand: review accept/reject, rollback -----------------------------------


def plan_accept(memory: Memory, same_key: Sequence[Memory], now: datetime) -> list[Step]:
    """Accept a memory held for review or contested: it becomes active, and the live memories it
    conflicted with are superseded by it, as is every other live value of its key (one key, one
    current value: a value written while it waited is replaced by the one now accepted)."""
    _reviewable(memory)
    why = "accepted in review"
    steps = [Step(memory, {"status": Status.active.value, "conflicts_with": []}, why)]
    rivals = [m for m in same_key if m.id != memory.id and m.status in SEARCHABLE_STATUSES
              and (m.id in memory.conflicts_with or memory.id in m.conflicts_with
                   or (is_keyed(memory.mtype) and m.key == memory.key))]
    steps += [Step(m, superseded(memory.id, now), why) for m in rivals]
    return steps


def _reviewable(memory: Memory) -> None:
    if memory.status not in (Status.pending_review, Status.contested):
        raise ValueError(f"memory {memory.id} is {memory.status.value}: only pending_review or contested is reviewed")


def plan_reject(memory: Memory, same_key: Sequence[Memory]) -> list[Step]:
    """Reject it: never searched again, kept as history; a rival it contested stands alone again."""
    _reviewable(memory)
    why = "rejected in review"
    steps = [Step(memory, {"status": Status.deleted.value}, why)]
    for m in same_key:
        if m.id != memory.id and m.status is Status.contested and memory.id in m.conflicts_with:
            left = [c for c in m.conflicts_with if c != memory.id]
            fields: dict[str, Any] = {"conflicts_with": left}
            if not left:
                fields["status"] = Status.active.value
            steps.append(Step(m, fields, why))
    return steps


@dataclass(frozen=True)
class Rollback:
    # The restored version, written as a new point (None: that content is already current).
    restored: Memory | None
    steps: list[Step]


def plan_rollback(versions: Sequence[Memory], to_version: int, now: datetime, space: IdSpace = PUBLIC) -> Rollback:
    """Bring back version `to_version` of a keyed memory as a new version on top (named in `space`).

    Nothing is rewritten: the live versions are superseded by the new one, which carries
    the old content and says where it came from. Rolling back to what is already current
    plans nothing, so a rollback run twice is one rollback.
    """
    target = next((m for m in versions if m.version == to_version), None)
    if target is None:
        raise ValueError(f"no version {to_version}; versions are {sorted(m.version for m in versions)}")
    if not is_keyed(target.mtype):
        raise ValueError(f"a {target.mtype.value} has one version; nothing to roll back")
    live = [m for m in versions if m.status in SEARCHABLE_STATUSES]
    if len(live) == 1 and live[0].content == target.content:
        return Rollback(None, [])
    version = 1 + max(m.version for m in versions)
    newest = max(versions, key=lambda m: m.version)
    restored = target.model_copy(update={
        "id": space.memory_id(target.subject, target.key, version), "version": version, "rev": 1,
        "status": Status.active, "tier": target.tier if target.tier is not Tier.archive else Tier.short_term,
        "created_at": now, "updated_at": now, "valid_from": now, "valid_to": None, "supersedes": newest.id,
        "superseded_by": None, "conflicts_with": [], "strength": 1.0, "strength_at": None, "revisions": [],
        "evidence": f"rolled back to version {to_version} ({target.id})"})
    why = f"rolled back to version {to_version}"
    steps = [Step(m, superseded(restored.id, now), why) for m in live]
    return Rollback(restored, steps)


def _iso(value: datetime | None) -> str:
    return value.isoformat() if value else "?"
