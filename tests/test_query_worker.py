"""The query worker's own costs around a job: RQ's loop beats and checks for `rq suspend` on every job, three and
one Redis round trips each time, and starts a timer thread for its timeout; the worker does the first two at most
once a second and ends jobs that time out from one watchdog thread (a search waits for none of it)."""

from __future__ import annotations

import logging
import threading
import uuid

import pytest
import redis
import rq.worker.base as rq_base
from rq import Queue
from rq.exceptions import StopRequested
from rq.serializers import JSONSerializer
from rq.timeouts import JobTimeoutException

from memflow.workers.rq_adapter import COMMAND_READ_S, DEQUEUE_WAIT_S, QueryWorker, Watchdog, WatchedDeathPenalty
from tests.conftest import wait_for


@pytest.fixture
def worker(client: redis.Redis) -> QueryWorker:
    queue = Queue("t-query-worker", connection=client, serializer=JSONSerializer)
    made = QueryWorker([queue], connection=client, serializer=JSONSerializer, worker_ttl=16)
    made.register_birth()
    return made


def beats(client: redis.Redis, worker: QueryWorker) -> bytes | None:
    return client.hget(worker.key, "last_heartbeat")  # type: ignore[return-value]


def test_a_worker_beats_at_most_once_a_second_between_jobs(worker: QueryWorker, client: redis.Redis) -> None:
    worker.heartbeat()
    first = beats(client, worker)
    for _ in range(5):
        worker.heartbeat()  # RQ's loop: before a dequeue, after it, after the job
    assert beats(client, worker) == first
    assert client.ttl(worker.key) > 16
    with client.pipeline() as pipe:  # a beat RQ adds to a pipeline of its own costs no round trip: always sent
        worker.heartbeat(pipeline=pipe)
        pipe.execute()
    assert beats(client, worker) != first
    worker.register_death()


def test_a_worker_checks_for_suspension_at_most_once_a_second(worker: QueryWorker,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    asked = []
    monkeypatch.setattr(rq_base, "is_suspended", lambda *a: asked.append(1) and False)
    for _ in range(5):
        worker.check_for_suspension(False)
    assert len(asked) == 1
    worker.register_death()


def test_a_stopped_worker_stops_at_its_next_beat(client: redis.Redis) -> None:
    stop = threading.Event()
    worker = QueryWorker([Queue("t-query-worker", connection=client, serializer=JSONSerializer)],
                         connection=client, serializer=JSONSerializer, worker_ttl=16, stop=stop)
    worker.heartbeat()
    stop.set()
    with pytest.raises(StopRequested):
        worker.heartbeat()


def test_a_stop_ends_the_worker_and_its_command_thread_when_that_thread_read_the_unsubscribe_first(
        client: redis.Redis) -> None:
    """RQ reads its command channel (`rq` shutdown, stop-job) on a thread of its own. At a stop RQ unsubscribed,
    then told that thread to end: one that read the confirmation in between went back to a 60 s wait for a
    subscription, RQ gave up on it after 1 s, and it outlived the worker by a minute (in a run of the system tests,
    1 stop in 7). Here the thread reads an unsubscribe before the stop: it ends with the worker all the same."""
    stop = threading.Event()
    worker = QueryWorker([Queue(f"t-stop-{uuid.uuid4().hex[:8]}", connection=client, serializer=JSONSerializer)],
                         connection=client, serializer=JSONSerializer, worker_ttl=16, stop=stop)
    working = threading.Thread(target=worker.work, kwargs={"logging_level": "WARNING"}, daemon=True)
    working.start()
    wait_for(lambda: worker.pubsub_thread is not None, what="the worker to subscribe to its commands")
    commands = worker.pubsub_thread
    worker.pubsub.unsubscribe()
    wait_for(lambda: not worker.pubsub.subscribed, what="the command thread to read the unsubscribe")
    stop.set()
    working.join(timeout=10)
    assert not working.is_alive()
    wait_for(lambda: not commands.is_alive(), timeout_s=2, what="the command thread to end with its worker")


def test_a_worker_blocked_in_its_dequeue_waits_a_fraction_of_a_second_and_stops_after_it(
        client: redis.Redis, caplog: pytest.LogCaptureFixture) -> None:
    """RQ blocks a dequeue worker_ttl - 15 s, at least 1 s, and sees a stop only between two: every stop of a
    process (or of a test's system, ~250 a suite run) waited up to a second. The wait is DEQUEUE_WAIT_S: what
    each dequeue asks Redis for, as RQ logs it, and the worker ends once stopped (no stopwatch: how long a stop
    takes is one dequeue wait, its command thread's read is COMMAND_READ_S)."""
    caplog.set_level(logging.DEBUG, logger="rq.queue")
    stop = threading.Event()
    name = f"t-stop-{uuid.uuid4().hex[:8]}"
    worker = QueryWorker([Queue(name, connection=client, serializer=JSONSerializer)],
                         connection=client, serializer=JSONSerializer, worker_ttl=16, stop=stop)
    working = threading.Thread(target=worker.work, kwargs={"logging_level": "WARNING"}, daemon=True)
    working.start()

    def blocked_in_its_dequeue() -> bool:
        return any(c.get("cmd") in ("blmove", "blpop") and "b" in c.get("flags", "") for c in client.client_list())

    wait_for(blocked_in_its_dequeue, what="the worker to block in its dequeue")
    stop.set()
    working.join(timeout=10)  # a deadline: one that never sees the stop, not a slow one
    assert not working.is_alive()
    waits = [r.getMessage().rsplit(" ", 1)[-1] for r in caplog.records if "operation for" in r.getMessage()
             and name in r.getMessage()]
    assert waits and set(waits) == {str(DEQUEUE_WAIT_S)}, waits
    assert DEQUEUE_WAIT_S < 1 and COMMAND_READ_S < 1  # RQ's: 1 s, and up to 1 s more


def test_a_job_past_its_timeout_is_ended_and_no_job_starts_a_thread() -> None:
    """Job timeouts run on one watchdog thread (RQ's TimerDeathPenalty starts one per job, before every search),
    which ends with the last worker that runs it."""
    def job_threads() -> list[threading.Thread]:
        # The watchdog and RQ's per-job timers, not whatever threads other tests are still ending.
        return [t for t in threading.enumerate() if t.name == "memflow-job-watchdog" or isinstance(t, threading.Timer)]

    # Another test's system may still be stopping in the background under load, its worker holding the watchdog.
    wait_for(lambda: Watchdog.current() is None, timeout_s=60, what="every other query worker to have stopped")
    before = len(job_threads())
    with Watchdog.running():
        threads = len(job_threads())
        assert threads == before + 1
        for _ in range(50):
            with WatchedDeathPenalty(30, JobTimeoutException):
                pass
        assert len(job_threads()) == threads
        # A job that would never end: ended by its 1 s timeout (the message says which), or by this test's own.
        with pytest.raises(JobTimeoutException, match="maximum timeout value \\(1 seconds\\)"):
            with WatchedDeathPenalty(1, JobTimeoutException):
                while True:
                    sum(range(1000))
        assert len(job_threads()) == threads
    assert len(job_threads()) == before


def test_a_worker_writes_its_state_once_per_change(worker: QueryWorker, client: redis.Redis) -> None:
    """RQ's SimpleWorker writes "idle" after each job and again as its loop turns (a round trip each)."""
    worker.set_state("busy")
    worker.set_state("idle")
    client.hset(worker.key, "state", "marked")
    worker.set_state("idle")  # the loop's second "idle": already written
    assert client.hget(worker.key, "state") == b"marked"
    worker.set_state("busy")
    assert client.hget(worker.key, "state") == b"busy"
    worker.register_death()
