"""Searches never wait behind jobs: a process runs the jobs queue on a worker of its own (workers/system.py), so a
search, and the health check `/healthz` asks for, are answered while a maintenance job runs."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest

from memflow.shared import rpc
from memflow.shared.client import MemoryClient
from memflow.shared.embedder import Embedder
from memflow.shared.settings import Settings
from memflow.shared.store import Store
from memflow.workers.runtime import Context
from memflow.workers.system import QUERY, Runner, stage_parts
from tests.conftest import wait_for


class Gated:
    """The real store, whose `subjects()` (where a lifecycle job over every subject starts) waits until the test
    opens the gate: a job as long as the test wants."""

    def __init__(self, store: Store) -> None:
        self.store, self.entered, self.gate = store, threading.Event(), threading.Event()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def subjects(self) -> list[str]:
        self.entered.set()
        self.gate.wait(120)
        return self.store.subjects()


@pytest.fixture
def gated(settings: Settings, embedder: Embedder) -> Iterator[tuple[Context, Gated]]:
    ctx = Context.from_settings(settings.replace(rpc_timeout_s=5.0, search_timeout_s=5.0), embedder=embedder)
    store = Gated(ctx.store)
    ctx._store = store  # type: ignore[assignment]
    runner = Runner(stage_parts(ctx, (QUERY,)))
    runner.start()
    try:
        yield ctx, store
    finally:
        store.gate.set()
        runner.shutdown()
        ctx.close()


def test_a_search_and_the_health_check_are_answered_while_a_job_runs(gated: tuple[Context, Gated]) -> None:
    ctx, store = gated
    client = MemoryClient(ctx.settings)
    wait_for(lambda: client.query_workers() >= 1, what="a query worker")
    reports: list[Any] = []
    job = threading.Thread(target=lambda: reports.append(client.call(rpc.RUN_JOB, name="decay", timeout_s=60)))
    job.start()
    assert store.entered.wait(30), "the job did not start"

    found = client.search("someone", "what did I say about the garden?")  # failed after 5 s unanswered
    assert found.status == "empty", found.error
    assert client.call(rpc.HEALTH, timeout_s=2.0).store == "ok"  # what /healthz asks, with its deadline
    assert job.is_alive() and not reports, "the job ended before the search: it proves nothing"
    store.gate.set()
    job.join(30)
    assert [r.job for r in reports] == ["decay"]
