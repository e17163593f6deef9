"""`memflow serve` holds to its own origin (issue 38 item 6): a page of another port of this machine, or of
the server's host over another scheme, gets nothing, `--no-auth` or keys; a route that reads JSON refuses any
other body with a clear 415, since `Content-Type: text/plain` is how a page posts without a preflight.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

import httpx
import pytest

from memflow.workers.front import authorities, host_refusal
from tests import test_api
from tests.test_api import Served, error_of, free_port, start_serve, stop, subject

served = test_api.served  # the module's system and `memflow serve` (with keys)


@dataclass
class Open:
    """A `--no-auth` server beside the keyed one, on the same system."""

    url: str
    port: int


@pytest.fixture(scope="module")
def open_door(served: Served) -> Iterator[Open]:
    settings = served.settings.replace(http_allowed_hosts="memory.example.org, proxy.example:443")
    url, process = start_serve(settings, "--no-auth")
    yield Open(url, int(url.rsplit(":", 1)[1]))
    stop(process)


def other_port(own: int) -> int:
    """A port of this machine that is not the server's: a page of another local web server."""
    port = free_port()
    return port if port != own else other_port(own)


def event(subj: str) -> dict[str, str]:
    return {"event_id": "e1", "subject": subj, "session_id": "s", "kind": "message", "role": "user",
            "text": "planted by a page", "ts": "2026-01-05T09:00:00+00:00"}


def test_a_page_of_another_port_posts_nothing_under_no_auth(open_door: Open) -> None:
    # The attack: a page of http://127.0.0.1:9999 posts to the --no-auth server on its own port, as text/plain
    # (no preflight). Its Host is the server's own; only the Origin's port tells it apart.
    subj, own = subject(), open_door.port
    body = json.dumps(event(subj)).encode()
    pages = [f"http://127.0.0.1:{other_port(own)}", f"http://localhost:{other_port(own)}",
             f"https://127.0.0.1:{own}", f"http://[::1]:{other_port(own)}", "http://127.0.0.1"]
    with httpx.Client(base_url=open_door.url, timeout=30) as http:
        for origin in pages:
            for path in ("/v1/events", "/v1/import", "/v1/memories"):
                reply = http.post(path, content=body, headers={"Origin": origin, "Content-Type": "text/plain"})
                assert reply.status_code == 403, (origin, path, reply.status_code, reply.text)
                assert error_of(reply)["field"] == "Origin" and origin in error_of(reply)["message"]
        # What already worked still does: a page of the server itself, and no Origin at all (curl, the SDKs).
        for headers in ({"Origin": f"http://127.0.0.1:{own}"}, {"Origin": f"http://localhost:{own}"}, {}):
            reply = http.post("/v1/events", json=event(subj), headers=headers)
            assert reply.status_code == 202, (headers, reply.text)
        assert http.get("/v1/subjects", headers={"Origin": f"http://127.0.0.1:{own}"}).status_code == 200


def test_a_host_naming_another_port_is_refused_421(open_door: Open) -> None:
    own = open_door.port
    with httpx.Client(base_url=open_door.url, timeout=30) as http:
        for host in (f"127.0.0.1:{other_port(own)}", f"localhost:{other_port(own)}", f"memory.example.org:{own + 1}",
                     "proxy.example:8443", "localhost:no-port"):
            reply = http.get("/v1/subjects", headers={"Host": host})
            assert reply.status_code == 421, (host, reply.status_code, reply.text)
            assert error_of(reply)["field"] == "Host"
        # Its own port; a Host without one (a proxy's default port forwarded here); an entry's own port.
        for host in (f"127.0.0.1:{own}", f"memory.example.org:{own}", "memory.example.org", "proxy.example:443"):
            assert http.get("/v1/subjects", headers={"Host": host}).status_code == 200, host


def test_an_allowed_host_entry_names_its_port_or_means_the_servers_own(open_door: Open) -> None:
    # `memory.example.org` (no port): the server's own port and scheme. `proxy.example:443`: a TLS proxy in front,
    # whose pages are https://proxy.example.
    own, subj = open_door.port, subject()
    with httpx.Client(base_url=open_door.url, timeout=30) as http:
        for origin, status in ((f"http://memory.example.org:{own}", 202), ("https://memory.example.org", 403),
                               (f"http://memory.example.org:{other_port(own)}", 403),
                               ("https://proxy.example", 202), ("https://proxy.example:443", 202),
                               ("https://proxy.example:8443", 403), (f"http://proxy.example:{own}", 403)):
            reply = http.post("/v1/events", json=event(subj), headers={"Origin": origin})
            assert reply.status_code == status, (origin, reply.status_code, reply.text)


def test_with_keys_a_page_of_another_port_is_refused_too(served: Served) -> None:
    own = int(served.url.rsplit(":", 1)[1])
    with served.http(served.admin) as http:
        reply = http.post("/v1/memories", json={"subject": subject(), "content": "x"},
                          headers={"Origin": f"http://127.0.0.1:{other_port(own)}"})
        assert reply.status_code == 403 and error_of(reply)["field"] == "Origin", reply.text
        assert http.get("/v1/subjects", headers={"Host": f"localhost:{other_port(own)}"}).status_code == 421


def test_the_origin_is_compared_whole() -> None:
    allowed = authorities("127.0.0.1", ["lan-box", "proxy.example:443"])
    for origin, scheme, refused in [("http://127.0.0.1:8765", "http", None), ("http://LocalHost.:8765", "http", None),
                                    ("http://127.0.0.1:8766", "http", "Origin"), ("http://127.0.0.1", "http", "Origin"),
                                    ("https://127.0.0.1:8765", "http", "Origin"), ("https://127.0.0.1:8765", "https", None),
                                    ("http://lan-box:8765", "http", None), ("https://proxy.example", "http", None),
                                    ("http://127.0.0.1:99999", "http", "Origin"), ("chrome-extension://abc", "http", "Origin"),
                                    ("null", "http", "Origin")]:
        refusal = host_refusal(allowed, "127.0.0.1:8765", origin, scheme=scheme, port=8765)
        assert (refusal.field if refusal else None) == refused, (origin, scheme)


def bodies(subj: str) -> dict[tuple[str, str], bytes]:
    """A body each route that reads one would take, as JSON text (an import: an empty export's lines)."""
    some_id = str(uuid.uuid4())
    return {("POST", "/v1/events"): json.dumps(event(subj)).encode(),
            ("POST", "/v1/memories"): json.dumps({"subject": subj, "content": "I like green tea."}).encode(),
            ("POST", "/v1/search"): json.dumps({"subject": subj, "query": "tea"}).encode(),
            ("POST", "/v1/pack"): json.dumps({"subject": subj, "query": "tea"}).encode(),
            ("POST", "/v1/feedback"): json.dumps({"subject": subj, "memory_ids": [some_id]}).encode(),
            ("DELETE", f"/v1/subjects/{subj}/memories"): json.dumps({"memory_ids": [some_id]}).encode()}


def test_a_route_that_reads_json_refuses_another_body_415(served: Served) -> None:
    # text/plain (a page's post without a preflight), a form, or no Content-Type at all: each got pydantic's
    # "Input should be a valid dictionary", or was read as the event it spells.
    subj = subject()
    with served.http(served.admin) as http:
        for (method, path), body in bodies(subj).items():
            for sent in ("text/plain", "application/x-www-form-urlencoded", "text/plain; charset=utf-8", None):
                headers = {"Content-Type": sent} if sent else {}
                reply = http.request(method, path, content=body, headers=headers)
                assert reply.status_code == 415, (path, sent, reply.status_code, reply.text)
                error = error_of(reply)
                assert error["code"] == "invalid_input" and error["field"] == "Content-Type", error
                assert "application/json" in error["message"], error
            for sent in ("application/json", "application/json; charset=utf-8", "Application/JSON",
                         "application/vnd.memflow+json"):
                reply = http.request(method, path, content=body, headers={"Content-Type": sent})
                assert reply.status_code in (200, 202), (path, sent, reply.status_code, reply.text)
        assert http.get(f"/v1/subjects/{subj}/memories").status_code == 200  # no body: none asked for
        forgotten = http.delete(f"/v1/subjects/{subj}/memories", params={"contains": "nothing like it"})
        assert forgotten.status_code == 200, forgotten.text


def test_an_import_reads_json_lines_only(served: Served) -> None:
    lines = export_of(served, subject())
    with served.http(served.admin) as http:
        for sent in ("text/plain", "application/json", None):
            reply = http.post("/v1/import", content=lines, headers={"Content-Type": sent} if sent else {})
            assert reply.status_code == 415, (sent, reply.status_code, reply.text)
            assert error_of(reply)["field"] == "Content-Type" and "application/x-ndjson" in error_of(reply)["message"]
        reply = http.post("/v1/import", content=lines, headers={"Content-Type": "application/x-ndjson"})
        assert reply.status_code == 200, reply.text


def export_of(served: Served, subj: str) -> bytes:
    with served.http(served.admin) as http:
        reply = http.get(f"/v1/subjects/{subj}/export")
        assert reply.status_code == 200, reply.text
        return reply.content
