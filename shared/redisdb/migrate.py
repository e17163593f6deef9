"""Bring a Redis written by memflow before partitions (issue 17) to today's key layout, once, at start-up.

Before, each stage had one stream (`<prefix>events`, `<prefix>extract`, ...) and one dead-letter stream;
now each is split into partitions by subject (shared/redisdb/keys.py). What must not be lost on an upgrade:
- the work still to do: entries of the old work streams that their group has not read, or read and not
  acknowledged, are appended to their subject's partition (an event re-delivered is idempotent);
- the dead letters, moved to their subject's partition (kept as they were, reason and all);
- the `changes` feed and the API keys, renamed under their hash tags.
What was already done (acknowledged entries) is history and dropped with the old streams.

Only a single server can hold the old layout (a cluster deployment starts on the new one). A lock
makes concurrent starters migrate once; the old keys are deleted as they are moved, so a second
run finds nothing.
"""

from __future__ import annotations

import logging
from typing import Any

import orjson
import redis

from memflow.shared.redisdb.keys import FIELD, INPUT_STREAM, STAGES, Keys

log = logging.getLogger(__name__)


def migrate_unpartitioned(client: redis.Redis, keys: Keys) -> dict[str, int]:
    """Move what the old layout holds into the new one; how many entries or keys moved, by kind."""
    old = [f"{keys.prefix}{name}" for name in (*INPUT_STREAM.values(), "changes", "apikeys")]
    if not client.exists(*old) and not client.exists(*(f"{keys.prefix}dlq:{s}" for s in STAGES)):
        return {}
    moved: dict[str, int] = {}
    with client.lock(f"{keys.prefix}migrate-lock", timeout=600, blocking_timeout=600):
        for stage in STAGES:
            moved[f"work:{stage}"] = _move_work(client, keys, stage)
            moved[f"dlq:{stage}"] = _move_dead(client, keys, stage)
        moved["keys"] = _rename(client, keys)
    moved = {kind: n for kind, n in moved.items() if n}
    if moved:
        log.warning("moved the pre-partition keys to the partitioned layout: %s", moved)
    return moved


def _move_work(client: redis.Redis, keys: Keys, stage: str) -> int:
    stream = f"{keys.prefix}{INPUT_STREAM[stage]}"
    if not client.exists(stream):
        return 0
    undone = _undone(client, stream, keys.group(stage))
    for _, fields in undone:  # in id order: a subject's work keeps its order in its partition
        payload = fields.get(FIELD.encode(), b"")
        client.xadd(keys.input_of(stage, keys.partition(_subject(payload))), {FIELD: payload})
    client.delete(stream, f"{keys.prefix}autoclaim:{stage}", f"{keys.prefix}errors:{stage}")
    return len(undone)


def _undone(client: redis.Redis, stream: str, group: str) -> list[tuple[Any, dict[bytes, bytes]]]:
    """The entries the group has not acknowledged, oldest first: pending, or unread (after its last
    delivered id). Acknowledged history is not read at all."""
    found: Any = next((g for g in client.xinfo_groups(stream) if _text(g["name"]) == group), None)
    last = _text(found["last-delivered-id"]) if found else "0-0"
    unread: Any = client.xrange(stream, min=f"({last}" if last != "0-0" else "-")
    pending: Any = client.xpending_range(stream, group, "-", "+", 10_000_000) if found else []
    pipe = client.pipeline(transaction=False)
    for p in pending:
        pipe.xrange(stream, min=p["message_id"], max=p["message_id"])
    held = [entry for got in pipe.execute() for entry in got]
    return sorted(held + list(unread), key=lambda entry: tuple(int(x) for x in _text(entry[0]).split("-")))


def _move_dead(client: redis.Redis, keys: Keys, stage: str) -> int:
    stream = f"{keys.prefix}dlq:{stage}"
    letters: Any = client.xrange(stream)
    for _, fields in letters:
        partition = keys.partition(_subject(fields.get(b"payload", b"")))
        fields[b"source"] = keys.input_of(stage, partition).encode()
        client.xadd(keys.dlq(stage, partition), fields)
    client.delete(stream)
    return len(letters)


def _rename(client: redis.Redis, keys: Keys) -> int:
    renamed = 0
    if client.exists(f"{keys.prefix}changes"):
        client.rename(f"{keys.prefix}changes", keys.changes)
        renamed += 1
    for key in client.scan_iter(match=f"{keys.prefix}apikey:*"):
        client.rename(key, keys.api_key_hash(_text(key).rsplit(":", 1)[1]))
        renamed += 1
    if client.exists(f"{keys.prefix}apikeys"):
        client.rename(f"{keys.prefix}apikeys", keys.api_keys)
        renamed += 1
    return renamed


def _subject(payload: bytes) -> str:
    try:
        value = orjson.loads(payload).get("subject")
    except (orjson.JSONDecodeError, AttributeError):
        return ""
    return value if isinstance(value, str) else ""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
