"""The one writer of the store (docs/write-path.md#the-applier).

Every change to a memory — a write batch of resolve, a lifecycle job, forget, feedback, review,
rollback — reaches the store as a `Mutation` applied here, and nowhere else. `Applier.apply`:

1. takes the subject's write lock in Redis, so that writers of one subject take turns;
2. reads the points the ops name and forget's tombstones of what it puts, and asks
   `pipeline.writes.plan` what each op does: write, done already (an earlier attempt was cut
   short), stale, or not at all (forgotten);
3. writes: puts in one call, then patches and counts, then purges. Each write is conditional in
   the engine (a put only where no point is, a patch only on the revision it was planned on) and
   read back: the lock can expire under a stalled writer, the condition cannot (etcd's
   compare-and-write; docs/conventions.md#a-write-checks-its-own-precondition);
4. announces each change on `changes` exactly once (within a day), still under the lock, so
   the feed is in revision order: a script appends the entry only if the op is not yet in the
   mutation's ledger, so a retry after a crash between the write and the announcement announces
   it, and one after the announcement stays silent.

A whole write batch (`on_stale="send_back"`) built on a revision that moved on writes nothing and
says so; the caller sends the candidate back to be decided again. A batch an earlier attempt had
started is completed instead: its remaining patches are applied to the revision found.

`copy_points`, `copy_fields` and `drop_points` are the reindex's writes into an index being built: the same
store seam, no memory changes meaning there (shared/writer/reindex.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

import redis
from redis.exceptions import LockError
from redis.lock import Lock

from memflow.pipeline import writes
from memflow.pipeline.models import Change, Memory, Mutation
from memflow.shared.codec import encode
from memflow.shared.errors import Permanent, StaleVersion
from memflow.shared.redisdb.keys import FIELD, Keys
from memflow.shared.storage.store import MemoryFilter, Store

log = logging.getLogger(__name__)

# An op's announcement is remembered this long: a retry or replay of the mutation within it stays silent.
# One day, not a week: the ledgers share the feed's cluster slot and grow with a day's mutations there. A
# retry comes within minutes (a reclaim); a replay after a day (a DLQ replay) may announce a done op again,
# with the same `rev`, which a consumer mirroring the feed dedupes by (memory_id, rev).
LEDGER_TTL_S = 24 * 3600
# Longer than any mutation takes to apply (a job's steps for one subject), short enough that a
# writer that died holding it delays the subject's next write by at most this.
LOCK_TIMEOUT_S = 60.0
LOCK_WAIT_S = 30.0
# The same step records the subject's last entry (its profile's revision) and drops its materialized profile
# (shared/changes/profiles.py): no profile outlives the change that made it stale, a forget's words included.
# The owner's fence: an owner whose lock expired (another may hold it now) announces nothing, checked in
# the same step as the append, so no stall between a check and the append can reorder the feed. The ledger is
# marked after the append: a script is not rolled back when a command fails, and an append refused (the
# feed's key unwritable, out of memory) must leave the op unannounced for the retry, not marked as announced.
_ANNOUNCE = """
if redis.call('GET', KEYS[3]) ~= ARGV[6] then return -1 end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return 0 end
local id = redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', ARGV[4], ARGV[5])
redis.call('HSET', KEYS[1], ARGV[1], 1)
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('HSET', KEYS[4], ARGV[7], id)
redis.call('DEL', KEYS[5])
return 1
"""


@dataclass
class Applied:
    """What a mutation did: the changes it made (or found made by an earlier attempt), the ops it could
    not apply because their points had moved on (by point id), and the puts it did not write because
    what they hold was forgotten (by point id)."""

    changes: list[Change] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)
    forgotten: list[str] = field(default_factory=list)


class Applier:
    def __init__(self, store: Store, client: redis.Redis, keys: Keys, changes_maxlen: int) -> None:
        self.store, self.client, self.keys, self.changes_maxlen = store, client, keys, changes_maxlen
        self._announce = client.register_script(_ANNOUNCE)

    def apply(self, mutation: Mutation, vectors: Mapping[str, Sequence[float]] | None = None) -> Applied:
        """Apply `mutation` (vectors: the dense vector of each memory it puts, by id). Safe to repeat."""
        with self.holding(mutation.subject) as held:
            return held.apply(mutation, vectors)

    @contextmanager
    def holding(self, subject: str, wait_s: float = LOCK_WAIT_S) -> Iterator[Held]:
        """The subject's write lock, for a caller that reads and decides under it too (forget: what it
        finds to forget, and its tombstones, must be of the same instant as its deletion). A Redis error
        passes through: the consumer loop rides out outages."""
        lock = self.client.lock(self.keys.write_lock(subject), timeout=LOCK_TIMEOUT_S, blocking_timeout=wait_s)
        if not lock.acquire(blocking=wait_s > 0):  # wait_s 0: one try (a read path's write that never waits)
            raise StaleVersion(f"the write lock of {subject} stayed taken for {wait_s} s")
        try:
            yield Held(self, subject, lock)
        finally:
            try:
                lock.release()
            except LockError:  # expired while held: `Held.renew` refused every step after that
                log.warning("write lock of %s expired while held", subject)

    def current(self, mutation: Mutation) -> dict[str, Memory]:
        ids = list(dict.fromkeys(writes.target(op) for op in mutation.ops))
        return {m.id: m for m in self.store.get(MemoryFilter(mutation.subject, ids=ids))} if ids else {}

    def tombstones(self, mutation: Mutation) -> writes.Tombstones:
        """What forget left of the events and words of the memories `mutation` puts (workers/forgetting.py)."""
        memories = writes.puts(mutation)
        if not memories:
            return writes.Tombstones()
        events = sorted({e for m in memories for e in m.source_event_ids})
        hashes = [writes.content_hash(m.content) for m in memories]
        pipe = self.client.pipeline(transaction=False)  # two keys of the subject, in two cluster slots
        pipe.smismember(self.keys.forgotten_events(mutation.subject), events) if events else pipe.ping()
        pipe.hmget(self.keys.forgotten_contents(mutation.subject), hashes)
        flags, when = pipe.execute()
        forgotten = frozenset(e for e, f in zip(events, flags, strict=True) if f) if events else frozenset()
        return writes.Tombstones(forgotten, {h: datetime.fromisoformat(_text(w))
                                             for h, w in zip(hashes, when, strict=True) if w})

    def announce_once(self, mutation: Mutation, write: writes.Write, token: bytes) -> None:
        """Append `write`'s change to the feed unless it was announced before, while `token` holds the lock."""
        assert write.change is not None
        keys = [self.keys.announced(mutation.id), self.keys.changes, self.keys.write_lock(mutation.subject),
                self.keys.revisions, self.keys.profile(mutation.subject)]
        done = self._announce(keys=keys, args=[write.op_key, LEDGER_TTL_S, self.changes_maxlen, FIELD,
                                               encode(write.change), token, mutation.subject])
        if done == -1:
            raise StaleVersion(f"the write lock of {mutation.subject} expired before {write.op_key} was announced")


class Held:
    """The subject's write lock, held: what is applied through it is read, planned, written and announced
    under it. The lock is an optimisation, never the only guard (docs/write-path.md#under-races): every
    store write is conditional on the revision it was planned on, and the lock is renewed before each step,
    so an owner that stalled past its lease stops there instead of writing or announcing after a newer one."""

    def __init__(self, applier: Applier, subject: str, lock: Lock) -> None:
        self.applier, self.subject, self._lock = applier, subject, lock

    def renew(self) -> None:
        """Renew the lease for the next step, or stop: the lock expired and another writer may hold it."""
        try:
            self._lock.extend(LOCK_TIMEOUT_S, replace_ttl=True)
        except LockError as exc:
            raise StaleVersion(f"the write lock of {self.subject} expired while held") from exc

    def _token(self) -> bytes:
        token = self._lock.local.token
        assert isinstance(token, bytes)
        return token

    def apply(self, mutation: Mutation, vectors: Mapping[str, Sequence[float]] | None = None) -> Applied:
        if mutation.subject != self.subject:
            raise Permanent(f"a mutation of {mutation.subject} under the write lock of {self.subject}")
        a = self.applier
        current = a.current(mutation)
        plan = writes.plan(mutation, current, tombstones=a.tombstones(mutation))
        if (plan.stale or plan.forgotten) and mutation.on_stale == "send_back":
            # A write batch is all or nothing: built on a moved revision it is decided again; holding
            # something forgotten, none of it is written (its retirements would point at nothing).
            if not plan.started:
                return Applied(stale=plan.stale, forgotten=plan.forgotten)
            plan = writes.plan(mutation, current, rebase=True, tombstones=writes.Tombstones())  # cut short: complete it
        self._write(plan, vectors or {})
        announced = [w for w in plan.writes if w.change is not None]
        for write in announced:  # inside the lock, in the order written: the feed is in revision order
            a.announce_once(mutation, write, self._token())
        return Applied([w.change for w in announced if w.change is not None], plan.stale, plan.forgotten)

    def _write(self, plan: writes.Plan, vectors: Mapping[str, Sequence[float]]) -> None:
        todo = [w for w in plan.writes if not w.done]
        store = self.applier.store
        puts = [w.memory for w in todo if w.memory is not None]
        if puts:
            missing = [m.id for m in puts if m.id not in vectors]
            if missing:
                raise Permanent(f"no vector for the new memories {missing}")
            self.renew()
            store.put(puts, [vectors[m.id] for m in puts], new_only=True)
            # Landed before anything is patched: a put the engine skipped (a point under its id that is not the
            # subject's) must not leave the versions it retires pointing at nothing.
            self._check([w for w in todo if w.kind == "put"])
        at_rev: dict[str, int | None] = {}  # a point written twice by one plan: the second write expects the first's
        for w in todo:
            if w.fields:
                self.renew()
                store.set_fields(self.subject, w.memory_id, w.fields, if_rev=at_rev.get(w.memory_id, w.at_rev))
                at_rev[w.memory_id] = w.fields.get("rev", at_rev.get(w.memory_id, w.at_rev))
        purged = [w.memory_id for w in todo if w.kind == "delete"]
        if purged:
            self.renew()
            store.delete(self.subject, purged)
        self._check([w for w in todo if w.kind != "put"])

    def _check(self, written: Sequence[writes.Write]) -> None:
        """Each put and revision-moving patch landed: the engine refuses a conditional write silently, so
        the points are read back. A write another writer beat (an owner that stalled past its lease, or one
        that took an expired one) is not retried here: the mutation is, on the revision it finds."""
        stamped = {w.memory_id: w.op_key for w in written
                   if w.kind == "put" or (w.kind == "patch" and "last_op" in w.fields)}
        if not stamped:
            return
        found = {m.id: m.last_op for m in self.applier.store.get(MemoryFilter(self.subject, ids=list(stamped)))}
        lost = sorted(i for i, key in stamped.items() if found.get(i) != key and i not in _purged(written))
        if lost:
            raise StaleVersion(f"another writer changed {lost} of {self.subject} first (compare-and-write refused)")


def _purged(written: Sequence[writes.Write]) -> set[str]:
    return {w.memory_id for w in written if w.kind == "delete"}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def copy_points(dest: Store, memories: Sequence[Memory], vectors: Sequence[Sequence[float]]) -> None:
    """Write points as they are into an index being built (reindex): no memory changes, nothing to announce."""
    dest.put(memories, vectors)


def copy_fields(dest: Store, memory: Memory, fields: dict[str, Any]) -> None:
    """Bring a copied point's payload up to date in an index being built (reindex's catch-up)."""
    dest.set_fields(memory.subject, memory.id, fields)


def drop_points(dest: Store, points: Mapping[str, str]) -> None:
    """Remove from an index being built the points gone from the one it copies (reindex's catch-up), given as
    point id → subject."""
    by_subject: dict[str, list[str]] = {}
    for memory_id, subject in points.items():
        by_subject.setdefault(subject, []).append(memory_id)
    for subject, memory_ids in by_subject.items():
        dest.delete(subject, memory_ids)
