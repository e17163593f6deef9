"""The one consumer loop every stage runs on.

A stage supplies `(stage name, input model, handler)` (shared/streaming/handlers.py: what a handler returns, and what
it may ask of the loop while it runs). The loop:
- owns some of the stage's partitions (shared/streaming/leases.py: leases in Redis, a fair share each, taken
  over from a consumer that died once its lease runs out, or that made no progress for
  MEMFLOW_MAX_BATCH_S) and creates the stage's consumer group on every partition's stream (ignoring
  only BUSYGROUP), once the partition count is the one recorded for the deployment (shared/redisdb/keys.py);
- marks progress at every turn and after every entry a handler is done with (`progress`): its leases
  are renewed only while it does;
- reclaims entries left pending by a failing consumer with XAUTOCLAIM (cursor kept in Redis;
  `min_idle_time` longer than any handler takes), and at once those of a partition it just took over;
- reads new entries of all its partitions with XREADGROUP, decodes them, and hands them to the
  handler as one batch (a stage whose cost is per batch, an embedding call, batches across partitions),
  once it has confirmed that it still holds each partition of the batch (shared/streaming/leases.py: `confirm`);
  a per-entry handler (`per_item`) is handed an entry only after its partition's lease is confirmed
  again, so a consumer that lost a partition mid-batch runs no further side effect of it (its entries
  stay pending for the new owner);
- for each entry that succeeded, XADDs what the handler emits and XACKs the entry in one script per
  partition, fenced by the partition's lease, so an entry is acknowledged exactly when its output is
  durable, and only by the partition's owner;
- sends an entry that can never succeed (bad JSON, failed validation, a `Permanent`
  error) to its partition's `dlq:<stage>` at once, and one that keeps failing there after
  `max_deliveries` deliveries — again in one script with the XACK;
- retries in place, with backoff, an entry that met a write it could not reconcile (`StaleVersion`), at most
  `max_deliveries` rounds, then dead-letters it with its reason: a conflict that never resolves never holds
  the partition (and every subject's writes behind it);
- retries in place, with backoff, an entry that failed because a dependency is down
  (`Retryable`: Qdrant unavailable), so an outage never spends a message's budget (past
  MEMFLOW_MAX_BATCH_S the partitions go to another consumer, shared/streaming/leases.py: the entry's error hash
  says it was waiting out an outage, and those handovers are not counted against it), and keeps
  its claim on the entries it holds meanwhile (XCLAIM JUSTID resets their idle time without
  counting a delivery), so that no other consumer reclaims them;
- leaves an entry that failed otherwise pending (redelivered after `reclaim_idle_ms`),
  backing off while a whole batch fails;
- trims the acknowledged past of its partitions' streams once it is `retention_ms` old (shared/streaming/backlog.py);
- outlives anything a batch raises: a Redis outage is waited out, and any other error
  escaping a step (a bug outside the handler) is logged with its traceback and backed off,
  never the silent end of the stage's thread;
- stops between batches when asked: a batch in hand is finished or left pending,
  never half-applied; its partitions are released for the others to take at once.

What the streams hold as a whole — each stage's backlog, the trimming of the acknowledged past, the partition
count — is shared/streaming/backlog.py's.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic

import orjson
import redis
from redis.cluster import RedisCluster

from memflow.shared.codec import decode, encode
from memflow.shared.errors import DecodeError, Permanent, Retryable, StaleVersion
from memflow.shared.polling import backoff_s
from memflow.shared.redisdb.connections import replicated
from memflow.shared.redisdb.keys import FIELD, Keys, check_partitions
from memflow.shared.settings import Settings
from memflow.shared.streaming.backlog import trim_acknowledged
from memflow.shared.streaming.handlers import BatchHandler, Emit, M, Outcome, handing
from memflow.shared.streaming.leases import LeaseLost, Leases
from memflow.shared.unstored import fates, pending

log = logging.getLogger(__name__)

# How an entry's last error says it was waiting out an outage (a `Retryable` failure): its deliveries since are
# handovers between consumers (shared/streaming/leases.py gives partitions up after MEMFLOW_MAX_BATCH_S without
# progress), which do not spend its budget.
OUTAGE = "outage: "
# How a dead letter that kept meeting a conflicting write says so (`_conflicted`).
CONFLICT = "conflict that did not resolve in "

@dataclass
class Entry:
    id: str
    raw: bytes | None
    partition: int = 0
    deliveries: int = 1


# Entries read per batch (at most; each owned partition is asked its share). 256 with resolve's linger
# (workers/resolve.py) took bench perf's ingest from 0.29x to 0.438x of the raw encode, against 64
# (bench/RESULTS.md, "Ingest history"). A tuned constant, no deployment's choice: it was MEMFLOW_READ_COUNT.
READ_COUNT = 256


@dataclass
class ConsumerConfig:
    max_deliveries: int = 5
    reclaim_idle_ms: int = 60_000
    block_ms: int = 1_000
    count: int = READ_COUNT
    retry_base_s: float = 0.05
    retry_max_s: float = 5.0
    # How long a short batch waits for more entries (0: hand over what came at once).
    linger_ms: int = 0
    # A partition's owner renews its lease four times a lease; a dead one's partitions are free after it.
    lease_ms: int = 10_000
    # A batch (or one entry of a per-item handler) that makes no progress for this long loses its partitions.
    max_batch_s: float = 300.0
    # Acknowledged entries of the work streams are kept this long, then trimmed (0: trimmed at once).
    retention_ms: int = 3_600_000
    # Replicas that must hold a settled batch before the loop goes on (WAIT; 0: the master's word is enough).
    wait_replicas: int = 0
    wait_timeout_ms: int = 1000
    decode_context: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings) -> ConsumerConfig:
        """The consumer loop's settings (MEMFLOW_MAX_DELIVERIES, _RECLAIM_IDLE_MS, _BLOCK_MS, ...)."""
        s = settings.consumer
        return cls(max_deliveries=s.max_deliveries, reclaim_idle_ms=s.reclaim_idle_ms, block_ms=s.block_ms,
                   retry_base_s=s.retry_base_s, retry_max_s=s.retry_max_s,
                   lease_ms=s.lease_ms, max_batch_s=s.max_batch_s, retention_ms=int(s.retention_s * 1000),
                   wait_replicas=settings.redis.wait_replicas, wait_timeout_ms=settings.redis.wait_timeout_ms,
                   decode_context={"max_text_bytes": settings.limits.max_text_bytes})


# In a cluster one XREADGROUP reads one slot, so a consumer of several partitions reads them without
# blocking and, when all were empty, blocks on one of them (in turn) at most this long.
CLUSTER_BLOCK_MS = 50
# How often an owner trims the acknowledged past of its partitions' streams.
TRIM_EVERY_S = 10.0


class StreamConsumer(Generic[M]):
    def __init__(self, client: redis.Redis, keys: Keys, stage: str, model: type[M],
                 handler: BatchHandler[M], config: ConsumerConfig, name: str | None = None) -> None:
        self.client, self.keys, self.stage, self.model = client, keys, stage, model
        self.handler, self.config = handler, config
        self.group = keys.group(stage)
        self.name = name or f"{stage}-{random.getrandbits(32):08x}"
        self.leases = Leases(client, keys, stage, self.name, config.lease_ms, config.max_batch_s)
        self._partition_of = {keys.input_of(stage, p): p for p in range(keys.partitions)}
        self._cluster = isinstance(client, RedisCluster)
        self._failures = 0
        self._next_reclaim = 0.0
        self._next_trim = 0.0
        self._turn = 0
        # Partitions just taken over, and when: what was pending there then is the previous owner's, reclaimed
        # at once (not after reclaim_idle_ms) by one pass over their pending entries.
        self._sweep: dict[int, float] = {}
        self._stop = threading.Event()
        self._refresh_claim_script = client.register_script(_REFRESH_CLAIM)
        self._settle_script = client.register_script(_SETTLE)

    def stream(self, partition: int) -> str:
        return self.keys.input_of(self.stage, partition)

    def ensure_group(self) -> None:
        """Refuse a partition count other than the deployment's (PartitionCountMismatch), then create the group
        on every partition's stream."""
        check_partitions(self.client, self.keys)
        for stream in self.keys.inputs_of(self.stage):
            try:
                self.client.xgroup_create(stream, self.group, id="0", mkstream=True)
            except redis.ResponseError as exc:
                if "BUSYGROUP" not in str(exc):
                    raise

    def run(self, stop: threading.Event) -> None:
        """Consume until `stop` is set. Nothing a step raises ends the loop: Redis outages are waited
        out, anything else is logged with its traceback and backed off (its entries stay pending)."""
        self._stop = stop
        self.ensure_group()
        log.info("consumer %s reading %d partitions of %s as group %s", self.name, self.keys.partitions,
                 self.stage, self.group)
        self.leases.progress()
        renewing = self.leases.keep_renewing(stop)
        try:
            while not stop.is_set():
                failed = self._step_surviving()
                self._failures = self._failures + 1 if failed else 0
                if failed:
                    stop.wait(backoff_s(self._failures, self.config.retry_base_s, self.config.retry_max_s))
        finally:
            renewing.join(timeout=1)
            self._release_quietly()

    def _release_quietly(self) -> None:
        try:
            self.leases.release_all()
        except redis.RedisError as exc:  # the leases run out by themselves
            log.warning("consumer %s could not release its partitions (%s)", self.name, exc)

    def _step_surviving(self) -> bool:
        try:
            return self.step()
        except redis.ConnectionError as exc:
            log.warning("consumer %s: redis unavailable (%s)", self.name, exc)
        except redis.RedisError:
            # A refused command (OOM, a replica turned read-only, a lost group) or a server that stopped
            # answering (TimeoutError) is an outage of the loop, not of one message: say so loudly.
            log.exception("consumer %s: redis error", self.name)
        # A bug outside the handler (the handler's own errors are outcomes) must not end the stage
        # silently: logged, backed off, and the entries it held are reclaimed and retried.
        except Exception:  # noqa: BLE001
            log.exception("consumer %s: a step failed", self.name)
        return True

    def step(self) -> bool:
        """Take or give up partitions, reclaim, read, process one batch. True when every entry of a
        non-empty batch failed."""
        self.leases.progress()  # a turn of the loop: its leases stay renewed for another max_batch_s
        self._take_over(self.leases.refresh())
        owned = self.leases.owned()
        if not owned:  # every partition has an owner: wait for a share to come free
            self._stop.wait(min(self.config.block_ms / 1000, max(0.001, self.leases.due_in_s())))
            return False
        self._trim_due(owned)
        entries = self._reclaim_due(owned) or self._read(owned)
        if not entries:
            return False
        return self._process(entries)

    def _take_over(self, taken: list[int]) -> None:
        now = time.monotonic()
        for p in taken:
            self.client.set(self.keys.autoclaim_cursor(self.stage, p), "0-0")
            self._sweep[p] = now

    # -- reading -------------------------------------------------------------

    def _read(self, owned: list[int]) -> list[Entry]:
        # No longer than until the leases' next refresh: a partition coming free is taken when it does.
        block_ms = max(1, min(self.config.block_ms, int(self.leases.due_in_s() * 1000)))
        entries = self._read_once(owned, self.config.count, block_ms)
        # A lone entry means the stream is quiet: waiting for company would only add latency.
        if len(entries) > 1 and self.config.linger_ms:
            entries += self._linger(owned, self.config.count - len(entries))
        return entries

    def _linger(self, owned: list[int], room: int) -> list[Entry]:
        """Wait a little for more entries when a batch came back short.

        Upstream stages hand messages on one at a time; a stage whose cost is per batch
        (an embedding call) would otherwise run on batches of one.
        """
        more: list[Entry] = []
        deadline = time.monotonic() + self.config.linger_ms / 1000
        while room > len(more) and (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            got = self._read_once(owned, room - len(more), left_ms)
            if not got:
                break
            more += got
        return more

    def _read_once(self, owned: list[int], count: int, block_ms: int) -> list[Entry]:
        """New entries of the partitions we own: one blocking read of them all, or in a cluster (one slot
        per read) a round of reads that do not block, then a short blocking read of one partition."""
        # COUNT counts per stream: each partition is asked its share of `count`, so that a batch stays within
        # it (a stage whose batch is one model call would otherwise run batches of partitions × count).
        count = max(1, -(-count // len(owned)))
        if not self._cluster or len(owned) == 1:
            return self._xread({self.stream(p): ">" for p in owned}, count, block_ms)
        with self.client.pipeline(transaction=False) as pipe:
            for p in owned:
                pipe.xreadgroup(self.group, self.name, {self.stream(p): ">"}, count=count)
            replies = pipe.execute()
        entries = [e for reply in replies for e in self._entries(reply)]
        if entries:
            return entries
        self._turn += 1
        one = owned[self._turn % len(owned)]
        return self._xread({self.stream(one): ">"}, count, min(block_ms, CLUSTER_BLOCK_MS))

    def _xread(self, streams: dict[Any, Any], count: int, block_ms: int) -> list[Entry]:
        return self._entries(self.client.xreadgroup(self.group, self.name, streams, count=count, block=block_ms))

    def _entries(self, reply: Any) -> list[Entry]:
        # XREADGROUP answers [[stream, [(id, fields), ...]], ...] (RESP2) or {stream: [[...]]} (RESP3).
        per_stream = reply.items() if isinstance(reply, dict) else (reply or [])
        return [Entry(_text(eid), fields.get(FIELD.encode()), self._partition_of[_text(name)])
                for name, got in per_stream for eid, fields in (got[0] if isinstance(reply, dict) else got)]

    def _reclaim_due(self, owned: list[int]) -> list[Entry]:
        # Nothing can be reclaimable before it has been idle reclaim_idle_ms, so a sweep
        # every half of that (at most every second) finds everything in time. A partition just
        # taken over is swept at once, whatever the idle time: its entries have no other owner.
        now = time.monotonic()
        if now < self._next_reclaim and not self._sweep:
            return []
        entries: list[Entry] = []
        for p in owned:
            entries += self._reclaim(p, self._min_idle_ms(p, now))
            if len(entries) >= self.config.count:
                return entries
        if not entries:
            self._next_reclaim = now + min(1.0, self.config.reclaim_idle_ms / 2000)
        return entries

    def _min_idle_ms(self, partition: int, now: float) -> int:
        # In a partition taken over at t, an entry idle since before t was delivered to its previous owner;
        # one we read since is idle for less, and waits the usual reclaim_idle_ms.
        taken = self._sweep.get(partition)
        return self.config.reclaim_idle_ms if taken is None else max(1, int((now - taken) * 1000))

    def _reclaim(self, partition: int, min_idle_ms: int) -> list[Entry]:
        stream, cursor_key = self.stream(partition), self.keys.autoclaim_cursor(self.stage, partition)
        start = _text(self.client.get(cursor_key) or b"0-0")
        reply: Any = self.client.xautoclaim(stream, self.group, self.name, min_idle_ms, start_id=start,
                                           count=self.config.count)
        next_id, claimed, deleted = reply[0], reply[1], (reply[2] if len(reply) > 2 else [])
        self.client.set(cursor_key, next_id)
        if _text(next_id) == "0-0":
            self._sweep.pop(partition, None)
        if deleted:
            self.client.xack(stream, self.group, *deleted)
        entries = [Entry(_text(eid), fields.get(FIELD.encode()), partition)
                   for eid, fields in claimed if fields is not None]
        self._attach_deliveries(entries)
        return self._give_up_on_exhausted(entries)

    def _attach_deliveries(self, entries: list[Entry]) -> None:
        for entry in entries:
            info = self.client.xpending_range(self.stream(entry.partition), self.group, entry.id, entry.id, 1)
            entry.deliveries = int(info[0]["times_delivered"]) if info else 1

    def _give_up_on_exhausted(self, entries: list[Entry]) -> list[Entry]:
        alive = []
        for entry in entries:
            if entry.deliveries > self.config.max_deliveries:
                errors = self.keys.errors(self.stage, entry.partition)
                last = self.client.hget(errors, entry.id)
                if last is not None and _text(last).startswith(OUTAGE):
                    # Its deliveries were handovers while it waited out an outage (every consumer saw it, none
                    # could do better): not its fault, so not its budget. The mark goes now: should this try
                    # crash the process, the next delivery counts as usual.
                    self.client.hdel(errors, entry.id)
                    alive.append(entry)
                    continue
                reason = f"gave up after {entry.deliveries - 1} deliveries: {_text(last or b'unknown error')}"
                self._dead_letter(entry, reason, entry.deliveries - 1)
            else:
                alive.append(entry)
        return alive

    # -- retention -----------------------------------------------------------

    def _trim_due(self, owned: list[int]) -> None:
        now = time.monotonic()
        if now < self._next_trim:
            return
        self._next_trim = now + TRIM_EVERY_S
        for p in owned:
            trim_acknowledged(self.client, self.stream(p), self.config.retention_ms)

    # -- processing ----------------------------------------------------------

    def _process(self, entries: list[Entry]) -> bool:
        decoded: list[tuple[Entry, M]] = []
        for entry in self._still_ours(entries):
            try:
                decoded.append((entry, decode(entry.raw, self.model, self.config.decode_context)))
            except DecodeError as exc:
                self._dead_letter(entry, f"undecodable: {exc}", entry.deliveries)
        if not decoded:
            return False
        done, failed = self._handle_through_outages(decoded)
        self.leases.progress()
        self._ack_with(done)
        for entry, error in failed:
            self._settle_failure(entry, error)
        return not done

    def _still_ours(self, entries: list[Entry]) -> list[Entry]:
        """The entries whose partition's lease is still ours (`Leases.confirm`): the others are left to the
        partition's new owner before any of their side effects runs."""
        ours = {p for p in dict.fromkeys(entry.partition for entry in entries) if self.leases.confirm(p)}
        return [entry for entry in entries if entry.partition in ours]

    def _handle_through_outages(self, decoded: list[tuple[Entry, M]]
                                ) -> tuple[list[tuple[Entry, list[Emit]]], list[tuple[Entry, BaseException]]]:
        """Run the handler; entries that fail with a `Retryable` error (the store or another
        dependency is down) are retried here, with backoff, until they pass or we stop.

        An outage is not the message's fault: retrying in place keeps it from using up its
        delivery budget and landing in the DLQ because Qdrant restarted.
        """
        done: list[tuple[Entry, list[Emit]]] = []
        failed: list[tuple[Entry, BaseException]] = []
        todo, rounds = decoded, 0
        conflicts: dict[str, int] = {}  # by entry id: the rounds it met a write it could not reconcile
        while todo:
            retry, why, outage = [], "", []
            for pair, outcome in zip(todo, self._outcomes(todo), strict=True):
                if not isinstance(outcome, BaseException):
                    done.append((pair[0], outcome))
                elif isinstance(outcome, LeaseLost) or not self.leases.owns(pair[0].partition):
                    continue  # the partition has another owner (or soon will): its entry is that one's
                elif isinstance(outcome, StaleVersion) and self._conflicted(conflicts, pair[0]):
                    failed.append((pair[0], Permanent(f"{CONFLICT}{conflicts[pair[0].id] - 1} rounds: "
                                                      f"{type(outcome).__name__}: {outcome}")))
                elif isinstance(outcome, Retryable) and not self._stop.is_set():
                    retry.append(pair)
                    why = f"{type(outcome).__name__}: {outcome}"
                    if not isinstance(outcome, StaleVersion):
                        outage.append(pair[0])
                else:
                    failed.append((pair[0], outcome))
            if retry:
                if outage and rounds == 0:
                    self._record_outage(outage, why)
                rounds += 1
                log.warning("stage %s: %d entries wait out an outage (round %d; %s)", self.stage, len(retry), rounds,
                            why[:300])
                retry = self._wait_holding(retry, backoff_s(rounds, self.config.retry_base_s, self.config.retry_max_s))
            todo = retry
        return done, failed

    def _conflicted(self, conflicts: dict[str, int], entry: Entry) -> bool:
        """Count a round in which `entry` met a write it could not reconcile (StaleVersion); True once it met one
        in more than `max_deliveries` rounds. A conflict is retried in place, like an outage (another writer's
        lease runs out, a stalled one stops), but not for ever: one that never resolves (a point under its id
        that is not its subject's) would hold its partition, and every subject's writes behind it, for good."""
        conflicts[entry.id] = conflicts.get(entry.id, 0) + 1
        return conflicts[entry.id] > self.config.max_deliveries

    def _wait_holding(self, held: list[tuple[Entry, M]], wait_s: float) -> list[tuple[Entry, M]]:
        """Wait `wait_s` (or until stopped) keeping the claim on the entries held; the ones still ours.

        An entry idle for reclaim_idle_ms is another consumer's to reclaim: that one would handle
        it too and spend a delivery of its budget. So the claim is refreshed at least every third
        of that, and once more just before the retry.
        """
        every_s = self.config.reclaim_idle_ms / 3000
        deadline = time.monotonic() + wait_s
        while True:
            # A partition given up meanwhile (no progress for max_batch_s) is its next owner's: not held, not retried.
            held = self._refresh_claim([pair for pair in held if self.leases.owns(pair[0].partition)])
            left_s = deadline - time.monotonic()
            if not held or left_s <= 0 or self._stop.wait(min(left_s, every_s)):
                return held

    def _refresh_claim(self, held: list[tuple[Entry, M]]) -> list[tuple[Entry, M]]:
        ours: set[tuple[int, str]] = set()
        for partition, ids in _by_partition([entry for entry, _ in held]).items():
            args = [self.group, self.name, *ids]
            ours |= {(partition, _text(eid)) for eid in
                     self._refresh_claim_script(keys=[self.stream(partition)], args=args)}
        for entry, _ in held:
            if (entry.partition, entry.id) not in ours:  # reclaimed while we were stalled: its new owner's alone
                log.warning("stage %s entry %s was reclaimed by another consumer; leaving it to it",
                            self.stage, entry.id)
        return [pair for pair in held if (pair[0].partition, pair[0].id) in ours]

    def _outcomes(self, pairs: list[tuple[Entry, M]]) -> Sequence[Outcome]:
        """The handler's outcome per item; an exception from the batch as a whole is every item's
        (retried, then dead-lettered with its reason), never the end of the stage's thread. While it
        runs, the handler can confirm each item's lease and mark progress (`per_item`, `progress`)."""
        with handing(self.leases, [entry.partition for entry, _ in pairs]):
            try:
                return self.handler([item for _, item in pairs])
            except Exception as exc:  # noqa: BLE001 - a batch handler's bug must not stop the stream
                log.exception("stage %s: the batch handler failed as a whole", self.stage)
                return [exc for _ in pairs]

    def _record_outage(self, entries: list[Entry], why: str) -> None:
        """Mark entries that meet an outage (once per batch that meets one, so a few writes per outage)."""
        pipe = self.client.pipeline(transaction=False)
        for entry in entries:
            pipe.hset(self.keys.errors(self.stage, entry.partition), entry.id, f"{OUTAGE}{why}"[:2000])
        pipe.execute()

    def _settle_failure(self, entry: Entry, outcome: BaseException) -> None:
        """Dead-letter a permanent failure; keep the error of a retryable one and leave it pending."""
        if isinstance(outcome, Permanent):
            self._dead_letter(entry, f"{type(outcome).__name__}: {outcome}", entry.deliveries)
            return
        reason = f"{OUTAGE if isinstance(outcome, Retryable) else ''}{type(outcome).__name__}: {outcome}"
        log.warning("stage %s entry %s failed (delivery %d): %s", self.stage, entry.id, entry.deliveries, reason)
        self.client.hset(self.keys.errors(self.stage, entry.partition), entry.id, reason[:2000])

    def _ack_with(self, done: list[tuple[Entry, list[Emit]]]) -> None:
        """Emit the outputs of every successful entry and acknowledge them: one script per partition."""
        by_partition: dict[int, list[tuple[Entry, list[Emit]]]] = {}
        for entry, emits in done:
            by_partition.setdefault(entry.partition, []).append((entry, emits))
        for partition, settled in by_partition.items():
            adds = [(emit.stream, {FIELD: encode(emit.message)}) for _, emits in settled for emit in emits]
            self._settle(partition, [entry.id for entry, _ in settled], adds)

    def _dead_letter(self, entry: Entry, reason: str, attempts: int) -> None:
        log.error("stage %s entry %s dead-lettered: %s", self.stage, entry.id, reason)
        # What it carries will not be stored: no longer served as pending (before the move: a crash between
        # leaves the entry to be dead-lettered again, never served for good).
        pending.settle_dead(self.client, self.keys, self.stage, entry.raw)
        fates.dead_lettered(self.client, self.keys, self.stage, entry.raw, reason)  # what its events' fates say
        record = {"payload": entry.raw if entry.raw is not None else b"", "error": reason,
                  "attempts": attempts, "source": self.stream(entry.partition), "source_id": entry.id,
                  "stage": self.stage, "at": time.time()}
        self._settle(entry.partition, [entry.id], [(self.keys.dlq(self.stage, entry.partition),
                                                    {k: _field(v) for k, v in record.items()})])

    def _settle(self, partition: int, ids: list[str], adds: list[tuple[str, dict[str, Any]]]) -> None:
        """Append `adds` and acknowledge `ids` in one script, if we still own the partition.

        A consumer that lost its lease (stalled past it, its partition taken over) settles nothing:
        the entries stay pending and the new owner handles them; what this one wrote to the store
        meanwhile is idempotent (deterministic ids, revision checks)."""
        outputs = list(dict.fromkeys(stream for stream, _ in adds))
        args: list[Any] = [self.name, self.group, len(ids), *ids]
        for stream, fields in adds:
            args += [outputs.index(stream) + 4, len(fields), *(x for kv in fields.items() for x in kv)]
        keys = [self.keys.lease(self.stage, partition), self.stream(partition),
                self.keys.errors(self.stage, partition), *outputs]
        if not int(self._run_settle(keys, args)):
            log.warning("consumer %s no longer owns partition %d of %s: %d entries left to its new owner",
                        self.name, partition, self.stage, len(ids))
            self.leases.lost(partition)


    def _run_settle(self, keys: list[str], args: list[Any]) -> Any:
        if not self.config.wait_replicas:
            return self._settle_script(keys=keys, args=args)
        # Outputs and acknowledgements that a failover could lose would be work lost (the outputs) or
        # redone (the acknowledgements): the loop goes on once the partition's replicas hold them.
        def settle(pipe: Any) -> None:
            self._settle_script(keys=keys, args=args, client=pipe)

        [settled] = replicated(self.client, keys[0], settle, replicas=self.config.wait_replicas,
                               timeout_ms=self.config.wait_timeout_ms)
        return settled


def _by_partition(entries: Sequence[Entry]) -> dict[int, list[str]]:
    grouped: dict[int, list[str]] = {}
    for entry in entries:
        grouped.setdefault(entry.partition, []).append(entry.id)
    return grouped


# Reset the idle time of the entries this consumer still owns (JUSTID: no delivery counted) and
# return their ids; an entry another consumer has claimed meanwhile is left to it. One script, so
# that no claim lands between the ownership check and the refresh.
_REFRESH_CLAIM = """
local kept = {}
for i = 3, #ARGV do
  local entry = redis.call('XPENDING', KEYS[1], ARGV[1], ARGV[i], ARGV[i], 1)[1]
  if entry and entry[2] == ARGV[2] then
    redis.call('XCLAIM', KEYS[1], ARGV[1], ARGV[2], 0, ARGV[i], 'JUSTID')
    kept[#kept + 1] = ARGV[i]
  end
end
return kept
"""

# Settle a batch of one partition, fenced by its lease: KEYS = lease, input stream, error hash, the
# output streams; ARGV = owner, group, n, the n ids, then per output entry: the index of its stream
# in KEYS, its field count, and its fields and values. Nothing happens unless the owner still holds
# the lease; else the outputs are appended in order and the ids acknowledged, all or nothing.
_SETTLE = """
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
local n = tonumber(ARGV[3])
local i = 4 + n
while i <= #ARGV do
  local fields = {}
  local count = tonumber(ARGV[i + 1]) * 2
  for j = 1, count do fields[j] = ARGV[i + 1 + j] end
  redis.call('XADD', KEYS[tonumber(ARGV[i])], '*', unpack(fields))
  i = i + 2 + count
end
if n > 0 then
  local ids = {}
  for j = 1, n do ids[j] = ARGV[3 + j] end
  redis.call('XACK', KEYS[2], ARGV[2], unpack(ids))
  redis.call('HDEL', KEYS[3], unpack(ids))
end
return 1
"""


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _field(value: Any) -> bytes | str | int | float:
    if isinstance(value, (bytes, str, int, float)):
        return value
    return orjson.dumps(value)
