"""Deterministic memory ids (docs/write-path.md#deterministic-ids): the same input names the same point.

A redelivered write therefore rewrites its point instead of adding one. Keyed memories
(one live version per topic) are named by subject + key + version; the others
(episodes, events, skills — many per key) by subject + key + the events they came from.

Deterministic is not predictable: ids are named in a deployment's `IdSpace`, a keyed hash (HMAC-SHA256) under
a secret the deployment keeps (shared/redisdb/keys.py `id_space`). Another tenant knows the subject, the key and the
events of a memory it wants to plant or touch, never the secret, so it cannot name the id this store will give it
(docs/write-path.md#ids-belong-to-their-subject). `PUBLIC` is the old, secret-free naming (uuid5 of the public
inputs): what stores made before the secret named their memories, and what pure tests use.
"""

from __future__ import annotations

import hashlib
import hmac
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

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


# Secrets shorter than this are refused: 16 bytes (128 bits) is past any guessing.
MIN_SECRET_BYTES = 16


@dataclass(frozen=True)
class IdSpace:
    """How one deployment names its memories: `secret` keys the hash (None: the public naming, `PUBLIC`)."""

    secret: bytes | None = None

    def __post_init__(self) -> None:
        if self.secret is not None and len(self.secret) < MIN_SECRET_BYTES:
            raise ValueError(f"an id secret has at least {MIN_SECRET_BYTES} bytes")

    def __repr__(self) -> str:  # never the secret itself: it would reach logs and tracebacks
        return "IdSpace(PUBLIC)" if self.secret is None else "IdSpace(<secret>)"

    def name(self, *parts: str) -> str:
        """The id of these parts: a UUID, the same for the same parts in this space, unrelated in any other."""
        text = _SEP.join(parts)
        if self.secret is None:
            return str(uuid.uuid5(NAMESPACE, text))
        digest = hmac.new(self.secret, text.encode(), hashlib.sha256).digest()
        return str(uuid.UUID(bytes=digest[:16], version=4))  # a random-looking UUID: it is one to anyone else

    def memory_id(self, subject: str, key: str, version: int) -> str:
        return self.name("keyed", subject, key, str(version))

    def event_memory_id(self, subject: str, key: str, source_event_ids: Sequence[str]) -> str:
        return self.name("events", subject, key, *sorted(set(source_event_ids)))

    def episode_id(self, subject: str, event_id: str) -> str:
        """The id of the episode that recorded `event_id`."""
        return self.event_memory_id(subject, episode_key(event_id), [event_id])

    def candidate_id(self, candidate: Candidate, version: int = 1) -> str:
        if is_keyed(candidate.mtype):
            return self.memory_id(candidate.subject, candidate.key, version)
        return self.event_memory_id(candidate.subject, candidate.key, candidate.source_event_ids)

    def record_id(self, memory: Memory) -> str:
        """The id this space gives `memory` in its subject, from what it holds (key and version, or key and
        events): what an import checks a record's id against (pipeline/export.py)."""
        if is_keyed(memory.mtype):
            return self.memory_id(memory.subject, memory.key, memory.version)
        return self.event_memory_id(memory.subject, memory.key, memory.source_event_ids)

    def minted(self, subject: str, foreign_id: str) -> str:
        """The id an imported record whose id this space would not give gets instead: bound to `subject`, and the
        same for the same file imported again (a re-import stays idempotent)."""
        return self.name("imported", subject, foreign_id)


PUBLIC = IdSpace()


def memory_id(subject: str, key: str, version: int) -> str:
    """A keyed memory's id in the public naming (`PUBLIC.memory_id`)."""
    return PUBLIC.memory_id(subject, key, version)


def event_memory_id(subject: str, key: str, source_event_ids: Sequence[str]) -> str:
    return PUBLIC.event_memory_id(subject, key, source_event_ids)


def episode_key(event_id: str) -> str:
    """The key of the verbatim record (episode) of one event."""
    return normalize_key(f"episode.{event_id}")


def episode_id(subject: str, event_id: str) -> str:
    """The public id of the episode that recorded `event_id` (resolve finds episodes by key, not by id)."""
    return PUBLIC.episode_id(subject, event_id)


def is_keyed(mtype: MType) -> bool:
    """Whether a memory of this type has one live version per key (and so can be superseded)."""
    return mtype not in _UNKEYED


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
    space: IdSpace = PUBLIC,
) -> Memory:
    """The store payload a candidate becomes, stamped with the candidate's event time, named in `space`."""
    c = candidate
    return Memory(
        id=space.candidate_id(c, version),
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


@dataclass(frozen=True)
class NextVersion:
    """The version a candidate's new memory takes on its key, and the space its id is named in (resolve)."""

    number: int
    space: IdSpace = PUBLIC

    def first(self) -> NextVersion:
        """Version 1 of a key of the candidate's own, in the same space."""
        return NextVersion(1, self.space)

    def memory(self, candidate: Candidate, **fields: Any) -> Memory:
        return new_memory(candidate, version=self.number, space=self.space, **fields)
