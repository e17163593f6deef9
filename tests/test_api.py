"""The HTTP API (`memflow serve`) as a real uvicorn process, over the real pipeline, through httpx.

One system (stages and a query worker in this process, MiniLM, the Edge store) and one `serve`
process for the module; each test writes under subjects of its own.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from memflow.shared.admission.apikeys import KeyStore
from memflow.shared.errors import InvalidInput
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.server import RedisServer
from memflow.shared.settings import Settings, to_env
from memflow.shared.storage.store import MemoryFilter
from memflow.workers.front import authorities, host_names, host_refusal, sdk_hosts
from memflow.workers.mcp import SUBJECT_HEADER
from tests.conftest import System, start_system, wait_for


@dataclass
class Served:
    system: System
    settings: Settings
    url: str
    process: subprocess.Popen[str]
    admin: str  # a key for every subject

    def key(self, *subjects: str, read_only: bool = False) -> str:
        store = KeyStore(self.system.client.redis, self.system.client.keys)
        return store.create(f"test-{uuid.uuid4().hex[:6]}", list(subjects), read_only=read_only,
                            now=datetime.now(UTC))[1]

    def http(self, key: str | None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        return httpx.Client(base_url=self.url, headers=headers, timeout=30)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_serve(settings: Settings, *args: str, attempts: int = 3) -> tuple[str, subprocess.Popen[str]]:
    """`memflow serve` on a free port, its output in `serve.log` of the data dir (a pipe nobody reads
    would stop the server once full). A port found free can be taken before the server binds it (seen under
    load: "address already in use"): the server is then started again on another."""
    for attempt in range(attempts):
        port = free_port()
        env = {**os.environ, **to_env(settings)}
        log = (settings.store.data_dir / "serve.log").open("a")
        process = subprocess.Popen([sys.executable, "-m", "memflow.workers.cli", "serve", "--port", str(port), *args],
                                   env=env, text=True, stdout=log, stderr=subprocess.STDOUT)
        process.log_path = Path(log.name)  # type: ignore[attr-defined]
        url = f"http://127.0.0.1:{port}"
        said = log.tell()
        wait_for(functools.partial(_listening_or_ended, process, url), 60, "memflow serve to listen")
        if process.poll() is None:
            return url, process
        output = process.log_path.read_text()[said:]  # type: ignore[attr-defined]
        if "address already in use" not in output or attempt == attempts - 1:
            raise AssertionError(f"memflow serve stopped: {output}")
    raise AssertionError("unreachable")


def _listening_or_ended(process: subprocess.Popen[str], url: str) -> bool:
    if process.poll() is not None:
        return True  # ended: start_serve tells why
    try:
        return httpx.get(f"{url}/openapi.json", timeout=1).status_code == 200
    except httpx.TransportError:
        return False


def stop(process: subprocess.Popen[str]) -> str:
    """Stop it; what it printed."""
    process.terminate()
    process.wait(timeout=20)
    return str(process.log_path.read_text())  # type: ignore[attr-defined]


def serving(redis_server: RedisServer, embedder: Embedder, data_dir: Path, **overrides: Any) -> Iterator[Served]:
    """One system and one `memflow serve` process with an admin key, stopped when the generator is closed:
    the modules that test a front door against a live server build their fixture on it (`overrides`: settings)."""
    settings = Settings(redis_url=redis_server.url, stream_prefix=f"t{uuid.uuid4().hex[:10]}:", data_dir=data_dir,
                        reclaim_idle_ms=300, block_ms=50, retry_base_s=0.01, retry_max_s=0.2, **overrides)
    system = start_system(settings, embedder)
    url, process = start_serve(settings)
    admin = KeyStore(system.client.redis, system.client.keys).create("admin", ["*"], read_only=False,
                                                                    now=datetime.now(UTC))[1]
    yield Served(system, settings, url, process, admin)
    stop(process)
    system.shutdown()


@pytest.fixture(scope="module")
def served(redis_server: RedisServer, embedder: Embedder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from serving(redis_server, embedder, tmp_path_factory.mktemp("api"))


def subject() -> str:
    return f"api-{uuid.uuid4().hex[:8]}"


def event(subj: str, text: str, n: int = 0, **extra: Any) -> dict[str, Any]:
    return {"event_id": f"{subj}-{n}-{uuid.uuid4().hex[:6]}", "subject": subj, "session_id": "s1",
            "kind": "message", "role": "user", "text": text, "ts": "2026-03-02T09:00:00+00:00", **extra}


def remembered(served: Served, subj: str, *texts: str) -> list[str]:
    """Publish `texts` for `subj` over HTTP and wait until the pipeline has written them; their memory ids."""
    with served.http(served.admin) as http:
        end = {"event_id": f"{subj}-end", "subject": subj, "session_id": "s1", "kind": "session_end",
               "ts": "2026-03-02T09:05:00+00:00"}
        reply = http.post("/v1/events", json=[*(event(subj, t, i) for i, t in enumerate(texts)), end])
        assert reply.status_code == 202, reply.text
        assert served.system.client.wait_idle(30)
        memories = http.get(f"/v1/subjects/{subj}/memories").json()["memories"]
    return [m["id"] for m in memories]


def error_of(reply: httpx.Response) -> dict[str, Any]:
    body = reply.json()
    assert set(body) == {"error"}, body
    assert "Traceback" not in reply.text
    return dict(body["error"])


# -- the round trip ---------------------------------------------------------------------------


def test_publish_search_pack_inspect_history_feedback_forget(served: Served) -> None:
    subj = subject()
    ids = remembered(served, subj, "I prefer tea over coffee in the morning.", "My sister Anna lives in Lyon.")
    assert len(ids) >= 2  # the statements, and the records of the session
    with served.http(served.admin) as http:
        found = http.post("/v1/search", json={"subject": subj, "query": "what do I drink in the morning?", "k": 3})
        assert found.status_code == 200
        result = found.json()
        assert result["status"] == "ok" and "tea" in result["hits"][0]["content"]
        tea = result["hits"][0]["id"]

        packed = http.post("/v1/pack", json={"subject": subj, "query": "offer a drink", "budget_tokens": 400})
        assert packed.status_code == 200 and any("tea" in m for m in packed.json()["preferences"]
                                                 + packed.json()["memories"])

        versions = http.get(f"/v1/memories/{tea}/history", params={"subject": subj}).json()
        assert versions["subject"] == subj and versions["versions"][0]["id"] == tea
        assert http.get(f"/v1/memories/{tea}/history").json()["asked"] == tea  # the subject is found

        def uses() -> int:
            state = http.get(f"/v1/subjects/{subj}/memories").json()["memories"]
            return int(next(m["access_count"] for m in state if m["id"] == tea))
        before = uses()
        adopted = http.post("/v1/feedback", json={"subject": subj, "memory_ids": [tea]})
        assert adopted.json() == {"count": 1} and uses() == before + 1

        gone = http.request("DELETE", f"/v1/subjects/{subj}/memories", json={"contains": "tea"})
        assert gone.status_code == 200, gone.text
        report = gone.json()
        assert tea in report["ids"] and report["proof"]["in_store"] == [] and report["proof"]["ids"] == report["ids"]
        assert report["proof"]["unknown"] == [] and not any(report["proof"]["residue"].values())
        after = http.post("/v1/search", json={"subject": subj, "query": "what do I drink in the morning?"}).json()
        assert tea not in [h["id"] for h in after["hits"]]
        traced = http.get(f"/v1/subjects/{subj}/traces")
        assert traced.status_code == 200, traced.text
        assert traced.json() and all(t["subject"] == subj for t in traced.json())


def test_whom_memories_are_about_people_listed_searches_restricted_and_kept_apart(served: Served) -> None:
    subj = subject()
    remembered(served, subj, "I'm vegetarian.", "我住在苏州。", "My wife is on a keto diet.",
               "My girlfriend lives in Singapore.")
    with served.http(served.admin) as http:
        people = http.get(f"/v1/subjects/{subj}/people").json()
        assert people["subject"] == subj
        assert {p["about"] for p in people["people"]} == {"wife", "girlfriend"}
        assert all("Suzhou" not in m["content"] and "苏州" not in m["content"]
                   for p in people["people"] for m in p["memories"])
        mine = http.post("/v1/search", json={"subject": subj, "query": "Which city do I live in?"}).json()
        assert "苏州" in mine["hits"][0]["content"] and mine["hits"][0]["about"] == "self"
        assert mine["plan"]["about"] == "self"
        theirs = http.post("/v1/search", json={"subject": subj, "query": "What diet?", "about": "wife"}).json()
        assert theirs["hits"] and {h["about"] for h in theirs["hits"]} == {"wife"}
        # The girlfriend's city never superseded the user's: both are current.
        current = [m for m in http.get(f"/v1/subjects/{subj}/memories").json()["memories"] if m["status"] == "active"]
        assert any("苏州" in m["content"] for m in current) and any("Singapore" in m["content"] for m in current)
        assert http.post("/v1/search", json={"subject": subj, "query": "x", "about": "bad holder"}).status_code == 422


def test_an_explicit_write_is_accepted_at_once_and_found_once_written(served: Served) -> None:
    subj = subject()
    with served.http(served.admin) as http:
        written = http.post("/v1/memories", json={"subject": subj, "content": "The project code name is Atlas.",
                                                  "external_ref": "crm:1"})
        assert written.status_code == 202 and written.json()["event_id"].startswith("write-")
        assert served.system.client.wait_idle(30)
        hits = http.post("/v1/search", json={"subject": subj, "query": "project code name"}).json()["hits"]
        assert any("Atlas" in h["content"] for h in hits)


def test_an_empty_subject_says_empty_and_a_search_nobody_answers_says_failed(served: Served) -> None:
    with served.http(served.admin) as http:
        empty = http.post("/v1/search", json={"subject": subject(), "query": "anything at all"})
        assert empty.status_code == 200 and empty.json()["status"] == "empty"
    # A second API on a prefix no query worker serves: the search could not look.
    lonely = served.settings.replace(stream_prefix=f"t{uuid.uuid4().hex[:10]}:", search_timeout_s=1.0,
                                     rpc_timeout_s=1.0)
    url, process = start_serve(lonely, "--no-auth")
    try:
        reply = httpx.post(f"{url}/v1/search", json={"subject": "x", "query": "q"}, timeout=30)
        assert reply.status_code == 504
        assert reply.json()["status"] == "failed" and reply.json()["code"] == "timeout"
        health = httpx.get(f"{url}/healthz", timeout=30)
        assert health.status_code == 503 and health.json()["query_workers"] == 0
    finally:
        err = stop(process)
    assert "NO API KEYS" in err


def test_health_names_redis_the_store_and_the_query_workers_to_a_key_and_only_up_or_down_to_anyone(
        served: Served) -> None:
    with served.http(served.key("nobody-in-particular", read_only=True)) as http:
        health = http.get("/healthz")
    assert health.status_code == 200
    assert health.json() | {"memories": 0} == {"status": "ok", "redis": "ok", "store": "ok", "query_workers": 1,
                                               "memories": 0, "auth": "on", "error": None}
    # Without a key (or with a wrong one), up or down and nothing else: it told the memory count before.
    for headers in ({}, {"Authorization": "Bearer mf_nothing_here"}):
        anyone = httpx.get(f"{served.url}/healthz", headers=headers, timeout=30)
        assert anyone.status_code == 200 and anyone.json() == {"status": "ok"}, anyone.text


def test_inspect_far_in_time_is_refused_naming_now(served: Served) -> None:
    # Year 1 overflowed inspect's day arithmetic: 503 and a traceback in the log.
    with served.http(served.admin) as http:
        for now in ("0001-01-01T00:00:00+00:00", "9999-12-31T00:00:00+00:00"):
            reply = http.get(f"/v1/subjects/{subject()}/memories", params={"now": now})
            assert reply.status_code == 422 and error_of(reply)["field"] == "now", reply.text
        assert http.get(f"/v1/subjects/{subject()}/memories",
                        params={"now": "2026-03-02T09:00:00+00:00"}).status_code == 200


def test_external_ref_is_a_reference_not_a_document(served: Served) -> None:
    subj = subject()
    with served.http(served.admin) as http:
        huge = http.post("/v1/memories", json={"subject": subj, "content": "I like tea.", "external_ref": "x" * 900_000})
        assert huge.status_code == 422 and error_of(huge)["field"] == "external_ref", huge.text
        fine = http.post("/v1/memories", json={"subject": subj, "content": "I like tea.", "external_ref": "x" * 2048})
        assert fine.status_code == 202, fine.text
    with pytest.raises(InvalidInput, match="meta.external_ref is 2049 characters"):  # the SDK, the same bound
        served.system.client.write(subj, "I like tea.", external_ref="x" * 2049)


def test_feedback_at_far_from_the_servers_clock_is_refused(served: Served) -> None:
    # Year 9999 was written into last_accessed_at: a memory that never decays.
    subj = subject()
    ids = remembered(served, subj, "I prefer green tea in the afternoon.")
    now = datetime.now(UTC)
    with served.http(served.admin) as http:
        for at in (now.replace(year=9999), now + timedelta(hours=1), now - timedelta(days=30),
                   datetime(1, 1, 1, tzinfo=UTC)):
            reply = http.post("/v1/feedback", json={"subject": subj, "memory_ids": ids, "at": at.isoformat()})
            assert reply.status_code == 422 and error_of(reply)["field"] == "at", (at, reply.text)
        for at in (now - timedelta(days=2), now + timedelta(minutes=1)):
            reply = http.post("/v1/feedback", json={"subject": subj, "memory_ids": ids, "at": at.isoformat()})
            assert reply.json() == {"count": len(ids)}, (at, reply.text)
    for memory in served.system.client.inspect(subj).memories:
        assert memory.last_accessed_at is None or memory.last_accessed_at < now + timedelta(minutes=5)


def test_a_memory_that_does_not_exist_is_a_quiet_404(served: Served, caplog: pytest.LogCaptureFixture) -> None:
    # Not the worker's error: RQ logged ERROR with a traceback for every history of an unknown id.
    caplog.set_level(logging.DEBUG, logger="memflow.workers.rq_adapter")
    missing = str(uuid.uuid4())
    with served.http(served.admin) as http:
        assert http.get(f"/v1/memories/{missing}/history").status_code == 404
    wait_for(lambda: any(missing in r.getMessage() for r in caplog.records), 30, "the refusal to be logged")
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING and missing in r.getMessage()] == []
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR and "NotFound" in r.getMessage()]


# -- bad input ----------------------------------------------------------------------------------


BAD = [
    ("malformed JSON", "/v1/search", b'{"subject": "a", "query": ', 400, "body"),
    ("wrong type", "/v1/search", {"subject": "a", "query": "q", "k": "many"}, 422, "k"),
    ("unknown field", "/v1/search", {"subject": "a", "query": "q", "colour": "red"}, 422, "colour"),
    ("no subject id", "/v1/search", {"subject": "a b", "query": "q"}, 422, "subject"),
    ("naive time", "/v1/search", {"subject": "a", "query": "q", "now": "2026-03-02T09:00:00"}, 422, "now"),
    ("naive event time", "/v1/events", {**event("a", "hello"), "ts": "2026-03-02T09:00:00"}, 422, "ts"),
    ("bad event in a batch", "/v1/events", [event("a", "one"), {**event("a", "two"), "role": "robot"}], 422,
     "1.role"),
    ("missing field", "/v1/memories", {"subject": "a"}, 422, "content"),
    # Issue 30 item 6: a write that is all secret was 202 and stored nothing, with no signal.
    ("only a secret", "/v1/memories", {"subject": "a", "content": "sk-live-9fQ2xW7mZ4kP1vB8nR3tY6cJ"}, 422, "content"),
    ("10 MB body", "/v1/events", {**event("a", "x" * 10_000_000)}, 413, "body"),
]


@pytest.mark.parametrize(("what", "path", "body", "status", "field"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_named_and_the_next_request_is_served(served: Served, what: str, path: str, body: Any,
                                                          status: int, field: str) -> None:
    subj = subject()
    published = served.system.client.keys.inputs_of("trigger")
    before = sum(served.system.client.redis.xlen(stream) for stream in published)
    with served.http(served.admin) as http:
        if isinstance(body, bytes):
            reply = http.post(path, content=body, headers={"content-type": "application/json"})
        else:
            reply = http.post(path, json=body)
        assert reply.status_code == status, reply.text
        error = error_of(reply)
        assert error["code"] == "invalid_input" and error["field"] == field, error
        # Nothing of a refused batch was published, and the next good request is served.
        assert sum(served.system.client.redis.xlen(stream) for stream in published) == before
        good = http.post("/v1/events", json=event(subj, "I like green tea."))
        assert good.status_code == 202 and len(good.json()["ids"]) == 1


def test_the_openapi_document_covers_every_route_and_the_error_shape(served: Served) -> None:
    doc = httpx.get(f"{served.url}/openapi.json").json()
    paths = doc["paths"]
    for path, method in [("/v1/events", "post"), ("/v1/events/{event_id}", "get"), ("/v1/memories", "post"),
                         ("/v1/search", "post"),
                         ("/v1/pack", "post"), ("/v1/subjects/{subject}/memories", "get"),
                         ("/v1/subjects/{subject}/memories", "delete"), ("/v1/memories/{memory_id}/history", "get"),
                         ("/v1/feedback", "post"), ("/healthz", "get"), ("/metrics", "get")]:
        assert method in paths[path], (path, method)
    assert "ErrorReply" in doc["components"]["schemas"] and "HTTPBearer" in doc["components"]["securitySchemes"]
    codes = doc["components"]["schemas"]["ErrorBody"]["properties"]["code"]["enum"]
    assert {"invalid_input", "unauthorized", "forbidden", "store_unavailable", "timeout"} <= set(codes)
    events = paths["/v1/events"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert "ChatEvent" in str(events) and "array" in str(events)


# -- keys -----------------------------------------------------------------------------------------


def test_a_request_without_a_valid_key_is_refused_and_a_revoked_key_at_once(served: Served) -> None:
    subj = subject()
    body = {"subject": subj, "query": "anything"}
    assert error_of(httpx.post(f"{served.url}/v1/search", json=body))["code"] == "unauthorized"
    with served.http("mf_nothing_here") as http:
        assert http.post("/v1/search", json=body).status_code == 401
    key = served.key(subj)
    store = KeyStore(served.system.client.redis, served.system.client.keys)
    key_id = key.split("_")[1]
    with served.http(key) as http:
        assert http.post("/v1/search", json=body).status_code == 200
        assert store.revoke(key_id)
        refused = http.post("/v1/search", json=body)
        assert refused.status_code == 401 and error_of(refused)["code"] == "unauthorized"


def test_keys_from_the_command_line(served: Served) -> None:
    env = {**os.environ, **to_env(served.settings)}

    def memflow(*args: str) -> str:
        done = subprocess.run([sys.executable, "-m", "memflow.workers.cli", "keys", *args], env=env, text=True,
                              capture_output=True, timeout=60)
        assert done.returncode == 0, done.stderr
        return done.stdout

    secret = memflow("create", "--name", "cli-key", "--subjects", "team-a/*,team-b/alice", "--read-only")
    secret = secret.strip().splitlines()[-1]
    assert secret.startswith("mf_")
    listed = [k for k in json.loads(memflow("list", "--json")) if k["name"] == "cli-key"]
    assert listed[0]["subjects"] == ["team-a/*", "team-b/alice"] and listed[0]["read_only"] is True
    assert secret not in memflow("list", "--json")  # never shown again, nor its hash
    with served.http(secret) as http:
        assert http.post("/v1/search", json={"subject": "team-a/x", "query": "q"}).status_code == 200
        assert error_of(http.post("/v1/events", json=event("team-a/x", "hi")))["code"] == "forbidden"
    memflow("revoke", listed[0]["id"])
    with served.http(secret) as http:
        assert http.post("/v1/search", json={"subject": "team-a/x", "query": "q"}).status_code == 401


def test_a_key_touches_only_its_subjects_everywhere(served: Served) -> None:
    mine, theirs = f"team-a/{subject()}", f"team-b/{subject()}"
    their_ids = remembered(served, theirs, "My bank PIN hint is the cat's name, Miso.")
    key = served.key("team-a/*")
    with served.http(key) as http:
        for method, path, body in [
            ("POST", "/v1/search", {"subject": theirs, "query": "PIN"}),
            ("POST", "/v1/pack", {"subject": theirs, "query": "PIN"}),
            ("GET", f"/v1/subjects/{theirs}/memories", None),
            ("GET", f"/v1/subjects/{theirs}/traces", None),
            ("GET", f"/v1/subjects/{theirs}/people", None),
            ("GET", f"/v1/memories/{their_ids[0]}/history?subject={theirs}", None),
            ("POST", "/v1/feedback", {"subject": theirs, "memory_ids": their_ids}),
            ("DELETE", f"/v1/subjects/{theirs}/memories", {"memory_ids": their_ids}),
            ("POST", "/v1/events", event(theirs, "I moved.")),
            ("POST", "/v1/events", [event(mine, "fine"), event(theirs, "not fine")]),
            ("POST", "/v1/memories", {"subject": theirs, "content": "planted"}),
        ]:
            reply = http.request(method, path, json=body)
            assert reply.status_code == 403 and error_of(reply)["code"] == "forbidden", (method, path, reply.text)
            assert "Miso" not in reply.text
        # Their memory's id where an id is expected: as if it did not exist.
        history = http.get(f"/v1/memories/{their_ids[0]}/history")
        assert history.status_code == 404 and "Miso" not in history.text
        assert http.post("/v1/feedback", json={"subject": mine, "memory_ids": their_ids}).json() == {"count": 0}
        gone = http.request("DELETE", f"/v1/subjects/{mine}/memories", json={"memory_ids": their_ids})
        assert gone.json()["count"] == 0
        assert theirs not in http.get("/v1/subjects").json()["subjects"]
    with served.http(served.admin) as http:
        assert [m["id"] for m in http.get(f"/v1/subjects/{theirs}/memories").json()["memories"]] == their_ids


def test_a_history_without_its_subject_reads_no_point_of_a_subject_the_key_may_not_see(
        served: Served, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 38: an operation checks a point's subject before it touches it. A key of `team-a/*` asking the history
    of another team's memory id, naming no subject, is answered 404, and the worker looked for it only among the
    subjects the key may see (before, it read every subject's point of that id and checked the answer after)."""
    mine, theirs = f"team-a/{subject()}", f"team-b/{subject()}"
    remembered(served, mine, "I like green tea.")
    their_ids = remembered(served, theirs, "My bank PIN hint is the cat's name, Miso.")
    store = served.system.ctx.store
    read: list[str] = []
    get = store.get

    def recorded(flt: MemoryFilter, **kwargs: Any) -> Any:
        read.append(flt.subject)
        return get(flt, **kwargs)
    monkeypatch.setattr(store, "get", recorded)
    with served.http(served.key("team-a/*")) as http:
        reply = http.get(f"/v1/memories/{their_ids[0]}/history")
    assert reply.status_code == 404 and "Miso" not in reply.text
    assert mine in read and theirs not in read, read


def test_a_read_only_key_reads_and_never_writes(served: Served) -> None:
    subj = subject()
    remembered(served, subj, "I am allergic to peanuts.")
    with served.http(served.key(subj, read_only=True)) as http:
        assert http.post("/v1/search", json={"subject": subj, "query": "allergy"}).json()["status"] == "ok"
        for method, path, body in [("POST", "/v1/events", event(subj, "x")),
                                   ("POST", "/v1/memories", {"subject": subj, "content": "x"}),
                                   ("POST", "/v1/feedback", {"subject": subj, "memory_ids": [str(uuid.uuid4())]}),
                                   ("DELETE", f"/v1/subjects/{subj}/memories", {"contains": "peanuts"})]:
            assert http.request(method, path, json=body).status_code == 403, path



# -- the isolation probe --------------------------------------------------------------------------


def test_isolation_probe_1000_cross_key_requests_over_50_subjects_leak_nothing(served: Served) -> None:
    """Keys scoped to one subject or to a group pattern ask, 1,000 times, for what is not theirs: another
    subject by name (every route), or another subject's memory ids under their own subject. Every answer
    is a refusal or nothing, no answer carries another subject's words, and nothing of theirs changed."""
    import random
    rng = random.Random(16)
    run = uuid.uuid4().hex[:6]
    groups = {g: [f"iso{run}-g{g}/u{i:02d}" for i in range(10)] for g in range(5)}
    subjects = [s for members in groups.values() for s in members]
    word = {s: f"codeword{n:02d}{run}" for n, s in enumerate(subjects)}
    with served.http(served.admin) as http:
        for s in subjects:
            assert http.post("/v1/memories", json={"subject": s, "content": f"My locker code is {word[s]}."}
                             ).status_code == 202
    assert served.system.client.wait_idle(60)

    def state() -> dict[str, list[tuple[str, int]]]:
        with served.http(served.admin) as http:
            return {s: sorted((m["id"], m["access_count"]) for m in
                              http.get(f"/v1/subjects/{s}/memories").json()["memories"]) for s in subjects}
    before = state()
    ids = {s: [m for m, _ in before[s]] for s in subjects}
    assert all(ids.values())
    scopes = [[f"iso{run}-g{g}/*"] for g in groups] + [[s] for s in subjects[::2]]
    keyed = [(served.key(*scope), scope) for scope in scopes]

    def request(own: str, other: str) -> tuple[str, str, Any, set[int]]:
        foreign = rng.choice(ids[other])
        return rng.choice([
            ("POST", "/v1/search", {"subject": other, "query": "locker code"}, {403}),
            ("POST", "/v1/pack", {"subject": other, "query": "locker code"}, {403}),
            ("GET", f"/v1/subjects/{other}/memories", None, {403}),
            ("GET", f"/v1/subjects/{other}/traces", None, {403}),
            ("GET", f"/v1/memories/{foreign}/history", None, {404}),
            ("GET", f"/v1/memories/{foreign}/history?subject={other}", None, {403}),
            ("GET", f"/v1/memories/{foreign}/history?subject={own}", None, {404}),
            ("POST", "/v1/feedback", {"subject": other, "memory_ids": [foreign]}, {403}),
            ("POST", "/v1/feedback", {"subject": own, "memory_ids": [foreign]}, {200}),
            ("DELETE", f"/v1/subjects/{other}/memories", {"memory_ids": [foreign]}, {403}),
            ("DELETE", f"/v1/subjects/{own}/memories", {"memory_ids": [foreign]}, {200}),
            ("DELETE", f"/v1/subjects/{other}/memories", {"contains": "locker"}, {403}),
            ("POST", "/v1/events", event(other, f"planted {word[other]}"), {403}),
            ("POST", "/v1/memories", {"subject": other, "content": "planted"}, {403}),
        ])

    leaks, asked = [], 0
    clients = {key: served.http(key) for key, _ in keyed}
    try:
        while asked < 1000:
            key, scope = rng.choice(keyed)
            own = rng.choice([s for s in subjects if any(s == p or p.endswith("*") and s.startswith(p[:-1])
                                                         for p in scope)])
            other = rng.choice([s for s in subjects if s not in own and not any(
                s == p or p.endswith("*") and s.startswith(p[:-1]) for p in scope)])
            method, path, body, expected = request(own, other)
            reply = clients[key].request(method, path, json=body)
            asked += 1
            visible = [w for s, w in word.items() if w in reply.text and s != own]
            if reply.status_code not in expected or visible:
                leaks.append((method, path, reply.status_code, visible))
            if reply.status_code == 200:
                assert reply.json().get("count") == 0, (method, path, reply.text)
    finally:
        for c in clients.values():
            c.close()
    assert asked == 1000 and leaks == []
    assert state() == before  # no use counted, nothing forgotten, nothing planted


def test_a_body_streamed_without_a_length_is_cut_off_at_the_limit(served: Served) -> None:
    def chunks() -> Iterator[bytes]:
        yield b'{"subject": "a", "query": "'
        for _ in range(1000):
            yield b"x" * 10_000
        yield b'"}'
    with served.http(served.admin) as http:
        reply = http.post("/v1/search", content=chunks(), headers={"content-type": "application/json"})
        assert reply.status_code == 413 and error_of(reply) | {"message": ""} == {
            "code": "invalid_input", "field": "body", "message": ""}
        assert http.post("/v1/search", json={"subject": subject(), "query": "q"}).status_code == 200


def test_an_unknown_route_or_method_answers_in_the_same_error_shape(served: Served) -> None:
    with served.http(served.admin) as http:
        assert error_of(http.get("/v1/nothing-here"))["code"] == "not_found"
        assert http.get("/v1/search").status_code == 405 and error_of(http.get("/v1/search"))["code"] == "invalid_input"


def test_several_server_processes_share_the_port_and_the_keys(served: Served) -> None:
    url, process = start_serve(served.settings, "--workers", "2")
    subj = subject()
    key = served.key(subj)
    try:
        with httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=30) as http:
            ids = [http.post("/v1/events", json=event(subj, f"turn {i}", i)).json()["ids"][0] for i in range(20)]
            assert len(set(ids)) == 20
            assert all(http.post("/v1/search", json={"subject": subj, "query": "turn"}).status_code == 200
                       for _ in range(10))
            assert KeyStore(served.system.client.redis, served.system.client.keys).revoke(key.split("_")[1])
            # Whichever process answers, the next request is refused.
            assert {http.post("/v1/search", json={"subject": subj, "query": "turn"}).status_code
                    for _ in range(10)} == {401}
    finally:
        stop(process)


# -- which hosts the server answers to ----------------------------------------------------------------

MCP_INITIALIZE = {"jsonrpc": "2.0", "id": 1, "method": "initialize",
                  "params": {"protocolVersion": "2025-06-18", "capabilities": {},
                             "clientInfo": {"name": "t", "version": "1"}}}


def rebinding_probe(url: str, headers: dict[str, str]) -> dict[str, httpx.Response]:
    """Every kind of route, asked with `headers` (a Host, an Origin) beside the caller's own."""
    subj = subject()
    mcp_headers = {**headers, "Accept": "application/json, text/event-stream", SUBJECT_HEADER: subj}
    with httpx.Client(base_url=url, timeout=30) as http:
        return {"healthz": http.get("/healthz", headers=headers),
                "subjects": http.get("/v1/subjects", headers=headers),
                "write": http.post("/v1/memories", json={"subject": subj, "content": "planted"}, headers=headers),
                "inspector": http.get("/", headers=headers),
                "openapi": http.get("/openapi.json", headers=headers),
                "mcp": http.post("/mcp", json=MCP_INITIALIZE, headers=mcp_headers)}


def test_a_page_of_another_site_gets_nothing_with_or_without_keys(served: Served) -> None:
    # DNS rebinding: attacker.example re-pointed at 127.0.0.1 reached a --no-auth server as its own origin
    # and read every subject. Host and Origin must now name the server.
    port = served.url.rsplit(":", 1)[1]
    rebound = served.settings.replace(http_allowed_hosts="memory.example.org, LAN-Box.")
    url, process = start_serve(rebound, "--no-auth")
    try:
        attacker = f"attacker.example:{port}"
        for probe in (rebinding_probe(url, {"Host": attacker, "Origin": f"http://{attacker}"}),
                      rebinding_probe(served.url, {"Host": attacker, "Authorization": f"Bearer {served.admin}"})):
            for route, reply in probe.items():
                assert reply.status_code == 421, (route, reply.status_code, reply.text)
                assert error_of(reply) | {"message": ""} == {"code": "forbidden", "field": "Host", "message": ""}
                assert "MEMFLOW_HTTP_ALLOWED_HOSTS" in error_of(reply)["message"]
        # The right Host, a page of another site as Origin (a form or fetch of a page elsewhere).
        for route, reply in rebinding_probe(url, {"Origin": "http://attacker.example"}).items():
            assert reply.status_code == 403 and error_of(reply)["field"] == "Origin", (route, reply.text)
        assert rebinding_probe(url, {"Origin": "null"})["write"].status_code == 403  # a sandboxed page
        # Its own names on its own port (a Host without one came through a proxy's): localhost, 127.0.0.1, [::1],
        # and the ones the setting adds; the Origin of a page of its own (tests/test_door_origin.py: of no other).
        own = url.rsplit(":", 1)[1]
        for host, name in ((f"localhost:{own}", "localhost"), ("127.0.0.1", "127.0.0.1"), (f"[::1]:{own}", "[::1]"),
                           ("memory.example.org", "memory.example.org"), (f"lan-box:{own}", "lan-box")):
            for route, reply in rebinding_probe(url, {"Host": host, "Origin": f"http://{name}:{own}"}).items():
                assert reply.status_code in (200, 202), (host, route, reply.status_code, reply.text)
    finally:
        stop(process)


def test_the_host_names_a_server_answers_to() -> None:
    assert host_names("0.0.0.0", [""]) == {"localhost", "127.0.0.1", "::1"}
    assert host_names("10.0.0.5", ["Memory.Example.org.", " lan "]) == {"localhost", "127.0.0.1", "::1", "10.0.0.5",
                                                                        "memory.example.org", "lan"}
    names = authorities("127.0.0.1", [])
    for host, origin, refused in [("localhost:8765", None, None), ("LOCALHOST.:8765", "http://127.0.0.1:8765", None),
                                  ("[::1]:8765", "http://[::1]:8765", None), (None, None, None),
                                  ("attacker.example:8765", None, "Host"), ("127.0.0.1.nip.io", None, "Host"),
                                  ("localhost", "http://attacker.example", "Origin"), ("localhost", "null", "Origin")]:
        refusal = host_refusal(names, host, origin, port=8765)
        assert (refusal.field if refusal else None) == refused, (host, origin)
    assert host_refusal(authorities("0.0.0.0", ["*"]), "anything", "http://else", port=8765) is None
    hosts, origins = sdk_hosts(frozenset({"localhost", "::1"}))
    assert hosts == ["[::1]", "[::1]:*", "localhost", "localhost:*"]
    assert "http://localhost:*" in origins and "https://[::1]" in origins
