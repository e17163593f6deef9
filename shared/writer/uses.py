"""The uses of memories, recorded off the read path and counted on their points later (docs/write-path.md).

A `pack` or a `feedback` adopts memories: each adopted point's `access_count` goes up by one and its
`last_accessed_at` to when. Writing that to the point takes the subject's write lock, which a search must
never wait for; so a use is first recorded here, in one Redis script that never waits, and counted on the
points (`workers/ops.py fold_uses`, a `CountOp` per point through the applier) when the lock is free: at
once if it is, else by the next pack or feedback of the subject, the lifecycle jobs that read the counts,
or the `uses` job.

Counted once: a use is recorded under the request id of the call that made it; a retried pack or feedback
(same id) records nothing more. The fold takes what is recorded in one step (`take`: the hash renamed
aside) and gives it back only once it is counted (`counted`); a fold cut short is redone from the same
snapshot as the same mutation, which the applier counts once (pipeline/writes.py `_count`).

Keys (shared/redisdb/keys.py), all of one subject in one cluster slot, all bounded:
- `uses` / `uses_folding`: two fields per memory used since the last fold; expire `KEEP_S` after the last
  use recorded (uses never counted in that long are dropped, not kept forever);
- `uses_seen`: request ids of the last `SEEN_WINDOW_MS`, at most `SEEN_MAX` of them;
- `uses_subjects`: the subjects with uses to count, one member each, removed when counted.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime

import redis

from memflow.shared.redisdb.keys import Keys

Client = redis.Redis | redis.RedisCluster

# A retry of the same request within this long counts once (a client's retries span seconds to minutes).
SEEN_WINDOW_MS = 3_600_000
SEEN_MAX = 10_000
# Recorded uses not counted in a week are dropped (the `uses` job folds every few minutes).
KEEP_S = 7 * 24 * 3600

# KEYS: uses, seen. ARGV: request id, now ms, window ms, seen max, keep s, at ms, memory ids...
# The request's uses are added only if its id is new: a retry finds it and adds nothing.
_RECORD = """
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', tonumber(ARGV[2]) - tonumber(ARGV[3]))
if redis.call('ZADD', KEYS[2], 'NX', ARGV[2], ARGV[1]) == 0 then return 0 end
redis.call('ZREMRANGEBYRANK', KEYS[2], 0, -tonumber(ARGV[4]) - 1)
redis.call('PEXPIRE', KEYS[2], ARGV[3])
for i = 7, #ARGV do
  redis.call('HINCRBY', KEYS[1], 'n:' .. ARGV[i], 1)
  local last = tonumber(redis.call('HGET', KEYS[1], 'at:' .. ARGV[i]) or '0')
  if tonumber(ARGV[6]) > last then redis.call('HSET', KEYS[1], 'at:' .. ARGV[i], ARGV[6]) end
end
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""

# KEYS: uses, folding. ARGV: a new fold id. What a fold counts: an unfinished fold's snapshot (under its
# own id) first, else the recorded uses, named by the new id.
_TAKE = """
if redis.call('EXISTS', KEYS[2]) == 0 then
  if redis.call('EXISTS', KEYS[1]) == 0 then return {} end
  redis.call('RENAME', KEYS[1], KEYS[2])
  redis.call('HSET', KEYS[2], 'fold', ARGV[1])
end
return redis.call('HGETALL', KEYS[2])
"""


@dataclass(frozen=True)
class Use:
    """How often one memory was used since the last fold, and when last."""

    memory_id: str
    uses: int
    at: datetime


@dataclass(frozen=True)
class Taken:
    """A snapshot of the uses to count: `fold` names it (the same when a fold cut short takes it again)."""

    fold: str
    uses: list[Use]


class Uses:
    """The owner of the use keys of every subject: record, take, counted."""

    def __init__(self, client: Client, keys: Keys) -> None:
        self.client, self.keys = client, keys
        self._record = client.register_script(_RECORD)
        self._take = client.register_script(_TAKE)

    def record(self, subject: str, request_id: str, memory_ids: Sequence[str], at: datetime,
               now_ms: int) -> bool:
        """Record one use of each memory by request `request_id` (`now_ms`: the clock the retry window is
        measured on); False when that request's uses were recorded before (a retry)."""
        ids = list(dict.fromkeys(memory_ids))
        keys = [self.keys.uses(subject), self.keys.uses_seen(subject)]
        args: list[str | int] = [request_id, now_ms, SEEN_WINDOW_MS, SEEN_MAX, KEEP_S, int(at.timestamp() * 1000), *ids]
        fresh = bool(int(self._record(keys=keys, args=args)))
        if fresh and ids:
            self.client.sadd(self.keys.uses_subjects, subject)
        return fresh

    def take(self, subject: str) -> Taken:
        """The uses to count on the points now (the same again, same fold id, until `counted` is called)."""
        raw = self._take(keys=[self.keys.uses(subject), self.keys.uses_folding(subject)], args=[uuid.uuid4().hex])
        fields = {_text(raw[i]): _text(raw[i + 1]) for i in range(0, len(raw), 2)}
        uses = [Use(name[2:], int(n), datetime.fromtimestamp(int(fields.get(f"at:{name[2:]}", 0)) / 1000, UTC))
                for name, n in sorted(fields.items()) if name.startswith("n:")]
        return Taken(fields.get("fold", ""), uses)

    def counted(self, subject: str) -> None:
        """The uses `take` gave are on the points: forget them (and the subject, if none came meanwhile)."""
        self.client.delete(self.keys.uses_folding(subject))
        if not self.client.exists(self.keys.uses(subject)):
            self.client.srem(self.keys.uses_subjects, subject)

    def pending(self, subject: str) -> dict[str, int]:
        """Uses recorded and not yet counted, by memory id (inspect adds them to the points' counts)."""
        pipe = self.client.pipeline(transaction=False)
        pipe.hgetall(self.keys.uses(subject))
        pipe.hgetall(self.keys.uses_folding(subject))
        out: dict[str, int] = {}
        for raw in pipe.execute():
            for name, n in raw.items():
                if _text(name).startswith("n:"):
                    out[_text(name)[2:]] = out.get(_text(name)[2:], 0) + int(n)
        return out

    def subjects(self) -> list[str]:
        """The subjects with uses to count."""
        return sorted(_text(s) for s in self.client.smembers(self.keys.uses_subjects))


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value
