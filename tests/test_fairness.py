"""Fairness per key (issue 30, item 2): one tenant's searches cannot hold another's. A key has at most
MEMFLOW_HTTP_KEY_CONCURRENCY requests in flight and MEMFLOW_HTTP_KEY_RATE_PER_S a second (429 with
Retry-After past either; a tool error saying when over /mcp), counted across every server process and both
doors (shared/admission/shares.py), and a process runs MEMFLOW_QUERY_WORKERS search workers, so a key's slow searches
hold some of them, never all.

Real parts: the query stage's workers as `memflow worker` lays them out (workers/system.stage_parts), a real
`memflow serve` with keys, and an LLM planner (the scripted server) that holds key A's searches until the
test lets them go: A's searches are in flight for as long as the test says, without a timing assumption.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import numpy as np
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client
from mcp_types import CallToolResult
from rq.timeouts import JobTimeoutException

from bench.llm_stub import Reply, ScriptedLLM
from memflow.shared.admission.apikeys import KeyStore
from memflow.shared.admission.fairness import Admitted, Limits, Refused, Share, admit, keep_s, renewed, take_stream
from memflow.shared.admission.shares import KeyShares, Place
from memflow.shared.inference.embedder import CHEAP_ENCODE_CHARS, E5Embedder, Embedder, TurnLock
from memflow.shared.redisdb.connections import connect_async
from memflow.shared.redisdb.keys import Keys
from memflow.shared.redisdb.server import RedisServer
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings
from memflow.workers.mcp import SUBJECT_HEADER
from memflow.workers.runtime import Context
from memflow.workers.system import QUERY, Runner, stage_parts
from tests.conftest import wait_for
from tests.test_api import start_serve, stop

# Ambiguous (a reference with no name): the planner asks the LLM, which holds it while the gate is shut.
HELD_QUERY = "What was that project called?"
# Named and plain: no LLM call, answered by the store alone.
PLAIN_QUERY = "Who is my manager?"


@dataclass
class Deployment:
    settings: Settings
    url: str
    llm: ScriptedLLM
    gate: threading.Event
    keys: KeyStore

    def key(self, pattern: str) -> str:
        return self.keys.create(f"k-{uuid.uuid4().hex[:6]}", [pattern], read_only=False, now=datetime.now(UTC))[1]


def held_while_shut(gate: threading.Event) -> Any:
    def script(body: dict[str, Any]) -> Reply:
        if "that project" in json.dumps(body, ensure_ascii=False):
            gate.wait(120)
        return Reply(content="{}")
    return script


@pytest.fixture
def deployment(redis_server: RedisServer, embedder: Embedder, tmp_path: Path) -> Iterator[Deployment]:
    gate = threading.Event()
    with ScriptedLLM(held_while_shut(gate)) as llm:
        settings = Settings(redis_url=redis_server.url, stream_prefix=f"t{uuid.uuid4().hex[:10]}:", data_dir=tmp_path,
                            llm_base_url=llm.url, llm_model="scripted", llm_plan_timeout_s=120.0,
                            search_timeout_s=120.0, rpc_timeout_s=120.0, query_workers=3, http_key_concurrency=2)
        ctx = Context.from_settings(settings, embedder=embedder)
        runner = Runner(stage_parts(ctx, (QUERY,)))
        runner.start()
        url, process = start_serve(settings)
        try:
            yield Deployment(settings, url, llm, gate, KeyStore(ctx.client, ctx.keys))
        finally:
            gate.set()
            stop(process)
            runner.shutdown()
            ctx.close()


def search(url: str, key: str, subject: str, query: str, into: list[httpx.Response] | None = None) -> httpx.Response:
    reply = httpx.post(f"{url}/v1/search", json={"subject": subject, "query": query},
                       headers={"Authorization": f"Bearer {key}"}, timeout=60)
    if into is not None:
        into.append(reply)
    return reply


def test_a_key_flooding_slow_searches_cannot_hold_another_keys_search(deployment: Deployment) -> None:
    a, b = deployment.key("team-a/*"), deployment.key("team-b/*")
    a_replies: list[httpx.Response] = []
    flood = [threading.Thread(target=search, args=(deployment.url, a, "team-a/x", HELD_QUERY, a_replies), daemon=True)
             for _ in range(2)]
    for thread in flood:
        thread.start()
    wait_for(lambda: deployment.llm.in_flight == 2, 60, "key A's two searches to be held in the planner")

    # A third of A's is refused at once: A has its most in flight.
    refused = search(deployment.url, a, "team-a/x", HELD_QUERY)
    assert refused.status_code == 429, refused.text
    assert refused.json()["error"]["code"] == "rate_limited" and int(refused.headers["retry-after"]) >= 1

    # B's search is answered while both of A's are still held (one query worker was all there was: it waited).
    answered = search(deployment.url, b, "team-b/y", PLAIN_QUERY)
    assert answered.status_code == 200 and answered.json()["status"] == "empty", answered.text
    assert deployment.llm.in_flight == 2 and not a_replies, "A's searches were let go before B was answered"

    deployment.gate.set()
    for thread in flood:
        thread.join(60)
    assert [r.status_code for r in a_replies] == [200, 200], [r.text for r in a_replies]
    # Once A's are answered, A is served again: its places were given back.
    assert search(deployment.url, a, "team-a/x", PLAIN_QUERY).status_code == 200


def test_a_key_past_its_rate_is_told_when_to_try_again_by_every_server_process(deployment: Deployment) -> None:
    """The bucket is the key's, not a process's: `memflow serve --workers N` (or N servers behind a balancer)
    gives a key no more than its burst and rate in all."""
    slow = deployment.settings.replace(http_key_rate_per_s=0.01, http_key_burst=2)
    (url, process), (other_url, other) = start_serve(slow), start_serve(slow)
    try:
        a, b = deployment.key("team-a/*"), deployment.key("team-b/*")
        assert [search(u, a, "team-a/x", PLAIN_QUERY).status_code for u in (url, other_url)] == [200, 200]
        for u in (url, other_url):
            over = search(u, a, "team-a/x", PLAIN_QUERY)
            assert over.status_code == 429 and over.json()["error"]["code"] == "rate_limited", over.text
            assert "0.01 requests a second" in over.json()["error"]["message"]
            assert int(over.headers["retry-after"]) >= 1
        # Another key's budget is its own.
        assert search(other_url, b, "team-b/y", PLAIN_QUERY).status_code == 200
    finally:
        stop(process)
        stop(other)


def test_a_keys_places_are_counted_across_server_processes(deployment: Deployment) -> None:
    a, b = deployment.key("team-a/*"), deployment.key("team-b/*")
    other_url, other = start_serve(deployment.settings)
    a_replies: list[httpx.Response] = []
    flood = [threading.Thread(target=search, args=(deployment.url, a, "team-a/x", HELD_QUERY, a_replies), daemon=True)
             for _ in range(2)]
    try:
        for thread in flood:
            thread.start()
        wait_for(lambda: deployment.llm.in_flight == 2, 60, "key A's two searches to be held in the planner")
        refused = search(other_url, a, "team-a/x", PLAIN_QUERY)  # the other process: A has its most in flight
        assert refused.status_code == 429 and "2 requests in flight" in refused.json()["error"]["message"], refused.text
        assert search(other_url, b, "team-b/y", PLAIN_QUERY).status_code == 200
        deployment.gate.set()
        for thread in flood:
            thread.join(60)
        assert [r.status_code for r in a_replies] == [200, 200], [r.text for r in a_replies]
        assert search(other_url, a, "team-a/x", PLAIN_QUERY).status_code == 200  # given back to every process
    finally:
        deployment.gate.set()
        stop(other)


# -- /mcp: the same budget as the API's ---------------------------------------------------------------------


async def recall(url: str, key: str, subject: str, query: str) -> CallToolResult:
    """One `recall` tool call over /mcp of `url`, as the SDK's client makes it."""
    headers = {"Authorization": f"Bearer {key}", SUBJECT_HEADER: subject}
    async with (httpx2.AsyncClient(headers=headers, timeout=60) as http,
                Client(streamable_http_client(f"{url}/mcp", http_client=http)) as client):
        return await client.call_tool("recall", {"query": query})


def text_of(result: CallToolResult) -> str:
    return " ".join(getattr(block, "text", "") for block in result.content)


def test_mcp_tool_calls_count_against_the_keys_budget_with_its_api_requests(deployment: Deployment) -> None:
    """A key flooding /mcp holds no more than through the API, and one budget covers both doors: past it, a
    tool error that says when to try again (a model reads it), never a dropped connection."""
    a, b = deployment.key("team-a/*"), deployment.key("team-b/*")
    url = deployment.url

    async def flood_over_mcp() -> tuple[list[CallToolResult], CallToolResult, int, CallToolResult]:
        held: list[CallToolResult] = []

        async def held_recall() -> None:
            held.append(await recall(url, a, "team-a/x", HELD_QUERY))
        async with anyio.create_task_group() as tasks:
            for _ in range(2):
                tasks.start_soon(held_recall)
            while deployment.llm.in_flight < 2:  # a condition polled, as wait_for does
                await anyio.sleep(0.05)
            third = await recall(url, a, "team-a/x", PLAIN_QUERY)
            over_http = await anyio.to_thread.run_sync(search, url, a, "team-a/x", PLAIN_QUERY)
            other = await recall(url, b, "team-b/y", PLAIN_QUERY)
            deployment.gate.set()
        return held, third, over_http.status_code, other
    held, third, http_status, other = asyncio.run(asyncio.wait_for(flood_over_mcp(), 90))

    assert third.is_error and "2 requests in flight" in text_of(third), text_of(third)
    assert "try again in 1 s" in text_of(third) and "Retry-After: 1" in text_of(third)
    assert http_status == 429  # the API counts the places A holds over /mcp
    assert not other.is_error, text_of(other)  # B's own budget, answered while A's are held
    assert [r.is_error for r in held] == [False, False], [text_of(r) for r in held]


def test_api_requests_in_flight_leave_the_key_no_place_over_mcp(deployment: Deployment) -> None:
    a = deployment.key("team-a/*")
    flood = [threading.Thread(target=search, args=(deployment.url, a, "team-a/x", HELD_QUERY), daemon=True)
             for _ in range(2)]
    for thread in flood:
        thread.start()
    wait_for(lambda: deployment.llm.in_flight == 2, 60, "key A's two searches to be held in the planner")
    refused = asyncio.run(recall(deployment.url, a, "team-a/x", PLAIN_QUERY))
    assert refused.is_error and "rate limited" in text_of(refused) and "try again in" in text_of(refused)
    deployment.gate.set()
    for thread in flood:
        thread.join(60)
    answered = asyncio.run(recall(deployment.url, a, "team-a/x", PLAIN_QUERY))
    assert not answered.is_error, text_of(answered)


def test_the_inspectors_pages_count_against_the_keys_budget(deployment: Deployment) -> None:
    """The inspector's search box is a search too: no third door past a key's limits."""
    a, b = deployment.key("team-a/*"), deployment.key("team-b/*")

    def page(key: str, subject: str) -> httpx.Response:
        return httpx.get(f"{deployment.url}/subjects/{subject}/search", params={"q": PLAIN_QUERY},
                         headers={"Authorization": f"Bearer {key}"}, timeout=60)
    flood = [threading.Thread(target=search, args=(deployment.url, a, "team-a/x", HELD_QUERY), daemon=True)
             for _ in range(2)]
    for thread in flood:
        thread.start()
    wait_for(lambda: deployment.llm.in_flight == 2, 60, "key A's two searches to be held in the planner")
    refused = page(a, "team-a/x")
    assert refused.status_code == 429 and "2 requests in flight" in refused.text, refused.text
    assert refused.headers["retry-after"] == "1"
    assert page(b, "team-b/y").status_code == 200
    deployment.gate.set()
    for thread in flood:
        thread.join(60)
    assert page(a, "team-a/x").status_code == 200


# -- the record in Redis ---------------------------------------------------------------------------------------


def test_a_place_never_given_back_lapses_and_the_record_of_an_idle_key_goes(redis_server: RedisServer) -> None:
    """What a server process that died holding a place leaves: the place lapses with its lease (the key is
    served again), and the key's record expires once it says nothing (no key holds memory for ever)."""
    keys = Keys(prefix=f"t{uuid.uuid4().hex[:10]}:")

    async def scenario() -> tuple[Place | Refused, Place | Refused, float, float, Place | Refused]:
        client = connect_async(redis_server.url, socket_timeout_s=5, max_connections=4)
        dead = KeyShares(client, keys, Limits(concurrency=1, rate_per_s=1000, burst=5, lease_s=3.0))
        alive = KeyShares(client, keys, Limits(concurrency=1, rate_per_s=1000, burst=5, lease_s=3.0))
        try:
            taken = await dead.admit("a")  # never released: its process died
            assert isinstance(taken, Place)
            seconds, micros = await client.time()
            lapses = await client.hget(keys.key_share("a"), f"place:{taken.id}")
            assert lapses is not None
            refused = await alive.admit("a")  # one place, still held (for at most 3 s)
            while isinstance(again := await alive.admit("a"), Refused):  # a condition polled: the lease's end
                await asyncio.sleep(0.05)
            await alive.release(again)
            while await client.exists(keys.key_share("a")):  # the record goes once it says nothing (its TTL)
                await asyncio.sleep(0.05)
            return taken, refused, float(lapses), seconds + micros / 1e6, again
        finally:
            await client.aclose()
    taken, refused, lapses, now, again = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert isinstance(taken, Place) and isinstance(again, Place)
    assert isinstance(refused, Refused) and "1 requests in flight" in refused.reason
    assert 0 < lapses - now <= 3.0  # the server's clock, a lease of 3 s


def test_a_keys_requests_at_once_are_counted_not_refused_for_racing_each_other(redis_server: RedisServer) -> None:
    """32 requests of one key at once in one server process: each read-decide-write of the key's record would
    conflict with the others' (a third of 8 were refused for it); they take their turns, and all are counted."""
    keys = Keys(prefix=f"t{uuid.uuid4().hex[:10]}:")

    async def scenario() -> tuple[list[Place | Refused], int, int]:
        client = connect_async(redis_server.url, socket_timeout_s=5, max_connections=40)
        shares = KeyShares(client, keys, Limits(concurrency=100, rate_per_s=1e6, burst=10**6, lease_s=60.0))
        try:
            taken = await asyncio.gather(*(shares.admit("a") for _ in range(32)))
            held = await shares.in_flight("a")
            await asyncio.gather(*(shares.release(p) for p in taken if isinstance(p, Place)))
            return taken, held, await shares.in_flight("a")
        finally:
            await client.aclose()
    taken, held, after = asyncio.run(asyncio.wait_for(scenario(), 30))
    assert [p for p in taken if isinstance(p, Refused)] == [] and held == 32 and after == 0


def test_a_keys_share_counts_places_refills_with_the_time_given_and_lets_a_lapsed_place_go() -> None:
    limits = Limits(concurrency=2, rate_per_s=1.0, burst=3, lease_s=10.0)

    def take(share: Share | None, place: str, now: float) -> Share:
        decided = admit(share, limits, place, now)
        assert isinstance(decided, Admitted), decided
        return decided.share

    two = take(take(None, "p1", 0.0), "p2", 0.0)
    full = admit(two, limits, "p3", 0.0)
    assert isinstance(full, Refused) and "2 requests in flight" in full.reason and full.retry_after_s == 1
    one = Share(two.tokens, two.at_s, {"p2": two.places["p2"]})  # p1 given back
    assert isinstance(admit(one, limits, "p3", 0.0), Admitted)  # the third of a burst of three
    empty = Share(0.0, 0.0)  # every token spent, every place given back
    over = admit(empty, limits, "p4", 0.25)
    assert isinstance(over, Refused) and over.retry_after_s == 1 and "rate of 1 requests a second" in over.reason
    held = take(take(empty, "p4", 1.0), "p5", 2.0)  # a token a second; neither place is given back
    assert isinstance(admit(held, limits, "p6", 10.5), Refused)  # both live
    assert isinstance(admit(held, limits, "p6", 11.0), Admitted)  # p4 lapsed: its process died
    # Another process read the clock a little earlier: the bucket does not refill backwards.
    assert take(Share(2.0, 2.0), "p6", 1.5) == Share(1.0, 2.0, {"p6": 12.0})
    assert keep_s(held, limits) == 10.0  # p5 lapses at 12; the bucket is full at 2 + 3 s


def test_a_keys_streams_take_places_that_lapse_unless_renewed_and_a_counted_away_one_is_not_renewed() -> None:
    two = take_stream({"s1": 10.0}, 2, "s2", 1.0, 9.0)
    assert two == {"s1": 10.0, "s2": 10.0}
    full = take_stream(two, 2, "s3", 5.0, 9.0)
    assert isinstance(full, Refused) and "2 streams open" in full.reason
    assert renewed(two, "s1", 5.0, 9.0) == {"s1": 14.0, "s2": 10.0}  # s1's loop made progress; s2's did not
    after = take_stream({"s1": 14.0, "s2": 10.0}, 2, "s3", 10.0, 9.0)  # s2 lapsed: its process died
    assert after == {"s1": 14.0, "s3": 19.0}
    assert renewed(after, "s2", 10.5, 9.0) is None  # counted away: that stream ends rather than overcount


def test_the_search_timeout_is_what_a_caller_waits_and_a_search_past_it_still_holds_its_keys_place(
        deployment: Deployment) -> None:
    """MEMFLOW_SEARCH_TIMEOUT_S, not the 120 s RPC timeout of these settings: a search held in the planner is
    answered `failed` (504 over HTTP) once it has passed, by the server and by the SDK alike. The worker is
    still running it: the key's place stays taken until the worker is done, so a key cannot take every worker
    by giving up on its searches and sending new ones."""
    short = deployment.settings.replace(search_timeout_s=2.0)
    url, process = start_serve(short)
    try:
        a = deployment.key("team-a/*")
        for _ in range(2):  # answered within `search`'s 60 s deadline: the 120 s RPC timeout was not waited
            reply = search(url, a, "team-a/x", HELD_QUERY)
            assert reply.status_code == 504 and reply.json()["status"] == "failed", reply.text
            assert reply.json()["code"] == "timeout" and "within 2.0 s" in reply.text, reply.text
        assert deployment.llm.in_flight == 2  # both still in a worker's hands
        refused = search(url, a, "team-a/x", PLAIN_QUERY)
        assert refused.status_code == 429 and "2 requests in flight" in refused.json()["error"]["message"]

        found = MemoryClient(short).search("team-a/x", HELD_QUERY)  # its own deadline is the one it names
        assert found.status == "failed" and "within 2.0 s" in (found.error or ""), found

        deployment.gate.set()  # the workers finish A's searches: its places are given back
        wait_for(lambda: search(url, a, "team-a/x", PLAIN_QUERY).status_code == 200, 60, "A's places back")
    finally:
        stop(process)


def test_a_recall_past_the_search_timeout_still_holds_its_keys_place_over_mcp(deployment: Deployment) -> None:
    """As over HTTP: a recall its tool call gave up on (MEMFLOW_SEARCH_TIMEOUT_S) keeps the key's place until
    the worker is done with it, so a key cannot take every worker by letting its recalls time out."""
    short = deployment.settings.replace(search_timeout_s=2.0)
    url, process = start_serve(short)
    try:
        a = deployment.key("team-a/*")
        for _ in range(2):
            timed_out = asyncio.run(recall(url, a, "team-a/x", HELD_QUERY))
            assert timed_out.is_error and "memory unavailable" in text_of(timed_out), text_of(timed_out)
        assert deployment.llm.in_flight == 2  # both still in a worker's hands
        refused = asyncio.run(recall(url, a, "team-a/x", PLAIN_QUERY))
        assert refused.is_error and "2 requests in flight" in text_of(refused), text_of(refused)

        deployment.gate.set()  # the workers finish A's recalls: its places are given back
        wait_for(lambda: not asyncio.run(recall(url, a, "team-a/x", PLAIN_QUERY)).is_error, 60, "A's places back")
    finally:
        stop(process)


def test_the_encoder_goes_to_the_cheapest_waiter_and_a_waiter_ended_by_its_deadline_only_leaves() -> None:
    lock, entered = TurnLock(), []
    waiting = threading.Semaphore(0)

    def enter(name: str, cost: int) -> None:
        waiting.release()
        try:
            with lock.turn(cost):
                entered.append(name)
        except JobTimeoutException:
            entered.append(f"{name} ended")

    holding = lock.turn(4000)  # a long encode holds the encoder
    holding.__enter__()
    threads = {}
    for name, cost in (("long", 4000), ("doomed", 10), ("short", 40), ("longer", 8000)):
        threads[name] = threading.Thread(target=enter, args=(name, cost), daemon=True)
        threads[name].start()
        waiting.acquire()
        wait_for(lambda: len(lock._waiting) == len(threads), 10, f"{name} to wait")
    # The watchdog ends a search past its deadline with an exception raised in its thread, here while it waits.
    assert ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(threads["doomed"].ident or 0),
                                                     ctypes.py_object(JobTimeoutException)) == 1
    with lock._changed:
        lock._changed.notify_all()  # wakes it to raise
    wait_for(lambda: entered == ["doomed ended"], 10, "the doomed waiter to end")
    holding.__exit__(None, None, None)
    for thread in threads.values():
        thread.join(10)
    # The short search went before the long ones that asked first; the long ones in the order they asked.
    assert entered == ["doomed ended", "short", "long", "longer"]
    with lock.turn(1):  # and the lock is free again
        pass


def test_a_long_encode_passed_over_too_often_goes_next() -> None:
    lock = TurnLock()
    lock._waiting, lock._passes = {0: 9000, 5: 10}, {0: TurnLock.MAX_PASSES, 5: 0}
    assert lock._next() == 0
    lock._passes[0] = TurnLock.MAX_PASSES - 1
    assert lock._next() == 5


# -- e5: a one-line search beside a long encode ----------------------------------------------------------------

ONE_LINE = "who is my manager?"
# A query at the API's cap (~512 tokens): about a second of e5 on this machine, and another tenant's to send.
LONG = " ".join(["my colleague Anna planned the Lisbon offsite with the finance team last spring"] * 40)


def test_a_one_line_search_is_encoded_beside_a_long_encode_never_behind_it(e5: E5Embedder) -> None:
    """Key B's search waited for key A's long encode in progress (p50 1.5 s under A's flood, bench/RESULTS.md):
    a cheap encode has a lane of its own, so it waits for at most another cheap one."""
    assert len(ONE_LINE) <= CHEAP_ENCODE_CHARS < len(LONG)
    alone = e5.encode_queries([ONE_LINE])[0]
    done: list[list[float]] = []
    with e5._lock.turn(len(LONG)):  # a long encode holds the encoder
        threading.Thread(target=lambda: done.extend(e5.encode_queries([ONE_LINE])), daemon=True).start()
        wait_for(lambda: done, 30, "the one-line encode while a long one is in progress")
    assert done == [alone]


def test_one_cheap_and_one_expensive_encode_run_at_once_each_lane_in_turn() -> None:
    lock, entered = TurnLock(cheap_lane=100), []

    def enter(name: str, cost: int) -> None:
        with lock.turn(cost):
            entered.append(name)
    with lock.turn(4000), lock.turn(50):  # both lanes busy
        threads = [threading.Thread(target=enter, args=(n, c), daemon=True) for n, c in (("long", 5000), ("cheap", 60))]
        for thread in threads:
            thread.start()
        wait_for(lambda: len(lock._waiting) == 2, 10, "both to wait, each for its own lane")
        assert entered == []
    for thread in threads:
        thread.join(10)
    assert sorted(entered) == ["cheap", "long"]
    with lock.turn(4000):  # the cheap lane is free while the expensive one is held
        enter("cheap again", 60)
    assert entered[-1] == "cheap again"


def test_encodes_run_at_once_give_the_vectors_they_give_alone(e5: E5Embedder) -> None:
    """The lanes run two calls of the engine at once: each allocates its own buffers and only reads the model."""
    alone = {ONE_LINE: e5.encode_queries([ONE_LINE])[0], LONG: e5.encode_queries([LONG])[0]}
    got: dict[str, list[list[float]]] = {ONE_LINE: [], LONG: []}

    def encode(text: str, times: int) -> None:
        for _ in range(times):
            got[text] += e5.encode_queries([text])
    threads = [threading.Thread(target=encode, args=(LONG, 2)), threading.Thread(target=encode, args=(ONE_LINE, 20))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    for text, vectors in got.items():
        assert vectors and all(np.allclose(v, alone[text], atol=1e-6) for v in vectors), text
