"""What a memflow process is made of: settings, Redis, and (lazily) the store and the model.

Stages that touch the store (resolve, upsert, query) must share one process in the
embedded mode, because an Edge shard is opened by one process; the context builds the
store and the embedder once and hands the same ones to every stage in the process.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any

import redis

from pipeline.models import Change, LLMTrace, Memory, Revision, Trace
from pipeline.score import UNRELATED
from shared.codec import encode
from shared.connections import connect, require_url
from shared.embedder import Embedder, build_embedder
from shared.keys import FIELD, Keys
from shared.llm import LLM
from shared.settings import Settings
from shared.store import Identity, Store, open_store
from shared.streams import ConsumerConfig, StreamConsumer

log = logging.getLogger(__name__)

STORE_STAGES = ("resolve", "upsert")
# Bookkeeping a job refreshes often: not worth a line in a memory's history.
QUIET_FIELDS = frozenset({"strength", "strength_at", "access_count", "last_accessed_at"})
LIGHT_STAGES = ("trigger", "extract")


@dataclass
class Context:
    settings: Settings
    client: redis.Redis
    keys: Keys
    _store: Store | None = None
    _embedder: Embedder | None = None
    _llm: LLM | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_settings(cls, settings: Settings) -> Context:
        return cls(settings, connect(require_url(settings)), Keys(settings.stream_prefix))

    @property
    def embedder(self) -> Embedder:
        with self._lock:
            if self._embedder is None:
                self._embedder = build_embedder(self.settings)
            return self._embedder

    @cached_property
    def unrelated(self) -> list[list[float]]:
        """`pipeline.score.UNRELATED` as stored passages: what a query's noise floor is measured against."""
        return self.embedder.encode_passages(UNRELATED)

    @property
    def store(self) -> Store:
        """The store, opened for this process's embedder: ModelMismatch if another model made its vectors."""
        embedder = self.embedder
        with self._lock:
            if self._store is None:
                self._store = open_store(self.settings, Identity(embedder.model_id, embedder.dim))
            return self._store

    @property
    def llm(self) -> LLM | None:
        """The LLM client, or None when no server is configured (the rules do everything)."""
        if not self.settings.llm_base_url:
            return None
        with self._lock:
            if self._llm is None:
                self._llm = LLM(self.settings, self.client, self.keys, trace=self.trace)
            return self._llm

    def consumer_config(self) -> ConsumerConfig:
        s = self.settings
        return ConsumerConfig(max_deliveries=s.max_deliveries, reclaim_idle_ms=s.reclaim_idle_ms,
                              block_ms=s.block_ms, count=s.read_count, retry_base_s=s.retry_base_s,
                              retry_max_s=s.retry_max_s, decode_context={"max_text_bytes": s.max_text_bytes})

    def set_fields(self, memory: Memory, fields: dict[str, Any], *, action: str, why: str, at: datetime) -> None:
        """Change a stored memory outside the write path (forget, jobs, review) and say so on `changes`.

        The point's revision moves on, so a write batch built on the old state is sent back to
        resolve; a change of state (not a strength refresh) is logged in the point's revisions
        and announced.
        """
        before = fields_of(memory, fields)
        record = dict(fields) | {"rev": memory.rev + 1}
        quiet = not set(fields) - QUIET_FIELDS
        if not quiet:
            revision = Revision(rev=memory.rev + 1, at=at, why=why, before=before)
            record["revisions"] = [*memory.revisions, revision]
        self.store.set_fields(memory.id, record)
        if not quiet:  # a strength refresh is bookkeeping: the capped audit feed keeps room for changes
            self.announce(Change(memory_id=memory.id, subject=memory.subject, action=action, why=why,
                                 before=before, after=fields, at=at))

    def announce(self, change: Change) -> None:
        self.client.xadd(self.keys.changes, {FIELD: encode(change)}, maxlen=self.settings.changes_maxlen,
                         approximate=True)

    def trace(self, entry: Trace | LLMTrace) -> None:
        """An entry of the capped `traces` feed: a search, or an LLM call (written by `LLM.ask`)."""
        self.client.xadd(self.keys.traces, {FIELD: encode(entry)}, maxlen=self.settings.traces_maxlen,
                         approximate=True)

    def close(self) -> None:
        if self._llm is not None:
            self._llm.close()
            self._llm = None
        if self._store is not None:
            self._store.close()
            self._store = None


def fields_of(memory: Memory, names: Iterable[str]) -> dict[str, Any]:
    """The memory's current values of these fields, as plain JSON values."""
    return {name: getattr(getattr(memory, name), "value", getattr(memory, name)) for name in names}


def build_consumer(ctx: Context, stage: str) -> StreamConsumer[Any]:
    from workers import extract, resolve, trigger, upsert

    builders: dict[str, Callable[[Context], StreamConsumer[Any]]] = {
        "trigger": trigger.build, "extract": extract.build, "resolve": resolve.build, "upsert": upsert.build}
    if stage not in builders:
        raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(builders)}")
    return builders[stage](ctx)


def start_consumers(ctx: Context, stages: Sequence[str], stop: threading.Event) -> list[threading.Thread]:
    """One thread per stage, each its own consumer in its stage's group."""
    threads = []
    for stage in stages:
        consumer = build_consumer(ctx, stage)
        consumer.ensure_group()
        thread = threading.Thread(target=consumer.run, args=(stop,), name=f"memflow-{stage}", daemon=True)
        thread.start()
        threads.append(thread)
    return threads


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM/SIGINT ask every loop to finish its batch and return."""

    def handler(signum: int, _frame: Any) -> None:
        log.info("signal %s: stopping after the current batch", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
