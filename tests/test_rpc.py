"""The query worker's calls (issue 15, typed RPC): one table, a handler per call, a context per worker.

On the real Redis and store: the client and the worker are built from `shared.sdk.rpc.RPCS`; a job is
validated by the worker whoever enqueued it; two workers in one process answer each with its own
context (a module global once made the last one built answer for both).
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from memflow.pipeline.models import Tier
from memflow.shared.errors import InvalidInput, RpcError
from memflow.shared.inference.embedder import Embedder
from memflow.shared.sdk.rpc import INSPECT, RPCS, RUN_JOB, WORKERS_MODULE, InspectReport, RunJobRequest, request_of
from memflow.shared.settings import Settings
from tests.conftest import System, run_cli, start_system

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def remember(system: System, subject: str, text: str) -> None:
    system.client.write(subject, text, ts=T0)
    assert system.client.wait_idle(timeout_s=60)


def test_every_call_of_the_table_has_one_handler_of_its_types() -> None:
    from memflow.workers.query import HANDLERS

    assert set(HANDLERS) == set(RPCS)
    assert all(HANDLERS[name].rpc is rpc for name, rpc in RPCS.items())
    assert all(rpc.job_name == f"{WORKERS_MODULE}.{name}" for name, rpc in RPCS.items())


def test_a_scheduled_firing_is_a_run_job_request() -> None:
    """The scheduler names the job and its fields positionally (scheduler/firings.py); the worker reads them
    as the same request the client sends by name."""
    from memflow.scheduler.firings import RUN_JOB as SCHEDULED

    assert RUN_JOB.job_name == SCHEDULED
    fired = request_of(RUN_JOB, ["decay", None, T0.isoformat(), False], {"tier": "short_term"})
    assert fired == RunJobRequest(name="decay", now=T0, tier=Tier.short_term)


def test_two_workers_in_one_process_answer_each_with_its_own_context(settings: Settings, embedder: Embedder,
                                                                     tmp_path_factory: pytest.TempPathFactory) -> None:
    other = settings.replace(stream_prefix=settings.redis.stream_prefix + "b:",
                             data_dir=tmp_path_factory.mktemp("b"))
    first, second = start_system(settings, embedder), start_system(other, embedder)
    try:
        remember(first, "ann", "Remember: my locker code word is heron.")
        remember(second, "ann", "Remember: my bike is called Comet.")
        for system, word in ((first, "heron"), (second, "Comet")):
            said = [m.content for m in system.client.inspect("ann").memories]
            assert said and all(word in c for c in said), said
    finally:
        second.shutdown()
        first.shutdown()


def test_a_call_is_typed_both_ways(system: System) -> None:
    remember(system, "ann", "Remember: my locker code word is heron.")
    report = system.client.call(INSPECT, subject="ann", now=T0)
    assert isinstance(report, InspectReport) and report.now == T0
    assert [m.content for m in report.memories if "heron" in m.content]
    with pytest.raises(InvalidInput) as refused:  # refused before anything is enqueued
        system.client.call(INSPECT, subject="ann", now=T0, colour="blue")
    assert refused.value.field == "colour"


def test_the_worker_refuses_a_job_that_is_no_call_or_no_request(system: System) -> None:
    with pytest.raises(RpcError, match="no RPC"):
        system.client._call("drop_everything", "ann")
    with pytest.raises(RpcError, match="history takes at most 3"):
        system.client._call("history", "00000000-0000-4000-8000-000000000000", None, None, "extra")
    with pytest.raises(RpcError, match="memory_ids"):
        system.client._call("feedback", fields={"subject": "ann", "memory_ids": "not a list"})


def test_a_handlers_error_reaches_the_client_as_rpc_error(system: System) -> None:
    nowhere = "00000000-0000-4000-8000-000000000000"
    with pytest.raises(RpcError) as raised:
        system.client.history(nowhere, subject="ann")
    assert raised.value.kind == "NotFound"
    # What an SDK user reads is the error in one line; the worker's traceback is kept apart, for a debug log.
    assert str(raised.value) == f"history: no memory {nowhere} for subject ann"
    assert "Traceback" in (raised.value.worker_traceback or "")


def test_the_cli_prints_typed_replies_as_json(system: System, monkeypatch: pytest.MonkeyPatch) -> None:
    remember(system, "fran", "Remember: my locker code word is heron.")
    shown = json.loads(run_cli(system, monkeypatch, "inspect", "fran", "--json"))
    assert shown == system.client.inspect("fran").model_dump(mode="json") | {"now": shown["now"]}
    forgot = json.loads(run_cli(system, monkeypatch, "forget", "fran", "--contains", "heron", "--verify", "--json"))
    assert forgot["count"] >= 1 and forgot["verify"]["verified"] is True
    assert forgot["verify"]["ids"] == forgot["ids"]
