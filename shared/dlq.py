"""Operations on the dead-letter streams: look, put back, throw away."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import redis

from shared.keys import FIELD, Keys


@dataclass(frozen=True)
class DeadLetter:
    id: str
    stage: str
    error: str
    attempts: int
    source: str
    source_id: str
    payload: bytes


def _decode(entry_id: Any, fields: Any) -> DeadLetter:
    def text(name: str) -> str:
        return str(fields.get(name.encode(), b"").decode(errors="replace"))

    return DeadLetter(entry_id.decode(), text("stage"), text("error"), int(text("attempts") or 0),
                      text("source"), text("source_id"), fields.get(b"payload", b""))


def list_dead(client: redis.Redis, keys: Keys, stage: str, count: int = 100) -> list[DeadLetter]:
    entries: Any = client.xrange(keys.dlq(stage), count=count)
    return [_decode(eid, f) for eid, f in entries]


def show(client: redis.Redis, keys: Keys, stage: str, entry_id: str) -> DeadLetter | None:
    found = client.xrange(keys.dlq(stage), min=entry_id, max=entry_id)
    return _decode(*found[0]) if found else None


def _select(client: redis.Redis, keys: Keys, stage: str, ids: list[str] | None) -> list[DeadLetter]:
    entries = list_dead(client, keys, stage, count=100_000)
    return entries if ids is None else [e for e in entries if e.id in ids]


def replay(client: redis.Redis, keys: Keys, stage: str, ids: list[str] | None = None) -> int:
    """Put dead letters back on the stream they came from (all of them when ids is None).

    The re-add and the removal from the DLQ are one MULTI: a crash cannot lose or double one.
    """
    entries = _select(client, keys, stage, ids)
    for entry in entries:
        pipe = client.pipeline(transaction=True)
        pipe.xadd(entry.source or keys.input_of(stage), {FIELD: entry.payload})
        pipe.xdel(keys.dlq(stage), entry.id)
        pipe.execute()
    return len(entries)


def drop(client: redis.Redis, keys: Keys, stage: str, ids: list[str] | None = None) -> int:
    entries = _select(client, keys, stage, ids)
    if entries:
        client.xdel(keys.dlq(stage), *[e.id for e in entries])
    return len(entries)
