"""Each published event's fate, in Redis (pipeline/fates.py says what the states mean).

Where it lives: one hash per subject (`Keys.fates`, event id → the fate as JSON), in the subject's partition slot
beside its streams and pending entries, so that a publish writes `accepted` in the script that XADDs the event
(shared/unstored/published.py): atomically, in the one round trip of the publish. The stage that decides the rest
writes it before it acknowledges the message (trigger: the gate's refusal; extract: a turn that yields nothing;
resolve: forgotten in flight, or already stored; upsert: the memories written; the consumer loop: a dead letter): a
stage that crashes in between is handed the message again and writes the same fate again.

Scoped: the hash is the subject's, so a lookup names the subject, and an id published under another subject is
not found (the HTTP route answers 404 for both: an event's existence never leaks across subjects).

Bounded: the hash expires once the subject has published nothing for TTL_S, and holds at most PER_SUBJECT events
(the oldest published go first; the publish's script trims it). An event whose fate is gone is answered as unknown.
`memflow partitions set` moves each hash to the subject's partition under the new count (`move`); forgetting a
memory drops the fates of the events it was read from (they name it).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import orjson
import redis

from memflow.pipeline.fates import EventFate, FateState
from memflow.shared.codec import json_object
from memflow.shared.errors import DecodeError
from memflow.shared.redisdb.keys import Keys

Client = redis.Redis | redis.RedisCluster

# How long a subject's fates are kept after its last publish: a week, time enough to ask about the events of a
# session that closes days later. A tuned constant, no deployment's choice.
TTL_S = 7 * 24 * 3600
# The events whose fate one subject keeps (the oldest published go first): a few hundred bytes each.
PER_SUBJECT = 5000
# Trimmed to this share of PER_SUBJECT once over it, so that a subject at the bound is not trimmed at every publish.
TRIM_TO = 0.9

# Merge one word on each event's fate (pipeline/fates.py: how a later word meets an earlier one). KEYS[1]: the
# subject's fates; ARGV: TTL, now (ms), then per event: its id, the state, the reason ("" none), n, n memory ids.
_MERGE = """
local function rank_over(old, new)
  if new == 'stored' or new == 'dead_lettered' then return true end
  if new == 'dropped' then return old ~= 'stored' end
  if new == 'nothing_to_remember' then return old == 'accepted' or old == 'dead_lettered' or old == new end
  return old == 'dead_lettered' or old == 'accepted'
end
local i = 3
while i <= #ARGV do
  local id, state, reason, n = ARGV[i], ARGV[i + 1], ARGV[i + 2], tonumber(ARGV[i + 3])
  local raw = redis.call('HGET', KEYS[1], id)
  local fate = raw and cjson.decode(raw) or {at = tonumber(ARGV[2])}
  local ids, seen = {}, {}
  for _, m in ipairs(type(fate.memory_ids) == 'table' and fate.memory_ids or {}) do
    ids[#ids + 1] = m; seen[m] = true
  end
  for j = 1, n do
    local m = ARGV[i + 3 + j]
    if not seen[m] then ids[#ids + 1] = m; seen[m] = true end
  end
  if not fate.state or rank_over(fate.state, state) then
    fate.state = state
    if reason == '' then fate.reason = nil else fate.reason = reason end
  end
  if #ids > 0 then fate.memory_ids = ids else fate.memory_ids = nil end
  redis.call('HSET', KEYS[1], id, cjson.encode(fate))
  i = i + 4 + n
end
redis.call('EXPIRE', KEYS[1], ARGV[1])
return 1
"""


def record(client: Client, keys: Keys, subject: str, state: FateState, event_ids: Iterable[str],
           reason: str | None = None, memory_ids: Mapping[str, Sequence[str]] | None = None) -> None:
    """The stage's word on these events of `subject` (`memory_ids`: per event, the memories it is stored as)."""
    ids = list(dict.fromkeys(event_ids))
    if not ids:
        return
    args: list[Any] = [TTL_S, int(time.time() * 1000)]
    for event_id in ids:
        made = list((memory_ids or {}).get(event_id, ()))
        args += [event_id, state.value, reason or "", len(made), *made]
    client.eval(_MERGE, 1, keys.fates(subject), *args)


def stored(client: Client, keys: Keys, subject: str, memory_ids: Mapping[str, Sequence[str]]) -> None:
    """These events are in the store as these memories (by event id)."""
    record(client, keys, subject, FateState.stored, memory_ids, memory_ids=memory_ids)


def read(client: Client, keys: Keys, subject: str, event_id: str) -> EventFate | None:
    """The event's fate, or None when nothing was recorded for it under `subject` (never published there, or
    expired)."""
    raw = client.hget(keys.fates(subject), event_id)
    if raw is None:
        return None
    fate = orjson.loads(raw)
    ids = fate.get("memory_ids")
    return EventFate(event_id=event_id, subject=subject, state=FateState(fate["state"]),
                     memory_ids=ids if isinstance(ids, list) else [], reason=fate.get("reason"))


def forget(client: Client, keys: Keys, subject: str, event_ids: Iterable[str]) -> int:
    """Drop the fates of forgotten events: they name the memories forgotten (workers/forgetting.py)."""
    ids = list(dict.fromkeys(event_ids))
    return int(client.hdel(keys.fates(subject), *ids)) if ids else 0


def events_in(stage: str, payload: bytes | None) -> dict[str, list[str]]:
    """{subject: event ids} a work message of `stage` carries: a published event its own, an extract task its
    turns', a candidate (resolve) or a write batch's candidate (upsert) the events it was read from. Only the ids
    are read, not the model: a message dead-lettered because it does not validate still names its events."""
    try:
        message = json_object(payload or b"")
    except DecodeError:
        return {}
    subject = message.get("subject")
    if stage == "upsert":
        candidate = message.get("candidate")
        message = candidate if isinstance(candidate, dict) else {}
    if stage == "trigger":
        ids = [message.get("event_id")]
    elif stage == "extract":
        ids = [t.get("event_id") for t in message.get("turns") or [] if isinstance(t, dict)]
    else:
        found = message.get("source_event_ids")
        ids = found if isinstance(found, list) else []
    named = [i for i in ids if isinstance(i, str) and i]
    return {subject: named} if isinstance(subject, str) and subject and named else {}


def dead_lettered(client: Client, keys: Keys, stage: str, payload: bytes | None, reason: str) -> None:
    """A work message of `stage` goes to its DLQ: the events it carries are dead-lettered, and why."""
    for subject, ids in events_in(stage, payload).items():
        record(client, keys, subject, FateState.dead_lettered, ids, f"the {stage} stage gave up on it: {reason}"[:500])


def move(client: Client, old: Keys, new: Keys) -> int:
    """After the partition count changed (`memflow partitions set`, drained): each subject's fates to its partition
    under the new count; how many hashes moved. A scan of the keyspace, once per change of the count (a rare
    operator's step), rather than an index every publish would keep."""
    moved = 0
    for found in client.scan_iter(match=f"{old.prefix}{{p*}}:fates:*", count=1000):
        key = found.decode() if isinstance(found, bytes) else str(found)
        subject = key.split(":fates:", 1)[1]
        target = new.fates(subject)
        if key == old.fates(subject) and target != key:
            held, ttl = client.hgetall(key), client.ttl(key)
            if held:
                client.hset(target, mapping=held)  # type: ignore[arg-type]
                client.expire(target, ttl if ttl > 0 else TTL_S)
            client.delete(key)
            moved += 1
    return moved


def replayed(client: Client, keys: Keys, stage: str, payload: bytes | None) -> None:
    """A dead letter of `stage` goes back on its stream: its events are accepted again (over their dead letter only)."""
    for subject, ids in events_in(stage, payload).items():
        record(client, keys, subject, FateState.accepted, ids, "replayed from the dead letters")

