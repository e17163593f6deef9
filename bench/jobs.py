"""`memflow bench jobs`: searches at a steady rate while the maintenance jobs run beside them (issue 29).

A fresh embedded system (as `memflow up` runs it: its own Redis, trigger and extract as child processes, the
store stages, the query worker and the jobs worker in this process) is filled with `size` memories straight
through the store (random unit vectors, in subjects of SUBJECT_SIZE, nothing through the LLM path). Then one
thread sends searches of random subjects at `rate` per second, first with nothing else running (idle), then
while the `index` job runs (an HNSW build of everything written: on an Edge shard, in a process of its own,
shared/storage/edge_build.py) and then while `consolidate` runs (`--jobs`: others, e.g. decay and review), each
enqueued as the scheduler enqueues it, its report left unread as the scheduler leaves it. A search's latency is
counted from the moment it was due, not when it was sent: a stall delays every search due meanwhile, and each one
counts (no coordinated omission). `partitions_lost`: partitions a live stream consumer of this process lost during
the job, counted from the lease owner's own warnings (shared/streaming/leases.py logs each loss). `stalls`: each search
during a job slower than 2x idle p99, with what ran meanwhile (`Timeline`: the index build's steps, which EdgeStore logs
at DEBUG as each ends, and the collector's pauses): why p99 is what it is.

Target (issue 29): during each job p99 <= 2x idle p99, no failed search, no partition lost.
"""

from __future__ import annotations

import gc
import logging
import os
import random
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
from rq import Queue
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from memflow.bench.perf import NAMES, NOUNS, bulk_load_subjects, emit, on_fresh_system, pct_ms, say
from memflow.scheduler.firings import Entry, enqueue_firing
from memflow.shared.settings import Settings
from memflow.shared.storage.edge_store import STEP_LOG
from memflow.workers.embedded import Embedded

SUBJECT_SIZE = 1000
JOBS = ("index", "consolidate")
JOB_TIMEOUT_S = 3600.0
# A collection shorter than this is not worth naming as what a slow search met.
GC_NOTED_S = 0.005
STORE_LOGGER = "memflow.shared.storage.edge_store"
# The Redis server's moments at least this slow are noted (its latency monitor), to name what a slow search met.
REDIS_SLOW_MS = 20


class LeaseLosses(logging.Handler):
    """Counts the partitions stream consumers lose, from shared/streaming/leases.py's warnings: "consumer %s lost
    partition %d of %s" (one), and "... giving up partitions %s of %s ..." (a stalled consumer: each of them)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.count = 0
        self._lock_count = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        lost = 0
        if "lost partition" in str(record.msg):
            lost = 1
        elif "giving up partitions" in str(record.msg) and isinstance(record.args, tuple):
            lost = next((len(a) for a in record.args if isinstance(a, list)), 1)
        with self._lock_count:
            self.count += lost


class Timeline(logging.Handler):
    """What ran in this process, as (start, end, what) in wall-clock seconds: each step of an index build (from
    EdgeStore's DEBUG log of it, STEP_LOG, sent as the step ends with its duration) and each garbage collection
    longer than GC_NOTED_S (gc.callbacks). `start`/`stop` attach and detach it."""

    def __init__(self, gc_noted_s: float = GC_NOTED_S) -> None:
        super().__init__(logging.DEBUG)
        self.gc_noted_s = gc_noted_s
        self.spans: list[tuple[float, float, str]] = []
        self._gc_started = 0.0
        self._spans_lock = threading.Lock()
        self._level = logging.NOTSET

    def emit(self, record: logging.LogRecord) -> None:
        if record.msg != STEP_LOG or not isinstance(record.args, tuple):
            return
        shard, step, took = record.args
        self._add(record.created - float(took), record.created, f"{step} of {shard}")  # type: ignore[arg-type]

    def collected(self, start: float, end: float) -> dict[str, Any]:
        """The collections noted in [start, end]: how many, and the longest, in ms (a collection holds the
        interpreter lock: each one delays every search due meanwhile)."""
        with self._spans_lock:
            took = [e - s for s, e, what in self.spans if what.startswith("gc ") and start <= s <= end]
        return {"noted": len(took), "max_ms": round(max(took, default=0.0) * 1000, 1)}

    def redis_stalls(self, client: Any) -> None:
        """The Redis server's own slow moments since the last call (its latency monitor: an fsync of the AOF, a
        command, a fork), as spans: a search is a few Redis round trips, and the server's event loop waits for
        each fsync (`appendfsync always`)."""
        for event, *_ in client.execute_command("LATENCY", "LATEST"):
            name = event.decode() if isinstance(event, bytes) else str(event)
            for at, ms in client.execute_command("LATENCY", "HISTORY", name):
                self._add(int(at) - int(ms) / 1000, int(at) + 1.0, f"redis {name} {int(ms)} ms")
        client.execute_command("LATENCY", "RESET")

    def during(self, start: float, end: float) -> list[str]:
        """What overlapped [start, end], longest first."""
        with self._spans_lock:
            met = [(e - s, what) for s, e, what in self.spans if s < end and e > start]
        return [what for _, what in sorted(met, reverse=True)]

    def start(self) -> None:
        store = logging.getLogger(STORE_LOGGER)
        self._level = store.level
        store.setLevel(logging.DEBUG)
        store.addHandler(self)
        gc.callbacks.append(self._collected)

    def stop(self) -> None:
        gc.callbacks.remove(self._collected)
        store = logging.getLogger(STORE_LOGGER)
        store.removeHandler(self)
        store.setLevel(self._level)

    def _collected(self, phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            self._gc_started = time.time()
        elif time.time() - self._gc_started >= self.gc_noted_s:
            self._add(self._gc_started, time.time(), f"gc generation {info['generation']}")

    def _add(self, start: float, end: float, what: str) -> None:
        with self._spans_lock:
            self.spans.append((start, end, what))


class Searches:
    """Searches of random subjects, one due every 1/rate s, sent by one thread until stopped."""

    def __init__(self, system: Embedded, subjects: list[str], rate: float, seed: int = 29) -> None:
        self.system, self.subjects, self.every_s = system, subjects, 1.0 / rate
        self.rng = random.Random(seed)
        self.latencies: list[float] = []
        self.answered: list[float] = []  # wall clock: each search's end, to match with the Timeline
        self.failed = 0

    def run_while(self, busy: Callable[[], bool]) -> None:
        due = time.perf_counter()
        while busy():
            wait = due - time.perf_counter()
            if wait > 0:
                time.sleep(wait)
            subject = self.rng.choice(self.subjects)
            found = self.system.client.search(
                subject, f"what did {self.rng.choice(NAMES)} do with the {self.rng.choice(NOUNS)}")
            self.latencies.append(time.perf_counter() - due)
            self.answered.append(time.time())
            self.failed += found.status == "failed"
            due += self.every_s


def searched_idle(system: Embedded, subjects: list[str], rate: float, seconds: float,
                  timeline: Timeline) -> dict[str, Any]:
    searches = Searches(system, subjects, rate)
    began, ends = time.time(), time.perf_counter() + seconds
    searches.run_while(lambda: time.perf_counter() < ends)
    timeline.redis_stalls(system.ctx.client)
    p50 = pct_ms(searches.latencies, 0.5)
    return {"p99_ms": pct_ms(searches.latencies, 0.99), "p50_ms": p50,
            "max_ms": pct_ms(searches.latencies, 1.0), "searches": len(searches.latencies),
            "failed": searches.failed, "gc": timeline.collected(began, time.time()),
            "stalls": stalls(searches, 2 * p50 / 1000, timeline, "idle")}


def stalls(searches: Searches, slow_s: float, timeline: Timeline, job: str) -> list[dict[str, Any]]:
    """Each search slower than `slow_s`, with what ran from when it was due to its answer."""
    found = []
    for latency, answered in zip(searches.latencies, searches.answered, strict=True):
        if latency > slow_s:
            met = timeline.during(answered - latency, answered)
            found.append({"ms": round(latency * 1000, 1), "during": ", ".join(met) or f"{job}: no step recorded"})
    return found


def searched_during(system: Embedded, subjects: list[str], rate: float, job: str,
                    losses: LeaseLosses, slow_s: float, timeline: Timeline) -> dict[str, Any]:
    """Searches while `job` runs on the jobs worker (enqueued as the scheduler does), what the job took, and the
    searches slower than `slow_s` with what ran meanwhile."""
    searches = Searches(system, subjects, rate, seed=hash(job) % 1000)
    lost_before, started, began = losses.count, time.perf_counter(), time.time()
    fired = enqueue_as_scheduled(system, job)
    searches.run_while(lambda: not _ended(fired))
    seconds = time.perf_counter() - started
    if fired.get_status() != JobStatus.FINISHED:
        raise RuntimeError(f"{job} ended {fired.get_status()}: {fired.latest_result()}")
    timeline.redis_stalls(system.ctx.client)
    detail = {"p50_ms": pct_ms(searches.latencies, 0.5), "max_ms": pct_ms(searches.latencies, 1.0),
              "searches": len(searches.latencies), "gc": timeline.collected(began, time.time())}
    say(f"{job}: {orjson.dumps(detail).decode()}")
    return {"seconds": round(seconds, 1), "p99_ms": pct_ms(searches.latencies, 0.99), "failed": searches.failed,
            "partitions_lost": losses.count - lost_before, "stalls": stalls(searches, slow_s, timeline, job)}


def enqueue_as_scheduled(system: Embedded, job: str) -> Job:
    """`job` on the jobs queue as the scheduler puts it there (scheduler/firings.py), firing now. The report stays
    in Redis unread, as the scheduler leaves it: the bench's process, which is the system's too, does not decode a
    report of every memory changed (20k entries: ~0.3 s of the interpreter lock a search would wait for)."""
    queue = Queue(system.ctx.keys.jobs_queue, connection=system.ctx.queue_client or system.ctx.client,
                  serializer=JSONSerializer)
    entry = Entry(job, None, {"hour": 0}, timedelta(hours=2))
    fired = enqueue_firing(queue, system.ctx.settings.redis.stream_prefix, entry, datetime.now(UTC),
                           job_timeout_s=int(JOB_TIMEOUT_S))
    if fired is None:
        raise RuntimeError(f"{job} was enqueued already at this instant")
    return fired


def _ended(fired: Job) -> bool:
    """Asked by the thread sending searches before each (one round trip): the job's end is seen within 1/rate s."""
    return fired.get_status() in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED)


def measure(system: Embedded, *, size: int, rate: float, idle_s: float,
            jobs: Sequence[str] = JOBS) -> dict[str, Any]:
    each = min(SUBJECT_SIZE, size)
    say(f"filling the store with {size} memories ({size // each} subjects) ...")
    subjects = bulk_load_subjects(system, max(1, size // each), each)
    # The fill leaves gigabytes of dirty pages; written back while idle is measured, they stall the server's AOF
    # fsyncs and the shard's page faults (seen: idle p99 82 -> 225 ms from one run to the next) and flatter the
    # ratio. Written out before: the idle figure is the steady state's.
    os.sync()
    losses, timeline = LeaseLosses(), Timeline()
    leases = logging.getLogger("memflow.shared.streaming.leases")
    leases.addHandler(losses)
    timeline.start()
    system.ctx.client.config_set("latency-monitor-threshold", REDIS_SLOW_MS)
    system.ctx.client.execute_command("LATENCY", "RESET")  # type: ignore[no-untyped-call]
    try:
        for subject in subjects:  # steady state: a subject's first search is not what a job could slow down
            system.client.search(subject, "warming up")
        say(f"searches at {rate:g}/s, idle, for {idle_s:g} s ...")
        idle = searched_idle(system, subjects, rate, idle_s, timeline)
        say(f"idle: {orjson.dumps(idle).decode()}")
        during = {}
        for job in jobs:
            say(f"searches at {rate:g}/s while {job} runs ...")
            during[job] = searched_during(system, subjects, rate, job, losses, 2 * idle["p99_ms"] / 1000, timeline)
            say(f"{job}: {orjson.dumps(during[job]).decode()}")
    finally:
        system.ctx.client.config_set("latency-monitor-threshold", 0)
        timeline.stop()
        leases.removeHandler(losses)
    return {"size": len(subjects) * each, "idle": {"p99_ms": idle["p99_ms"], "stalls": idle["stalls"]},
            "jobs": during}


def print_report(report: dict[str, Any]) -> None:
    idle = report["idle"]["p99_ms"]
    print(f"jobs beside searches @ {report['size']} memories: idle search p99 {idle:.1f} ms")
    for stall in report["idle"]["stalls"]:
        print(f"    {stall['ms']:>9.1f} ms during {stall['during']}")
    for job, figures in report["jobs"].items():
        verdict = "ok" if (figures["p99_ms"] <= 2 * idle and not figures["failed"]
                           and not figures["partitions_lost"]) else "MISSED"
        print(f"  {job:<12} {figures['seconds']:>7.1f} s  search p99 {figures['p99_ms']:.1f} ms "
              f"({figures['p99_ms'] / idle:.2f}x idle), failed {figures['failed']}, "
              f"partitions lost {figures['partitions_lost']}  [{verdict}]")
        for stall in figures["stalls"]:
            print(f"    {stall['ms']:>9.1f} ms during {stall['during']}")


def run_cli(*, size: int, rate: float, idle_s: float, as_json: bool, settings: Settings,
            jobs: Sequence[str] = JOBS) -> int:
    report = on_fresh_system(settings, "jobs",
                             lambda system: measure(system, size=size, rate=rate, idle_s=idle_s, jobs=jobs))
    return emit(report, as_json, print_report)
