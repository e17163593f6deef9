"""A session's buffered turns (workers/trigger.py keeps them; a session's end reads them): the one owner of
the buffer keys, their bound and their retention.

- `Keys.session_buffer(subject, session)`: hash, event id → `Turn`. At most `max_turns` turns: trimmed as it
  is written (the oldest by event time go once it holds an eighth more), not only when read. Expires
  `ttl_s` after its last turn, and `CLOSED_TTL_S` after its session's end (a redelivered end still finds it).
- `Keys.session_buffers(subject)`: set of the subject's session ids with a buffer, so that forget reads the
  subject's buffers by name instead of scanning the keyspace. It expires with the last buffer; a member
  whose buffer expired is dropped when it is read.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime

import redis

from memflow.pipeline.models import Turn
from memflow.shared.codec import decode, encode
from memflow.shared.redisdb.keys import Keys

Client = redis.Redis | redis.RedisCluster

# A closed session's buffer outlives its session_end by this much, so that a redelivered session_end
# still finds its turns.
CLOSED_TTL_S = 3600


class SessionBuffers:
    def __init__(self, client: Client, keys: Keys, max_turns: int, ttl_s: int) -> None:
        self.client, self.keys, self.max_turns, self.ttl_s = client, keys, max_turns, ttl_s

    def add(self, subject: str, session_id: str, turn: Turn) -> None:
        """Keep a turn (a redelivered one overwrites itself: keyed by event id), within the bound."""
        key = self.keys.session_buffer(subject, session_id)
        pipe = self.client.pipeline(transaction=False)  # two keys, in two cluster slots
        pipe.hset(key, turn.event_id, encode(turn))
        pipe.expire(key, self.ttl_s)
        pipe.hlen(key)
        pipe.sadd(self.keys.session_buffers(subject), session_id)
        pipe.expire(self.keys.session_buffers(subject), self.ttl_s)
        held = int(pipe.execute()[2])
        if held > self.max_turns + self.max_turns // 8:  # some slack: not a trim on every turn at the bound
            self._trim(key)

    def _trim(self, key: str) -> None:
        turns = {event_id: decode(raw, Turn) for event_id, raw in self.client.hgetall(key).items()}
        oldest = sorted(turns, key=lambda e: (turns[e].ts, turns[e].event_id))[:len(turns) - self.max_turns]
        if oldest:
            self.client.hdel(key, *oldest)

    def turns(self, subject: str, session_id: str, until: datetime) -> list[Turn]:
        """The session's turns said up to `until`, by event time, at most `max_turns` (the newest)."""
        raw = self.client.hvals(self.keys.session_buffer(subject, session_id))
        said = [turn for turn in (decode(r, Turn) for r in raw) if turn.ts <= until]
        return sorted(said, key=lambda t: (t.ts, t.event_id))[-self.max_turns:]

    def close(self, subject: str, session_id: str) -> None:
        self.client.expire(self.keys.session_buffer(subject, session_id), CLOSED_TTL_S)

    def of(self, subject: str) -> Iterator[str]:
        """The keys of the subject's buffers (those still there; the index forgets the others)."""
        index = self.keys.session_buffers(subject)
        sessions = sorted(_text(s) for s in self.client.smembers(index))
        for session_id in sessions:
            key = self.keys.session_buffer(subject, session_id)
            if self.client.exists(key):
                yield key
            else:
                self.client.srem(index, session_id)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
