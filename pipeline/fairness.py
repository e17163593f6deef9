"""Per-key fairness at a front door: how many requests one key may have in flight, and how fast it may
send them (a token bucket), so that one tenant's flood cannot take every query worker from the others
(issue 30). Pure: the caller passes the time (a monotonic clock's seconds)."""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Refused:
    """Why a request was refused, and when it may be tried again (whole seconds, at least 1: Retry-After)."""

    reason: str
    retry_after_s: int


@dataclass
class _Bucket:
    tokens: float
    at: float
    in_flight: int = 0


class KeyLimits:
    """`concurrency` requests in flight per key, and `rate_per_s` requests per second per key with bursts of
    `burst`. A key not heard from in a while costs nothing: its bucket is dropped once full and idle.
    Not thread-safe: one event loop's (the HTTP API calls it from its loop only)."""

    def __init__(self, concurrency: int, rate_per_s: float, burst: int) -> None:
        self.concurrency, self.rate_per_s, self.burst = concurrency, rate_per_s, burst
        self._buckets: dict[str, _Bucket] = {}

    def admit(self, key: str, now: float) -> Refused | None:
        """Take a place for `key`'s request (release it with `release`), or say why not."""
        bucket = self._buckets.get(key) or _Bucket(tokens=float(self.burst), at=now)
        bucket.tokens = min(float(self.burst), bucket.tokens + (now - bucket.at) * self.rate_per_s)
        bucket.at = now
        self._buckets[key] = bucket
        if bucket.in_flight >= self.concurrency:
            return Refused(f"this key has {bucket.in_flight} requests in flight, its most at once", 1)
        if bucket.tokens < 1.0:
            wait = (1.0 - bucket.tokens) / self.rate_per_s
            return Refused(f"this key is over its rate of {self.rate_per_s:g} requests a second",
                           max(1, math.ceil(wait)))
        bucket.tokens -= 1.0
        bucket.in_flight += 1
        return None

    def release(self, key: str, now: float) -> None:
        bucket = self._buckets[key]
        bucket.in_flight -= 1
        full_by_now = bucket.tokens + (now - bucket.at) * self.rate_per_s >= self.burst
        if not bucket.in_flight and full_by_now:
            del self._buckets[key]  # an idle key with a full bucket is the same as one never seen

    def in_flight(self, key: str) -> int:
        bucket = self._buckets.get(key)
        return bucket.in_flight if bucket else 0
