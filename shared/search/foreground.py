"""Searches first, inside one process: a maintenance job steps aside while a search is answered.

The query worker and the jobs worker run side by side in the process that holds the store (workers/system.py),
and share one interpreter lock. A search lets the lock go at every Redis reply and every model op, and asks for
it again; a job running pure Python beside it takes it each time, for up to the switch interval (1 ms) or a whole
engine call (a scroll page). Hundreds of such waits per search: measured at 20k memories, search p50 64 → 919 ms
during `consolidate`, whose 2 s of work is the store read (scroll, payload validation) and the planning.

So a job does its work in steps (a subject's read, its plan, its writes) and, before each, waits while a search is
in flight: the job's Python is then not running while a search runs, only the step a search arrived in. The wait
is bounded (`patience_s`): under searches without a pause a job still moves on, one step per `patience_s`.
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


class Foreground:
    """The searches a process is answering now (`serving`), and the wait of a job's step for them (`step_aside`)."""

    def __init__(self, patience_s: float = PATIENCE_S) -> None:
        self.patience_s = patience_s
        self._in_flight = 0
        self._changed = threading.Condition()
        self.stepped_aside = 0  # steps that waited for a search (counted: the tests and the log read it)

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
                if not self._in_flight:
                    self._changed.notify_all()

    def step_aside(self) -> float:
        """Before a job's next step: wait while a search is in flight, at most `patience_s`; the seconds waited."""
        with self._changed:
            if not self._in_flight:
                return 0.0
            self.stepped_aside += 1
            started = time.monotonic()
            self._changed.wait_for(lambda: not self._in_flight, timeout=self.patience_s)
            return time.monotonic() - started


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
