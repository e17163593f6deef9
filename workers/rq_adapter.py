"""Every place memflow reaches into RQ's internals, in one module: the query worker's job class, worker and death
penalty. Each override below is pinned by a test that fails when RQ changes what it overrides
(tests/test_rq_adapter.py), and pyproject.toml holds RQ to the range those tests passed on.

- `RpcJob._execute`: a job runs an RPC of the table with the worker's context, not a function imported by name.
- `WatchedDeathPenalty` (a `TimerDeathPenalty`): one watchdog thread per process instead of a thread per job.
- `QueryWorker` (a `SimpleWorker`): runs in a thread (`_install_signal_handlers`), stops on an Event (by raising
  RQ's `StopRequested` from `heartbeat`), beats, writes its state and checks for suspension at most once a second,
  reads its command channel in short waits (`subscribe`, `unsubscribe`), answers a caller's mistake without a
  traceback (`handle_exception`), and lets the process's maintenance jobs step aside for a search (`execute_job`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any, ClassVar, cast

from rq import Queue, SimpleWorker
from rq.exceptions import StopRequested
from rq.job import Job
from rq.job_lifecycle import call_exception_handlers
from rq.timeouts import TimerDeathPenalty

from memflow.shared.errors import InvalidInput, NotFound
from memflow.shared.search.foreground import Foreground, frozen_heap

log = logging.getLogger(__name__)
# What a call raises for its caller's mistake: answered to the caller, no error of the worker's.
ANSWERED = (NotFound, InvalidInput)

# Runs one job: its function name, positional and keyword arguments; returns its reply (workers/query.py `serve`).
Serve = Callable[[str, Sequence[Any], dict[str, Any]], Any]


class RpcJob(Job):
    """A job of the query worker: its function name names an RPC of the table, run by the worker's `serve` (with
    its context, as arq and saq hand a job its `ctx`). Nothing is imported by name and no module global holds the
    context; each worker binds its own (`bound_to`)."""

    serve: ClassVar[Serve]

    @classmethod
    def bound_to(cls, serve: Serve) -> type[RpcJob]:
        return type("RpcJob", (cls,), {"serve": staticmethod(serve)})

    def _execute(self) -> Any:
        return type(self).serve(self.func_name or "", self.args, self.kwargs)


# The worker's beat keeps its key for worker_ttl + 60 s; once a second is plenty, and costs a search nothing.
BEAT_EVERY_S = 1.0
# A stop is seen between two dequeue waits (RQ's own: worker_ttl - 15 s, at least 1 s): a process, a test's system,
# stops within this long. An idle worker asks Redis 4 times a second, one blocking pop each: nothing to a server.
DEQUEUE_WAIT_S = 0.25
# RQ's command channel is read in waits this long (RQ's own: 60 s): a stop ends its thread within one.
COMMAND_READ_S = 0.25
# Past one read and RQ's 2 s pause after a lost connection, the command thread is not ending by itself.
COMMAND_JOIN_S = COMMAND_READ_S + 2.5


class Watchdog:
    """One thread that ends jobs that outlive their timeout, for every job of the process. RQ's
    TimerDeathPenalty starts a timer thread per job and waits for it to start: a thread and two handovers of
    the interpreter lock before every search. The thread runs while a query worker works (`running`), and
    ends with the last one, so a stopped worker leaves no thread behind."""

    _current: ClassVar[Watchdog | None] = None
    _users = 0
    _starting: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._due: dict[WatchedDeathPenalty, float] = {}
        self._changed = threading.Condition()
        self._ended = False
        self._thread = threading.Thread(target=self._watch, name="memflow-job-watchdog", daemon=True)
        self._thread.start()

    @classmethod
    @contextmanager
    def running(cls) -> Iterator[None]:
        """The process's watchdog, started by the first worker to enter and ended by the last to leave."""
        with cls._starting:
            if cls._current is None:
                cls._current = Watchdog()
            cls._users += 1
        try:
            yield
        finally:
            with cls._starting:
                cls._users -= 1
                ending = cls._current if cls._users == 0 else None
                if ending is not None:
                    cls._current = None
            if ending is not None:
                ending._end()

    @classmethod
    def current(cls) -> Watchdog | None:
        return cls._current

    def arm(self, penalty: WatchedDeathPenalty, timeout_s: float) -> None:
        with self._changed:
            self._due[penalty] = time.monotonic() + timeout_s
            self._changed.notify()

    def disarm(self, penalty: WatchedDeathPenalty) -> None:
        with self._changed:  # once disarmed, never fired: the check below holds the same lock
            self._due.pop(penalty, None)

    def _end(self) -> None:
        with self._changed:
            self._ended = True
            self._changed.notify()
        self._thread.join()

    def _watch(self) -> None:
        with self._changed:
            while not self._ended:
                now = time.monotonic()
                for penalty in [p for p, due in self._due.items() if due <= now]:
                    del self._due[penalty]
                    self._fire(penalty)
                self._changed.wait(min(self._due.values(), default=now + 60.0) - now)

    @staticmethod
    def _fire(penalty: WatchedDeathPenalty) -> None:
        try:
            penalty.handle_death_penalty()  # type: ignore[no-untyped-call]  # raises the timeout in the job's thread
        except (ValueError, SystemError) as exc:  # the job's thread is gone: nothing left to end
            log.warning("a job outlived its timeout, but its thread could not be told: %s", exc)


class WatchedDeathPenalty(TimerDeathPenalty):
    """TimerDeathPenalty (a job's timeout raised in the thread running it, wherever that thread is) on the
    process's one watchdog thread instead of a new thread per job; RQ's own timer thread when no query
    worker is running one (a job performed outside `QueryWorker.work`)."""

    def setup_death_penalty(self) -> None:
        self._watchdog = Watchdog.current()
        if self._watchdog is None:
            super().setup_death_penalty()  # type: ignore[no-untyped-call]
        elif self._timeout > 0:
            self._watchdog.arm(self, self._timeout)

    def cancel_death_penalty(self) -> None:
        if self._watchdog is None:
            super().cancel_death_penalty()  # type: ignore[no-untyped-call]
        elif self._timeout > 0:
            self._watchdog.disarm(self)


class QueryWorker(SimpleWorker):
    """A SimpleWorker that runs RPC jobs, and can run in a thread and be stopped with an Event. Its searches have
    the process's maintenance jobs step aside (`foreground`: the jobs of the queue named `maintenance`)."""

    # The default death penalty arms SIGALRM, which only the main thread may do; a watchdog
    # thread enforces job timeouts wherever the worker runs.
    death_penalty_class = WatchedDeathPenalty

    def __init__(self, *args: Any, stop: threading.Event | None = None, foreground: Foreground | None = None,
                 maintenance: str | None = None, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._stop_event = stop or threading.Event()
        self._foreground, self._maintenance = foreground or Foreground(), maintenance
        self._beaten_at = self._suspension_checked_at = -BEAT_EVERY_S

    def work(self, *args: Any, **kwargs: Any) -> bool:
        # a full collection walks no model or library (shared/search/foreground.py)
        with Watchdog.running(), frozen_heap():
            return super().work(*args, **kwargs)

    def execute_job(self, job: Job, queue: Queue) -> None:
        """A call a user waits for is in flight from its dequeue to its stored reply: the maintenance jobs of this
        process step aside meanwhile (shared/search/foreground.py). A maintenance job does not wait for itself."""
        if queue.name == self._maintenance:
            return super().execute_job(job, queue)  # type: ignore[no-any-return]
        with self._foreground.serving():
            return super().execute_job(job, queue)  # type: ignore[no-any-return]

    @property
    def dequeue_timeout(self) -> float:  # type: ignore[override]  # RQ's is whole seconds; Redis takes fractions
        return DEQUEUE_WAIT_S

    def handle_exception(self, job: Job, *exc_info: Any) -> None:
        """A call refused for what its caller asked (no such memory, a bad field) is answered to the caller,
        who is told: one line at DEBUG here, not RQ's ERROR with a traceback (a history 404 logged one)."""
        if isinstance(exc_info[1], ANSWERED):
            log.debug("job %s refused: %s: %s", job.id, type(exc_info[1]).__name__, exc_info[1])
            call_exception_handlers(self._exc_handlers, job, *exc_info)
            return
        super().handle_exception(job, *exc_info)

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is threading.main_thread():
            super()._install_signal_handlers()  # type: ignore[no-untyped-call]

    def subscribe(self) -> None:
        """RQ's command channel (`rq` shutdown, stop-job), read by a thread of its own in COMMAND_READ_S waits."""
        self.pubsub = cast(Any, self.connection).pubsub()  # untyped before redis 8.2, typed after: no ignore fits both
        self.pubsub.subscribe(**{self.pubsub_channel_name: self.handle_payload})
        self.pubsub_thread = self.pubsub.run_in_thread(  # type: ignore[assignment]
            sleep_time=COMMAND_READ_S, daemon=True, exception_handler=self._pubsub_exception_handler)

    def unsubscribe(self) -> None:
        """The command thread told to end, then waited for: it ends within one read and closes its connection.
        (RQ unsubscribes first and tells it after: a thread that read the confirmation in between went back to
        waiting for a subscription, RQ gave up on it after 1 s, and it outlived its worker by a minute.)"""
        thread = self.pubsub_thread
        if thread is None:
            return
        thread.stop()
        thread.join(timeout=COMMAND_JOIN_S)
        if thread.is_alive():  # a read that will not end: closing its socket ends it
            log.warning("worker %s: its command thread did not end within %.0f s; closing its connection",
                        self.name, COMMAND_JOIN_S)
            self.pubsub.close()

    def heartbeat(self, timeout: int | None = None, pipeline: Any = None) -> None:
        """RQ's beat, sent at most once a second unless it rides on a pipeline of RQ's: its loop beats three times
        a job (before a dequeue, after it, after the job), each three round trips, all while a search waits."""
        # Called on every turn of RQ's dequeue loop (at most dequeue_timeout apart).
        if self._stop_event.is_set():
            raise StopRequested()
        if pipeline is not None:
            super().heartbeat(timeout, pipeline)
        elif time.monotonic() - self._beaten_at >= BEAT_EVERY_S:
            with self.connection.pipeline(transaction=False) as pipe:
                super().heartbeat(timeout, pipe)
                pipe.execute()
            self._beaten_at = time.monotonic()

    def set_state(self, state: str, pipeline: Any = None) -> None:
        """The state, written once per change: SimpleWorker writes "idle" after a job and its loop again."""
        if pipeline is not None or state != self.get_state():
            super().set_state(state, pipeline)

    def check_for_suspension(self, burst: bool) -> None:
        """`rq suspend` is seen within a second, not before every job (one round trip each)."""
        if time.monotonic() - self._suspension_checked_at >= BEAT_EVERY_S:
            super().check_for_suspension(burst)
            self._suspension_checked_at = time.monotonic()

