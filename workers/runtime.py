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
from datetime import UTC, datetime
from functools import cached_property
from typing import Any

import redis

from pipeline.gate import redact
from pipeline.models import LLMTrace, Memory, Trace
from pipeline.prompting import Refused
from pipeline.score import UNRELATED
from shared.applier import Applier
from shared.codec import encode
from shared.connections import connect, require_url
from shared.embedder import Embedder, build_embedder
from shared.keys import FIELD, Keys
from shared.llm import LLM, Answer, LLMUnavailable, elapsed_ms
from shared.settings import Settings
from shared.store import Identity, Store, open_store
from shared.streams import ConsumerConfig, StreamConsumer

log = logging.getLogger(__name__)

STORE_STAGES = ("resolve", "upsert")
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
                self._llm = LLM(self.settings, self.client, self.keys)
            return self._llm

    def consumer_config(self) -> ConsumerConfig:
        s = self.settings
        return ConsumerConfig(max_deliveries=s.max_deliveries, reclaim_idle_ms=s.reclaim_idle_ms,
                              block_ms=s.block_ms, count=s.read_count, retry_base_s=s.retry_base_s,
                              retry_max_s=s.retry_max_s, decode_context={"max_text_bytes": s.max_text_bytes})

    @property
    def applier(self) -> Applier:
        """The one writer of the store (shared/applier.py): every change to a memory goes through it."""
        return Applier(self.store, self.client, self.keys, self.settings.changes_maxlen)

    def trace(self, entry: Trace | LLMTrace) -> None:
        """An entry of the capped `traces` feed: a search, or an LLM call."""
        self.client.xadd(self.keys.traces, {FIELD: encode(entry)}, maxlen=self.settings.traces_maxlen,
                         approximate=True)

    def note_llm(self, purpose: str, subject: str, started: float, *, error: LLMUnavailable | Refused | None = None,
                 answer: Answer | None = None, items: int = 0, stand_ins: int = 0, session_id: str | None = None,
                 note: str | None = None) -> None:
        """Trace one LLM call; a fallback (`error`) is also counted, per subject and globally, by reason."""
        if error is not None and self.llm is not None:
            self.llm.count(subject, {"fallbacks": 1, f"fallback:{error.reason}": 1})
        self.trace(LLMTrace(
            purpose=purpose, subject=subject, session_id=session_id, outcome="ok" if error is None else "fallback",
            reason=error.reason if error is not None else note,
            detail=redact(str(error))[:200] if error is not None else None, items=items, stand_ins=stand_ins,
            prompt_tokens=answer.prompt_tokens if answer else 0,
            completion_tokens=answer.completion_tokens if answer else 0,
            latency_ms=elapsed_ms(started), at=datetime.now(UTC)))

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
