"""Deterministic memory ids (docs/write-path.md#deterministic-ids): the same input names the same point.

A redelivered write therefore rewrites its point instead of adding one. Keyed memories
(one live version per topic) are named by subject + key + version; the others
(episodes, events, skills — many per key) by subject + key + the events they came from.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence

from memflow.pipeline.models import Candidate, Memory, MType, Source, Status, Tier
from memflow.pipeline.topics import normalize_key

# Fixed for good: changing it would rename every memory in every store.
NAMESPACE = uuid.UUID("6f1d3c2a-4b5e-5c8d-9e0f-a1b2c3d4e5f6")
# Unit separator: in no subject, key or event id, so ("a", "bc") and ("ab", "c") differ.
_SEP = "\x1f"

_UNKEYED = frozenset({MType.episode, MType.event, MType.skill})
# Said by the user in so many words: straight to long-term. Inferences, derivations and
# tool output start short-term, an observation period (docs/write-path.md#tiers). Only what is meant
# to last is promoted: a verbatim record, an event, a passing wish or the task at hand
# stays short-term however plainly it was said ("昨天讨论了缓存方案" is no standing fact).
_LONG_TERM_SOURCES = frozenset({Source.explicit, Source.explicit_correction})
_SHORT_LIVED = frozenset({MType.episode, MType.event, MType.session_context, MType.task_state, MType.temp_preference})


def memory_id(subject: str, key: str, version: int) -> str:
    return str(uuid.uuid5(NAMESPACE, _SEP.join(("keyed", subject, key, str(version)))))


def event_memory_id(subject: str, key: str, source_event_ids: Sequence[str]) -> str:
    return str(uuid.uuid5(NAMESPACE, _SEP.join(("events", subject, key, *sorted(set(source_event_ids))))))


def episode_key(event_id: str) -> str:
    """The key of the verbatim record (episode) of one event."""
    return normalize_key(f"episode.{event_id}")


def episode_id(subject: str, event_id: str) -> str:
    """The id of the episode that recorded `event_id`: resolve finds it without a search."""
    return event_memory_id(subject, episode_key(event_id), [event_id])


def is_keyed(mtype: MType) -> bool:
    """Whether a memory of this type has one live version per key (and so can be superseded)."""
    return mtype not in _UNKEYED


def candidate_id(candidate: Candidate, version: int = 1) -> str:
    if is_keyed(candidate.mtype):
        return memory_id(candidate.subject, candidate.key, version)
    return event_memory_id(candidate.subject, candidate.key, candidate.source_event_ids)


def starting_tier(c: Candidate) -> Tier:
    lasting = c.source in _LONG_TERM_SOURCES and c.mtype not in _SHORT_LIVED
    return Tier.long_term if lasting else Tier.short_term


def new_memory(
    candidate: Candidate,
    *,
    version: int = 1,
    supersedes: str | None = None,
    status: Status = Status.active,
    conflicts_with: Sequence[str] = (),
) -> Memory:
    """The store payload a candidate becomes, stamped with the candidate's event time."""
    c = candidate
    return Memory(
        id=candidate_id(c, version),
        subject=c.subject,
        uri=f"mem://{c.subject}/{c.dir.value}/{c.key}",
        dir=c.dir,
        mtype=c.mtype,
        key=c.key,
        content=c.content,
        confidence=c.confidence,
        importance=c.importance,
        source=c.source,
        status=status,
        tier=starting_tier(c),
        created_at=c.ts,
        updated_at=c.ts,
        pinned=c.pinned,
        expires_at=c.expires_at,
        valid_from=c.ts,
        extractor=c.extractor,
        slot=c.slot,
        about=c.about,
        version=version,
        supersedes=supersedes,
        conflicts_with=list(conflicts_with),
        source_event_ids=list(dict.fromkeys(c.source_event_ids)),
        session_ids=[c.session_id] if c.session_id else [],
        evidence=c.evidence,
        tag_version=c.tag_version,
        external_ref=c.external_ref,
        context=c.context,
        context_event_ids=list(c.context_event_ids),
    )
