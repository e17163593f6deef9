"""The change feed over HTTP (`GET /v1/changes`, docs/changes.md): the `changes` stream's entries, ids and kinds
only, filtered to the key's subjects, as a paged JSON list or, with `Accept: text/event-stream`, as Server-Sent
Events that follow the stream as it grows. Both resume after the last id seen (`after`, or `Last-Event-ID`).

A page is one request like any other (a place among the requests and the key's share). A stream is not: it
lives as long as its reader, so it holds no place among the requests and no thread — it waits on the event loop
in a blocking read of its own Redis connection, MEMFLOW_HTTP_STREAM_KEEPALIVE_S at a time, writing a keep-alive
comment on its own clock — and is counted instead: MEMFLOW_HTTP_MAX_STREAMS per process (its connections),
_PER_KEY per key across every server process (a place in Redis, shared/admission/shares.py, renewed by the stream's loop
and lapsing STREAM_LEASE_KEEPALIVES keep-alives after its last renewal if its process died). Before each
keep-alive it checks its key is still valid and renews its place, and no read outlasts the next keep-alive: a
revoked key's stream ends within a keep-alive, and so does one whose place was counted away as lapsed (it stalled
past its lease).

What a stream sends depends on its key's subjects and its own clock only. Another subject's entry wakes its read
and moves its read position, nothing else: no line, no `id:`, no keep-alive sooner or later. So its `id:`s are its
own entries' (and, opened from now, the moment it opened: `feed.since`), and a reader that resumes after one reads
past the others' entries again, on the server, rather than be told where they were."""

from __future__ import annotations

import logging
import math
import time
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Annotated, Any

import anyio
import redis
from fastapi import APIRouter, FastAPI, Header, Query, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.types import Receive, Scope, Send

from memflow.pipeline import feed
from memflow.pipeline.feed import CURSOR_PATTERN, DEFAULT_PAGE, MAX_PAGE, ChangesPage
from memflow.pipeline.models import Subject
from memflow.shared.admission.apikeys import ApiKey
from memflow.shared.admission.fairness import Refused
from memflow.shared.admission.shares import KeyShares, Place
from memflow.shared.changes.feed import SCAN_BATCH, decoded, opening_async, page_async
from memflow.shared.redisdb.connections import connect_async, require_url
from memflow.shared.redisdb.keys import Keys, id_space
from memflow.shared.settings import Settings
from memflow.workers.api_edge import ERRORS, RETRY_AFTER_S, Caller, admitted, fair_share
from memflow.workers.front import ApiError, allowed, authenticate_async, bearer

SSE = "text/event-stream"
log = logging.getLogger(__name__)

changes_routes = APIRouter(prefix="/v1", responses=ERRORS, tags=["read"])

_EVENTS = {"description": "With `Accept: text/event-stream`: Server-Sent Events. Each change is an event `change` "
                          "whose `id:` is the entry's id and whose data is a `FeedEntry`; an event `gap` says the "
                          "stream was trimmed past the cursor; a comment line is a keep-alive, every "
                          "MEMFLOW_HTTP_STREAM_KEEPALIVE_S; the first, opened from now, carries the cursor of the "
                          "opening as its `id:`.",
           "content": {SSE: {"schema": {"type": "string"}}}}


# A stream's place in Redis lapses this many keep-alives after its last renewal. Its loop renews it once a
# keep-alive, and one pass of the loop is a read of up to a keep-alive and the writes after it: four
# leave a slow reader's stream room, and free a dead process's places within a minute (15 s keep-alives).
STREAM_LEASE_KEEPALIVES = 4


class Streams:
    """The streams one server process holds open: at most `total`, `per_key` for one key in this process (the
    key's places across processes are KeyShares' when keys are checked; with --no-auth, one caller, only these)."""

    def __init__(self, total: int, per_key: int) -> None:
        self.total, self.per_key = total, per_key
        self.open: Counter[str] = Counter()

    def take(self, key_id: str) -> Callable[[], None]:
        """A place for a stream of `key_id`, or the refusal; the function that gives it back (once)."""
        if sum(self.open.values()) >= self.total:
            raise ApiError(503, "busy", f"the server holds {self.total} streams: try again shortly",
                           retry_after_s=RETRY_AFTER_S)
        if self.open[key_id] >= self.per_key:
            raise _too_many(self.per_key)
        self.open[key_id] += 1
        given = False

        def give_back() -> None:
            nonlocal given
            if not given:
                given = True
                self.open[key_id] -= 1
                if self.open[key_id] <= 0:
                    del self.open[key_id]
        return give_back


def _too_many(per_key: int) -> ApiError:
    return ApiError(429, "rate_limited", f"this key holds {per_key} streams open already: close one",
                    retry_after_s=RETRY_AFTER_S)


@dataclass
class Held:
    """A stream's places: this process's (`give_back_here`) and, when keys are checked, its key's across
    processes (`place` in `shares`), renewed by the stream's loop and given back when it ends."""

    give_back_here: Callable[[], None]
    shares: KeyShares | None = None
    place: Place | None = None
    lease_s: float = 0.0

    async def renew(self) -> bool:
        if self.shares is None or self.place is None:
            return True
        try:
            return await self.shares.renew_stream(self.place, self.lease_s)
        except redis.RedisError:
            return True  # Redis unreachable: the place lapses if this lasts; the read beside it fails first

    async def give_back(self) -> None:
        self.give_back_here()
        if self.shares is not None and self.place is not None:
            place, self.place = self.place, None
            with anyio.CancelScope(shield=True):  # a request cancelled at shutdown still gives its place back
                try:
                    await self.shares.release_stream(place)
                except redis.RedisError:
                    log.warning("a stream's place of key %s was not given back: it lapses", place.key_id)


async def hold(request: Request, key: ApiKey, state: Feed) -> Held:
    """The places a new stream of `key` takes, or the refusal: 503 when this process holds its most streams,
    429 when the key holds its most across every process."""
    held = Held(state.streams.take(key.id))
    shares: KeyShares | None = request.app.state.shares
    if shares is None:
        return held
    try:
        taken = await shares.take_stream(key.id, state.streams.per_key, state.lease_s)
    except BaseException:
        held.give_back_here()
        raise
    if isinstance(taken, Refused):
        held.give_back_here()
        raise _too_many(state.streams.per_key)
    held.shares, held.place, held.lease_s = shares, taken, state.lease_s
    return held


class Feed:
    """What the streams share: their connections (one each while it reads), their places, the keep-alive."""

    def __init__(self, settings: Settings, keys: Keys) -> None:
        http = settings.http
        self.keys, self.keepalive_s = keys, http.stream_keepalive_s
        self.lease_s = STREAM_LEASE_KEEPALIVES * http.stream_keepalive_s
        self.streams = Streams(http.max_streams, http.max_streams_per_key)
        self.sealed: feed.Sealed | None = None  # the places pages seal (`_sealed`), once read
        # Its own pool: a stream holds a connection for its whole read, never one of the requests'.
        self.redis = connect_async(require_url(settings), cluster=settings.redis.cluster,
                                   socket_timeout_s=http.stream_keepalive_s + settings.client.socket_timeout_s,
                                   connect_timeout_s=settings.client.connect_timeout_s,
                                   max_connections=http.max_streams + 1)


def install(app: FastAPI, settings: Settings, keys: Keys) -> Feed:
    app.state.feed = Feed(settings, keys)
    app.include_router(changes_routes)
    return app.state.feed  # type: ignore[no-any-return]


@changes_routes.get("/changes", response_model=ChangesPage, responses={200: _EVENTS})
async def changes(request: Request, key: Caller,
                  subject: Annotated[Subject | None, Query(description="One subject (else every subject the key "
                                                                       "may see).")] = None,
                  after: Annotated[str | None, Query(pattern=CURSOR_PATTERN, description=(
                      "The last entry's id seen, or `next` of the page before as it came; `0` or none: from the "
                      "oldest entry kept (a page) or from now (a stream)."))] = None,
                  limit: Annotated[int, Query(ge=1, le=MAX_PAGE, description="Entries at most (a page).")
                                   ] = DEFAULT_PAGE,
                  last_event_id: Annotated[str | None, Header(pattern=CURSOR_PATTERN, description=(
                      "Sent by a reconnecting EventSource: resume after it (over `after`)."))] = None,
                  ) -> Response:
    """What changed, in the order it changed: which memory of which subject, what kind of change, its revision
    after it and when, never the memory's words. A page (JSON) by default, Server-Sent Events with
    `Accept: text/event-stream`. Only the subjects the key may see; resumable after any entry's id."""
    if subject is not None:
        allowed(key, subject)
    visible: Callable[[str], bool] = (lambda s: s == subject) if subject is not None else key.may_see
    state: Feed = request.app.state.feed
    async with _admission(request, key):  # a stream's opening counts as a request; its life does not
        start = await _opened(request, last_event_id or after)
        if wants_events(request.headers.get("accept")):
            return await _stream(request, key, state, visible, start)
        found = await page_async(request.app.state.redis, state.keys, start or feed.START, visible, limit,
                                 lambda: _sealed(request))
    return JSONResponse(found.model_dump(mode="json"))


async def _opened(request: Request, after: str | None) -> str | None:
    """`after` as a stream id: a page's sealed `next` opened, or 422 naming `after` if this deployment did not
    seal it."""
    if after is None or not feed.is_sealed(after):
        return None if after is None else feed.cursor(after)
    try:
        return (await _sealed(request)).open(after)
    except ValueError as exc:
        raise ApiError(422, "invalid_input", str(exc), "after") from None


async def _sealed(request: Request) -> feed.Sealed:
    """The deployment's sealer of feed places (pipeline/feed.py `Sealed`), read once a process (the secret is
    made once a deployment and never changes: shared/redisdb/keys.py `id_space`, on the blocking client, in a
    thread)."""
    state: Feed = request.app.state.feed
    if state.sealed is None:
        client = request.app.state.client
        secret = (await anyio.to_thread.run_sync(id_space, client.redis, client.keys)).secret
        assert secret is not None  # id_space always names with a secret
        state.sealed = feed.Sealed(secret)
    return state.sealed


@asynccontextmanager
async def _admission(request: Request, key: ApiKey) -> AsyncIterator[None]:
    async with asynccontextmanager(admitted)(request), asynccontextmanager(fair_share)(request, key):
        yield


def wants_events(accept: str | None) -> bool:
    """Whether the caller asked for SSE before JSON (`Accept` in the order given; q-values are not weighed)."""
    for part in (accept or "").split(","):
        media = part.split(";", 1)[0].strip().lower()
        if media in (SSE, "application/json"):
            return media == SSE
    return False


async def _stream(request: Request, key: ApiKey, state: Feed, visible: Callable[[str], bool],
                  after: str | None) -> Response:
    ends, opened = await opening_async(state.redis, state.keys)
    start = after or ends.last
    gap = after is not None and ends.gap(start)
    opening = feed.sse_opening(None if after else opened)  # the stream's last id would date another's write
    held = await hold(request, key, state)
    secret = bearer(request.headers.get("authorization")) or request.cookies.get("memflow_key")

    async def still_valid() -> bool:
        if not request.app.state.auth:
            return True
        try:
            await authenticate_async(request.app.state.keystore, request.app.state.redis, secret)
        except ApiError:
            return False
        return True
    events = _events(state, start, visible, opening, gap, still_valid, held.renew)
    return EventStream(events, held.give_back, media_type=SSE,
                       headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})


async def _events(state: Feed, start: str, visible: Callable[[str], bool], opening: bytes, gap: bool,
                  still_valid: Callable[[], Awaitable[bool]], renew: Callable[[], Awaitable[bool]]
                  ) -> AsyncIterator[bytes]:
    """The stream's visible entries after `start` as they come; a keep-alive every keep-alive on the stream's own
    clock, after checking the key is still valid and renewing the place (`renew`: by this loop, so a stream that
    stalls stops renewing); ends at the first keep-alive the key is revoked or the place is gone by.

    A read blocks until the next keep-alive at most, and an entry the key may not see only moves the read on:
    it sends nothing and moves no keep-alive, so the stream's lines and their timing are the key's alone."""
    yield opening  # the reader knows the stream is open (and its cursor) before anything changes
    if gap:
        yield feed.sse_gap(start)
    cursor, due = start, time.monotonic() + state.keepalive_s
    while True:
        left = due - time.monotonic()
        if left <= 0:
            if not await still_valid() or not await renew():
                return
            yield feed.KEEP_ALIVE
            due += state.keepalive_s
            if due <= time.monotonic():  # a reader too slow for a keep-alive: the clock starts again, no burst
                due = time.monotonic() + state.keepalive_s
            continue
        read = await state.redis.xread({state.keys.changes: cursor}, count=SCAN_BATCH,
                                       block=max(1, math.ceil(left * 1000)))
        if not read:
            continue
        raw = _entries(read)
        found, last, _ = feed.take(decoded(raw), visible, len(raw))
        for entry in found:
            yield feed.sse_event(entry)
        cursor = last or cursor


def _entries(read: Any) -> Any:
    """The entries of an XREAD of one stream (RESP2: [[name, entries]]; RESP3: {name: [entries]})."""
    if isinstance(read, dict):
        return next(iter(read.values()))[0] if read else []
    return read[0][1]


class EventStream(StreamingResponse):
    """A stream that gives its place back however it ends, and stops as soon as its reader hangs up (not at
    the next write that fails: that could be a keep-alive away)."""

    def __init__(self, content: AsyncIterator[bytes], give_back: Callable[[], Awaitable[None]], **options: Any) -> None:
        super().__init__(content, **options)
        self.give_back = give_back

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            async with anyio.create_task_group() as group:
                async def hung_up() -> None:
                    await self.listen_for_disconnect(receive)
                    group.cancel_scope.cancel()
                group.start_soon(hung_up)
                try:
                    await self.stream_response(send)
                except OSError:
                    pass
                group.cancel_scope.cancel()
        finally:
            await self.give_back()


async def close(app: FastAPI) -> None:
    state: Feed | None = getattr(app.state, "feed", None)
    if state is not None:
        await state.redis.aclose()

