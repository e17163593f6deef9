"""What memflow overrides of RQ's internals (workers/rq_adapter.py) and reads of them (shared/sdk/client.py), pinned: each
test fails when RQ changes a method memflow overrides or calls, its signature, or the attribute it reads, so that an
RQ upgrade fails here rather than in a worker that stops answering. pyproject.toml holds RQ to the range these
tests passed on; widening it means running them first. The behaviour of each override is tested where it is cheap
here, and in tests/test_query_worker.py (beats, suspension, stops, timeouts, state)."""

from __future__ import annotations

import inspect
import threading
import uuid
from collections.abc import Callable
from typing import Any

import pytest
import redis
from rq import Queue, SimpleWorker
from rq.exceptions import StopRequested
from rq.job import Job
from rq.job_lifecycle import call_exception_handlers
from rq.results import Result
from rq.serializers import JSONSerializer
from rq.timeouts import BaseDeathPenalty, TimerDeathPenalty
from rq.worker.base import BaseWorker

from memflow.workers.rq_adapter import QueryWorker, RpcJob, WatchedDeathPenalty


def parameters(function: Callable[..., Any]) -> list[str]:
    return list(inspect.signature(function).parameters)


# (RQ's class, the method memflow overrides or calls, its parameters as memflow relies on them)
RELIED_ON = [
    (Job, "_execute", ["self"]),  # RpcJob: a job runs an RPC of the table
    (Job, "perform", ["self"]),  # ... which is what calls it
    (BaseWorker, "_install_signal_handlers", ["self"]),  # QueryWorker: a worker in a thread installs none
    (SimpleWorker, "execute_job", ["self", "job", "queue"]),
    (BaseWorker, "work", ["self", "burst", "logging_level", "date_format", "log_format", "max_jobs", "max_idle_time",
                          "with_scheduler", "dequeue_strategy"]),
    (BaseWorker, "handle_exception", ["self", "job", "exc_info"]),
    (BaseWorker, "subscribe", ["self"]),
    (BaseWorker, "unsubscribe", ["self"]),
    (BaseWorker, "handle_payload", ["self", "message"]),
    (BaseWorker, "_pubsub_exception_handler", ["self", "exc", "pubsub", "pubsub_thread"]),
    (BaseWorker, "heartbeat", ["self", "timeout", "pipeline"]),
    (BaseWorker, "set_state", ["self", "state", "pipeline"]),
    (BaseWorker, "get_state", ["self"]),
    (BaseWorker, "check_for_suspension", ["self", "burst"]),
    (TimerDeathPenalty, "setup_death_penalty", ["self"]),  # WatchedDeathPenalty: one watchdog thread
    (TimerDeathPenalty, "cancel_death_penalty", ["self"]),
    (TimerDeathPenalty, "handle_death_penalty", ["self"]),
    (BaseDeathPenalty, "__enter__", ["self"]),
    (BaseDeathPenalty, "__exit__", ["self", "type", "value", "traceback"]),
]


@pytest.mark.parametrize(("owner", "name", "expected"), RELIED_ON, ids=[f"{o.__name__}.{n}" for o, n, _ in RELIED_ON])
def test_each_method_memflow_overrides_or_calls_is_still_rqs_with_the_same_parameters(
        owner: type, name: str, expected: list[str]) -> None:
    assert name in vars(owner), f"RQ no longer defines {owner.__name__}.{name}"
    assert parameters(getattr(owner, name)) == expected


def test_the_worker_loop_still_ends_on_stop_requested_and_asks_for_the_dequeue_timeout() -> None:
    """QueryWorker stops by raising StopRequested from its beat, and shortens RQ's dequeue wait (a property)."""
    loop = inspect.getsource(BaseWorker.work)
    assert "except StopRequested" in loop and "heartbeat" in inspect.getsource(BaseWorker)
    assert "self.dequeue_timeout" in loop
    assert isinstance(inspect.getattr_static(BaseWorker, "dequeue_timeout"), property)
    assert issubclass(StopRequested, Exception)


def test_rq_calls_the_exception_handlers_as_the_worker_does() -> None:
    assert parameters(call_exception_handlers) == ["handlers", "job", "exc_info"]


def test_the_attributes_the_worker_reads_are_still_set_by_rq(client: redis.Redis) -> None:
    worker = QueryWorker([Queue(f"t-rq-{uuid.uuid4().hex[:8]}", connection=client, serializer=JSONSerializer)],
                         connection=client, serializer=JSONSerializer)
    assert isinstance(worker._exc_handlers, list)
    assert worker.pubsub_thread is None and isinstance(worker.pubsub_channel_name, str)
    assert worker.death_penalty_class is WatchedDeathPenalty


def test_a_death_penalty_still_knows_its_timeout_and_the_thread_it_ends() -> None:
    penalty = WatchedDeathPenalty(3)
    assert (penalty._timeout, penalty._target_thread_id) == (3, threading.get_ident())


def test_the_results_the_client_reads_are_still_where_and_as_it_reads_them() -> None:
    """shared/sdk/client.py reads a call's result off RQ's result stream itself (XREAD, so it can wait on an event
    loop), then restores it with RQ's own `Result.restore`."""
    assert parameters(Result.get_key) == ["job_id"]
    assert str(Result.get_key("j")).endswith("j")  # type: ignore[no-untyped-call]
    assert parameters(Result.restore) == ["job_id", "result_id", "payload", "connection", "serializer"]
    assert Result.Type.SUCCESSFUL and {"exc_string", "return_value", "type"} <= set(inspect.signature(Result).parameters)


def test_a_job_runs_the_rpc_its_function_names_with_the_bound_serve(client: redis.Redis) -> None:
    ran: list[tuple[str, list[Any], dict[str, Any]]] = []
    bound = RpcJob.bound_to(lambda name, args, kwargs: ran.append((name, list(args), kwargs)) or "answered")
    queue = Queue(f"t-rq-{uuid.uuid4().hex[:8]}", connection=client, serializer=JSONSerializer, job_class=bound)
    job = queue.enqueue("memflow.workers.query.health", kwargs={"subject": "ana"})
    assert isinstance(job, bound) and job.perform() == "answered"
    assert ran == [("memflow.workers.query.health", [], {"subject": "ana"})]


def test_a_worker_in_a_thread_installs_no_signal_handlers(client: redis.Redis) -> None:
    """RQ's own install raises there ("signal only works in main thread"); a query worker runs in a thread."""
    worker = QueryWorker([Queue(f"t-rq-{uuid.uuid4().hex[:8]}", connection=client, serializer=JSONSerializer)],
                         connection=client, serializer=JSONSerializer)
    assert in_a_thread(worker._install_signal_handlers) is None
    assert isinstance(in_a_thread(lambda: SimpleWorker._install_signal_handlers(worker)), ValueError)


def in_a_thread(action: Callable[[], object]) -> BaseException | None:
    """What `action` raised when run in a thread of its own (None: nothing)."""
    raised: list[BaseException] = []

    def run() -> None:
        try:
            action()
        except BaseException as exc:  # noqa: BLE001 - whatever it raises is the answer
            raised.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    thread.join()
    return raised[0] if raised else None
