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
from functools import cached_property
from typing import Any

import numpy as np
import redis
from numpy.typing import NDArray

from memflow.pipeline.ids import IdSpace
from memflow.pipeline.models import LLMTrace, Memory, Trace
from memflow.pipeline.ranking import RankingProfiles
from memflow.pipeline.score import UNRELATED
from memflow.shared.inference.embedder import Embedder, build_embedder
from memflow.shared.inference.llm import LLM
from memflow.shared.inference.reranker import Reranker
from memflow.shared.monitoring.status import Traces
from memflow.shared.redisdb.connections import connect_queue, connect_streams, stage_socket_timeout_s
from memflow.shared.redisdb.keys import Keys, id_space
from memflow.shared.search.foreground import Foreground
from memflow.shared.search.reader import SearchReader
from memflow.shared.settings import Settings
from memflow.shared.storage.store import Identity, Store, open_store
from memflow.shared.streaming.consumer import ConsumerConfig
from memflow.shared.writer.applier import Applier

log = logging.getLogger(__name__)

STORE_STAGES = ("resolve", "upsert")
LIGHT_STAGES = ("trigger", "extract")


@dataclass
class Context:
    settings: Settings
    client: redis.Redis
    keys: Keys
    # The RPC queues' server (RQ): `client` itself unless the queues have their own (MEMFLOW_REDIS_QUEUE_URL, or the
    # embedded mode's transient server).
    queue_client: redis.Redis | None = None
    _store: Store | None = None
    _embedder: Embedder | None = None
    _llm: LLM | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # The searches this process is answering: its maintenance jobs step aside for them (shared/search/foreground.py).
    foreground: Foreground = field(default_factory=Foreground)
    # What its searches rank by (pipeline/ranking.py): the tuned constants, or a benchmark variant's.
    ranking: RankingProfiles = field(default_factory=RankingProfiles)

    @classmethod
    def from_settings(cls, settings: Settings, *, embedder: Embedder | None = None) -> Context:
        """The one way a process builds its context; `embedder`: one already loaded (tests, benchmarks)."""
        timeout_s = stage_socket_timeout_s(settings.consumer.block_ms)
        client = connect_streams(settings, socket_timeout_s=timeout_s)
        return cls(settings, client, settings.keys, _embedder=embedder,
                   queue_client=connect_queue(settings, client, socket_timeout_s=timeout_s))

    @property
    def transient(self) -> redis.Redis:
        """The server of what must not wait for the disk: the RPC queues, and what a search writes (its trace, the
        latency histogram, utilisation, plan cache, LLM usage). The queues' server (docs/architecture.md "Which
        writes are durable")."""
        return self.queue_client or self.client

    @property
    def embedder(self) -> Embedder:
        with self._lock:
            if self._embedder is None:
                self._embedder = build_embedder(self.settings)
            return self._embedder

    @cached_property
    def id_space(self) -> IdSpace:
        """How this deployment names its memories (pipeline/ids.py): the secret every process reads from Redis."""
        return id_space(self.client, self.keys)

    @cached_property
    def reranker(self) -> Reranker | None:
        """The second look's reranker (shared/inference/reranker.py), or None when the settings turn it off."""
        return Reranker.use() if self.settings.ranking.second_look == "use" else None

    @property
    def search_reader(self) -> SearchReader:
        """What a search reads through (shared/search/reader.py); the noise floor's passages measured when first
        asked for."""
        return SearchReader(self.settings, self.store, self.embedder, self.reranker, lambda: self.unrelated,
                            self.client, self.keys, self.llm, transient=self.transient)

    @cached_property
    def unrelated(self) -> NDArray[np.float64]:
        """`pipeline.score.UNRELATED` as stored passages, one row each: what a query's noise floor is measured
        against (a matrix: one product per search)."""
        return np.asarray(self.embedder.encode_passages(UNRELATED), dtype=np.float64)

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
        if not self.settings.llm.base_url:
            return None
        with self._lock:
            if self._llm is None:
                self._llm = LLM(self.settings, self.transient, self.keys, trace=self.trace)  # its usage: transient
            return self._llm

    def consumer_config(self) -> ConsumerConfig:
        return ConsumerConfig.from_settings(self.settings)

    @property
    def applier(self) -> Applier:
        """The one writer of the store (shared/writer/applier.py): every change to a memory goes through it."""
        return Applier(self.store, self.client, self.keys, self.settings.limits.changes_maxlen)

    @property
    def traces(self) -> Traces:
        """The capped `traces` feed (shared/monitoring/status.py): searches, and LLM calls (written by `LLM.ask`); on
        the queues' server with everything else a search writes (docs/architecture.md "Which writes are durable")."""
        return Traces(self.transient, self.keys, self.settings.limits.traces_maxlen)

    def trace(self, entry: Trace | LLMTrace, via: redis.Redis | None = None) -> None:
        """An entry of the `traces` feed (`Traces.add`)."""
        self.traces.add(entry, via)

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
