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

`--disk-load` (issue 42): in the same run on the same store, the same searches also while another process writes and
fsyncs files on the data dir's filesystem (bench/diskload.py): idle under load right after idle, and each job under
load right after the job alone, each judged against the same run's idle p99 by the same target; and publish idle and
under load, next to a bare durable XADD (bench/perf.py `bench_publish`), judged by issue 42's p99 <= 2x that XADD.
The Redis stalls are read from each distinct server the system talks to (the streams' and the RPC queues').
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import random
import threading
import time
import zlib
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import redis
from rq import Queue
from rq.job import Job, JobStatus
from rq.serializers import JSONSerializer

from memflow.bench.diskload import Bound, disk_load
from memflow.bench.perf import NAMES, NOUNS, bench_publish, bulk_load_subjects, emit, on_fresh_system, pct_ms, say
from memflow.scheduler.firings import Entry, enqueue_firing
from memflow.shared.settings import Settings
from memflow.shared.storage.edge_store import STEP_LOG
from memflow.shared.storage.store import Optimizable
from memflow.workers.embedded import Embedded
from memflow.workers.jobs import INDEX_AFTER_CHANGES
from memflow.workers.jobs import run as run_job
from memflow.workers.runtime import Context

SUBJECT_SIZE = 1000
JOBS = ("index", "consolidate")
JOB_TIMEOUT_S = 3600.0
FREE_SECOND_TRIES = 10  # runs of one job a bench makes within a few seconds
# A collection shorter than this is not worth naming as what a slow search met.
GC_NOTED_S = 0.005
STORE_LOGGER = "memflow.shared.storage.edge_store"
# The Redis server's moments at least this slow are noted (its latency monitor), to name what a slow search met.
REDIS_SLOW_MS = 20
# Publishes per publish figure (--disk-load): idle, and under load.
PUBLISHES = 1000


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

    def redis_stalls(self, servers: Sequence[tuple[str, redis.Redis]]) -> None:
        """Each Redis server's own slow moments since the last call (its latency monitor: an fsync of the AOF, a
        command, a fork), as spans named by the server's label (`redis_servers`): a search is a few Redis round
        trips, and a server's event loop waits for each fsync (`appendfsync always`)."""
        for label, client in servers:
            named = f"redis ({label})" if label else "redis"
            for event, *_ in client.execute_command("LATENCY", "LATEST"):  # type: ignore[no-untyped-call]
                name = event.decode() if isinstance(event, bytes) else str(event)
                for at, ms in client.execute_command("LATENCY", "HISTORY", name):  # type: ignore[no-untyped-call]
                    self._add(int(at) - int(ms) / 1000, int(at) + 1.0, f"{named} {name} {int(ms)} ms")
            client.execute_command("LATENCY", "RESET")  # type: ignore[no-untyped-call]

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
        """Until `busy` says no, asked before each search but the first: a figure always has a search (a job that
        ended before a first search could meet it would leave none, and no percentile of none)."""
        due, first = time.perf_counter(), True
        while first or busy():
            first = False
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


@dataclass
class Watch:
    """What a phase's figures read besides its searches: the partitions lost, what ran meanwhile, and each Redis
    server's own slow moments."""

    losses: LeaseLosses
    timeline: Timeline
    servers: list[tuple[str, redis.Redis]]

    def figures(self, searches: Searches, what: str, lost_before: int, began: float,
                slow_s: float | None) -> dict[str, Any]:
        """The phase's figures; its searches slower than `slow_s` (None: 2x their own p50) with what ran meanwhile."""
        self.timeline.redis_stalls(self.servers)
        found: dict[str, Any] = {
            "p50_ms": pct_ms(searches.latencies, 0.5), "p99_ms": pct_ms(searches.latencies, 0.99),
            "max_ms": pct_ms(searches.latencies, 1.0), "searches": len(searches.latencies), "failed": searches.failed,
            "partitions_lost": self.losses.count - lost_before, "gc": self.timeline.collected(began, time.time())}
        slow = slow_s if slow_s is not None else 2 * found["p50_ms"] / 1000
        return found | {"stalls": stalls(searches, slow, self.timeline, what)}


@contextlib.contextmanager
def watching(watch: Watch) -> Iterator[Watch]:
    """`watch` attached for the block: the lease owner's warnings, the timeline, each server's latency monitor."""
    leases = logging.getLogger("memflow.shared.streaming.leases")
    leases.addHandler(watch.losses)
    watch.timeline.start()
    for _, client in watch.servers:
        client.config_set("latency-monitor-threshold", REDIS_SLOW_MS)
        client.execute_command("LATENCY", "RESET")  # type: ignore[no-untyped-call]
    try:
        yield watch
    finally:
        for _, client in watch.servers:
            client.config_set("latency-monitor-threshold", 0)
        watch.timeline.stop()
        leases.removeHandler(watch.losses)


def redis_servers(ctx: Context) -> list[tuple[str, redis.Redis]]:
    """Each distinct Redis server the system talks to, labelled: the streams' (`ctx.client`) and the RPC queues'
    (`ctx.queue_client`) when that is another server (one that does not persist, say: its event loop has stalls of
    its own). The latency monitor is a server's, so two connections to one server are read once; one server is left
    unlabelled."""
    named = [("streams", ctx.client)] + ([("queue", ctx.queue_client)] if ctx.queue_client is not None else [])
    distinct: dict[tuple[str, ...], tuple[str, redis.Redis]] = {}
    for label, client in named:
        distinct.setdefault(_address(client), (label, client))
    servers = list(distinct.values())
    return servers if len(servers) > 1 else [("", servers[0][1])]


def _address(client: redis.Redis) -> tuple[str, ...]:
    """Where `client` connects: its unix socket, else its host and port (not its database: one server's); a client
    without one pool (a cluster's) is its own."""
    pool = getattr(client, "connection_pool", None)
    if pool is None:
        return ("client", str(id(client)))
    kwargs = pool.connection_kwargs
    if kwargs.get("path"):
        return ("unix", str(kwargs["path"]))
    return ("tcp", str(kwargs.get("host")), str(kwargs.get("port")))


def searched_idle(system: Embedded, subjects: list[str], rate: float, seconds: float, watch: Watch,
                  slow_s: float | None = None) -> dict[str, Any]:
    """Searches for `seconds` with no job running (the same searches each time: one seed)."""
    searches = Searches(system, subjects, rate)
    lost_before, began, ends = watch.losses.count, time.time(), time.perf_counter() + seconds
    searches.run_while(lambda: time.perf_counter() < ends)
    return watch.figures(searches, "idle", lost_before, began, slow_s)


def stalls(searches: Searches, slow_s: float, timeline: Timeline, job: str) -> list[dict[str, Any]]:
    """Each search slower than `slow_s`, with what ran from when it was due to its answer."""
    found = []
    for latency, answered in zip(searches.latencies, searches.answered, strict=True):
        if latency > slow_s:
            met = timeline.during(answered - latency, answered)
            found.append({"ms": round(latency * 1000, 1), "during": ", ".join(met) or f"{job}: no step recorded"})
    return found


def searched_during(system: Embedded, subjects: list[str], rate: float, job: str, watch: Watch,
                    slow_s: float) -> dict[str, Any]:
    """Searches while `job` runs on the jobs worker (enqueued as the scheduler does), what the job took, and the
    searches slower than `slow_s` with what ran meanwhile. The same searches for each run of one job (one seed)."""
    searches = Searches(system, subjects, rate, seed=zlib.crc32(job.encode()) % 1000)
    lost_before, started, began = watch.losses.count, time.perf_counter(), time.time()
    fired = enqueue_as_scheduled(system, job)
    searches.run_while(lambda: not _ended(fired))
    seconds = time.perf_counter() - started
    if fired.get_status() != JobStatus.FINISHED:
        raise RuntimeError(f"{job} ended {fired.get_status()}: {fired.latest_result()}")
    return {"seconds": round(seconds, 1), **watch.figures(searches, job, lost_before, began, slow_s)}


def judged(figures: dict[str, Any], idle_p99_ms: float) -> dict[str, Any]:
    """`figures` with their p99 against the same run's idle p99 and the target's verdict: p99 <= 2x idle, no failed
    search, no partition lost."""
    ok = figures["p99_ms"] <= 2 * idle_p99_ms and not figures["failed"] and not figures["partitions_lost"]
    return figures | {"vs_idle_p99": round(figures["p99_ms"] / max(idle_p99_ms, 1e-6), 2),
                      "verdict": "ok" if ok else "MISSED"}


def under_load(system: Embedded, bound: Bound, phase: Callable[[], dict[str, Any]]) -> dict[str, Any]:
    """`phase`'s figures while another process writes and fsyncs beside the data (bench/diskload.py), with what that
    writer did (`writer`)."""
    with disk_load(system.settings.store.data_dir / "diskload", bound) as load:
        figures = phase()
    if load.report.get("stopped_by") != "stop":
        say(f"the disk writer ended before the phase did ({load.report}): its figures are partly without load")
    return figures | {"writer": load.report}


def published(system: Embedded, n: int, tag: str) -> dict[str, Any]:
    """Publish p50/p99 next to a bare durable XADD (bench/perf.py), once the pipeline is idle (a publish does not
    wait behind the ingest of what came before), judged by issue 42's target: p99 <= 2x the durable XADD's."""
    system.client.wait_idle(600)
    figures = bench_publish(system.client, n, durable=True, tag=tag)
    ok = figures["p99_ms"] <= 2 * figures["durable_xadd_p99_ms"]
    return figures | {"verdict": "ok" if ok else "MISSED"}


def reseeded(system: Embedded, subjects: list[str], each: int, built: bool) -> None:
    """The store put back as a job's run alone found it, for its run under load: every seeded memory written again
    as first written (the same ids, texts and vectors: bulk_load_subjects is seeded), which undoes what the job
    changed (decay rewrites each one; consolidate and review change none of these) and leaves the index job the
    whole store to build again. `built`: the run alone found the store built; so is it again (unmeasured)."""
    say(f"rewriting the {len(subjects) * each} memories as they were ...")
    bulk_load_subjects(system, len(subjects), each)
    if built:
        run_job(system.ctx, "index", None, datetime.now(UTC), dry_run=False)
    system.client.wait_idle(600)
    os.sync()  # as after the fill (`measure`): no write-back of the rewrite during the phase


def _built(system: Embedded) -> bool:
    """Whether the store has nothing an index build would take (its searches run on built indexes)."""
    store = system.ctx.store
    return not isinstance(store, Optimizable) or store.changed_since_optimize() < INDEX_AFTER_CHANGES


def enqueue_as_scheduled(system: Embedded, job: str) -> Job:
    """`job` on the jobs queue as the scheduler puts it there (scheduler/firings.py), firing now. The report stays
    in Redis unread, as the scheduler leaves it: the bench's process, which is the system's too, does not decode a
    report of every memory changed (20k entries: ~0.3 s of the interpreter lock a search would wait for)."""
    queue = Queue(system.ctx.keys.jobs_queue, connection=system.ctx.transient,
                  serializer=JSONSerializer)
    entry = Entry(job, None, {"hour": 0}, timedelta(hours=2))
    now = datetime.now(UTC)
    # A firing's id is its job and its second (scheduler/firings.py): a small store's job and its rewrite end within
    # the second the job's first run fired in, so a later run of the same job fires at the next free second.
    for ahead in range(FREE_SECOND_TRIES):
        fired = enqueue_firing(queue, system.ctx.settings.redis.stream_prefix, entry, now + timedelta(seconds=ahead),
                               job_timeout_s=int(JOB_TIMEOUT_S))
        if fired is not None:
            return fired
    raise RuntimeError(f"{job} was enqueued already at each of the {FREE_SECOND_TRIES} seconds from {now}")


def _ended(fired: Job) -> bool:
    """Asked by the thread sending searches before each (one round trip): the job's end is seen within 1/rate s."""
    return fired.get_status() in (JobStatus.FINISHED, JobStatus.FAILED, JobStatus.STOPPED, JobStatus.CANCELED)


def measure(system: Embedded, *, size: int, rate: float, idle_s: float, jobs: Sequence[str] = JOBS,
            load: Bound | None = None, publishes: int = PUBLISHES) -> dict[str, Any]:
    """Searches idle then during each job; with `load`, also each under disk load, and publish idle and under it."""
    each = min(SUBJECT_SIZE, size)
    say(f"filling the store with {size} memories ({size // each} subjects) ...")
    subjects = bulk_load_subjects(system, max(1, size // each), each)
    # The fill leaves gigabytes of dirty pages; written back while idle is measured, they stall the server's AOF
    # fsyncs and the shard's page faults (seen: idle p99 82 -> 225 ms from one run to the next) and flatter the
    # ratio. Written out before: the idle figure is the steady state's.
    os.sync()
    with watching(Watch(LeaseLosses(), Timeline(), redis_servers(system.ctx))) as watch:
        for subject in subjects:  # steady state: a subject's first search is not what a job could slow down
            system.client.search(subject, "warming up")
        say(f"searches at {rate:g}/s, idle, for {idle_s:g} s ...")
        idle = searched_idle(system, subjects, rate, idle_s, watch)
        say(f"idle: {orjson.dumps(idle).decode()}")
        report: dict[str, Any] = {"size": len(subjects) * each, "idle": judged(idle, idle["p99_ms"]), "jobs": {}}
        if load is not None:
            report["disk_load"] = idle_under_load(system, subjects, rate, idle_s, watch, idle["p99_ms"], load,
                                                  publishes)
        for job in jobs:
            report["jobs"][job], loaded = job_phases(system, subjects, each, rate, job, watch, idle["p99_ms"], load)
            if loaded is not None:
                report["disk_load"]["jobs"][job] = loaded
    return report


def job_phases(system: Embedded, subjects: list[str], each: int, rate: float, job: str, watch: Watch,
               idle_p99_ms: float, load: Bound | None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """Searches while `job` runs alone, then (with `load`) while it runs again under disk load."""
    # The job alone first, on the store as it stands (what this bench measured before it had a disk load), then
    # under load on the store put back as the run alone found it (`reseeded`). A job changes what it runs over:
    # decay rewrites every memory, and index builds what changed since the last build, so a second build finds
    # nothing left to do. Run again on what the first run left, the job under load would be a lighter job, not the
    # same one under load.
    slow_s = 2 * idle_p99_ms / 1000
    system.client.wait_idle(600)  # what the previous phase sent the pipeline is not this phase's load
    built = job != "index" and _built(system)
    say(f"searches at {rate:g}/s while {job} runs ...")
    alone = judged(searched_during(system, subjects, rate, job, watch, slow_s), idle_p99_ms)
    say(f"{job}: {orjson.dumps(alone).decode()}")
    if load is None:
        return alone, None
    reseeded(system, subjects, each, built)
    say(f"searches at {rate:g}/s while {job} runs, under disk load ...")
    loaded = judged(under_load(system, load, lambda: searched_during(system, subjects, rate, job, watch, slow_s)),
                    idle_p99_ms)
    say(f"{job}, disk load: {orjson.dumps(loaded).decode()}")
    return alone, loaded


def idle_under_load(system: Embedded, subjects: list[str], rate: float, idle_s: float, watch: Watch,
                    idle_p99_ms: float, load: Bound, publishes: int) -> dict[str, Any]:
    """Publish idle; then, under one disk writer, the idle searches again (the same ones) and the publishes again."""
    say(f"{publishes} publishes, idle ...")
    publish_idle = published(system, publishes, "jobs-idle-p")
    system.client.wait_idle(600)  # the ingest of those publishes is not the searches' load
    say(f"searches at {rate:g}/s for {idle_s:g} s, then {publishes} publishes, under disk load ...")
    searched: dict[str, Any] = {}

    def phase() -> dict[str, Any]:
        searched.update(searched_idle(system, subjects, rate, idle_s, watch, 2 * idle_p99_ms / 1000))
        return published(system, publishes, "jobs-load-p")

    publish_loaded = under_load(system, load, phase)
    figures = {"idle": judged(searched, idle_p99_ms) | {"writer": publish_loaded.pop("writer")},
               "publish": {"idle": publish_idle, "under_load": publish_loaded}, "jobs": {}}
    say(f"idle, disk load: {orjson.dumps(figures).decode()}")
    return figures


def print_report(report: dict[str, Any]) -> None:
    idle = report["idle"]
    print(f"jobs beside searches @ {report['size']} memories: idle search p99 {idle['p99_ms']:.1f} ms "
          "(verdict: p99 <= 2x idle p99, 0 failed, 0 partitions lost)")
    print(f"  {'phase':<26} {'seconds':>8} {'searches':>8} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} "
          f"{'x idle':>7} {'failed':>6} {'lost':>4}  verdict")
    loaded = report.get("disk_load", {})
    rows = [("idle", idle)] + ([("idle, disk load", loaded["idle"])] if loaded else [])
    for job, figures in report["jobs"].items():
        rows.append((job, figures))
        if job in loaded.get("jobs", {}):
            rows.append((f"{job}, disk load", loaded["jobs"][job]))
    for name, figures in rows:
        seconds = f"{figures['seconds']:.1f}" if "seconds" in figures else "-"
        print(f"  {name:<26} {seconds:>8} {figures['searches']:>8} {figures['p50_ms']:>8.1f} "
              f"{figures['p99_ms']:>8.1f} {figures['max_ms']:>8.1f} {figures['vs_idle_p99']:>6.2f}x "
              f"{figures['failed']:>6} {figures['partitions_lost']:>4}  {figures['verdict']}")
    if loaded:
        print_load(loaded, [name for name, _ in rows if name.endswith("disk load")])
    for name, figures in rows:
        print_stalls(name, figures["stalls"])


def print_load(loaded: dict[str, Any], phases: list[str]) -> None:
    """Publish next to a bare durable XADD idle and under load, then what the writer did in each loaded phase."""
    print("  publish (verdict: p99 <= 2x a bare durable XADD's, same phase)")
    for name, p in (("idle", loaded["publish"]["idle"]), ("disk load", loaded["publish"]["under_load"])):
        print(f"    {name:<10} p50 {p['p50_ms']} ms  p99 {p['p99_ms']} ms   | bare durable XADD p50 "
              f"{p['durable_xadd_p50_ms']} ms  p99 {p['durable_xadd_p99_ms']} ms   ratio p99 "
              f"{p['p99_vs_durable_xadd']}x  {p['verdict']}")
    print("  the disk load (another process writing and fsyncing beside the data, bench/diskload.py)")
    writers = [loaded["idle"]["writer"], *(figures["writer"] for figures in loaded["jobs"].values())]
    for name, w in zip(phases, writers, strict=True):
        print(f"    {name:<26} {w.get('mb')} MB in {w.get('seconds')} s ({w.get('mb_per_s')} MB/s), "
              f"{w.get('fsyncs')} fsyncs, fsync p50 {w.get('fsync_p50_ms')} ms max {w.get('fsync_max_ms')} ms, "
              f"stopped by {w.get('stopped_by')}")


def print_stalls(phase: str, found: list[dict[str, Any]], most: int = 12) -> None:
    """The slowest `most` of a phase's slow searches, with what they met (every one is in the JSON)."""
    if not found:
        return
    print(f"  {phase}: {len(found)} searches slower than 2x idle p99" if phase != "idle" else
          f"  idle: {len(found)} searches slower than 2x idle p50")
    for stall in sorted(found, key=lambda s: -s["ms"])[:most]:
        print(f"    {stall['ms']:>9.1f} ms during {stall['during']}")
    if len(found) > most:
        print(f"    ... and {len(found) - most} more")


def run_cli(*, size: int, rate: float, idle_s: float, as_json: bool, settings: Settings,
            jobs: Sequence[str] = JOBS, load: Bound | None = None, publishes: int = PUBLISHES) -> int:
    report = on_fresh_system(settings, "jobs", lambda system: measure(
        system, size=size, rate=rate, idle_s=idle_s, jobs=jobs, load=load, publishes=publishes))
    return emit(report, as_json, print_report)
