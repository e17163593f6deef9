"""Which consumer owns which partition of a stage: leases in Redis.

A stage's work is split into partitions by subject (shared/redisdb/keys.py). Each partition is owned by one
consumer at a time, so a subject's work is handled in order and never by two consumers at once, with
any number of consumer processes per stage:

- a lease is a key holding its owner's name that expires `lease_ms` after its last renewal: a consumer
  that dies (kill -9, a lost host) stops renewing, and its partitions are free once their leases run
  out. One that stops cleanly releases them at once;
- every consumer heartbeats into the stage's registry (a sorted set scored by the server's clock, so
  hosts whose clocks disagree still agree on who is alive), and takes free partitions while it owns
  fewer than its fair share, ceil(partitions / live consumers). One that owns more than its share
  releases the extra between two batches, so a consumer that joins gets work within a refresh or two;
- a lease means progress (docs/conventions.md#a-lease-means-progress, Kafka's `max.poll.interval.ms`). The consumer loop
  marks progress at every turn and after every entry it handles (`progress`); a thread of its own renews
  the leases between two marks, so a batch that takes longer than a lease (a slow LLM) keeps them, but
  only for `max_batch_s` (MEMFLOW_MAX_BATCH_S) without one. Past it — a call that never returns, a retry
  in place that never ends — the thread gives every partition up, says so, and leaves the registry; the
  consumer takes none back for a lease, so that a healthy one takes them first;
- losing a lease anyway (a stall, a Redis blip) is safe: the stream consumer confirms its lease before
  each entry it hands a per-entry handler (`confirm`), so it runs no further side effect of a partition
  it lost, and settles a batch only while it holds the partition's lease (checked in the same script as
  the XACK), so the entries of a batch whose lease was lost stay pending for the new owner. A lease
  renewed at t (measured before the request) is the owner's in Redis until at least t + lease: a
  confirmation within half of that is local (the owner's own clock, Gray and Cheriton's leases), an
  older one asks Redis. So a healthy consumer pays no round trip per entry, and one whose renewals
  stopped (a stall, a blip) asks before its lease can have run out. What runs between a confirmation
  and the write it precedes is the store's to refuse (shared/writer/applier.py: conditional writes).

Every script touches one key: all of them run unchanged on a Redis Cluster.
"""

from __future__ import annotations

import logging
import math
import random
import threading
import time

import redis

from memflow.shared.errors import MemflowError
from memflow.shared.redisdb.keys import Keys

log = logging.getLogger(__name__)


class LeaseLost(MemflowError):
    """A message's partition has another owner now: not handled, not settled, left pending for that one."""

# Heartbeat into the registry, drop the dead from it, count the living, and say in how many ms the oldest
# heartbeat ages out (a consumer that died drops out then): one script, so that both are of one instant of the
# server's clock.
_HEARTBEAT = """
local now = redis.call('TIME')
local ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
redis.call('ZADD', KEYS[1], ms, ARGV[1])
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', ms - tonumber(ARGV[2]))
redis.call('PEXPIRE', KEYS[1], ARGV[2] * 10)
local oldest = redis.call('ZRANGE', KEYS[1], 0, 0, 'WITHSCORES')
return {redis.call('ZCARD', KEYS[1]), tonumber(oldest[2]) + tonumber(ARGV[2]) - ms}
"""
_RENEW = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('PEXPIRE', KEYS[1], ARGV[2]) end
return 0
"""
_RELEASE = """
if redis.call('GET', KEYS[1]) == ARGV[1] then return redis.call('DEL', KEYS[1]) end
return 0
"""
_LEAVE = "return redis.call('ZREM', KEYS[1], ARGV[1])"
# Take a free partition, or say in how many ms its owner's lease runs out (-1: held for good, never by us).
_ACQUIRE = """
if redis.call('SET', KEYS[1], ARGV[1], 'NX', 'PX', ARGV[2]) then return {1, 0} end
return {0, redis.call('PTTL', KEYS[1])}
"""


def live_consumers(client: redis.Redis, keys: Keys, stage: str, lease_ms: int) -> int:
    """How many consumers of `stage` heartbeat within a lease, by the server's clock."""
    seconds, micros = client.time()
    now_ms = int(seconds) * 1000 + int(micros) // 1000
    return int(client.zcount(keys.consumers(stage), now_ms - lease_ms, "+inf"))


class Leases:
    """The partitions of `stage` that the consumer `name` owns."""

    def __init__(self, client: redis.Redis, keys: Keys, stage: str, name: str, lease_ms: int,
                 max_batch_s: float = 300.0) -> None:
        self.client, self.keys, self.stage, self.name, self.lease_ms = client, keys, stage, name, lease_ms
        self.max_batch_s = max_batch_s
        self._owned: set[int] = set()
        # By partition: until when (monotonic) the lease is ours for certain, without asking Redis.
        self._sure_until: dict[int, float] = {}
        self._lock = threading.Lock()
        self._next_refresh = 0.0
        self._progress_at = time.monotonic()
        # After giving its partitions up for want of progress, a consumer takes none before this.
        self._idle_until = 0.0
        self._heartbeat = client.register_script(_HEARTBEAT)
        self._renew = client.register_script(_RENEW)
        self._release = client.register_script(_RELEASE)
        self._leave = client.register_script(_LEAVE)
        self._acquire_script = client.register_script(_ACQUIRE)

    @property
    def every_s(self) -> float:
        """How often leases are renewed and shares recomputed: four times a lease."""
        return self.lease_ms / 4000

    def due_in_s(self) -> float:
        """Seconds until the next `refresh` is due: a blocking read waits no longer, so that a partition whose
        owner died is taken as its lease runs out, not a read later."""
        return max(0.0, self._next_refresh - time.monotonic())

    def owned(self) -> list[int]:
        with self._lock:
            return sorted(self._owned)

    def owns(self, partition: int) -> bool:
        with self._lock:
            return partition in self._owned

    def lost(self, partition: int) -> None:
        """The partition's lease turned out not to be ours (found when settling a batch)."""
        with self._lock:
            self._owned.discard(partition)
            self._sure_until.pop(partition, None)

    def progress(self) -> None:
        """The loop moved on (a turn, an entry handled): its leases are renewed for another `max_batch_s`."""
        self._progress_at = time.monotonic()

    def stalled_s(self) -> float:
        """Seconds since the loop last made progress."""
        return time.monotonic() - self._progress_at

    def confirm(self, partition: int) -> bool:
        """Before a side effect of `partition`: is its lease ours now? Certain without asking while its last
        renewal is younger than half a lease; else asked of Redis, renewing it when it is ours (the loop is
        making progress) and forgetting it when it is not (a stall or a blip let it run out)."""
        with self._lock:
            if partition not in self._owned:
                return False
            if time.monotonic() < self._sure_until.get(partition, 0.0):
                return True
        if self._renew_one(partition):
            return True
        log.warning("consumer %s lost partition %d of %s", self.name, partition, self.stage)
        self.lost(partition)
        return False

    def _renew_one(self, partition: int) -> bool:
        """Extend one lease if it is still ours; note until when it is ours for certain."""
        asked = time.monotonic()
        if not int(self._renew(keys=[self.keys.lease(self.stage, partition)], args=[self.name, self.lease_ms])):
            return False
        self._held_from(partition, asked)
        return True

    def _held_from(self, partition: int, asked: float) -> None:
        # Redis ran the renewal after `asked`, so the lease lasts a lease from then at least; half of it leaves a
        # wide margin for the rates of the two clocks.
        with self._lock:
            if partition in self._owned:
                self._sure_until[partition] = asked + self.lease_ms / 2000

    def refresh(self, *, force: bool = False) -> list[int]:
        """Between two batches: heartbeat, renew, give up the extra and take free partitions up to our share.
        Returns the partitions newly taken (their pending entries are the previous owner's to redo)."""
        now = time.monotonic()
        if not force and now < self._next_refresh:
            return []
        if now < self._idle_until:  # out of the registry for now: the healthy consumers' shares are the whole
            self._next_refresh = self._idle_until
            return []
        count, ages_out_ms = self._heartbeat(keys=[self.keys.consumers(self.stage)], args=[self.name, self.lease_ms])
        live = max(1, int(count))
        # The living heartbeat every refresh, so only a dead consumer's heartbeat ages out before the next one:
        # its share is recomputed then, not up to a refresh later.
        self._next_refresh = now + min(self.every_s, max(0, int(ages_out_ms)) / 1000)
        self.renew()
        share = math.ceil(self.keys.partitions / live)
        with self._lock:
            extra = sorted(self._owned)[share:]
        for partition in extra:
            self._give_up(partition)
        return self._take(share)

    def renew(self) -> None:
        """Extend every lease we hold; forget the ones that expired meanwhile (another consumer may hold them)."""
        for partition in self.owned():
            if not self._renew_one(partition):
                log.warning("consumer %s lost partition %d of %s", self.name, partition, self.stage)
                self.lost(partition)

    def release_all(self) -> None:
        """On a clean stop: free our partitions now instead of when their leases run out."""
        for partition in self.owned():
            self._give_up(partition)
        self._leave(keys=[self.keys.consumers(self.stage)], args=[self.name])

    def keep_renewing(self, stop: threading.Event) -> threading.Thread:
        """Renew in a thread until `stop`, so that a long batch keeps its partitions while the loop makes
        progress; give them up once it has made none for `max_batch_s`."""
        def loop() -> None:
            while not stop.wait(self.every_s):
                try:
                    if self.stalled_s() > self.max_batch_s:
                        self.give_up_stalled()
                    else:
                        self.renew()
                except redis.RedisError as exc:  # an outage: the consumer's own loop waits it out
                    log.warning("consumer %s cannot renew its leases (%s)", self.name, exc)

        thread = threading.Thread(target=loop, name=f"{self.name}-leases", daemon=True)
        thread.start()
        return thread

    def give_up_stalled(self) -> None:
        """No progress for longer than a batch may take: free every partition at once, leave the registry (the
        others' shares are recomputed without us) and take none back for a lease."""
        owned = self.owned()
        if not owned:
            return
        log.error("consumer %s made no progress for %.0f s (MEMFLOW_MAX_BATCH_S=%g): giving up partitions %s of "
                  "%s to a healthy consumer; the batch in hand is left pending for it",
                  self.name, self.stalled_s(), self.max_batch_s, owned, self.stage)
        self._idle_until = time.monotonic() + self.lease_ms / 1000
        for partition in owned:  # first here: the loop hands no further entry of them over, whatever Redis says
            self.lost(partition)
        for partition in owned:  # then in Redis (down: the leases run out by themselves, renewed no more)
            self._release(keys=[self.keys.lease(self.stage, partition)], args=[self.name])
        self._leave(keys=[self.keys.consumers(self.stage)], args=[self.name])

    def _give_up(self, partition: int) -> None:
        self._release(keys=[self.keys.lease(self.stage, partition)], args=[self.name])
        self.lost(partition)

    def _take(self, share: int) -> list[int]:
        """Free partitions up to our share. Short of it, the next refresh is due when the first lease held by
        another runs out: a dead owner's partitions are taken a lease after its last renewal, at most a
        lease after its death, not up to a refresh later."""
        taken: list[int] = []
        free = [p for p in range(self.keys.partitions) if not self.owns(p)]
        random.shuffle(free)  # consumers starting together do not all race for partition 0 first
        soonest_ms: float = math.inf
        for partition in free:
            if len(self.owned()) >= share:
                break
            asked = time.monotonic()
            got, left_ms = self._acquire_script(keys=[self.keys.lease(self.stage, partition)],
                                                args=[self.name, self.lease_ms])
            if got:
                with self._lock:
                    self._owned.add(partition)
                self._held_from(partition, asked)
                taken.append(partition)
            elif int(left_ms) >= 0:
                soonest_ms = min(soonest_ms, int(left_ms))
        if len(self.owned()) < share and soonest_ms < math.inf:
            self._next_refresh = min(self._next_refresh, time.monotonic() + soonest_ms / 1000)
        return taken
