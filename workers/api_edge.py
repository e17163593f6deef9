"""What every route of the HTTP API stands behind (workers/api.py says why): who is asking, the calls of the
query worker, the server's bounds (requests at once, threads, each key's share) and the media type a route reads.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from functools import partial
from typing import Annotated, Any, TypeVar

import anyio
from anyio import to_thread
from fastapi import Depends, Request
from fastapi.responses import Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from memflow.shared.admission.apikeys import OPEN, ApiKey, KeyStore
from memflow.shared.admission.fairness import Refused
from memflow.shared.admission.shares import KeyShares, Place
from memflow.shared.errors import RpcError
from memflow.shared.sdk import rpc
from memflow.shared.sdk.client import MemoryClient, Sent
from memflow.shared.settings import HttpSettings
from memflow.workers.front import JSON, ApiError, ErrorReply, authenticate_async, error_line, presented, unread_media

T = TypeVar("T")

# -- who is asking ------------------------------------------------------------------------

_bearer = HTTPBearer(auto_error=False, description="An API key: `memflow keys create --name N --subjects 'team-a/*'`")


async def principal(request: Request,
                    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> ApiKey:
    """The key the request names (looked up on every request: a revoked key is refused at once)."""
    if not request.app.state.auth:
        return OPEN
    # The inspector page's cookie counts for reads only: a page elsewhere cannot make a browser
    # write or forget with it (and it is SameSite=Strict besides).
    cookie = request.cookies.get("memflow_key") if request.method == "GET" else None
    keystore: KeyStore = request.app.state.keystore
    # A header HTTPBearer did not take (the key alone, `Basic …`) is refused saying what to send, not as no key.
    header = credentials.credentials if credentials else presented(request.headers.get("authorization"))
    return await authenticate_async(keystore, request.app.state.redis, header or cookie)


async def client_of(request: Request) -> MemoryClient:
    # async: it does no I/O, and a sync dependency costs a hop to the thread pool per request
    client: MemoryClient = request.app.state.client
    return client


Caller = Annotated[ApiKey, Depends(principal)]
Client = Annotated[MemoryClient, Depends(client_of)]


def rpc_failure(exc: RpcError) -> ApiError:
    """The error a failed call answers with: by what the worker raised, with its message's last line (the
    error itself, never the worker's traceback)."""
    said = error_line(exc)
    if exc.kind == "timeout":
        return ApiError(504, "timeout", said)
    if exc.kind == "NotFound":
        return ApiError(404, "not_found", "no such memory for this key")
    if exc.kind == "InvalidInput":
        return ApiError(422, "invalid_input", said)
    return ApiError(503, "store_unavailable", said)


# -- how much the server takes on at once ----------------------------------------------------

# Seconds a refused request is told to wait before it tries again.
RETRY_AFTER_S = 1
# /healthz's own threads (a worker count and an enqueue, milliseconds each): never behind the routes'.
HEALTH_THREADS = 2
HEALTH_CONNECTIONS = 8


class Edge:
    """The bounds of one server process (MEMFLOW_HTTP_MAX_REQUESTS, _THREADS, _THREAD_WAIT_S)."""

    def __init__(self, http: HttpSettings) -> None:
        self.requests = anyio.CapacityLimiter(http.max_requests)
        # A ticket for one of the threads, taken with a deadline; then the thread itself, never waited
        # for (there are as many as tickets). AnyIO's default 40 stay the inspector's and /mcp's.
        self.tickets = anyio.CapacityLimiter(http.threads)
        self.threads = anyio.CapacityLimiter(http.threads)
        self.health_threads = anyio.CapacityLimiter(HEALTH_THREADS)
        self.thread_wait_s = http.thread_wait_s


def _busy(what: str) -> ApiError:
    return ApiError(503, "busy", f"the server is at its bound ({what}): try again shortly",
                    retry_after_s=RETRY_AFTER_S)


async def admitted(request: Request) -> AsyncIterator[None]:
    """A place among the requests being worked on, or 503 at once: past the bound a request is refused,
    never queued. Taken once the body is read (a client trickling one in holds no place)."""
    edge: Edge = request.app.state.edge
    ticket = object()
    try:
        edge.requests.acquire_on_behalf_of_nowait(ticket)
    except anyio.WouldBlock:
        raise _busy(f"{edge.requests.total_tokens:.0f} requests at once") from None
    try:
        yield
    finally:
        edge.requests.release_on_behalf_of(ticket)


async def blocking(request: Request, work: Callable[[], T]) -> T:
    """`work` (blocking Redis calls, each bounded by its socket timeout) in one of the edge's threads; 503
    when none frees within the wait."""
    edge: Edge = request.app.state.edge
    ticket, held = object(), False
    with anyio.move_on_after(edge.thread_wait_s):
        await edge.tickets.acquire_on_behalf_of(ticket)
        held = True
    if not held:
        raise _busy(f"no thread free within {edge.thread_wait_s} s")
    try:
        return await to_thread.run_sync(work, limiter=edge.threads)
    finally:
        edge.tickets.release_on_behalf_of(ticket)


async def called(request: Request, call: rpc.Rpc[Any, rpc.Rep], *, timeout_s: float | None = None,
                 **fields: Any) -> rpc.Rep:
    """One call of the query worker: enqueued in a thread, its reply waited for on the event loop (no
    thread held while the worker works). RpcError as the client raises it."""
    client: MemoryClient = request.app.state.client
    sent = await blocking(request, partial(client.send, call, timeout_s=timeout_s, **fields))
    result = await client.wait_async(sent, request.app.state.replies)
    if result is None:
        held_past_timeout(request, sent)
    return client.reply(sent, result)


async def ask(request: Request, call: rpc.Rpc[Any, rpc.Rep], **fields: Any) -> rpc.Rep:
    try:
        return await called(request, call, **fields)
    except RpcError as exc:
        raise rpc_failure(exc) from exc


# -- what every route may answer, and each key's share -------------------------------------

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorReply, "description": what} for status, what in (
        (400, "The body is not JSON (`invalid_input`)."),
        (401, "No key, or an unknown or revoked one (`unauthorized`)."),
        (403, "The key may not touch this subject, or is read-only (`forbidden`)."),
        (404, "No such memory for this key (`not_found`)."),
        (421, "The Host header names no host this server answers to (`forbidden`, field `Host`): see "
              "MEMFLOW_HTTP_ALLOWED_HOSTS, on the server's port. An Origin of another site, port or scheme is "
              "refused 403 (field `Origin`)."),
        (413, "The body is over the limit, or a batch too long (`invalid_input`)."),
        (422, "A field is invalid (`invalid_input`, naming the field)."),
        (429, "The key is past its share: requests in flight or per second (`rate_limited`, with Retry-After)."),
        (503, "The store or the query worker failed (`store_unavailable`), or the server is at its bound "
              "(`busy`, with Retry-After)."),
        (504, "No query worker answered in time (`timeout`)."))}

async def fair_share(request: Request, key: Caller) -> AsyncIterator[None]:
    """The key's place among its own requests (MEMFLOW_HTTP_KEY_CONCURRENCY in flight, MEMFLOW_HTTP_KEY_RATE_PER_S),
    counted with its requests to every server process, to /mcp and to the inspector's pages
    (shared/admission/shares.py), or 429 with Retry-After at once: one tenant's flood holds at most its share of the
    query workers, so another tenant's search is served meanwhile (issue 30). With --no-auth there is one caller:
    nothing to share."""
    async with key_place(request, key):
        yield


@asynccontextmanager
async def key_place(request: Request, key: ApiKey | None) -> AsyncIterator[None]:
    """`fair_share` for any route: none taken without a key (a page that shows the login form instead)."""
    shares: KeyShares | None = request.app.state.shares
    if shares is None or key is None:
        yield
        return
    place = await shares.admit(key.id)
    if isinstance(place, Refused):
        raise ApiError(429, "rate_limited", f"{place.reason}: try again shortly", retry_after_s=place.retry_after_s)
    request.state.share = place
    try:
        yield
    finally:
        if request.state.share is not None:  # else handed on to the call still running (`held_past_timeout`)
            await shares.release(place)


def held_past_timeout(request: Request, sent: Sent[Any]) -> None:
    """The caller gave up on `sent`, but a query worker may still be running it: its key's place is given back
    when the worker is done, not now (KeyShares.release_when_done)."""
    place: Place | None = getattr(request.state, "share", None)
    shares: KeyShares | None = request.app.state.shares
    if place is None or shares is None:
        return
    request.state.share = None
    shares.release_when_done(place, request.app.state.client, sent)


UNSUPPORTED_MEDIA = {"model": ErrorReply, "description": (
    "The body is sent as a media type the route does not read (`invalid_input`, field `Content-Type`): JSON is "
    "`application/json` or `application/*+json`; an import is `application/x-ndjson`.")}


class BodyRoute(APIRoute):
    """A route that reads a body refuses one of another media type, or of none, with 415 before reading it.
    `Content-Type: text/plain` is how a page of another origin posts without the browser's preflight; and
    FastAPI reads a body it does not take for JSON as bytes, answered with pydantic's "a valid dictionary"."""

    def __init__(self, path: str, endpoint: Callable[..., Any], **options: Any) -> None:
        super().__init__(path, endpoint, **options)
        if self.media_types():
            self.responses = {**self.responses, 415: UNSUPPORTED_MEDIA}

    def media_types(self) -> tuple[str, ...]:
        """What the route reads: the media types its document names for the body, else JSON if it has one."""
        documented = ((self.openapi_extra or {}).get("requestBody") or {}).get("content")
        return tuple(documented) if documented else (JSON,) if self.body_field is not None else ()

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler, media_types = super().get_route_handler(), self.media_types()
        if not media_types:
            return handler

        async def checked(request: Request) -> Response:
            refuse_unless_media(request, media_types)
            return await handler(request)
        return checked


def refuse_unless_media(request: Request, media_types: tuple[str, ...]) -> None:
    """415 when the request carries a body whose Content-Type is none of `media_types` (`unread_media`)."""
    refused = unread_media(request.headers, media_types)
    if refused is not None:
        raise refused
