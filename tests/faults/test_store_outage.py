"""The store goes away for a while: writes wait unacknowledged, searches say *failed*, both recover.

The outage is injected at the adapter boundary: the real Edge shard is wrapped, and while the
wrapper is "down" every call raises StoreUnavailable, exactly what the adapters raise for a
dead Qdrant server or an I/O error of the shard. CI holds the outage until its effects are
seen; FAULTS_FULL=1 holds it the issue's 30 s.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import Any

import pytest

from memflow.pipeline.models import Memory
from memflow.shared.errors import StoreUnavailable
from memflow.shared.inference.embedder import Embedder
from memflow.shared.settings import Settings
from memflow.shared.storage.store import Identity, MemoryFilter, Query, Scored, SearchMode, Store, open_store
from memflow.shared.streaming import dlq
from memflow.shared.streaming.backlog import backlog
from tests.conftest import start_system, wait_for
from tests.faults.common import FULL, T0, account, events

pytestmark = pytest.mark.faults
OUTAGE_S = 30.0 if FULL else 0.0
EVENTS = 100


class Unplugged:
    """A real store that can be unplugged: while `down` is set, every call fails as an outage."""

    def __init__(self, store: Store) -> None:
        self.store, self.down, self.refused = store, threading.Event(), 0

    def _check(self) -> None:
        if self.down.is_set():
            self.refused += 1
            raise StoreUnavailable("injected outage: the store does not answer")

    def ensure(self) -> None:
        self._check()
        self.store.ensure()

    def put(self, memories: Sequence[Memory], vectors: Sequence[Sequence[float]], *, new_only: bool = False) -> None:
        self._check()
        self.store.put(memories, vectors, new_only=new_only)

    def set_fields(self, subject: str, memory_id: str, fields: dict[str, Any], *, if_rev: int | None = None) -> None:
        self._check()
        self.store.set_fields(subject, memory_id, fields, if_rev=if_rev)

    def get(self, flt: MemoryFilter) -> list[Memory]:
        self._check()
        return self.store.get(flt)

    def query(self, flt: MemoryFilter, *, mode: SearchMode, limit: int, dense: Sequence[float] | None = None,
              text: str | None = None) -> list[Scored]:
        self._check()
        return self.store.query(flt, mode=mode, dense=dense, text=text, limit=limit)

    def query_many(self, queries: Sequence[Query]) -> list[list[Scored]]:
        self._check()
        return self.store.query_many(queries)

    def delete(self, subject: str, memory_ids: Sequence[str]) -> None:
        self._check()
        self.store.delete(subject, memory_ids)

    def count(self, subject: str | None = None) -> int:
        self._check()
        return self.store.count(subject)

    def subjects(self) -> list[str]:
        self._check()
        return self.store.subjects()

    def page(self, offset: str | None, limit: int) -> tuple[list[Memory], str | None]:
        self._check()
        return self.store.page(offset, limit)

    def close(self) -> None:
        self.store.close()


@pytest.mark.timeout(300)
def test_a_store_outage_holds_writes_fails_searches_and_recovers(settings: Settings, embedder: Embedder) -> None:
    unplugged = Unplugged(open_store(settings, Identity(embedder.model_id, embedder.dim)))
    system = start_system(settings, embedder, store=unplugged)
    batch = events(EVENTS, "outage")
    try:
        for event in batch[: EVENTS // 2]:
            system.client.publish(event)
        assert system.client.wait_idle(timeout_s=60)
        assert system.client.search("outage", "code word zq1x", now=T0).status == "ok"

        unplugged.down.set()
        for event in batch[EVENTS // 2:]:
            system.client.publish(event)
        # Writes wait: resolve holds its entries unacknowledged and retries in place (no DLQ).
        wait_for(lambda: backlog(system.ctx.client, system.ctx.keys, ("resolve",))["resolve"][1] > 0,
                 what="resolve holding entries through the outage")
        during = system.client.search("outage", "code word zq1x", now=T0)
        assert during.status == "failed" and "StoreUnavailable" in (during.error or ""), during
        threading.Event().wait(OUTAGE_S)  # FAULTS_FULL: hold the outage the 30 s
        assert dlq.count(system.client.redis, system.client.keys, "resolve") == 0
        refused = unplugged.refused
        unplugged.down.clear()

        assert system.client.wait_idle(timeout_s=120)
        report = account(system.client, "outage", EVENTS)
        print(f"store outage: {OUTAGE_S or 'until seen'} s, {refused} calls refused, {report}")
        assert system.client.search("outage", "code word zq1x", now=T0).status == "ok"
        assert report["missing"] == [] and report["doubled"] == [] and report["dead_letters"] == 0
    finally:
        unplugged.down.clear()
        system.shutdown()
