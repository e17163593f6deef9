"""Per-key fairness at the front doors: how many requests one key may have in flight, and how fast it may
send them (a token bucket), so that one tenant's flood cannot take every query worker from the others
(issue 30). A key's share is one record wherever it is kept (shared/admission/shares.py keeps it in Redis, so that
every server process and both doors, HTTP and /mcp, count against one budget per key).

Pure: the caller passes the record and the time (the seconds of one clock every process agrees on)."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field


@dataclass(frozen=True)
class Limits:
    """`concurrency` requests in flight per key, `rate_per_s` requests a second with bursts of `burst`. A place
    lapses `lease_s` after it was taken: a process that died holding one (its requests never end) leaks it
    for that long, never for good; it is at least the longest a request may hold its place."""

    concurrency: int
    rate_per_s: float
    burst: int
    lease_s: float


@dataclass(frozen=True)
class Share:
    """One key's record: its bucket's `tokens` as of `at_s`, and its places in flight (id → when it lapses)."""

    tokens: float
    at_s: float
    places: Mapping[str, float] = field(default_factory=dict)


@dataclass(frozen=True)
class Refused:
    """Why a request was refused, and when it may be tried again (whole seconds, at least 1: Retry-After)."""

    reason: str
    retry_after_s: int


@dataclass(frozen=True)
class Admitted:
    """The key's record with the request's place taken: written back as it is."""

    share: Share


def fresh(limits: Limits, now_s: float) -> Share:
    """The record of a key not heard from lately: a full bucket, nothing in flight."""
    return Share(tokens=float(limits.burst), at_s=now_s)


def admit(share: Share | None, limits: Limits, place: str, now_s: float) -> Admitted | Refused:
    """Take `place` for a request of the key whose record is `share` (None: none kept), or say why not.
    Places past their lease are dropped first; the bucket refills with the time passed (never backwards:
    two processes may read the clock in either order)."""
    share = share or fresh(limits, now_s)
    current = max(now_s, share.at_s)
    live = {p: until for p, until in share.places.items() if until > current}
    tokens = refilled(share, limits, current)
    if len(live) >= limits.concurrency:
        return Refused(f"this key has {len(live)} requests in flight, its most at once", 1)
    if tokens < 1.0:
        wait = (1.0 - tokens) / limits.rate_per_s
        return Refused(f"this key is over its rate of {limits.rate_per_s:g} requests a second", max(1, math.ceil(wait)))
    return Admitted(Share(tokens - 1.0, current, {**live, place: current + limits.lease_s}))


def refilled(share: Share, limits: Limits, now_s: float) -> float:
    return min(float(limits.burst), share.tokens + max(0.0, now_s - share.at_s) * limits.rate_per_s)


def keep_s(share: Share, limits: Limits) -> float:
    """How long the record must be kept: until its last place lapses and its bucket is full again. Past that it
    says nothing a missing record does not (`fresh`), so an idle key costs no memory."""
    last = max(share.places.values(), default=share.at_s)
    full = share.at_s + (limits.burst - share.tokens) / limits.rate_per_s
    return max(last, full) - share.at_s


def take_stream(places: Mapping[str, float], per_key: int, place: str, now_s: float,
                lease_s: float) -> dict[str, float] | Refused:
    """Take `place` among a key's open streams (`places`: id → when it lapses), at most `per_key` live ones,
    or say why not. A stream's place is renewed while it lives (`renewed`); one past its lease (its process died
    or stalled) is dropped here, so the count heals within a lease."""
    live = {p: until for p, until in places.items() if until > now_s}
    if len(live) >= per_key:
        return Refused(f"this key holds {per_key} streams open already: close one", 1)
    return {**live, place: now_s + lease_s}


def renewed(places: Mapping[str, float], place: str, now_s: float, lease_s: float) -> dict[str, float] | None:
    """The places with `place`'s lease renewed from `now_s`; None when it is gone: another take dropped it as
    lapsed, and counted without it since, so the stream it held must end (its key may hold `per_key` others)."""
    if place not in places:
        return None
    return {**places, place: max(places[place], now_s + lease_s)}
