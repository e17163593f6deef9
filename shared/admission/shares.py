"""Each API key's share of the front doors, kept in Redis: every `memflow serve` process and both doors (the
HTTP API and /mcp) count one key's requests against one budget. shared/admission/fairness.py decides; this module
owns the record (docs/conventions.md#every-key-has-one-owner).

One hash per key (`Keys.key_share`): `tokens` and `at` (its bucket) and `place:<id>` → when that place lapses,
in seconds of the Redis server's clock (one clock for every process and host). `admit` reads the record
under WATCH, decides, and writes it back in one MULTI that fails if another process changed it meanwhile
(docs/conventions.md#a-write-checks-its-own-precondition: a conflict reads again). `release` gives a place back
with one HDEL. A process that dies holding places leaks them only until they lapse (`Limits.lease_s`), and
the hash expires once it says nothing a missing one does not (`fairness.keep_s`): its size is bounded by
the key's concurrency, its life by the lease.

A key's open change-feed streams (`GET /v1/changes` as Server-Sent Events) take places the same way, in a hash of
their own (`Keys.key_streams`: place id → when it lapses): at most MEMFLOW_HTTP_MAX_STREAMS_PER_KEY across every
process. A stream lives as long as its reader, so its place is renewed by the stream's own loop (`renew_stream`,
docs/conventions.md#a-lease-means-progress: a stream that stopped progressing stops renewing), given back when it
ends, and lapses `lease_s` after its last renewal if its process died; a stream whose place was counted away as
lapsed ends at its next renewal.

Kept on the RPC queues' server: one server, never a cluster (RQ runs on none), the one whose queue these
shares guard.
"""

from __future__ import annotations

import asyncio
import math
import time
import uuid
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any, TypeVar, cast

import redis
import redis.asyncio

from memflow.shared.admission.fairness import (
    Admitted,
    Limits,
    Refused,
    Share,
    admit,
    fresh,
    keep_s,
    refilled,
    renewed,
    take_stream,
)
from memflow.shared.polling import backoff_s
from memflow.shared.redisdb.keys import Keys
from memflow.shared.sdk.client import MemoryClient, Sent
from memflow.shared.settings import HttpSettings

# How many times `admit` reads again after another request of the same key changed the record first. Only a
# key's own requests conflict: a flood of one key retries among its own, another key's record is untouched.
ATTEMPTS = 8
# The pause after a conflict: full jitter, doubling from 1 ms up to 20 ms (8 attempts: at most ~0.1 s in all).
CONFLICT_BACKOFF_S, CONFLICT_BACKOFF_MAX_S = 0.001, 0.02
PLACE = "place:"
# How long a key's place stays taken by a call its caller stopped waiting for, at most, while a worker may
# still run it: a search in native code (the encoder) is not cut short at its deadline.
LINGER_S = 60.0


# What a decision on a key's record writes back: a new share, or an admission that carries one.
D = TypeVar("D", Admitted, Share)


@dataclass(frozen=True)
class Place:
    """A request's place among its key's requests in flight: give it back with `KeyShares.release`."""

    key_id: str
    id: str


def share_limits(http: HttpSettings) -> Limits:
    """The limits MEMFLOW_HTTP_KEY_CONCURRENCY, _KEY_RATE_PER_S, _KEY_BURST and _KEY_LEASE_S set."""
    return Limits(http.key_concurrency, http.key_rate_per_s, http.key_burst, http.key_lease_s)


class KeyShares:
    """The places and buckets of every key, on `client` (an asyncio client of the queues' server)."""

    def __init__(self, client: redis.asyncio.Redis, keys: Keys, limits: Limits) -> None:
        self.client, self.keys, self.limits = client, keys, limits
        self._lingering: set[asyncio.Task[None]] = set()  # a reference until each ends: the loop keeps weak ones
        # By key: this process's admissions of it, one at a time, and how many wait (the entry goes with the last).
        self._turns: dict[str, tuple[asyncio.Lock, list[int]]] = {}

    async def admit(self, key_id: str) -> Place | Refused:
        """A place for a request of `key_id`, or why not (and when to try again)."""
        place = uuid.uuid4().hex
        decided = await self._decided(key_id, lambda share, now_s: admit(share, self.limits, place, now_s))
        return Place(key_id, place) if isinstance(decided, Admitted) else decided

    async def spend(self, key_id: str) -> Refused | None:
        """One more token of `key_id`'s rate for a request that holds its place already and calls a query worker
        again (an export's next page, an import's next call: each a call, as a search is); None once taken, or when
        one will be there. No place is taken or checked."""
        decided = await self._decided(key_id, lambda share, now_s: _spent(share, self.limits, now_s))
        return decided if isinstance(decided, Refused) else None

    async def _decided(self, key_id: str, decide: Callable[[Share | None, float], D | Refused]) -> D | Refused:
        """`decide` on the key's record and the server's clock, its answer written back (`_try`), one admission of
        the key in this process at a time; a refusal after ATTEMPTS conflicts in a row."""
        name = self.keys.key_share(key_id)
        async with self._one_at_a_time(key_id):
            for attempt in range(ATTEMPTS):
                decided = await self._try(name, decide)
                if decided is not None:
                    return decided
                # Another process wrote the record first: it reads again after a jittered pause, so that two
                # processes hammering one key do not collide again and again.
                await asyncio.sleep(backoff_s(attempt, CONFLICT_BACKOFF_S, CONFLICT_BACKOFF_MAX_S))
        return Refused(f"this key's requests came too fast to count ({ATTEMPTS} conflicts in a row)", 1)

    @asynccontextmanager
    async def _one_at_a_time(self, key_id: str) -> AsyncIterator[None]:
        """A key's admissions in this process one after another: optimistic writes of one record from one loop
        would mostly conflict (8 at once: a third refused for it, measured), while across processes they rarely do."""
        lock, waiting = self._turns.setdefault(key_id, (asyncio.Lock(), [0]))
        waiting[0] += 1
        try:
            async with lock:
                yield
        finally:
            waiting[0] -= 1
            if not waiting[0]:
                del self._turns[key_id]

    async def _try(self, name: str, decide: Callable[[Share | None, float], D | Refused]) -> D | Refused | None:
        """One read-decide-write; None when another request of the key wrote first."""
        async with self.client.pipeline(transaction=True) as pipe:
            try:
                await pipe.watch(name)
                seconds, micros = await pipe.time()
                decided = decide(_share(await pipe.hgetall(name)), seconds + micros / 1e6)
                if isinstance(decided, Refused):
                    return decided
                cast(Any, pipe).multi()  # untyped in redis-py 8.2: no ignore that a typed release leaves unused
                _write(pipe, name, decided.share if isinstance(decided, Admitted) else decided, self.limits)
                await pipe.execute()
                return decided
            except redis.WatchError:
                return None

    async def release(self, place: Place) -> None:
        """Give `place` back (nothing if it lapsed meanwhile)."""
        await self.client.hdel(self.keys.key_share(place.key_id), PLACE + place.id)

    def release_when_done(self, place: Place, memory: MemoryClient, sent: Sent[Any]) -> None:
        """The caller gave up on `sent`, but a query worker may still be running it: `place` is given back when the
        worker is done (its result stored, within LINGER_S), not now. Otherwise a key whose calls outlive their
        timeout would start new ones while the old still hold workers, and take them all (issue 30). On the
        event loop of `client`."""
        lingering = Sent(sent.name, sent.job, LINGER_S, time.monotonic() + LINGER_S, sent.reply)

        async def release_when_done() -> None:
            try:
                await memory.wait_async(lingering, self.client)
            except redis.RedisError:
                pass  # the place is given back all the same
            finally:
                await self.release(place)
        task = asyncio.get_running_loop().create_task(release_when_done())
        self._lingering.add(task)
        task.add_done_callback(self._lingering.discard)

    # -- change-feed streams ---------------------------------------------------------------------------

    async def take_stream(self, key_id: str, per_key: int, lease_s: float) -> Place | Refused:
        """A place among `key_id`'s open streams (at most `per_key`, every process's), lapsing `lease_s` after
        it was taken or last renewed; or why not."""
        place = uuid.uuid4().hex
        decided = await self._streams(key_id, lambda places, now: take_stream(places, per_key, place, now, lease_s))
        return Place(key_id, place) if not isinstance(decided, Refused) else decided

    async def renew_stream(self, place: Place, lease_s: float) -> bool:
        """Renew a stream's place for `lease_s` more; False when it is gone (counted away as lapsed: the stream
        ends) or the record kept conflicting (it lapses rather than overcount)."""
        decided = await self._streams(place.key_id, lambda places, now: renewed(places, place.id, now, lease_s))
        return decided is not None and not isinstance(decided, Refused)

    async def release_stream(self, place: Place) -> None:
        """Give a stream's place back (nothing if it lapsed meanwhile)."""
        await self.client.hdel(self.keys.key_streams(place.key_id), place.id)

    async def _streams(self, key_id: str, decide: Callable[[dict[str, float], float], dict[str, float] | Refused | None]
                       ) -> dict[str, float] | Refused | None:
        """Read a key's stream places under WATCH, `decide` on the server's clock, write them back in one MULTI
        (a conflict reads again, as `admit`); what `decide` answered (None: nothing to write)."""
        name = self.keys.key_streams(key_id)
        for attempt in range(ATTEMPTS):
            async with self.client.pipeline(transaction=True) as pipe:
                try:
                    await pipe.watch(name)
                    seconds, micros = await pipe.time()
                    now = seconds + micros / 1e6
                    decided = decide({_text(k): float(v) for k, v in (await pipe.hgetall(name)).items()}, now)
                    if decided is None or isinstance(decided, Refused):
                        return decided
                    cast(Any, pipe).multi()
                    pipe.delete(name)  # the lapsed places go with it
                    pipe.hset(name, mapping={place: until for place, until in decided.items()})
                    pipe.pexpire(name, max(1, math.ceil((max(decided.values()) - now) * 1000)))
                    await pipe.execute()
                    return decided
                except redis.WatchError:
                    pass
            await asyncio.sleep(backoff_s(attempt, CONFLICT_BACKOFF_S, CONFLICT_BACKOFF_MAX_S))
        return Refused(f"this key's streams changed too fast to count ({ATTEMPTS} conflicts in a row)", 1)

    async def in_flight(self, key_id: str) -> int:
        """How many places `key_id` holds, lapsed ones included until its next request drops them."""
        fields = [_text(f) for f in await self.client.hkeys(self.keys.key_share(key_id))]
        return sum(f.startswith(PLACE) for f in fields)


def _share(raw: Mapping[Any, Any]) -> Share | None:
    fields = {_text(k): float(v) for k, v in raw.items()}
    if not fields:
        return None
    places = {k.removeprefix(PLACE): until for k, until in fields.items() if k.startswith(PLACE)}
    return Share(tokens=fields["tokens"], at_s=fields["at"], places=places)


def _spent(share: Share | None, limits: Limits, now_s: float) -> Share | Refused:
    """The record with one token taken (its places as they are), or when one will be there (fairness.admit's
    bucket, without its place)."""
    share = share or fresh(limits, now_s)
    current = max(now_s, share.at_s)
    tokens = refilled(share, limits, current)
    if tokens < 1.0:
        wait = (1.0 - tokens) / limits.rate_per_s
        return Refused(f"this key is over its rate of {limits.rate_per_s:g} requests a second", max(1, math.ceil(wait)))
    return Share(tokens - 1.0, current, share.places)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _write(pipe: redis.asyncio.client.Pipeline, name: str, share: Share, limits: Limits) -> None:
    pipe.delete(name)  # the lapsed places go with it
    pipe.hset(name, mapping={"tokens": share.tokens, "at": share.at_s,
                             **{PLACE + place: until for place, until in share.places.items()}})
    pipe.pexpire(name, max(1, math.ceil(keep_s(share, limits) * 1000)))
