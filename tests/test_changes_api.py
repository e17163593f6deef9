"""The change feed over HTTP (`GET /v1/changes`) as a reader and as an attacker holding one valid key would use
it: a reader that hangs up and resumes misses nothing and sees nothing twice; another key's subjects never
appear, with or without `subject=`; a page is bounded; a key holds a bounded number of streams; a revoked key's
stream ends; no memory's words are carried. A real `memflow serve` process over a real system (tests/test_api.py),
and `MemoryClient.changes` over a real Valkey."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from memflow.pipeline.feed import order
from memflow.pipeline.models import Change
from memflow.shared.admission.apikeys import KeyStore
from memflow.shared.changes.feed import MAX_SCAN
from memflow.shared.codec import encode
from memflow.shared.errors import InvalidInput
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.keys import FIELD
from memflow.shared.redisdb.server import RedisServer
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings
from tests.conftest import wait_for
from tests.test_api import Served, error_of, serving, start_serve, stop

KEEPALIVE_S = 0.5


@pytest.fixture(scope="module")
def served(redis_server: RedisServer, embedder: Embedder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    """One system and one `memflow serve` for the module: keep-alives twice a second, two streams per key."""
    yield from serving(redis_server, embedder, tmp_path_factory.mktemp("changes-api"), http_stream_keepalive_s=KEEPALIVE_S,
                            http_max_streams_per_key=2)


def tenant() -> str:
    return f"feed-{uuid.uuid4().hex[:8]}"


def written(served: Served, subj: str, *texts: str) -> None:
    for text in texts:
        served.system.client.write(subj, text, event_id=f"{subj}-{uuid.uuid4().hex[:8]}")
    assert served.system.client.wait_idle(60)


def every_page(served: Served, key: str, **params: Any) -> list[dict[str, Any]]:
    """Every entry the key may read, page after page from the oldest."""
    found: list[dict[str, Any]] = []
    after = "0"
    with served.http(key) as http:
        while True:
            reply = http.get("/v1/changes", params={**params, "after": after})
            assert reply.status_code == 200, reply.text
            page = reply.json()
            found += page["entries"]
            after = page["next"]
            if not page["more"]:
                return found


# -- Server-Sent Events, read as a reader would --------------------------------------------------


class Reader:
    """A stream's events, line by line as the protocol has them (comments kept: they are the keep-alives)."""

    def __init__(self, reply: httpx.Response) -> None:
        self.reply, self.lines = reply, reply.iter_lines()
        self.last_id: str | None = None

    def next_event(self) -> dict[str, str]:
        event: dict[str, str] = {}
        for line in self.lines:
            if line == "":
                if event:
                    if "id" in event:
                        self.last_id = event["id"]
                    return event
                continue
            name, _, value = line.partition(":")
            event[name or "comment"] = value.removeprefix(" ")
        raise EOFError("the stream ended")

    def changes_until(self, done: Any, timeout_s: float = 30.0) -> list[dict[str, Any]]:
        """The `change` events' data until `done(seen)` (keep-alives come twice a second: never stuck)."""
        seen: list[dict[str, Any]] = []
        deadline = time.monotonic() + timeout_s
        while not done(seen):
            assert time.monotonic() < deadline, f"only {seen}"
            event = self.next_event()
            if event.get("event") == "change":
                seen.append(json.loads(event["data"]))
                assert event["id"] == seen[-1]["id"]
        return seen


@contextmanager
def streamed(served: Served, key: str, last_event_id: str | None = None, **params: Any) -> Iterator[Reader]:
    headers = {"Accept": "text/event-stream", **({"Last-Event-ID": last_event_id} if last_event_id else {})}
    with served.http(key) as http, http.stream("GET", "/v1/changes", params=params, headers=headers) as reply:
        assert reply.status_code == 200, reply.read()
        assert reply.headers["content-type"].startswith("text/event-stream")
        reader = Reader(reply)
        opening = reader.next_event()  # open: its cursor is taken (from now: the opening's, as its `id:`)
        assert opening.pop("comment") == "keep-alive" and set(opening) == (set() if last_event_id or "after" in params
                                                                            else {"id"})
        yield reader


def test_a_reader_that_hangs_up_and_resumes_misses_nothing_and_sees_nothing_twice(served: Served) -> None:
    team = tenant()
    mine, theirs = f"{team}-a/x", f"{team}-b/x"
    key = served.key(f"{team}-a/*")
    with streamed(served, key) as reader:
        written(served, mine, "I live in Berlin.")
        first = reader.changes_until(lambda seen: len(seen) >= 1)
        last_id = reader.last_id
    # Hung up: more changes of both tenants meanwhile, one correcting what was read.
    written(served, mine, "Correction: I live in Munich, not Berlin.", "My sister Anna is a nurse.")
    written(served, theirs, "My bank is Acme Bank.")
    truth = every_page(served, served.admin, subject=mine)
    assert len(truth) > len(first)
    with streamed(served, key, last_event_id=last_id) as reader:
        rest = reader.changes_until(lambda seen: len(first) + len(seen) >= len(truth))
        # Nothing more of this key's comes, and nothing of theirs: the next events are keep-alives alone.
        assert all(reader.next_event() == {"comment": "keep-alive"} for _ in range(3))
    assert [e["id"] for e in first + rest] == [e["id"] for e in truth]
    assert {e["subject"] for e in first + rest} == {mine}


def test_another_keys_subjects_never_appear_in_a_page_or_a_stream(served: Served) -> None:
    team = tenant()
    mine, theirs = f"{team}-a/x", f"{team}-b/x"
    key = served.key(f"{team}-a/*")
    with streamed(served, key) as reader:
        written(served, theirs, "My bank is Acme Bank.", "My PIN reminder is the cat's name.")
        written(served, mine, "I prefer tea.")
        seen = reader.changes_until(lambda s: any(e["subject"] == mine for e in s))
    assert {e["subject"] for e in seen} == {mine}
    assert {e["subject"] for e in every_page(served, key)} == {mine}
    assert any(e["subject"] == theirs for e in every_page(served, served.admin))
    with served.http(key) as http:
        for accept in ("application/json", "text/event-stream"):
            refused = http.get("/v1/changes", params={"subject": theirs}, headers={"Accept": accept})
            assert refused.status_code == 403 and error_of(refused)["code"] == "forbidden"


def test_an_entry_carries_ids_and_kinds_never_the_words(served: Served) -> None:
    subj = tenant()
    written(served, subj, "My favourite colour is ultramarine.")
    with served.http(served.admin) as http:
        reply = http.get("/v1/changes", params={"subject": subj, "after": "0"})
    assert reply.status_code == 200
    entries = reply.json()["entries"]
    assert entries and all(set(e) == {"id", "memory_id", "subject", "kind", "revision", "at"} for e in entries)
    assert entries[0]["kind"] == "add" and entries[0]["revision"] is not None
    assert "ultramarine" not in reply.text


def test_a_page_is_bounded_and_pages_chain_without_overlap(served: Served) -> None:
    subj = tenant()
    written(served, subj, "I live in Oslo.", "I work as a baker.", "My dog is called Rex.")
    whole = every_page(served, served.admin, subject=subj)
    assert len(whole) >= 3
    assert every_page(served, served.admin, subject=subj, limit=1) == whole
    with served.http(served.admin) as http:
        first = http.get("/v1/changes", params={"subject": subj, "limit": 2}).json()
        assert len(first["entries"]) == 2 and first["more"] and first["next"] == first["entries"][-1]["id"]
        for bad in ({"limit": 1001}, {"limit": 0}, {"after": "yesterday"}, {"after": "1" * 20}):
            refused = http.get("/v1/changes", params=bad)
            assert refused.status_code == 422, refused.text
            assert error_of(refused)["field"] == next(iter(bad))
        refused = http.get("/v1/changes", headers={"Accept": "text/event-stream", "Last-Event-ID": "x; DROP"})
        assert refused.status_code == 422 and error_of(refused)["field"] == "last-event-id"


def test_the_openapi_document_gives_both_forms_their_models(served: Served) -> None:
    """The TypeScript client's types come from here."""
    doc = httpx.get(f"{served.url}/openapi.json").json()
    ok = doc["paths"]["/v1/changes"]["get"]["responses"]["200"]["content"]
    assert ok["application/json"]["schema"] == {"$ref": "#/components/schemas/ChangesPage"}
    assert "text/event-stream" in ok
    assert set(doc["components"]["schemas"]["FeedEntry"]["properties"]) == {"id", "memory_id", "subject", "kind",
                                                                            "revision", "at"}


def test_a_key_holds_a_bounded_number_of_streams(served: Served) -> None:
    key = served.key(f"{tenant()}/*")
    with streamed(served, key), streamed(served, key) as second:
        with served.http(key) as http:
            refused = http.get("/v1/changes", headers={"Accept": "text/event-stream"})
            assert refused.status_code == 429 and error_of(refused)["code"] == "rate_limited"
            assert refused.headers["Retry-After"]
        second.reply.close()

        def reopened() -> bool:
            with served.http(key) as http, http.stream("GET", "/v1/changes",
                                                       headers={"Accept": "text/event-stream"}) as reply:
                return reply.status_code == 200
        wait_for(reopened, 10, "the hung-up stream's place to be given back")
    with streamed(served, served.key(f"{tenant()}/*")):  # another key's streams are its own
        pass


def hold_stream(served: Served, key: str, stack: ExitStack) -> None:
    """Open a stream of `key` on `served` and keep it open in `stack`, once the key has a place free (one given
    back lands a moment after its reader hung up)."""
    def opened() -> bool:
        try:
            stack.enter_context(streamed(served, key))
        except AssertionError:
            return False
        return True
    wait_for(opened, 30, "a stream of the key to be let in")


def refused_stream(served: Served, key: str) -> bool:
    with served.http(key) as http, http.stream("GET", "/v1/changes", headers={"Accept": "text/event-stream"}) as reply:
        return reply.status_code == 429 and json.loads(reply.read())["error"]["code"] == "rate_limited"


def test_a_keys_streams_are_counted_across_server_processes_and_a_dead_ones_lapse(served: Served) -> None:
    """Two `memflow serve` processes on one Redis: a key's streams on one leave it none on the other
    (MEMFLOW_HTTP_MAX_STREAMS_PER_KEY is the key's, not a process's); a process killed holding the key's streams
    never gives them back, and its places lapse (four keep-alives after their last renewal) instead."""
    key = served.key(f"{tenant()}/*")
    other_url, other = start_serve(served.settings)
    there = dataclasses.replace(served, url=other_url, process=other)
    try:
        with ExitStack() as here:
            hold_stream(served, key, here)
            hold_stream(served, key, here)
            assert refused_stream(there, key)
        with ExitStack() as dying:
            hold_stream(there, key, dying)  # given back by the first process: taken on the other
            hold_stream(there, key, dying)
            assert refused_stream(served, key)
            other.kill()
            other.wait(20)
        with ExitStack() as after:  # never given back: lapsed
            hold_stream(served, key, after)
            hold_stream(served, key, after)
            assert refused_stream(served, key)
    finally:
        if other.poll() is None:
            stop(other)


def test_a_revoked_keys_stream_ends(served: Served) -> None:
    store = KeyStore(served.system.client.redis, served.system.client.keys)
    record, secret = store.create(f"revoked-{uuid.uuid4().hex[:6]}", [f"{tenant()}/*"], read_only=True,
                                  now=datetime.now(UTC))
    with streamed(served, secret) as reader:
        assert reader.next_event() == {"comment": "keep-alive"}  # nothing changes: kept alive
        assert store.revoke(record.id)
        after = []
        with pytest.raises(EOFError):  # a stream that goes on past two more events was not ended
            for _ in range(2):
                after.append(reader.next_event())
        assert after in ([], [{"comment": "keep-alive"}])  # ended by its next keep-alive (test_feed_privacy.py)


# -- the SDK, and a trimmed stream ------------------------------------------------------------------


def announced(client: MemoryClient, subject: str, n: int) -> list[str]:
    """`n` changes of `subject` on the feed, as the applier appends them (shared/writer/applier.py)."""
    ids = []
    for i in range(n):
        change = Change(memory_id=str(uuid.uuid4()), subject=subject, action="add", why=f"secret words {i}",
                        after={"content": "secret words"}, at=datetime.now(UTC), rev=1)
        ids.append(client.redis.xadd(client.keys.changes, {FIELD: encode(change)}).decode())
    return ids


def test_the_sdk_reads_pages_and_says_when_the_stream_was_trimmed_past_its_cursor(settings: Settings) -> None:
    client = MemoryClient(settings)
    assert client.changes().entries == []
    ids = announced(client, "a", 3) + announced(client, "b", 2)
    page = client.changes("a", limit=2)
    assert [e.id for e in page.entries] == ids[:2] and page.more and not page.gap
    rest = client.changes("a", after=page.next)
    assert [e.id for e in rest.entries] == ids[2:3] and not rest.more
    # Read to the end: `next` is a moment of the stream's clock (the millisecond before the page opened: b's entries
    # of that same millisecond are read again, never skipped), past a's last without naming any entry.
    assert order(rest.next) > order(ids[2]) and not client.redis.xrange(client.keys.changes, rest.next, rest.next)
    assert client.changes("a", after=rest.next).entries == []
    later = announced(client, "a", 1)
    assert [e.id for e in client.changes("a", after=rest.next).entries] == later
    assert "secret" not in rest.model_dump_json()
    client.redis.xtrim(client.keys.changes, minid=ids[3], approximate=False)  # as MAXLEN trims
    trimmed = client.changes(after=ids[0])
    assert trimmed.gap and [e.id for e in trimmed.entries] == ids[3:] + later
    assert not client.changes(after=ids[3]).gap
    # Stopped among b's entries (more than a page reads): a sealed place, and a's next change from it.
    with client.redis.pipeline(transaction=False) as pipe:
        for _ in range(MAX_SCAN):
            pipe.xadd(client.keys.changes, {FIELD: b"{}"})
        pipe.execute()
    last = announced(client, "a", 1)
    stopped = client.changes("a", after=later[0])
    assert stopped.entries == [] and stopped.more and stopped.next.startswith("~")
    assert [e.id for e in client.changes("a", after=stopped.next).entries] == last
    for bad in ({"limit": 0}, {"after": "yesterday"}, {"after": forged(stopped.next)}):
        with pytest.raises(InvalidInput):
            client.changes(**bad)


def forged(sealed: str) -> str:
    """A sealed cursor with one character of its place changed (not its last: base64 leaves bits there unread)."""
    return sealed[:10] + ("A" if sealed[10] != "A" else "B") + sealed[11:]


def test_a_stream_says_when_the_feed_was_trimmed_past_its_cursor(served: Served) -> None:
    """Last in the module: it trims the module's feed."""
    subj = tenant()
    written(served, subj, "I live in Quito.")
    newest = every_page(served, served.admin, subject=subj)[-1]["id"]
    served.system.client.redis.xtrim(served.system.client.keys.changes, minid=newest, approximate=False)
    with streamed(served, served.admin, after="1-0") as reader:
        assert reader.next_event() == {"event": "gap", "data": '{"after": "1-0"}'}
        assert reader.changes_until(lambda seen: len(seen) >= 1)[0]["id"] == newest
