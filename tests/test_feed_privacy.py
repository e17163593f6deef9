"""The change feed's stream tells a key about its own subjects only (issue 38, item 7), as an attacker holding one
valid key would probe it: while another tenant writes, the key's stream sends keep-alive comments on its own
clock and nothing else (no `id:` naming another's entry, no line sooner or later); a reader resumes after its own
ids (or the opening's) and misses nothing of its own, sees nothing twice; a revoked key's stream ends before its
second keep-alive after the revocation, however busy the other tenant is. A real `memflow serve` over a real
system and Valkey (tests/test_api.py); the other tenant's writes are appended to the `changes` stream as the
applier appends them (tests/test_changes_api.py's `announced`)."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime

import httpx
import pytest

from memflow.pipeline.feed import order
from memflow.shared.apikeys import KeyStore
from memflow.shared.embedder import Embedder
from memflow.shared.redis_server import RedisServer
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
        while (event := lines.next()) == [KEEP_ALIVE]:
            pass
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
        with pytest.raises(EOFError):
            while True:
                after.append(lines.next())
    assert after in ([], [[KEEP_ALIVE]]), after
