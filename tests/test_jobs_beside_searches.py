"""Searches never wait behind jobs: a process runs the jobs queue on a worker of its own (workers/system.py), so a
search, and the health check `/healthz` asks for, are answered while a maintenance job runs."""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from memflow.pipeline.ids import memory_id
from memflow.pipeline.lifecycle import Policy
from memflow.pipeline.models import Dir, Memory, MType, Source
from memflow.shared.inference.embedder import Embedder
from memflow.shared.sdk import rpc
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.search.foreground import FULL_AFTER, Foreground, freezers
from memflow.shared.settings import Settings
from memflow.shared.storage.edge_store import STEP_PAGE
from memflow.shared.storage.store import MemoryFilter, Store
from memflow.workers import jobs
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


def serving(settings: Settings, embedder: Embedder, wrap: Callable[[Store], Any],
            timeout_s: float) -> Iterator[tuple[Context, Any]]:
    """The query and jobs workers of one process, on the real store seen through `wrap` (a gate the test opens)."""
    ctx = Context.from_settings(settings.replace(rpc_timeout_s=timeout_s, search_timeout_s=timeout_s),
                                embedder=embedder)
    store = wrap(ctx.store)
    ctx._store = store
    runner = Runner(stage_parts(ctx, (QUERY,)))
    runner.start()
    try:
        yield ctx, store
    finally:
        store.gate.set()
        runner.shutdown()
        ctx.close()


@pytest.fixture
def gated(settings: Settings, embedder: Embedder) -> Iterator[tuple[Context, Gated]]:
    yield from serving(settings, embedder, Gated, 5.0)


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


class Held:
    """The real store, whose searches (`query_many`) wait at a gate the test opens while `hold` is set: a search
    in flight as long as the test wants. It notes which subjects a job reads (`get`)."""

    def __init__(self, store: Store) -> None:
        self.store, self.hold, self.entered, self.gate = store, threading.Event(), threading.Event(), threading.Event()
        self.read: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)

    def query_many(self, queries: Any) -> Any:
        if self.hold.is_set():
            self.entered.set()
            self.gate.wait(120)
        return self.store.query_many(queries)

    def get(self, flt: Any, **kwargs: Any) -> Any:
        self.read.append(flt.subject)
        return self.store.get(flt, **kwargs)


@pytest.fixture
def held(settings: Settings, embedder: Embedder) -> Iterator[tuple[Context, Held]]:
    yield from serving(settings, embedder, Held, 10.0)


def test_a_lifecycle_job_steps_aside_while_a_search_is_in_flight(held: tuple[Context, Held]) -> None:
    """Both workers share one interpreter lock: a job's Python running beside a search made the search wait for
    the lock after every Redis reply and model op (search p50 87 → 555 ms during consolidate at 20k memories).
    The job reads no subject while a search is answered, and goes on once it is."""
    ctx, store = held
    client = MemoryClient(ctx.settings)
    wait_for(lambda: client.query_workers() >= 1, what="a query worker")
    store.store.put([_memory(s) for s in ("ana", "bo")], ctx.embedder.encode_passages(["the garden"] * 2))
    store.hold.set()
    searched: list[Any] = []
    search = threading.Thread(target=lambda: searched.append(client.search("ana", "what about the garden?")))
    search.start()
    assert store.entered.wait(30), "the search did not reach the store"

    reports: list[Any] = []
    job = threading.Thread(target=lambda: reports.append(client.call(rpc.RUN_JOB, name="decay", timeout_s=60)))
    job.start()
    wait_for(lambda: store.read or ctx.foreground.stepped_aside, what="the job reading, or stepping aside")
    assert store.read == [], "the job read subjects while a search was in flight"
    store.gate.set()
    search.join(30)
    job.join(30)
    assert [r.status for r in searched] == ["ok"]
    assert [r.examined for r in reports] == [2] and set(store.read) == {"ana", "bo"}


def test_a_subjects_changes_are_written_in_chunks_with_the_searches_served_between(store_ctx: Context) -> None:
    """A subject's 1,000 strength refreshes were one mutation: ~0.5 s of lock renewals and store writes, which a
    search arriving waited for (decay's search p99 5.4x idle at 20k memories). They are written APPLY_CHUNK at a
    time, and the job steps aside between chunks."""
    ctx = store_ctx
    memories = [_memory("ana", f"garden.{i}") for i in range(2 * jobs.APPLY_CHUNK + 1)]
    ctx.store.put(memories, ctx.embedder.encode_passages(["the garden"]) * len(memories))
    now = AT + timedelta(days=30)
    plan = jobs.plan_decay_job(ctx.store.get(MemoryFilter("ana")), now, Policy(), None)
    assert len(plan.steps) == len(memories)
    written = []

    def between() -> None:  # what had been written each time the job stepped aside
        written.append(sum(m.strength_at == now for m in ctx.store.get(MemoryFilter("ana"))))

    assert jobs.apply(ctx.applier, ctx.embedder, jobs.Resolve(ctx.client, ctx.keys), "ana", plan, "decay", now,
                      between=between) == []
    assert written == [jobs.APPLY_CHUNK, 2 * jobs.APPLY_CHUNK]
    assert {m.strength_at for m in ctx.store.get(MemoryFilter("ana"))} == {now}


def test_consolidate_steps_aside_every_page_of_its_read_and_between_the_parts_of_its_plan(store_ctx: Context) -> None:
    """A subject's read was pages of 512 points (scroll, payloads read out, validated: ~19 ms of the interpreter
    lock each) and its plan one stretch of ~12 ms; a search arriving waited for the step in progress. The read now
    steps aside every STEP_PAGE points and the plan between its three parts, and plans what it planned before."""
    ctx = store_ctx
    now = AT + timedelta(days=2)
    # 40 topics, each said again in sessions 0, 1, 2...: promotions and patterns to plan.
    memories = [_memory("ana", f"garden.{i % 40}").model_copy(update={
        "id": memory_id("ana", f"garden.{i % 40}", i // 40 + 1), "session_ids": [f"s{i // 40}"],
        "created_at": AT + timedelta(days=1)}) for i in range(4 * STEP_PAGE + 1)]
    ctx.store.put(memories, ctx.embedder.encode_passages(["the garden"]) * len(memories))
    ctx.foreground = Foreground(patience_s=0.001)
    with ctx.foreground.serving():  # a search in flight throughout: every step the job takes waits for it once
        report = jobs.run(ctx, "consolidate", "ana", now, dry_run=True)
    pages = -(-len(memories) // STEP_PAGE)
    # Before the read, between its pages, before the plan, and between the plan's three parts.
    assert ctx.foreground.stepped_aside == 1 + (pages - 1) + 1 + 2
    planned = jobs.plan_consolidate(ctx.store.get(MemoryFilter("ana")), now, Policy(), None, ctx.id_space)
    assert report["examined"] == len(memories) and planned.steps and planned.new
    assert [c["id"] for c in report["changed"]] == [st.memory.id for st in planned.steps]
    assert [m["id"] for m in report["written"]] == [m.id for m in planned.new]


def test_while_searches_come_a_job_rests_after_each_step_for_the_cpu_it_took() -> None:
    """Stepping aside covers a search from its dequeue on, not its enqueue and dequeue before: a job running then
    held the interpreter lock a search asked for again and again (its time before the dequeue p50 3 -> 28 ms beside
    consolidate). While searches come, each step is followed by a rest as long as its CPU; without, no rest."""
    quiet = Foreground()
    quiet.step_aside()  # the job's first step begins
    _burn_cpu(0.005)
    assert quiet.step_aside() == 0.0 and quiet.rested == 0  # no search lately: full speed
    busy = Foreground()
    busy.step_aside()
    with busy.serving():
        pass  # a search came and went
    _burn_cpu(0.005)
    assert busy.step_aside() > 0 and busy.rested == 1 and busy.stepped_aside == 0


def test_a_subjects_read_and_plan_are_collected_once_not_every_700_allocations(store_ctx: Context) -> None:
    """A subject's read and plan allocate ~10 containers a memory: a young collection every ~70 memories, one of
    generation 1 every ~700, and a full one every ~70 subjects (120-145 ms at 100k memories, every search due
    meanwhile waiting: p99 beside consolidate). The collections are deferred over them and made once after."""
    ctx = store_ctx
    memories = [_memory("ana", f"garden.{i}") for i in range(2000)]
    ctx.store.put(memories, ctx.embedder.encode_passages(["the garden"]) * len(memories))
    collections: list[int] = []

    def noted(phase: str, info: dict[str, int]) -> None:
        if phase == "stop":
            collections.append(info["generation"])

    gc.collect()  # the counts from zero: what follows is the job's
    gc.callbacks.append(noted)
    try:
        report = jobs.run(ctx, "consolidate", "ana", AT + timedelta(days=2), dry_run=True)
    finally:
        gc.callbacks.remove(noted)
    assert report["examined"] == len(memories)
    assert collections.count(0) <= 2 and not [g for g in collections if g > 0], collections
    assert gc.isenabled()


def _burn_cpu(seconds: float) -> None:
    began = time.thread_time()
    while time.thread_time() - began < seconds:
        pass


AT = datetime(2026, 1, 5, tzinfo=UTC)


def _memory(subject: str, key: str = "garden") -> Memory:
    return Memory(id=memory_id(subject, key, 1), subject=subject, uri=f"mem://{subject}/general/{key}",
                  dir=Dir.general, mtype=MType.fact, key=key, content="I planted tomatoes in the garden",
                  confidence=0.9, source=Source.explicit, created_at=AT, updated_at=AT, source_event_ids=["e1"])


def test_the_heap_loaded_at_start_is_out_of_the_collectors_way_while_the_workers_run(
        settings: Settings, embedder: Embedder) -> None:
    """A full collection walks every object the process tracks, holding the interpreter lock: 344 ms over the
    model's and the libraries' ~500k objects, triggered by a job's allocations, measured as the longest stall of
    searches during `consolidate`. While the workers run that heap is frozen (no collection walks it); once they
    stop it is the collector's again."""
    ctx = Context.from_settings(settings, embedder=embedder)
    runner = Runner(stage_parts(ctx, (QUERY,)))
    runner.start()
    try:
        wait_for(lambda: MemoryClient(ctx.settings).query_workers() >= 1, what="a query worker")
        wait_for(lambda: gc.get_freeze_count() > 100_000, timeout_s=5, what="the heap frozen")  # the model and more
        # What a full collection walks: the objects the collector still tracks, the frozen ones not among them.
        walked, frozen = len(gc.get_objects()), gc.get_freeze_count()
        assert walked < frozen, f"a full collection walks {walked} objects, {frozen} frozen"
        assert gc.get_threshold()[2] >= FULL_AFTER  # and the rest walked less often
    finally:
        runner.shutdown()
        ctx.close()
    # Given back to the collector once every worker stopped (another test's may still be stopping: it holds the
    # heap frozen too, until it is done).
    wait_for(lambda: freezers() == 0, timeout_s=60, what="every worker stopped")
    assert gc.get_freeze_count() == 0 and gc.get_threshold()[2] < FULL_AFTER


def test_a_job_under_searches_without_a_pause_still_moves_on() -> None:
    """Stepping aside is bounded: a search always in flight delays each step of a job by `patience_s`, no more."""
    foreground = Foreground(patience_s=0.05)
    with foreground.serving():
        waited = foreground.step_aside()
    assert waited >= 0.05 and foreground.stepped_aside == 1  # it waited its patience (pytest-timeout: not forever)
    assert foreground.step_aside() == 0.0 and foreground.stepped_aside == 1  # nothing in flight: no wait
