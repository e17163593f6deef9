"""The system runner: every part of a memflow process started, watched and stopped in one place.

`memflow worker`, `memflow up` (workers/process.run_stages) and the embedded mode
(workers/embedded.py) all run their parts here: a stream stage's consumer loop, the RQ query
worker and the jobs worker beside it (a maintenance job never holds a search), a child process running
other stages (workers/process.ChildProcess). Each part runs in a
thread of its own; the runner notices when one ends while the process is still running.

When a part dies. A stage's consumer loop outlives anything one batch raises (it logs and backs
off, shared/streaming/consumer.py), and RQ's worker waits out a Redis outage in its dequeue; a part that ends
anyway met something its loop could not handle: an exception outside the loop, RQ quitting on a
Redis timeout or an error in its own bookkeeping, a child process killed. The runner logs it (with
its traceback) and restarts it in place, after a backoff that doubles with each death (0.5 s up to
30 s): most such deaths are an outage that passes, and a restart in place keeps the model and the
store loaded, where a new process reloads them for tens of seconds. A part that dies
`max_restarts` times in a row, each time within `stable_s` of its start, is not meeting an outage
but a defect: the runner stops every part and gives up. `memflow worker` and `memflow up` then
exit non-zero, so that the process supervisor (systemd, Kubernetes, compose `restart:`) restarts
the process and shows the crash loop; the embedded mode raises when its block ends.
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from memflow.shared.errors import MemflowError
from memflow.shared.redisdb.migrate import migrate_unpartitioned
from memflow.shared.streaming.consumer import StreamConsumer
from memflow.workers.query import JOBS, SEARCHES, build_worker
from memflow.workers.runtime import Context

log = logging.getLogger(__name__)

QUERY = "query"
SWITCH_INTERVAL_S = 0.001


@dataclass(frozen=True)
class RestartPolicy:
    max_restarts: int = 5
    # A part that ran this long before it died met something that passed: its count starts again.
    stable_s: float = 60.0
    base_s: float = 0.5
    max_s: float = 30.0

    def delay_s(self, deaths: int) -> float:
        return float(min(self.max_s, self.base_s * 2 ** min(deaths - 1, 30)))


class PartDied(MemflowError):
    """A part kept dying: the runner stopped every part."""


@dataclass(frozen=True)
class Part:
    """What the runner keeps running: `run(stop)` returns once `stop` is set. Returning while it is
    not set, or raising, is a death."""

    name: str
    run: Callable[[threading.Event], object]


@dataclass
class _Slot:
    part: Part
    thread: threading.Thread | None = None
    started_at: float = 0.0
    deaths: int = 0  # in a row, each within stable_s of its start
    restart_at: float | None = None


class Runner:
    def __init__(self, parts: Sequence[Part], *, policy: RestartPolicy = RestartPolicy(),
                 stop: threading.Event | None = None, clock: Callable[[], float] = time.monotonic) -> None:
        self.stop = stop or threading.Event()
        self.policy, self._clock = policy, clock
        self._slots = [_Slot(part) for part in parts]
        self.failure: str | None = None
        self._watcher: threading.Thread | None = None

    @property
    def threads(self) -> list[threading.Thread]:
        return [slot.thread for slot in self._slots if slot.thread is not None]

    def start(self) -> None:
        for slot in self._slots:
            self._launch(slot)

    def supervise(self, poll_s: float = 0.2) -> None:
        """Watch the parts until `stop` is set; PartDied (every part told to stop) when one keeps dying."""
        while not self.stop.wait(poll_s):
            self.check()

    def supervise_in_background(self) -> None:
        """Watch from a thread of its own (the embedded mode: the caller's thread is the caller's)."""
        self._watcher = threading.Thread(target=self._supervise_quietly, name="memflow-supervisor", daemon=True)
        self._watcher.start()

    def check(self) -> None:
        """One round: restart the parts whose backoff is over, note the ones that died since."""
        now = self._clock()
        for slot in self._slots:
            if slot.restart_at is not None:
                if now >= slot.restart_at and not self.stop.is_set():
                    self._launch(slot)
            elif slot.thread is not None and not slot.thread.is_alive() and not self.stop.is_set():
                self._note_death(slot, now)

    def shutdown(self, join_s: float = 30.0) -> None:
        """Ask every part to stop and wait for them (each finishes or leaves pending the batch in hand)."""
        self.stop.set()
        deadline = time.monotonic() + join_s
        for thread in [*self.threads, *([self._watcher] if self._watcher else [])]:
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
        _log_still_running([t for t in self.threads if t.is_alive()], join_s)

    def raise_if_failed(self) -> None:
        if self.failure is not None:
            raise PartDied(self.failure)

    def _note_death(self, slot: _Slot, now: float) -> None:
        stable = now - slot.started_at >= self.policy.stable_s
        slot.deaths = 1 if stable else slot.deaths + 1
        if slot.deaths > self.policy.max_restarts:
            self.failure = (f"{slot.part.name} died {slot.deaths} times in a row, each within "
                            f"{self.policy.stable_s:g} s of its start; see the log")
            log.critical("giving up: %s", self.failure)
            self.stop.set()
            raise PartDied(self.failure)
        delay = self.policy.delay_s(slot.deaths)
        log.error("%s died; restarting it in %.2f s (restart %d of %d in a row)", slot.part.name, delay,
                  slot.deaths, self.policy.max_restarts)
        slot.restart_at = now + delay

    def _launch(self, slot: _Slot) -> None:
        slot.restart_at, slot.started_at = None, self._clock()
        slot.thread = threading.Thread(target=self._run_part, args=(slot.part,), name=f"memflow-{slot.part.name}",
                                       daemon=True)
        slot.thread.start()

    def _run_part(self, part: Part) -> None:
        try:
            part.run(self.stop)
        # Whatever ends a part is logged here, with its traceback; the supervisor restarts it.
        except Exception:  # noqa: BLE001
            log.exception("%s died", part.name)
            return
        if not self.stop.is_set():
            log.error("%s returned while the process runs", part.name)

    def _supervise_quietly(self) -> None:
        try:
            self.supervise()
        except PartDied:
            pass  # recorded in self.failure and logged; raised by raise_if_failed when the system ends


def _log_still_running(threads: Sequence[threading.Thread], join_s: float) -> None:
    """A part that did not stop in time, with where it waits: a stop is seen within about a second (a stage's
    block, RQ's dequeue), so this is a defect, and its stack is what finds it."""
    frames = sys._current_frames()
    for thread in threads:
        frame = frames.get(thread.ident) if thread.ident is not None else None
        where = "".join(traceback.format_stack(frame)) if frame is not None else "(no stack)"
        log.error("%s still running %g s after its stop, at:\n%s", thread.name, join_s, where)


# -- assembling the parts ----------------------------------------------------------------


def build_consumer(ctx: Context, stage: str) -> StreamConsumer[Any]:
    from memflow.workers import extract, resolve, trigger, upsert

    builders: dict[str, Callable[[Context], StreamConsumer[Any]]] = {
        "trigger": trigger.build, "extract": extract.build, "resolve": resolve.build, "upsert": upsert.build}
    if stage not in builders:
        raise ValueError(f"unknown stage {stage!r}; stages are {', '.join(builders)}")
    return builders[stage](ctx)


def stage_parts(ctx: Context, stages: Sequence[str], *, query_log_level: str = "WARNING") -> list[Part]:
    """A part per stage: its consumer loops (MEMFLOW_CONSUMERS of them), or ("query") the RQ query worker and
    the jobs worker beside it.
    Every consumer group exists when this returns, so that nothing published from here on is missed; what
    a deployment from before partitions left in Redis has been moved into them (shared/redisdb/migrate.py)."""
    if not ctx.settings.redis.cluster:  # a cluster deployment starts on the partitioned layout
        migrate_unpartitioned(ctx.client, ctx.keys)
    parts = []
    for stage in stages:
        if stage == QUERY:  # search workers and a jobs worker: a search never waits for a job (an hour's consolidate)
            # They share one interpreter lock. A job's pure-Python stretch keeps it 5 ms at a time (Python's
            # default), and a search asks for it again after every Redis reply and every torch op: hundreds of
            # 5 ms waits (measured: search p50 1.6 s during consolidate at 20k memories). 1 ms bounds them.
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
            # MEMFLOW_QUERY_WORKERS search workers: one tenant's slow searches hold some of them, not all.
            parts += [Part(QUERY if i == 0 else f"{QUERY}-{i + 1}", _query_worker(ctx, query_log_level, (SEARCHES,)))
                      for i in range(ctx.settings.consumer.query_workers)]
            parts.append(Part(JOBS, _query_worker(ctx, query_log_level, (JOBS,))))
            continue
        for i in range(ctx.settings.consumer.consumers):
            consumer = build_consumer(ctx, stage)
            consumer.ensure_group()
            parts.append(Part(stage if i == 0 else f"{stage}-{i + 1}", consumer.run))
    return parts


def _query_worker(ctx: Context, log_level: str, serves: Sequence[str]) -> Callable[[threading.Event], object]:
    # A worker per start: RQ's worker registers its birth and death under its name, once.
    return lambda stop: build_worker(ctx, stop, serves).work(logging_level=log_level)


def run(ctx: Context, stages: Sequence[str], *, also: Sequence[Part] = (),
        policy: RestartPolicy = RestartPolicy(), query_log_level: str = "WARNING") -> None:
    """Run `stages` (and `also`) in the foreground until SIGTERM/SIGINT; exit non-zero when a part
    keeps dying. What `memflow worker` and `memflow up` run."""
    runner = Runner([*stage_parts(ctx, stages, query_log_level=query_log_level), *also], policy=policy)
    stop_on_signals(runner.stop)
    runner.start()
    try:
        runner.supervise()
    except PartDied as exc:
        raise SystemExit(f"memflow: {exc}") from exc
    finally:
        runner.shutdown()


def start_consumers(ctx: Context, stages: Sequence[str], stop: threading.Event) -> list[threading.Thread]:
    """One thread per stage, unsupervised: a stage's loop on its own, for tests that drive the stages."""
    threads = []
    for part in stage_parts(ctx, stages):
        thread = threading.Thread(target=part.run, args=(stop,), name=f"memflow-{part.name}", daemon=True)
        thread.start()
        threads.append(thread)
    return threads


def stop_on_signals(stop: threading.Event) -> None:
    """SIGTERM/SIGINT ask every part to finish its batch (the query worker: its job) and return."""

    def handler(signum: int, _frame: Any) -> None:
        log.info("signal %s: stopping after the current batch", signum)
        stop.set()

    signal.signal(signal.SIGTERM, handler)
    signal.signal(signal.SIGINT, handler)
