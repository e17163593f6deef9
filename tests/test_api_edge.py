"""The HTTP API's bounds under load (docs/conventions.md#bounded-at-the-edge, issue 29 item 8): a route waiting for the query worker
holds no thread, `/healthz` answers whatever the other routes wait for, and past its bound the API
refuses at once (503, Retry-After) rather than queueing.

Each test serves an API on a prefix of its own that no query worker serves at first (the slowest
query worker there is), fills it with searches, probes it, then starts a query worker that answers
them all.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
from rq import Queue

from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.connections import client_socket_timeout_s, connect
from memflow.shared.redisdb.server import RedisServer
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings
from tests.conftest import System, start_system, wait_for
from tests.test_api import start_serve, stop

FLOOD = 200
# Deadlines, not bounds: a /healthz or a refusal held behind the flood waits as long as its searches (120 s, the
# settings below), one answered at once (its own RPC waits 2 s at most) is well within these. Figures of how
# fast are `memflow bench http`'s.
HEALTH_DEADLINE_S = 30.0
REFUSAL_DEADLINE_S = 30.0


def lonely(redis_server: RedisServer, tmp_path: Path, **extra: Any) -> Settings:
    """Settings of a prefix of its own; a search waits long for its answer (the flood must still be waiting
    when the probes run)."""
    return Settings(redis_url=redis_server.url, stream_prefix=f"t{uuid.uuid4().hex[:10]}:", data_dir=tmp_path,
                    reclaim_idle_ms=300, block_ms=50, search_timeout_s=120.0, rpc_timeout_s=120.0, **extra)


def waiting_searches(settings: Settings) -> int:
    """Searches enqueued for a query worker and not yet taken."""
    return Queue(settings.keys.query_queue, connection=connect(settings.redis.url or "")).count


class Flood:
    """`n` clients searching at once from a thread of their own (an asyncio loop of httpx clients)."""

    def __init__(self, url: str, n: int) -> None:
        self.replies: list[httpx.Response | BaseException] = []
        self._thread = threading.Thread(target=asyncio.run, args=(self._all(url, n),), daemon=True)
        self._thread.start()

    async def _all(self, url: str, n: int) -> None:
        limits = httpx.Limits(max_connections=n + 10)
        async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as http:
            self.replies = await asyncio.gather(
                *(http.post("/v1/search", json={"subject": f"flood-{i}", "query": "what do I drink?"})
                  for i in range(n)), return_exceptions=True)

    def done(self, timeout_s: float) -> list[httpx.Response | BaseException]:
        self._thread.join(timeout_s)
        assert not self._thread.is_alive(), "the flood was never answered"
        return self.replies


def get_within(url: str, deadline_s: float) -> httpx.Response:
    """GET `url`, failing (not hanging) if no answer comes within the deadline."""
    try:
        return httpx.get(url, timeout=deadline_s)
    except httpx.TimeoutException:
        pytest.fail(f"{url} did not answer within {deadline_s} s: held behind the waiting searches")


def stopped(process: subprocess.Popen[str]) -> None:
    """Stop the server; killed if requests it still waits on keep it from stopping (a failed test)."""
    try:
        stop(process)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


@pytest.fixture
def workers() -> Iterator[list[System]]:
    """Query workers a test starts: shut down when it ends."""
    started: list[System] = []
    yield started
    for system in started:
        system.shutdown()


def test_healthz_and_a_search_are_answered_while_200_searches_wait_on_a_slow_query_worker(
        redis_server: RedisServer, embedder: Embedder, tmp_path: Path, workers: list[System]) -> None:
    settings = lonely(redis_server, tmp_path)
    url, process = start_serve(settings, "--no-auth")
    try:
        flood = Flood(url, FLOOD)
        # A sync route held one of AnyIO's 40 threads per waiting search: past 40, nothing else ran.
        wait_for(lambda: waiting_searches(settings) >= 40, 60, "the flood to reach the query queue")
        health = get_within(f"{url}/healthz", HEALTH_DEADLINE_S)
        assert health.status_code == 503 and health.json()["query_workers"] == 0, health.text
        assert health.json()["redis"] == "ok"
        # Every search of the flood waits for the worker, none holding a thread.
        wait_for(lambda: waiting_searches(settings) >= FLOOD, 60, f"all {FLOOD} searches to be enqueued")

        # The query worker arrives: a search from another client is answered, and so is the whole flood.
        workers.append(start_system(settings, embedder, stages=(), query=True))
        probe = httpx.post(f"{url}/v1/search", json={"subject": "probe", "query": "anything"}, timeout=60)
        assert probe.status_code == 200 and probe.json()["status"] == "empty", probe.text
        replies = flood.done(120)
        statuses = [r.status_code if isinstance(r, httpx.Response) else repr(r) for r in replies]
        assert statuses == [200] * FLOOD, {str(s) for s in statuses}
    finally:
        stopped(process)


def test_past_its_bound_the_api_refuses_at_once_with_retry_after_and_healthz_still_answers(
        redis_server: RedisServer, embedder: Embedder, tmp_path: Path, workers: list[System]) -> None:
    settings = lonely(redis_server, tmp_path, http_max_requests=3)
    url, process = start_serve(settings, "--no-auth")
    try:
        flood = Flood(url, 3)
        wait_for(lambda: waiting_searches(settings) >= 3, 60, "three searches to wait for a query worker")
        try:
            refused = httpx.post(f"{url}/v1/search", json={"subject": "one-more", "query": "q"},
                                 timeout=REFUSAL_DEADLINE_S)
        except httpx.TimeoutException:
            pytest.fail("a request past the bound was queued, not refused")
        assert refused.status_code == 503, refused.text
        assert refused.json()["error"]["code"] == "busy" and int(refused.headers["retry-after"]) >= 1
        assert waiting_searches(settings) == 3  # refused before it reached the queue: nothing of it waits
        health = get_within(f"{url}/healthz", HEALTH_DEADLINE_S)
        assert health.json()["redis"] == "ok"
        # Nothing lingers: once the worker answers, the next search is served.
        workers.append(start_system(settings, embedder, stages=(), query=True))
        assert [r.status_code for r in flood.done(60) if isinstance(r, httpx.Response)] == [200] * 3
        after = httpx.post(f"{url}/v1/search", json={"subject": "one-more", "query": "q"}, timeout=60)
        assert after.status_code == 200, after.text
    finally:
        stopped(process)


# -- every client connection has a socket timeout ------------------------------------------------


@pytest.fixture
def silent_server() -> Iterator[str]:
    """A server that accepts connections and never says a word (paused, wedged, half-open)."""
    listener = socket.create_server(("127.0.0.1", 0))
    held: list[socket.socket] = []
    closing = threading.Event()

    def accept() -> None:
        while not closing.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                return
    threading.Thread(target=accept, daemon=True).start()
    yield f"redis://127.0.0.1:{listener.getsockname()[1]}/0"
    closing.set()
    listener.close()
    for connection in held:
        connection.close()


def test_a_client_of_a_server_that_stopped_answering_raises_within_its_socket_timeout(
        silent_server: str, tmp_path: Path) -> None:
    settings = Settings(redis_url=silent_server, data_dir=tmp_path, socket_timeout_s=0.5, connect_timeout_s=0.5)
    bound_s = client_socket_timeout_s(settings)
    raised: list[BaseException] = []

    def open_client() -> None:
        try:
            MemoryClient(settings).redis.ping()
        except BaseException as exc:  # noqa: BLE001 - what it raised is the test's to judge
            raised.append(exc)
    attempt = threading.Thread(target=open_client, daemon=True)
    attempt.start()
    attempt.join(2 * bound_s + 5)  # the version check's INFO (its timeout passed over: checked next time), the PING
    assert not attempt.is_alive(), f"the client still waits on a silent server after {2 * bound_s + 5:.1f} s"
    # Connected, then no answer: the read's timeout ended it (a connect timeout would say "connecting").
    assert len(raised) == 1 and isinstance(raised[0], redis.TimeoutError), raised
    assert "reading" in str(raised[0]), raised
