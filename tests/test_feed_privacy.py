"""The change feed's stream tells a key about its own subjects only (issue 38, item 7), as an attacker holding one
valid key would probe it: while another tenant writes, the key's stream sends keep-alive comments on its own
clock and nothing else (no `id:` naming another's entry, no line sooner or later); a reader resumes after its own
ids (or the opening's) and misses nothing of its own, sees nothing twice; a revoked key's stream ends before its
second keep-alive after the revocation, however busy the other tenant is. A page is the same: with and without
another tenant's changes interleaved a key gets the same pages (`next` and `more` included), and one that stops
among many of theirs names its place sealed, resuming exactly there. A real `memflow serve` over a real
system and Valkey (tests/test_api.py); the other tenant's writes are appended to the `changes` stream as the
applier appends them (tests/test_changes_api.py's `announced`)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from typing import Any

import httpx
import pytest

from memflow.pipeline.feed import order
from memflow.pipeline.models import Change
from memflow.shared.admission.apikeys import KeyStore
from memflow.shared.codec import encode
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.keys import FIELD
from memflow.shared.redisdb.server import RedisServer
from tests.conftest import wait_for
from tests.test_api import Served, serving
from tests.test_changes_api import announced

KEEPALIVE_S = 0.5
KEEP_ALIVE = ": keep-alive"


@pytest.fixture(scope="module")
def served(redis_server: RedisServer, embedder: Embedder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from serving(redis_server, embedder, tmp_path_factory.mktemp("feed-privacy"),
                       http_stream_keepalive_s=KEEPALIVE_S)


def team() -> str:
    return f"priv-{uuid.uuid4().hex[:8]}"


class Lines:
    """A stream's events as the bytes' lines came, each event its lines (a keep-alive is `[": keep-alive"]`)."""

    def __init__(self, reply: httpx.Response) -> None:
        self.lines = reply.iter_lines()

    def next(self) -> list[str]:
        event: list[str] = []
        for line in self.lines:
            if line == "":
                if event:
                    return event
                continue
            event.append(line)
        raise EOFError("the stream ended")

    def past_keep_alives(self, most: int) -> list[str]:
        """The next event that is not a keep-alive, failing (not waiting for good) after `most` keep-alives."""
        for _ in range(most):
            if (event := self.next()) != [KEEP_ALIVE]:
                return event
        raise AssertionError(f"{most} keep-alives and no other event")

    def keep_alives(self, n: int) -> None:
        """The next `n` events, each a keep-alive and only that (keep-alives come on the stream's clock: never
        stuck)."""
        for _ in range(n):
            assert self.next() == [KEEP_ALIVE]


@contextmanager
def streamed(served: Served, key: str, last_event_id: str | None = None) -> Iterator[tuple[Lines, list[str]]]:
    """A stream of `key` and its opening event's lines."""
    headers = {"Accept": "text/event-stream", **({"Last-Event-ID": last_event_id} if last_event_id else {})}
    with served.http(key) as http, http.stream("GET", "/v1/changes", headers=headers) as reply:
        assert reply.status_code == 200, reply.read()
        lines = Lines(reply)
        yield lines, lines.next()


@contextmanager
def writing(served: Served, subject: str) -> Iterator[list[str]]:
    """Another tenant writing `subject` all along (one change every KEEPALIVE_S / 25, as a busy tenant does):
    the ids written so far, the last once it stopped."""
    client, stop, ids = served.system.client, threading.Event(), []

    def write() -> None:
        while not stop.is_set():
            ids.extend(announced(client, subject, 1))
            stop.wait(KEEPALIVE_S / 25)  # the tenant's pace, not a wait for anything
    writer = threading.Thread(target=write, daemon=True)
    writer.start()
    try:
        wait_for(lambda: len(ids) >= 3, 10, "the other tenant's first changes")
        yield ids
    finally:
        stop.set()
        writer.join(10)


def own_id(served: Served, subject: str) -> str:
    return announced(served.system.client, subject, 1)[0]


def test_another_tenants_writes_change_nothing_a_stream_sends(served: Served) -> None:
    name = team()
    mine, theirs = f"{name}-a/x", f"{name}-b/x"
    key = served.key(f"{name}-a/*")
    with streamed(served, key) as (lines, opening), writing(served, theirs) as ids:
        assert opening[-1] == KEEP_ALIVE
        # Some 25 of their changes a keep-alive: the stream sends keep-alives on its clock, each one alone.
        lines.keep_alives(3)
        mine_id = own_id(served, mine)
        event = lines.past_keep_alives(60)  # a deadline of 30 s, counted on the stream's own clock
        assert event[:2] == [f"id: {mine_id}", "event: change"], event
        lines.keep_alives(2)
    assert len(ids) > 3


def test_a_reader_resumes_after_the_opening_or_its_own_last_id_missing_nothing_seeing_nothing_twice(
        served: Served) -> None:
    """Its `id:`s are its own: where it had none, the opening's, a moment that names no entry of the stream."""
    name = team()
    mine, theirs = f"{name}-a/x", f"{name}-b/x"
    key = served.key(f"{name}-a/*")
    with writing(served, theirs), streamed(served, key) as (lines, opening):
        assert opening[1:] == [KEEP_ALIVE] and opening[0].startswith("id: ")
        lines.keep_alives(1)
    opened = opening[0].removeprefix("id: ")
    assert not served.system.client.redis.xrange(served.system.client.keys.changes, opened, opened)
    # Hung up before any change of its own came: resumed after the opening, its changes since then.
    first, second = own_id(served, mine), own_id(served, mine)
    with writing(served, theirs), streamed(served, key, last_event_id=opened) as (lines, opening):
        assert opening == [KEEP_ALIVE]  # the reader gave its cursor: nothing to tell
        assert [lines.next()[:2] for _ in range(2)] == [[f"id: {first}", "event: change"],
                                                       [f"id: {second}", "event: change"]]
        lines.keep_alives(2)
    # Resumed after its own last id, theirs before and after the next of its own: that one alone.
    with writing(served, theirs) as busy:
        third = own_id(served, mine)
        wait_for(lambda: order(busy[-1]) > order(third), 10, "another change of theirs after ours")
    assert order(second) < order(busy[0]) < order(third)
    with streamed(served, key, last_event_id=second) as (lines, _):
        assert lines.next()[:2] == [f"id: {third}", "event: change"]
        lines.keep_alives(2)


def test_a_revoked_keys_stream_ends_before_its_second_keep_alive_however_busy_another_tenant_is(
        served: Served) -> None:
    """The stream checks its key before each keep-alive and no read outlasts the next one: after the revocation,
    at most one keep-alive comes (the check before it ran just before the revocation), then the end. Keep-alives
    are the stream's own clock: the other tenant's writes neither hold them back nor hurry them."""
    name = team()
    store = KeyStore(served.system.client.redis, served.system.client.keys)
    record, secret = store.create(f"revoked-{uuid.uuid4().hex[:6]}", [f"{name}-a/*"], read_only=True,
                                  now=datetime.now(UTC))
    with streamed(served, secret) as (lines, _), writing(served, f"{name}-b/x"):
        lines.keep_alives(2)  # kept alive on its clock, busy as the other tenant is
        assert store.revoke(record.id)
        after: list[list[str]] = []
        with pytest.raises(EOFError):  # a stream that goes on past two more events was not ended
            for _ in range(2):
                after.append(lines.next())
    assert after in ([], [[KEEP_ALIVE]]), after


# -- pages --------------------------------------------------------------------------------------------


def pages(served: Served, key: str, after: str, limit: int) -> list[dict[str, Any]]:
    """Every page the key gets from `after` on, as a reader asks for them (again with `next` while `more`)."""
    got: list[dict[str, Any]] = []
    with served.http(key) as http:
        while not got or got[-1]["more"]:
            reply = http.get("/v1/changes", params={"after": got[-1]["next"] if got else after, "limit": limit})
            assert reply.status_code == 200, reply.text
            got.append(reply.json())
            assert len(got) < 10_000, "a reader that never gets to the end"
    return got


def start(served: Served, key: str) -> str:
    """Where a reader that read the whole feed resumes from: the last page's `next`."""
    return pages(served, key, "0", 1000)[-1]["next"]


def seen(served: Served, page: dict[str, Any], own: list[str], after: str) -> dict[str, Any]:
    """A page as its key can tell it: its entries by their place among the key's own changes, and its `next` by
    what it names: one of them, the cursor asked with, a sealed place, or a moment of the clock (an id no entry
    of the stream has, past the key's last); anything else is the raw id, another's."""
    def named(cursor: str) -> Any:
        if cursor in own:
            return ("own", own.index(cursor))
        if cursor == after:
            return "asked"
        if cursor.startswith("~"):
            return "sealed"
        redis, keys = served.system.client.redis, served.system.client.keys
        past_own = not own or order(cursor) > order(own[-1])
        return "clock" if past_own and cursor.endswith(f"-{10**19 - 1}") and not redis.xrange(keys.changes, cursor,
                                                                                                cursor) else cursor
    return {"entries": [own.index(e["id"]) for e in page["entries"]], "more": page["more"], "gap": page["gap"],
            "next": named(page["next"])}


def paged(served: Served, theirs: str | None) -> list[list[dict[str, Any]]]:
    """A key's pages of its own four changes, then of two more after it read to the end; with `theirs` set, another
    tenant's changes interleaved before, between and after its own."""
    name = team()
    mine = f"{name}-a/x"
    key = served.key(f"{name}-a/*")
    client = served.system.client

    def others(n: int) -> None:
        if theirs is not None:
            announced(client, theirs, n)

    after, own, answers = start(served, key), [], []
    for _ in range(2):
        for _ in range(2 if own else 4):
            others(3)
            own.append(own_id(served, mine))
        others(2)
        got = pages(served, key, after, 2)
        answers.append([seen(served, page, own, after) for page in got])
        read = [e["id"] for page in got for e in page["entries"]]
        assert read == (own if len(own) == 4 else own[4:]), read  # exactly its own, none missed, none twice
        after = got[-1]["next"]
    return answers


def test_another_tenants_writes_change_nothing_in_the_pages_a_key_gets(served: Served) -> None:
    """The same four changes of a key's, then two more read from where it stopped, with and without another
    tenant's changes interleaved: the same pages, `next` and `more` included. A full page says `more` whatever
    follows, a page read to the end ends at a moment of the clock, never at another's entry."""
    alone = paged(served, None)
    busy = paged(served, f"{team()}-b/x")
    assert busy == alone
    assert alone[0][-1]["next"] == "clock" and alone[0][1]["more"], alone


def test_a_page_that_stops_among_many_others_changes_names_no_place_of_theirs_and_resumes_exactly(
        served: Served) -> None:
    """Past the 5,000 entries a page reads, another tenant's changes stop a page before the end: its `next` is a
    sealed place (naming none of their entries, nor when), and a reader that asks again from it gets its own
    changes, all of them, once; a sealed cursor this deployment did not make is refused, naming `after`."""
    name = team()
    mine = f"{name}-a/x"
    key = served.key(f"{name}-a/*")
    client = served.system.client
    after, own = start(served, key), []
    for _ in range(3):
        own.append(own_id(served, mine))
        with client.redis.pipeline(transaction=False) as pipe:
            for i in range(3000):
                pipe.xadd(client.keys.changes, {FIELD: encode(Change(
                    memory_id=str(uuid.uuid4()), subject=f"{name}-b/x", action="add", why="", at=datetime.now(UTC),
                    rev=i + 1))})
            pipe.execute()
    own.append(own_id(served, mine))
    got = pages(served, key, after, 100)
    named = [seen(served, page, own, after)["next"] for page in got]
    assert "sealed" in named and all(n in ("sealed", "clock") or n[0] == "own" for n in named), named
    assert [e["id"] for page in got for e in page["entries"]] == own
    sealed = next(page["next"] for page in got if page["next"].startswith("~"))
    forged = sealed[:10] + ("A" if sealed[10] != "A" else "B") + sealed[11:]  # a bit of the place changed
    with served.http(key) as http:
        refused = http.get("/v1/changes", params={"after": forged})
        assert refused.status_code == 422 and refused.json()["error"]["field"] == "after", refused.text
        assert http.get("/v1/changes", params={"after": sealed}).status_code == 200
