"""`memflow bench http`: what the HTTP front door costs, measured beside what it stands on.

- search, the same queries over the same store (`size` memories in one subject), each query asked
  four ways in turn so that a noisy moment hits all four alike: the store alone (one encode + one
  hybrid query: the physical limit), the query worker's handler called in-process, `MemoryClient`
  (RPC over RQ), and `POST /v1/search` on a real `memflow serve` (a uvicorn process, a key checked
  on every request). The HTTP layer's cost is HTTP − MemoryClient, per query (the median of the
  paired differences), and again on a subject with no memories, where the search itself is cheap
  and the layer's cost is not lost in a 70 ms search's noise.
- writes: `POST /v1/events` from `clients` concurrent clients (threads, one keep-alive connection
  each), one event per request and batches, with one server process and with two (`--workers 2`),
  next to `MemoryClient.publish` from as many threads (the same XADDs without HTTP). They publish
  to a prefix no stage reads, so the figure is the API's own capacity, not the pipeline's; the CPU
  seconds the server processes spent per request say what limits it.
- refusals: what the refusals made before any item is looked at take (a 1 MB batch of 330,000 items by a
  read-only key and by one that may write, a query past what the encoders read): milliseconds, where
  validating the items first took 15 s (tests/test_api_cost.py checks the order, this the figure).
- two tenants (`--tenants-only`: these alone): key B's search p50/p99 idle, then while key A floods with the
  longest queries, and while key A loops on exporting its subject with vectors, on importing that export back,
  and on posting a 16 MiB import refused at its last line, each with its ratio to idle (issue 38: within 3×).
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx

from memflow.bench.perf import (
    AT,
    NAMES,
    NOUNS,
    _search_in_process,
    bulk_load,
    machine,
    pct_ms,
    run_embedded,
    say,
    timed,
)
from memflow.pipeline import export
from memflow.pipeline.export import End, Record
from memflow.pipeline.models import Dir, Memory, MType, SearchRequest, Source
from memflow.pipeline.tokens import MAX_QUERY_TOKENS, approximate_tokens
from memflow.shared.admission.apikeys import KeyStore
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings, to_env
from memflow.workers.embedded import Embedded
from memflow.workers.query import search as search_in_process

SUBJECT = "bench-search"


def free_port() -> int:
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextmanager
def listening(args: list[str], probe: str, env: dict[str, str] | None = None) -> Iterator[int]:
    """A server process (`python -m ARGS`), once `probe` answers: its pid; stopped at the end."""
    process = subprocess.Popen([sys.executable, "-m", *args], env=env, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                httpx.get(probe, timeout=1)
                break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline or process.poll() is not None:
                raise SystemExit(f"{' '.join(args)} did not start")
            time.sleep(0.05)
        yield process.pid
    finally:
        process.terminate()
        process.wait(timeout=20)


@contextmanager
def serving(settings: Settings, workers: int = 1) -> Iterator[tuple[str, int]]:
    """A real `memflow serve` for `settings` on a free port (`workers` processes): its URL and pid."""
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    with listening(["memflow.workers.cli", "serve", "--port", str(port), "--workers", str(workers)],
                   f"{url}/openapi.json", {**os.environ, **to_env(settings), "MEMFLOW_LOG_LEVEL": "WARNING"}) as pid:
        yield url, pid


def cpu_s(pid: int) -> float:
    """User + system CPU seconds a process and its children (the server processes of --workers) have used."""
    total = 0.0
    for p in [pid, *_children(pid)]:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return total


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


# -- search ------------------------------------------------------------------------------------


def bench_search(system: Embedded, http: httpx.Client, size: int, queries: int) -> dict[str, Any]:
    bulk_load(system, SUBJECT, size)
    rng = random.Random(size)
    texts = [f"what did {rng.choice(NAMES)} do with the {rng.choice(NOUNS)}" for _ in range(queries)]
    when = AT + timedelta(days=1)
    ways: dict[str, Callable[[str], object]] = {
        "store_limit": lambda t: _search_in_process(system, SUBJECT, t),
        "in_process": lambda t: search_in_process(system.ctx, SearchRequest(subject=SUBJECT, query=t, k=5, now=when)),
        "client": lambda t: system.client.search(SUBJECT, t, 5, now=when),
        "http": lambda t: _http_search(http, t, when),
    }
    for t in texts[:20]:  # warm every path (connections, caches) before counting
        for way in ways.values():
            way(t)
    took: dict[str, list[float]] = {name: [] for name in ways}
    for t in texts:
        for name, way in ways.items():
            took[name].append(timed(lambda w=way, t=t: w(t)))  # type: ignore[misc]
    out: dict[str, Any] = {"memories": size, "queries": queries}
    for name, values in took.items():
        out[name] = {"p50_ms": pct_ms(values, .5), "p95_ms": pct_ms(values, .95)}
    out["http_overhead_p50_ms"] = pct_ms([h - c for h, c in zip(took["http"], took["client"], strict=True)], .5)
    out["empty_subject"] = overhead_on_empty(system, http, texts, when)
    return out


def overhead_on_empty(system: Embedded, http: httpx.Client, texts: list[str], when: datetime) -> dict[str, Any]:
    """The same comparison on a subject with no memories: the RPC is as cheap as it gets."""
    took: dict[str, list[float]] = {"client": [], "http": []}
    for t in texts:
        took["client"].append(timed(lambda t=t: system.client.search("bench-empty", t, 5, now=when)))  # type: ignore[misc]
        took["http"].append(timed(lambda t=t: _http_search(http, t, when, "bench-empty")))  # type: ignore[misc]
    out: dict[str, Any] = {name: {"p50_ms": pct_ms(v, .5), "p95_ms": pct_ms(v, .95)} for name, v in took.items()}
    out["http_overhead_p50_ms"] = pct_ms([h - c for h, c in zip(took["http"], took["client"], strict=True)], .5)
    return out


def _http_search(http: httpx.Client, text: str, when: datetime, subject: str = SUBJECT) -> None:
    reply = http.post("/v1/search", json={"subject": subject, "query": text, "k": 5, "now": when.isoformat()})
    if reply.status_code != 200 or reply.json()["status"] == "failed":
        raise SystemExit(f"search over HTTP failed: {reply.status_code} {reply.text[:300]}")


# -- the floor of an HTTP round trip ---------------------------------------------------------------


async def bare_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
    """An ASGI app that reads the body and answers 202 with a constant: uvicorn and httpx alone."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 202, "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": b'{"ids": ["0-1"]}'})


@contextmanager
def bare_server() -> Iterator[str]:
    port = free_port()
    with listening(["uvicorn", "memflow.bench.api:bare_app", "--port", str(port), "--log-level", "warning"],
                   f"http://127.0.0.1:{port}/"):
        yield f"http://127.0.0.1:{port}"


def bench_round_trip(url: str, key: str, client: MemoryClient, n: int) -> dict[str, Any]:
    """One event at a time, p50: `MemoryClient.publish`, `POST /v1/events`, and the same POST to a bare
    uvicorn app (the floor: what HTTP costs here before memflow does anything)."""
    with bare_server() as bare, httpx.Client(base_url=bare) as floor, \
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}) as http:
        ways: dict[str, Callable[[int], object]] = {
            "client_publish": lambda i: client.publish(event(0, i)),
            "http": lambda i: http.post("/v1/events", json=event(0, i)),
            "bare_http_floor": lambda i: floor.post("/", json=event(0, i))}
        took: dict[str, list[float]] = {name: [] for name in ways}
        for i in range(n):
            for name, way in ways.items():
                took[name].append(timed(lambda w=way, i=i: w(i)))  # type: ignore[misc]
    return {name: pct_ms(values, .5) for name, values in took.items()}


# -- writes -------------------------------------------------------------------------------------


def event(i: int, n: int = 0) -> dict[str, Any]:
    return {"event_id": f"load-{i}-{n}-{uuid.uuid4().hex[:8]}", "subject": f"load-{i % 50}", "session_id": "s",
            "kind": "message", "role": "user", "text": f"turn {n}: I moved the meeting to Friday at {n % 12} pm.",
            "ts": (AT + timedelta(seconds=n)).isoformat()}


def concurrently(clients: int, per_client: int, work: Callable[[int, int], object]) -> float:
    """Run work(client, n) per_client times on each of `clients` threads; the wall seconds taken."""
    start = threading.Barrier(clients + 1)

    def run(c: int) -> None:
        start.wait()
        for n in range(per_client):
            work(c, n)
    threads = [threading.Thread(target=run, args=(c,)) for c in range(clients)]
    for t in threads:
        t.start()
    start.wait()
    began = time.perf_counter()
    for t in threads:
        t.join()
    return time.perf_counter() - began


def bench_writes(url: str, pid: int, key: str, client: MemoryClient, clients: int, requests: int,
                 batch: int) -> dict[str, Any]:
    per = max(1, requests // clients)
    https = [httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30)
             for _ in range(clients)]

    def one(c: int, n: int) -> None:
        if https[c].post("/v1/events", json=event(c, n)).status_code != 202:
            raise SystemExit("POST /v1/events refused")

    def many(c: int, n: int) -> None:
        if https[c].post("/v1/events", json=[event(c, n * batch + j) for j in range(batch)]).status_code != 202:
            raise SystemExit("POST /v1/events (batch) refused")
    try:
        concurrently(clients, 20, one)  # warm the connections
        cpu_before = cpu_s(pid)
        single_s = concurrently(clients, per, one)
        cpu_single = cpu_s(pid) - cpu_before
        batches = max(1, per // 10)
        batch_s = concurrently(clients, batches, many)
    finally:
        for h in https:
            h.close()
    sdk_s = concurrently(clients, per, lambda c, n: client.publish(event(c, n)))
    n = clients * per
    return {"clients": clients, "requests": n,
            "http_requests_per_s": round(n / single_s, 1),
            "serve_cpu_ms_per_request": round(cpu_single / n * 1000, 3),
            "serve_cpu_share": round(cpu_single / single_s, 2),
            "http_batch": batch, "http_batched_events_per_s": round(clients * batches * batch / batch_s, 1),
            "client_publish_per_s": round(n / sdk_s, 1)}


# -- what a refusal costs ----------------------------------------------------------------------------

# 330,000 empty objects in 990 KB (under the 1 MB body limit): validated one by one, they took 15 s (issue 30).
HUGE_BATCH = b"[" + b",".join([b"{}"] * 330_000) + b"]"


def bench_refusals(url: str, writer: str, reader: str, tries: int = 5) -> dict[str, float]:
    """p50 ms of the refusals that come before any item is looked at: the huge batch by a read-only key (403)
    and by one that may write (413, the count), and a query past what the encoders read (422)."""
    huge = {"content": HUGE_BATCH, "headers": {"content-type": "application/json"}}
    query = {"json": {"subject": "bench-refused", "query": " ".join(["coffee"] * 2_000)}}
    ways: dict[str, tuple[str, str, dict[str, Any], int]] = {
        "huge_batch_read_only_key": (reader, "/v1/events", huge, 403),
        "huge_batch_count": (writer, "/v1/events", huge, 413),
        "query_past_the_encoders": (writer, "/v1/search", query, 422)}
    took: dict[str, float] = {}
    for name, (key, path, body, code) in ways.items():
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
            def refused(path: str = path, body: dict[str, Any] = body, code: int = code) -> None:
                if http.post(path, **body).status_code != code:
                    raise SystemExit(f"POST {path}: not refused with {code}")
            took[name] = pct_ms([timed(refused) for _ in range(tries)], .5)
    return took


# -- two tenants: B's searches while A floods ---------------------------------------------------------

# The longest query the API takes (pipeline/tokens.MAX_QUERY_TOKENS, estimated), the costliest a tenant can send.
def longest_query(rng: random.Random) -> str:
    words: list[str] = []
    while approximate_tokens(" ".join(words)) < MAX_QUERY_TOKENS - 8:
        words.append(rng.choice([*NAMES, *NOUNS]).lower())
    return " ".join(words)


class Flood:
    """`parallel` clients of key A sending the longest queries back to back until stopped; a 429 is waited out
    for 50 ms (a client that ignores Retry-After), counted."""

    def __init__(self, url: str, key: str, parallel: int) -> None:
        self.stop, self.answered, self.refused, self.failed = threading.Event(), 0, 0, 0
        self._threads = [threading.Thread(target=self._run, args=(url, key, random.Random(i)), daemon=True)
                         for i in range(parallel)]
        for t in self._threads:
            t.start()

    def _run(self, url: str, key: str, rng: random.Random) -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
            while not self.stop.is_set():
                reply = http.post("/v1/search", json={"subject": SUBJECT, "query": longest_query(rng), "k": 5})
                if reply.status_code == 429:
                    self.refused += 1
                    self.stop.wait(0.05)
                elif reply.status_code == 200:
                    self.answered += 1
                else:
                    self.failed += 1

    def end(self) -> dict[str, int]:
        self.stop.set()
        for t in self._threads:
            t.join(120)
        return {"a_answered": self.answered, "a_refused_429": self.refused, "a_failed": self.failed}


def b_searches(url: str, key: str, probes: int) -> tuple[list[float], int]:
    """Key B's one-line searches, one at a time: the seconds each took (a failed one counts its wait), and how
    many failed (504 past MEMFLOW_SEARCH_TIMEOUT_S, or any other refusal)."""
    rng = random.Random(probes)
    took, failed = [], 0
    with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        for _ in range(probes):
            started = time.perf_counter()
            reply = http.post("/v1/search", json={
                "subject": B_SUBJECT, "query": f"what did {rng.choice(NAMES)} do with the {rng.choice(NOUNS)}",
                "k": 5, "now": (AT + timedelta(days=1)).isoformat()})
            took.append(time.perf_counter() - started)
            failed += reply.status_code != 200 or reply.json()["status"] == "failed"
    return took, failed


B_SUBJECT = "bench-tenant-b"


def bench_two_tenants(system: Embedded, parallel: int, probes: int) -> dict[str, Any]:
    """Key B's search p50/p99 idle, then while key A floods (`parallel` clients of the longest queries): with the
    per-key limits as configured, and with them lifted (A may have as many in flight as it likes)."""
    bulk_load(system, SUBJECT, 2000)  # A's: its long queries find something to rank
    bulk_load(system, B_SUBJECT, 2000)
    keys = KeyStore(system.client.redis, system.client.keys)
    a = keys.create("tenant-a", [SUBJECT], read_only=False, now=datetime.now(UTC))[1]
    b = keys.create("tenant-b", [B_SUBJECT], read_only=False, now=datetime.now(UTC))[1]
    out: dict[str, Any] = {"a_parallel": parallel, "b_probes": probes,
                           "query_workers": system.settings.consumer.query_workers,
                           "key_concurrency": system.settings.http.key_concurrency}
    lifted = system.settings.replace(http_key_concurrency=10_000)
    for name, settings in (("limited", system.settings), ("unlimited", lifted)):
        with serving(settings) as (url, _):
            b_searches(url, b, 10)  # warm
            idle, idle_failed = b_searches(url, b, probes)
            flood = Flood(url, a, parallel)
            try:
                busy, busy_failed = b_searches(url, b, probes)
            finally:
                counts = flood.end()
        out[name] = {"b_idle_p50_ms": pct_ms(idle, .5), "b_idle_p99_ms": pct_ms(idle, .99),
                     "b_flood_p50_ms": pct_ms(busy, .5), "b_flood_p99_ms": pct_ms(busy, .99),
                     "b_failed_idle": idle_failed, "b_failed_flood": busy_failed,
                     "p99_ratio": round(pct_ms(busy, .99) / max(pct_ms(idle, .99), 1e-3), 2), **counts}
    return out


# -- two tenants: B's searches while A exports or imports in a loop ---------------------------------------

A_SUBJECT = "bench-tenant-a"
# A's subject: its export with vectors (~16 KB a line at 768 dims) is what A's import loop posts back, under the cap.
A_MEMORIES = 500
# The file A's refused-import loop posts: 16 MiB of records of ~1 KB of words, refused at its last line.
REFUSED_BYTES = 16 * 1_048_576 - 4096


class Loop:
    """Key A doing `work` (one request on its own connection: its status code) back to back until stopped; a 429
    or 503 is waited out for 50 ms (a client that ignores Retry-After), counted."""

    def __init__(self, url: str, key: str, work: Callable[[httpx.Client], int]) -> None:
        self.stop = threading.Event()
        self.codes: dict[int, int] = {}
        self._thread = threading.Thread(target=self._run, args=(url, key, work), daemon=True)
        self._thread.start()

    def _run(self, url: str, key: str, work: Callable[[httpx.Client], int]) -> None:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=120) as http:
            while not self.stop.is_set():
                code = work(http)
                self.codes[code] = self.codes.get(code, 0) + 1
                if code in (429, 503):
                    self.stop.wait(0.05)

    def end(self) -> dict[str, int]:
        self.stop.set()
        self._thread.join(300)
        return {str(code): n for code, n in sorted(self.codes.items())}


def refused_file(subject: str, size: int = REFUSED_BYTES) -> bytes:
    """An import of `subject` of ~`size` bytes of valid records whose end line miscounts them: refused at its
    last line, after everything before it was read."""
    words = "I moved the weekly planning meeting with Dana to Friday afternoon because the office is closed. " * 3
    lines, total, i = [export.line(export.header(AT, [subject]))], 0, 0
    while total < size:
        memory = Memory(id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{subject}/refused/{i}")), subject=subject,
                        uri=f"mem://{subject}/general/refused.{i}", dir=Dir.general, mtype=MType.fact,
                        key=f"refused.{i}", content=f"{words}({i})", confidence=0.9, source=Source.explicit,
                        created_at=AT, updated_at=AT)
        lines.append(export.line(Record(memory=memory)))
        total, i = total + len(lines[-1]), i + 1
    return b"".join([*lines, export.line(End(memories=i + 1))])


def bench_transfer_tenants(system: Embedded, probes: int) -> dict[str, Any]:
    """Key B's search p50/p99 idle, then while key A exports its subject (with vectors) in a loop, imports that
    export back in a loop (each run finds every memory held), and posts a 16 MiB file refused at its last line in
    a loop; each phase `probes` searches of B, with the ratio of its p99 to idle's."""
    bulk_load(system, A_SUBJECT, A_MEMORIES)
    bulk_load(system, B_SUBJECT, 2000)
    keys = KeyStore(system.client.redis, system.client.keys)
    a = keys.create("tenant-a", [A_SUBJECT], read_only=False, now=datetime.now(UTC))[1]
    b = keys.create("tenant-b", [B_SUBJECT], read_only=False, now=datetime.now(UTC))[1]
    refused = refused_file(A_SUBJECT)
    ndjson = {"content-type": "application/x-ndjson"}
    out: dict[str, Any] = {"b_probes": probes, "a_memories": A_MEMORIES, "refused_file_bytes": len(refused),
                           "query_workers": system.settings.consumer.query_workers,
                           "key_concurrency": system.settings.http.key_concurrency}
    with serving(system.settings) as (url, _):
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {a}"}, timeout=120) as http:
            exported = http.get(f"/v1/subjects/{A_SUBJECT}/export", params={"with_vectors": True})
            if exported.status_code != 200:
                raise SystemExit(f"A's export failed: {exported.status_code} {exported.text[:300]}")
        out["a_file_bytes"] = len(exported.content)
        loops: dict[str, Callable[[httpx.Client], int]] = {
            "export": lambda h: h.get(f"/v1/subjects/{A_SUBJECT}/export", params={"with_vectors": True}).status_code,
            "import": lambda h: h.post("/v1/import", content=exported.content, headers=ndjson).status_code,
            "refused_import": lambda h: h.post("/v1/import", content=refused, headers=ndjson).status_code}
        b_searches(url, b, 10)  # warm
        idle, idle_failed = b_searches(url, b, probes)
        out["idle"] = {"b_p50_ms": pct_ms(idle, .5), "b_p99_ms": pct_ms(idle, .99), "b_failed": idle_failed}
        for name, work in loops.items():
            loop = Loop(url, a, work)
            try:
                busy, failed = b_searches(url, b, probes)
            finally:
                codes = loop.end()
            out[name] = {"b_p50_ms": pct_ms(busy, .5), "b_p99_ms": pct_ms(busy, .99), "b_failed": failed,
                         "p50_ratio": round(pct_ms(busy, .5) / max(pct_ms(idle, .5), 1e-3), 2),
                         "p99_ratio": round(pct_ms(busy, .99) / max(pct_ms(idle, .99), 1e-3), 2), "a_codes": codes}
    return out


# -- the command ----------------------------------------------------------------------------------


def run_cli(*, size: int, queries: int, clients: int, requests: int, batch: int, as_json: bool,
            settings: Settings, flood: int = 8, probes: int = 60, only_tenants: bool = False) -> int:
    return run_embedded(settings, "http", lambda system: measure(
        system, size=size, queries=queries, clients=clients, requests=requests, batch=batch, flood=flood,
        probes=probes, only_tenants=only_tenants), print_report, as_json)


def measure(system: Embedded, *, size: int, queries: int, clients: int, requests: int,
            batch: int, flood: int = 8, probes: int = 60, only_tenants: bool = False) -> dict[str, Any]:
    report: dict[str, Any] = {"machine": machine()}
    say(f"key B's searches, idle and while key A floods ({flood} parallel clients, the longest queries) ...")
    report["two_tenants"] = bench_two_tenants(system, flood, probes)
    say("key B's searches, idle and while key A exports, imports, and posts a refused 16 MiB import, in loops ...")
    report["transfer_tenants"] = bench_transfer_tenants(system, probes)
    if only_tenants:
        return report
    key = KeyStore(system.client.redis, system.client.keys).create("bench", ["*"], read_only=False,
                                                                   now=datetime.now(UTC))[1]
    with serving(system.settings) as (url, _):
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
            say(f"search at {size} memories, four ways ...")
            report["search"] = bench_search(system, http, size, queries)
    # Writes to a prefix no stage reads: the API's capacity alone, not the pipeline's.
    # One key writes from every client: its per-key limits are lifted, the figure is the server's capacity.
    quiet = system.settings.replace(stream_prefix=f"bench-w{uuid.uuid4().hex[:6]}:", http_key_concurrency=clients,
                                    http_key_rate_per_s=1e9, http_key_burst=10**9)
    quiet_client = MemoryClient(quiet)
    write_key = KeyStore(quiet_client.redis, quiet_client.keys).create("bench", ["*"], read_only=False,
                                                                       now=datetime.now(UTC))[1]
    with serving(quiet) as (url, _):
        say("one write at a time, next to a bare uvicorn ...")
        report["write_round_trip_p50_ms"] = bench_round_trip(url, write_key, quiet_client, 500)
        say("refusals made before any item is looked at ...")
        read_key = KeyStore(quiet_client.redis, quiet_client.keys).create("bench-read", ["*"], read_only=True,
                                                                          now=datetime.now(UTC))[1]
        report["refusals_p50_ms"] = bench_refusals(url, write_key, read_key)
    for workers in (1, 2):
        with serving(quiet, workers) as (url, pid):
            say(f"writes from {clients} concurrent clients, {workers} server process(es) ...")
            report["writes" if workers == 1 else f"writes_{workers}_processes"] = bench_writes(
                url, pid, write_key, quiet_client, clients, requests, batch)
    return report


def print_report(r: dict[str, Any]) -> None:
    print(f"machine: {r['machine']}")
    t = r["two_tenants"]
    print(f"key B's search while key A floods ({t['a_parallel']} parallel clients of the longest queries; "
          f"{t['query_workers']} query workers), p50 / p99 ms:")
    for name in ("limited", "unlimited"):
        f = t[name]
        limit = f"per-key limit {t['key_concurrency']} in flight" if name == "limited" else "no per-key limit"
        print(f"  {limit:<28} idle {f['b_idle_p50_ms']:>8} / {f['b_idle_p99_ms']:>8}   "
              f"flood {f['b_flood_p50_ms']:>8} / {f['b_flood_p99_ms']:>8}   p99 x{f['p99_ratio']}  "
              f"B failed {f['b_failed_flood']} of {t['b_probes']} (idle {f['b_failed_idle']}); "
              f"A: {f['a_answered']} answered, {f['a_refused_429']} refused 429, {f['a_failed']} failed")
    x = r["transfer_tenants"]
    print(f"key B's search while key A loops on export/import ({x['a_memories']} memories with vectors, "
          f"{x['a_file_bytes']} bytes; the refused file {x['refused_file_bytes']} bytes), p50 / p99 ms:")
    print(f"  {'idle':<16} {x['idle']['b_p50_ms']:>8} / {x['idle']['b_p99_ms']:>8}")
    for name in ("export", "import", "refused_import"):
        f = x[name]
        print(f"  {name:<16} {f['b_p50_ms']:>8} / {f['b_p99_ms']:>8}   x{f['p50_ratio']} / x{f['p99_ratio']}   "
              f"B failed {f['b_failed']} of {x['b_probes']}; A's replies {f['a_codes']}")
    if "search" not in r:
        return
    s = r["search"]
    print(f"search @ {s['memories']} memories, {s['queries']} queries (p50 / p95 ms):")
    for name in ("store_limit", "in_process", "client", "http"):
        print(f"  {name:<12} {s[name]['p50_ms']:>8} {s[name]['p95_ms']:>8}")
    e = s["empty_subject"]
    print(f"  HTTP layer adds (median of paired differences) {s['http_overhead_p50_ms']} ms; on an empty subject "
          f"{e['http_overhead_p50_ms']} ms (client p50 {e['client']['p50_ms']}, http p50 {e['http']['p50_ms']})")
    rt = r["write_round_trip_p50_ms"]
    print(f"one write at a time, p50 ms: MemoryClient.publish {rt['client_publish']}, POST /v1/events {rt['http']}, "
          f"the same POST to a bare uvicorn app {rt['bare_http_floor']}")
    if "refusals_p50_ms" in r:
        print("refused before any item is looked at, p50 ms: "
              + ", ".join(f"{name} {ms}" for name, ms in r["refusals_p50_ms"].items()))
    for name in ("writes", "writes_2_processes"):
        w = r[name]
        print(f"{name}, {w['clients']} concurrent clients: POST /v1/events {w['http_requests_per_s']} req/s "
              f"(serve CPU {w['serve_cpu_ms_per_request']} ms/request, {w['serve_cpu_share']} cores busy); "
              f"batches of {w['http_batch']}: {w['http_batched_events_per_s']} events/s; "
              f"MemoryClient.publish {w['client_publish_per_s']}/s")
