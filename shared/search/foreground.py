"""Searches first, inside one process: a maintenance job steps aside while a search is answered.

The query worker and the jobs worker run side by side in the process that holds the store (workers/system.py),
and share one interpreter lock. A search lets the lock go at every Redis reply and every model op, and asks for
it again; a job running pure Python beside it takes it each time, for up to the switch interval (1 ms) or a whole
engine call (a scroll page). Hundreds of such waits per search: measured at 20k memories, search p50 64 → 919 ms
during `consolidate`, whose 2 s of work is the store read (scroll, payload validation) and the planning.

So a job does its work in steps (a subject's read, its plan, its writes) and, before each, waits while a search is
in flight: the job's Python is then not running while a search runs, only the step a search arrived in. The wait
is bounded (`patience_s`): under searches without a pause a job still moves on, one step per `patience_s`. While
searches come, a job also rests after each step for as long as its CPU took (what comes before a search's dequeue
is not covered by the wait), and a job's read and plan of a subject defer the collector to one young collection
after them (`collections_deferred`).
"""

from __future__ import annotations

import gc
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

# A job waits at most this long for the searches in flight before its next step: at 5 searches/s of ~100 ms
# it never waits this long; under a saturating load the job still takes a step every half second.
PATIENCE_S = 0.5

# Stepping aside covers a search from its dequeue to its stored reply, not what comes before: the caller's enqueue
# and the worker's dequeue (RQ's round trips, the job's decoding), which ask for the interpreter lock a few dozen
# times each. A job running between searches holds it then, one switch interval (1 ms) at a time: measured beside
# `consolidate` at 20k memories, a search's time before its dequeue went p50 3 -> 28 ms. So while searches come
# (one ended within RECENT_S), each step of a job is followed by a rest of REST_PER_CPU times the CPU the step
# took (at most MAX_REST_S): the job holds the lock half the time at most, and a search arriving finds it free
# as often as not. With no search in the last RECENT_S a job runs at full speed.
RECENT_S = 1.0
REST_PER_CPU = 1.0
MAX_REST_S = 0.05
MIN_REST_S = 0.001  # a shorter sleep is mostly the call's own cost


class Foreground:
    """The searches a process is answering now (`serving`), and the wait of a job's step for them (`step_aside`)."""

    def __init__(self, patience_s: float = PATIENCE_S, rest_per_cpu: float = REST_PER_CPU) -> None:
        self.patience_s, self.rest_per_cpu = patience_s, rest_per_cpu
        self._in_flight = 0
        self._changed = threading.Condition()
        self._last_served = -RECENT_S  # time.monotonic() when a search last ended
        self._step = threading.local()  # the CPU time of the job's thread when its step began
        self.stepped_aside = 0  # steps that waited for a search (counted: the tests and the log read it)
        self.rested = 0  # steps followed by a rest, searches coming (counted: the tests read it)

    @contextmanager
    def serving(self) -> Iterator[None]:
        """A search (or any call a user waits for) in flight."""
        with self._changed:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._changed:
                self._in_flight -= 1
                self._last_served = time.monotonic()
                if not self._in_flight:
                    self._changed.notify_all()

    def step_aside(self) -> float:
        """Before a job's next step: wait while a search is in flight, at most `patience_s`, and while searches
        come rest after the step just done (REST_PER_CPU); the seconds waited."""
        started = time.monotonic()
        waited = self._rest()
        with self._changed:
            if self._in_flight:
                self.stepped_aside += 1
                self._changed.wait_for(lambda: not self._in_flight, timeout=self.patience_s)
                waited = True
        self._step.cpu = time.thread_time()
        return time.monotonic() - started if waited else 0.0

    def _rest(self) -> bool:
        """A rest as long as `rest_per_cpu` times the CPU this thread spent since its last step began, if a search
        ended within RECENT_S (or is in flight: the wait for it follows); whether it rested."""
        began: float | None = getattr(self._step, "cpu", None)
        with self._changed:
            coming = self._in_flight or time.monotonic() - self._last_served < RECENT_S
        if began is None or not coming or self.rest_per_cpu <= 0:
            return False
        rest = min(MAX_REST_S, (time.thread_time() - began) * self.rest_per_cpu)
        if rest < MIN_REST_S:
            return False
        self.rested += 1
        time.sleep(rest)
        return True


# -- the heap at start, out of the collector's way ------------------------------------------------------------------
# A full (generation 2) collection walks every tracked object and holds the interpreter lock throughout. A process
# that loaded the model, the engine and their libraries tracks ~500k objects: measured, one collection of 344 ms
# during `consolidate` at 20k memories (its 20k payloads validated into models trigger it), a stall of every search
# that no stepping aside prevents; with that heap frozen, 2.8 ms.

# What is left unfrozen is still walked by each full collection: the payloads searches validated lately (EdgeStore's
# cache, ~5k memories), 56k-116k objects at 100k memories, 18-29 ms a collection on the search thread that triggered
# it, measured; at the default pace (a full collection after 10 of generation 1, once the pending objects reach a
# quarter of the old ones) two in 40 s of 5 searches/s: 1 % of searches, p99 itself. After 100 of generation 1:
# none in 40 s. Cycles among young objects are still collected by generations 0 and 1 at their usual pace.
FULL_AFTER = 100

_frozen_by = 0
_thresholds: tuple[int, int, int] = gc.get_threshold()
_freezing = threading.Lock()


def freezers() -> int:
    """How many workers of this process hold the heap frozen now."""
    return _frozen_by


@contextmanager
def frozen_heap() -> Iterator[None]:
    """While a worker runs: what the process holds now (the model, the store, the libraries) in the collector's
    permanent generation, which no collection walks, and full collections at a slower pace (FULL_AFTER). Garbage
    is collected first, so none is frozen; the last worker to stop gives the heap and the pace back to the
    collector (a process that starts workers again, as the tests do, frees what its earlier ones left in cycles)."""
    global _frozen_by, _thresholds
    with _freezing:
        gc.collect()  # after a first freeze, a collection of what came since: cheap
        gc.freeze()
        if not _frozen_by:
            _thresholds = gc.get_threshold()
            gc.set_threshold(_thresholds[0], _thresholds[1], max(_thresholds[2], FULL_AFTER))
        _frozen_by += 1
    try:
        yield
    finally:
        with _freezing:
            _frozen_by -= 1
            if not _frozen_by:
                gc.unfreeze()
                gc.set_threshold(*_thresholds)


# -- a job's reads and plans, without collections in the middle ----------------------------------------------------
# A subject's read and plan allocate ~10 containers per memory (the engine's payload dicts, the validated models):
# ~14 young collections and 1.4 of generation 1 per 1,000 memories, so a full collection (which walks what is not
# frozen: 120-145 ms each at 100k memories, measured beside `consolidate`, a stall of every search due meanwhile)
# every ~70 subjects. Measured at 100k: 3 full collections in 3 consolidate runs (one a run, a search or two of
# ~70 each time: p99), and ~0.5 s of young and middle collections a run. Deferred over the step and collected
# once after it (the step's survivors, young: a few ms), the job adds one young collection per subject, and a
# full collection comes at the searches' own pace.
_deferring = 0
_was_enabled = True


@contextmanager
def collections_deferred() -> Iterator[None]:
    """No automatic collection while a job's step allocates (searches beside it allocate little meanwhile); the
    young generation collected once at its end, in the job's thread (so a search does not meet it)."""
    global _deferring, _was_enabled
    with _freezing:
        if not _deferring:
            _was_enabled = gc.isenabled()
            gc.disable()
        _deferring += 1
    try:
        yield
    finally:
        with _freezing:
            _deferring -= 1
            if not _deferring and _was_enabled:
                gc.enable()
        gc.collect(0)
