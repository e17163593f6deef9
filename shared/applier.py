"""The one writer of the store (docs/write-path.md#the-applier).

Every change to a memory — a write batch of resolve, a lifecycle job, forget, feedback, review,
rollback — reaches the store as a `Mutation` applied here, and nowhere else. `Applier.apply`:

1. takes the subject's write lock in Redis, so that reading a point, checking its revision and
   writing it is one step for every thread and process writing that subject (Qdrant has no
   compare-and-set of its own);
2. reads the points the ops name and asks `pipeline.writes.plan` what each op does: write, done
   already (an earlier attempt was cut short), or stale;
3. writes: puts in one call, then patches and counts, then purges;
4. announces each change on `changes` exactly once: a script appends the entry only if the op is
   not yet in the mutation's ledger, so a retry after a crash between the write and the
   announcement announces it, and one after the announcement stays silent.

A whole write batch (`on_stale="send_back"`) built on a revision that moved on writes nothing and
says so; the caller sends the candidate back to be decided again. A batch an earlier attempt had
started is completed instead: its remaining patches are applied to the revision found.

`copy_points`, `copy_fields` and `drop_points` are the reindex's writes into an index being built: the same
store seam, no memory changes meaning there (shared/reindex.py).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import redis
from redis.exceptions import LockError

from memflow.pipeline import writes
from memflow.pipeline.models import Change, Memory, Mutation
from memflow.shared.codec import encode
from memflow.shared.errors import Permanent, StaleVersion
from memflow.shared.keys import FIELD, Keys
from memflow.shared.store import MemoryFilter, Store

log = logging.getLogger(__name__)

# An op's announcement is remembered this long: a retry or replay of the mutation within it stays silent.
LEDGER_TTL_S = 7 * 24 * 3600
# Longer than any mutation takes to apply (a job's steps for one subject), short enough that a
# writer that died holding it delays the subject's next write by at most this.
LOCK_TIMEOUT_S = 60.0
LOCK_WAIT_S = 30.0
_ANNOUNCE = """
if redis.call('HSETNX', KEYS[1], ARGV[1], 1) == 0 then return 0 end
redis.call('EXPIRE', KEYS[1], ARGV[2])
redis.call('XADD', KEYS[2], 'MAXLEN', '~', ARGV[3], '*', ARGV[4], ARGV[5])
return 1
"""


@dataclass
class Applied:
    """What a mutation did: the changes it made (or found made by an earlier attempt), and the ops it
    could not apply because their points had moved on (by point id)."""

    changes: list[Change] = field(default_factory=list)
    stale: list[str] = field(default_factory=list)


class Applier:
    def __init__(self, store: Store, client: redis.Redis, keys: Keys, changes_maxlen: int) -> None:
        self.store, self.client, self.keys, self.changes_maxlen = store, client, keys, changes_maxlen
        self._announce = client.register_script(_ANNOUNCE)

    def apply(self, mutation: Mutation, vectors: Mapping[str, Sequence[float]] | None = None) -> Applied:
        """Apply `mutation` (vectors: the dense vector of each memory it puts, by id). Safe to repeat."""
        with self._locked(mutation.subject):
            current = self._current(mutation)
            plan = writes.plan(mutation, current)
            if plan.stale and mutation.on_stale == "send_back":
                if not plan.started:
                    return Applied(stale=plan.stale)
                plan = writes.plan(mutation, current, rebase=True)  # cut short before: complete it
            self._write(plan, vectors or {})
        announced = [w for w in plan.writes if w.change is not None]
        for write in announced:
            self._announce_once(mutation, write)
        return Applied([w.change for w in announced if w.change is not None], plan.stale)

    def _current(self, mutation: Mutation) -> dict[str, Memory]:
        ids = list(dict.fromkeys(writes.target(op) for op in mutation.ops))
        return {m.id: m for m in self.store.get(MemoryFilter(mutation.subject, ids=ids))} if ids else {}

    def _write(self, plan: writes.Plan, vectors: Mapping[str, Sequence[float]]) -> None:
        todo = [w for w in plan.writes if not w.done]
        puts = [w.memory for w in todo if w.memory is not None]
        if puts:
            missing = [m.id for m in puts if m.id not in vectors]
            if missing:
                raise Permanent(f"no vector for the new memories {missing}")
            self.store.put(puts, [vectors[m.id] for m in puts])
        for w in todo:
            if w.fields:
                self.store.set_fields(w.memory_id, w.fields)
        purged = [w.memory_id for w in todo if w.kind == "delete"]
        if purged:
            self.store.delete(purged)

    def _announce_once(self, mutation: Mutation, write: writes.Write) -> None:
        assert write.change is not None
        self._announce(keys=[self.keys.announced(mutation.id), self.keys.changes],
                       args=[write.op_key, LEDGER_TTL_S, self.changes_maxlen, FIELD, encode(write.change)])

    @contextmanager
    def _locked(self, subject: str) -> Iterator[None]:
        """The subject's write lock (a Redis error passes through: the consumer loop rides out outages)."""
        lock = self.client.lock(self.keys.write_lock(subject), timeout=LOCK_TIMEOUT_S, blocking_timeout=LOCK_WAIT_S)
        if not lock.acquire():
            raise StaleVersion(f"the write lock of {subject} stayed taken for {LOCK_WAIT_S} s")
        try:
            yield
        finally:
            try:
                lock.release()
            except LockError:  # held past its timeout: another writer may have taken it meanwhile
                log.warning("write lock of %s expired while held", subject)


def copy_points(dest: Store, memories: Sequence[Memory], vectors: Sequence[Sequence[float]]) -> None:
    """Write points as they are into an index being built (reindex): no memory changes, nothing to announce."""
    dest.put(memories, vectors)


def copy_fields(dest: Store, memory_id: str, fields: dict[str, Any]) -> None:
    """Bring a copied point's payload up to date in an index being built (reindex's catch-up)."""
    dest.set_fields(memory_id, fields)


def drop_points(dest: Store, memory_ids: Sequence[str]) -> None:
    """Remove from an index being built the points gone from the one it copies (reindex's catch-up)."""
    dest.delete(memory_ids)
