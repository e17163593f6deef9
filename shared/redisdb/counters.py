"""Per-day counters in one hash per owner (a subject's uses of its memories, its LLM spending): the one
place that writes them, and the bound on what they keep.

A counter's field names its day (an ISO date anywhere in the name: `recalled:2026-03-02`,
`2026-03-02:prompt_tokens`). Expiring the hash alone bounds nothing while it is written to: a subject
that is used every day refreshes the TTL every day, and the fields of every past day stayed for good.
So the first write of each day also deletes the fields of the days older than `keep_days` (once a day
per hash: a marker field holds the day it was last pruned), and the hash still expires `keep_days` after
its last write. A hash then holds at most `keep_days + 1` days of fields.
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

import redis
from redis.client import Pipeline

# KEYS[1]: the counters. ARGV: the day written (YYYYMMDD: the marker reads as a number, as every value does),
# the oldest day kept (ISO), ttl s, then (field, amount) pairs.
_ADD = """
for i = 4, #ARGV, 2 do redis.call('HINCRBY', KEYS[1], ARGV[i], ARGV[i + 1]) end
if redis.call('HGET', KEYS[1], 'pruned') ~= ARGV[1] then
  for _, name in ipairs(redis.call('HKEYS', KEYS[1])) do
    local day = string.match(name, '%d%d%d%d%-%d%d%-%d%d')
    if day and day < ARGV[2] then redis.call('HDEL', KEYS[1], name) end
  end
  redis.call('HSET', KEYS[1], 'pruned', ARGV[1])
end
redis.call('EXPIRE', KEYS[1], ARGV[3])
"""

# The marker field (the day it was last pruned, YYYYMMDD): no counter, its name holds no day.
PRUNED = "pruned"


class DailyCounters:
    """Counters by day in hashes that keep `keep_days` days."""

    def __init__(self, client: redis.Redis | redis.RedisCluster, keep_days: int) -> None:
        self.keep_days = keep_days
        self._add = client.register_script(_ADD)

    def add(self, key: str, at: datetime, amounts: Mapping[str, int], via: Any = None) -> None:
        """Add `amounts` ({field name: n}, each name holding `at`'s day) to `key`; `via`: a pipeline the
        caller sends."""
        pairs = [x for name, n in amounts.items() if n for x in (name, n)]
        if not pairs:
            return
        day = at.date()
        oldest = (day - timedelta(days=self.keep_days)).isoformat()
        args = [day.strftime("%Y%m%d"), oldest, self.keep_days * 86_400, *pairs]
        if isinstance(via, Pipeline):
            self._add(keys=[key], args=args, client=via)
        else:  # none, or a cluster's pipeline (it cannot load a script on the node it sends to): sent now
            self._add(keys=[key], args=args)
