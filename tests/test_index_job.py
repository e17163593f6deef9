"""The index job: the Edge shard's HNSW graphs are built by a scheduled job once enough points changed, never by
a search (shared/storage/edge_store.py: a build holds the process's interpreter lock)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest

from memflow.pipeline.models import Dir, Memory, MType, SearchRequest, Source
from memflow.scheduler.app import SCHEDULE
from memflow.shared.settings import Settings
from memflow.shared.storage.store import Optimizable
from memflow.workers import jobs, query
from memflow.workers.runtime import Context
from tests.hash_model import HashModel

T0 = datetime(2026, 4, 1, 9, 0, tzinfo=UTC)


def bulk(n: int, start: int = 0) -> list[Memory]:
    return [Memory(id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"ix/{i}")), subject="ix", uri=f"mem://ix/{i}",
                   dir=Dir.general, mtype=MType.fact, key=f"k.{i}", content=f"note number {i} about the garden",
                   confidence=0.9, source=Source.explicit, created_at=T0, updated_at=T0)
            for i in range(start, start + n)]


@pytest.fixture
def ctx(settings: Settings) -> Iterator[Context]:
    made = Context.from_settings(settings, embedder=HashModel())
    yield made
    made.close()


class Recorded:
    """The real shard, with a record of its builds."""

    def __init__(self, store: Optimizable) -> None:
        self.store, self.builds = store, 0

    def __getattr__(self, name: str) -> object:
        return getattr(self.store, name)

    def changed_since_optimize(self) -> int:
        return self.store.changed_since_optimize()

    def optimize(self, between: Any = None) -> bool:
        self.builds += 1
        return self.store.optimize(between)


def test_the_index_job_builds_once_enough_points_changed_and_a_search_never_does(ctx: Context) -> None:
    model = HashModel()
    first = bulk(jobs.INDEX_AFTER_CHANGES - 1)
    ctx.store.put(first, model.encode_passages([m.content for m in first]))
    store = Recorded(ctx.store)  # type: ignore[arg-type]
    ctx._store = store  # type: ignore[assignment]

    query.search(ctx, SearchRequest(subject="ix", query="the garden", k=3, now=T0))
    report = jobs.run(ctx, "index", None, T0, dry_run=False)
    assert (report["job"], report["examined"], store.builds) == ("index", jobs.INDEX_AFTER_CHANGES - 1, 0)

    one_more = bulk(1, start=jobs.INDEX_AFTER_CHANGES)
    ctx.store.put(one_more, model.encode_passages([one_more[0].content]))
    assert jobs.run(ctx, "index", None, T0, dry_run=True)["examined"] == jobs.INDEX_AFTER_CHANGES
    assert store.builds == 0  # a dry run only says how much changed
    assert jobs.run(ctx, "index", None, T0, dry_run=False)["examined"] == jobs.INDEX_AFTER_CHANGES
    assert store.builds == 1 and store.changed_since_optimize() == 0
    assert query.search(ctx, SearchRequest(subject="ix", query="the garden", k=3, now=T0)).status == "ok"
    assert store.builds == 1


def test_the_index_job_is_scheduled_every_ten_minutes() -> None:
    [entry] = [e for e in SCHEDULE if e.name == "index"]
    assert (entry.tier, entry.cron, entry.period.total_seconds()) == (None, {"minute": "*/10"}, 600)
