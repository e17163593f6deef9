"""What a memflow process is made of: settings, Redis, and (lazily) the store and the model.

Stages that touch the store (resolve, upsert, query) must share one process in the
embedded mode, because an Edge shard is opened by one process; the context builds the
store and the embedder once and hands the same ones to every stage in the process.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
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
from shared.connections import connect, require_url, stage_socket_timeout_s
from shared.embedder import Embedder, build_embedder
from shared.keys import FIELD, Keys
from shared.llm import LLM, Answer, LLMUnavailable, elapsed_ms
from shared.settings import Settings
from shared.store import Identity, Store, open_store
from shared.streams import ConsumerConfig

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
    def from_settings(cls, settings: Settings, *, embedder: Embedder | None = None) -> Context:
        """The one way a process builds its context; `embedder`: one already loaded (tests, benchmarks)."""
        client = connect(require_url(settings), socket_timeout_s=stage_socket_timeout_s(settings.block_ms))
        return cls(settings, client, Keys(settings.stream_prefix), _embedder=embedder)

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
        return ConsumerConfig.from_settings(self.settings)

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
