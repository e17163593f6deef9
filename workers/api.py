"""The HTTP API (`memflow serve`): the front door for agents that are not Python.

It talks to the running system exactly as `MemoryClient` does — a write is one XADD and the
reply is 202 (the pipeline works off the response path); reads are RPCs of the query worker —
and speaks its vocabulary: bodies and replies are the SDK's models (`subject`, `content`,
`query`, `k`, `now`, `hits`, `status`, …). Every request names a key (`Authorization: Bearer
mf_…`, shared/apikeys.py) and may touch only the subjects its patterns allow; an id of
another subject's memory is answered as if it did not exist. Errors are JSON with a stable
code (`ErrorReply`), never a stack trace.

FastAPI (on Starlette and uvicorn): request models are the pydantic models the SDK already
has, so validation, the field named in an error and the OpenAPI document come from one
source; Starlette alone would have us write all three by hand.

Bounded at the edge (STYLE 21). The routes are `async def`: a call of the query worker is enqueued
in a thread (RQ is sync: milliseconds) and its reply waited for on the event loop (redis.asyncio),
so a search waiting 10 s for a busy worker holds no thread. The blocking Redis calls (an enqueue, a
publish, a traces read) run in a pool of MEMFLOW_HTTP_THREADS threads of the API's own, each call
bounded by its connection's socket timeout. At most MEMFLOW_HTTP_MAX_REQUESTS requests are worked on
at once; past it, or when no thread frees within MEMFLOW_HTTP_THREAD_WAIT_S, a request is refused at
once (503 `busy`, Retry-After) rather than queued. `/healthz` takes no place among them and has
threads of its own: it answers whatever the other routes wait for.
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import AsyncIterator, Callable, Coroutine
from contextlib import asynccontextmanager
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Annotated, Any, Literal, TypeVar

import anyio
import orjson
import redis
from anyio import to_thread
from fastapi import APIRouter, Body, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import BaseModel, Field, ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memflow.pipeline.checks import MAX_META_TEXT
from memflow.pipeline.fairness import Refused
from memflow.pipeline.feed import REVISION_PATTERN
from memflow.pipeline.models import (
    ChatEvent,
    PackedPrompt,
    SearchRequest,
    SearchResult,
    Subject,
    Trace,
    Wire,
)
from memflow.pipeline.profile import ProfileReply
from memflow.pipeline.scopes import single_subject
from memflow.shared import profiles, rpc
from memflow.shared.apikeys import OPEN, ApiKey, KeyStore
from memflow.shared.client import MemoryClient, Sent
from memflow.shared.connections import client_socket_timeout_s, connect_async, require_url
from memflow.shared.errors import InvalidInput, MemflowError, RpcError
from memflow.shared.rpc import MemoryId
from memflow.shared.settings import HttpSettings, Settings, get_settings
from memflow.shared.shares import KeyShares, Place, share_limits
from memflow.shared.status import recent_traces
from memflow.workers.front import (
    ApiError,
    ErrorCode,
    ErrorReply,
    Forgotten,
    HostCheck,
    allowed,
    authenticate_async,
    authorities,
    bearer,
    error_line,
    host_names,
)
from memflow.workers.mcp import http_endpoint
from memflow.workers.system import Part

log = logging.getLogger("memflow.api")

T = TypeVar("T")
W = TypeVar("W", bound=BaseModel)

# -- bodies and replies (the SDK's models where it has them) ------------------------------

class Published(Wire):
    """The stream ids of the events appended, in the order given. Processing happens after the reply."""

    ids: list[str]


class WriteRequest(Wire):
    """`MemoryClient.write`: remember `content` explicitly (it still passes the gate, resolve and upsert)."""

    subject: Subject
    content: str = Field(min_length=1)
    session_id: str = "api"
    external_ref: str | None = Field(default=None, max_length=MAX_META_TEXT)
    ts: datetime | None = None
    event_id: str | None = None


class Written(Wire):
    id: str
    event_id: str


class SearchFailed(SearchResult):
    """A search that could not look (503/504): `status` is "failed", never "empty"."""

    code: ErrorCode


class ForgetBody(Wire):
    memory_ids: list[MemoryId] | None = None
    contains: str | None = None


class Health(Wire):
    """Up or down for anyone; the rest (what answers, how many memories, the error) for a caller with a key."""

    status: Literal["ok", "degraded"]
    redis: Literal["ok", "unavailable"] | None = None
    store: Literal["ok", "unavailable", "unknown"] | None = None
    query_workers: int | None = None
    memories: int | None = None
    auth: Literal["on", "off"] | None = None
    error: str | None = None


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
    return await authenticate_async(keystore, request.app.state.redis, credentials.credentials if credentials
                                    else cookie)


async def client_of(request: Request) -> MemoryClient:
    # async: it does no I/O, and a sync dependency costs a hop to the thread pool per request
    client: MemoryClient = request.app.state.client
    return client


Caller = Annotated[ApiKey, Depends(principal)]
Client = Annotated[MemoryClient, Depends(client_of)]


def _rpc_failure(exc: RpcError) -> ApiError:
    """The error a failed call answers with: by what the worker raised, with its message's last line (the
    error itself, never the worker's traceback)."""
    said = error_line(exc)
    if exc.kind == "timeout":
        return ApiError(504, "timeout", said)
    if exc.kind == "NotFound":
        return ApiError(404, "not_found", "no such memory for this key")
    if exc.kind == "InvalidInput":
        return ApiError(422, "invalid_input", said.rsplit("InvalidInput: ", 1)[-1])
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
        raise _rpc_failure(exc) from exc


# -- the routes -----------------------------------------------------------------------------

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
    counted with its requests to every server process, to /mcp and to the inspector's pages (shared/shares.py),
    or 429 with Retry-After at once: one tenant's flood holds at most its share of the query workers, so another
    tenant's search is served meanwhile (issue 30). With --no-auth there is one caller: nothing to share."""
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


# The media type every route that reads a body reads, unless its document names others (an import: JSON Lines).
JSON = "application/json"
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
    """415 when the request carries a body whose Content-Type is none of `media_types` (JSON: with any parameters,
    and `application/*+json` too); no body (a DELETE naming its ids in the query) is not asked for one."""
    if request.headers.get("content-length", "0") == "0" and "transfer-encoding" not in request.headers:
        return
    sent = request.headers.get("content-type", "")
    media = sent.partition(";")[0].strip().lower()
    if media in media_types or (JSON in media_types and media.startswith("application/") and media.endswith("+json")):
        return
    raise ApiError(415, "invalid_input", f"this route reads {' or '.join(media_types)}: send the body with "
                   f"`Content-Type: {media_types[0]}` (it came {f'as {sent!r}' if sent else 'with no Content-Type'})",
                   "Content-Type")


v1 = APIRouter(prefix="/v1", responses=ERRORS, dependencies=[Depends(admitted), Depends(fair_share)],
               route_class=BodyRoute)


@v1.post("/events", status_code=202, response_model=Published, tags=["write"],
         openapi_extra={"requestBody": {"required": True, "content": {"application/json": {
             "schema": {"oneOf": [{"$ref": "#/components/schemas/ChatEvent"},
                                  {"type": "array", "items": {"$ref": "#/components/schemas/ChatEvent"}}]}}}}})
async def publish_events(request: Request, key: Caller, client: Client) -> Published:
    """Publish one event or a batch (a JSON array) of what an agent saw or said. Validated all or nothing,
    appended in order, answered before any processing."""
    events, many = await bounded_batch(request, key, client.settings.http.max_batch)
    batch = [_validated(ChatEvent, event, f"{i}." if many else "") for i, event in enumerate(events)]
    for i, event in enumerate(batch):
        allowed(key, event.subject, write=True, field=f"{i}.subject" if many else "subject")
    return Published(ids=await blocking(request, partial(client.publish_many, batch)))


async def bounded_batch(request: Request, key: ApiKey, max_batch: int) -> tuple[list[Any], bool]:
    """The body's items, raw, and whether it was a list; refused before a single item is validated when the
    key may not write or there are too many (issue 30: 330,000 `{}` cost 15 s of validation, and then a
    read-only key was told no). orjson reads a 1 MB body in milliseconds; the per-item model is the cost."""
    if key.read_only:
        allowed(key, "", write=True)
    try:
        body = orjson.loads(await request.body())
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "invalid_input", f"the body is not JSON: {exc}", "body") from None
    if not isinstance(body, list):
        return [body], False
    if len(body) > max_batch:
        raise ApiError(413, "invalid_input", f"at most {max_batch} events per request ({len(body)} sent)", "body")
    return body, True


def _validated(model: type[W], value: Any, at: str) -> W:
    """`value` as `model`, or 422 naming the field (`3.ts`) as the rest of the API does."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise ApiError(422, "invalid_input", str(first.get("msg")), at + _field(tuple(first.get("loc", ())))) from None


@v1.post("/memories", status_code=202, response_model=Written, tags=["write"])
async def write_memory(request: Request, key: Caller, client: Client, body: WriteRequest) -> Written:
    """Remember `content` explicitly (`MemoryClient.write`); it is searchable once the pipeline has it."""
    event_id = body.event_id or f"write-{uuid.uuid4()}"
    stream_id = await blocking(request, partial(
        client.write, allowed(key, body.subject, write=True), body.content, session_id=body.session_id,
        external_ref=body.external_ref, ts=body.ts, event_id=event_id))
    return Written(id=stream_id, event_id=event_id)


@v1.post("/search", response_model=SearchResult, tags=["read"],
         responses={503: {"model": SearchFailed}, 504: {"model": SearchFailed}})
async def search(request: Request, key: Caller, client: Client, body: SearchRequest) -> Response:
    """Search a subject's memories: `status` is ok, empty (nothing remembered matches) or failed (could not
    look: 503 or 504, never an empty list). Waits MEMFLOW_SEARCH_TIMEOUT_S for the query worker, as the SDK."""
    allowed(key, body.subject)
    try:
        found = await called(request, rpc.SEARCH, timeout_s=client.settings.client.search_timeout_s,
                             **body.model_dump(exclude_none=True))
        # Validated as it came back: written out as it is, not checked again against the response model.
        return Response(found.model_dump_json(), media_type="application/json")
    except RpcError as exc:
        failure = _rpc_failure(exc)
        failed = SearchFailed(subject=body.subject, query=body.query, status="failed", error=failure.message,
                              code=failure.code)
        return JSONResponse(failed.model_dump(mode="json"), status_code=failure.status)


@v1.post("/pack", response_model=PackedPrompt, tags=["read"])
async def pack(request: Request, key: Caller, body: rpc.PackRequest) -> PackedPrompt:
    """The memories that matter for a task, packed into a prompt within `budget_tokens`."""
    allowed(key, body.subject)
    return await ask(request, rpc.PACK, **body.model_dump())


@v1.get("/subjects", response_model=rpc.SubjectList, tags=["read"])
async def subjects(request: Request, key: Caller) -> rpc.SubjectList:
    """The subjects with memories that this key may see."""
    found = await ask(request, rpc.SUBJECTS)
    return rpc.SubjectList(subjects=[s for s in found.subjects if key.may_see(s)])


@v1.get("/subjects/{subject:path}/memories", response_model=rpc.InspectReport, tags=["read"])
async def inspect(request: Request, key: Caller, subject: Subject, now: datetime | None = None) -> rpc.InspectReport:
    """Every memory of a subject with its type, tier, strength, uses and status (`MemoryClient.inspect`)."""
    return await ask(request, rpc.INSPECT, subject=allowed(key, subject), now=now)


@v1.get("/subjects/{subject:path}/people", response_model=rpc.People, tags=["read"])
async def people(request: Request, key: Caller, subject: Subject) -> rpc.People:
    """The people the subject has talked about ("wife", "mother", "friend:小李"), each with what is known of them
    now: a search restricted to one of them is `about=` that holder."""
    report = await ask(request, rpc.INSPECT, subject=allowed(key, subject))
    return rpc.People(subject=report.subject, people=report.people)


@v1.get("/subjects/{subject:path}/profile", response_model=ProfileReply, tags=["read"])
async def profile(request: Request, key: Caller, client: Client, subject: Subject,
                  since: Annotated[str | None, Query(pattern=REVISION_PATTERN, description=(
                      "A profile's `revision`: say what changed after it (`changes`)."))] = None,
                  max_tokens: Annotated[int | None, Query(ge=1, le=rpc.MAX_PROFILE_TOKENS, description=(
                      "Also the profile as prompt text (`prompt`) within this many tokens."))] = None,
                  ) -> ProfileReply | Response:
    """What holds now for the subject, without a query (docs/profile.md): identity facts, standing preferences
    and rules, the people in the user's life, open contests flagged; at `revision`, the subject's last change.
    Kept current from the change feed: a read is one Redis GET unless the subject changed since the last (a plain
    one serves the stored bytes as they are)."""
    allowed(key, subject)
    if since is None and max_tokens is None:  # the stored bytes as they are: validated when built, never parsed
        raw = await profiles.served_async(request.app.state.redis, client.keys, subject, datetime.now(UTC))
        if raw is not None:
            return Response(raw, media_type="application/json")
    found = await profiles.cached_async(request.app.state.redis, client.keys, subject, datetime.now(UTC))
    if found is None:  # changed since the last read: a query worker builds it from the store and keeps it
        return await ask(request, rpc.PROFILE, subject=subject, since=since, max_tokens=max_tokens)
    return await profiles.reply_async(request.app.state.redis, client.keys, found, since, max_tokens)


@v1.get("/subjects/{subject:path}/traces", response_model=list[Trace], tags=["read"])
async def traces(request: Request, key: Caller, client: Client, subject: Subject,
                 count: Annotated[int, Query(ge=1, le=200)] = 20) -> list[Trace]:
    """How the subject's last searches were answered (query redacted): plan, candidates, chosen, latency."""
    return await blocking(request, partial(recent_traces, client.redis, client.keys, allowed(key, subject), count))


# `:path`: an id with a slash in it (`..%2F..%2Fetc%2Fpasswd`) is answered as a bad id (422 naming it), not as
# no such route.
@v1.get("/memories/{memory_id:path}/history", response_model=rpc.History, tags=["read"])
async def history(request: Request, key: Caller, memory_id: MemoryId,
                  subject: Subject | None = None) -> rpc.History:
    """Every version of a memory and why each changed. A memory of a subject the key may not see is
    answered 404, as one that does not exist."""
    if subject is not None:
        allowed(key, subject)
    # A key for one subject looks there only; otherwise the worker looks among the subjects the key may see (it
    # reads no point of another), and the answer is checked against the key below all the same.
    named = subject or single_subject(key.subjects)
    found = await ask(request, rpc.HISTORY, memory_id=memory_id, subject=named,
                      within=None if named else list(key.subjects))
    if not key.may_see(found.subject):
        raise ApiError(404, "not_found", "no such memory for this key")
    return found


@v1.post("/feedback", response_model=rpc.Adopted, tags=["write"])
async def feedback(request: Request, key: Caller, body: rpc.FeedbackRequest) -> rpc.Adopted:
    """Count memories as used in an answer (their strength grows); ids of other subjects count nothing.
    `at` (default now) is within FEEDBACK_PAST_DAYS days before the server's time and minutes after."""
    allowed(key, body.subject, write=True)
    recent(body.at, datetime.now(UTC))
    return await ask(request, rpc.FEEDBACK, **body.model_dump())


# How far from the server's clock an HTTP caller's feedback may say it was: a day's answers reported late,
# a clock a little off. Beyond, `at` would set a memory's last use anywhere in time (year 9999: a memory
# that never decays). The SDK, which reaches Redis itself, may replay any time (evaluations do).
FEEDBACK_PAST_DAYS = 7
CLOCK_SKEW = timedelta(minutes=5)


def recent(at: datetime | None, now: datetime) -> None:
    """422 naming `at` when it is outside the window around `now`."""
    if at is not None and not now - timedelta(days=FEEDBACK_PAST_DAYS) <= at <= now + CLOCK_SKEW:
        raise ApiError(422, "invalid_input", f"`at` must fall within {FEEDBACK_PAST_DAYS} days before the "
                       f"server's time and {CLOCK_SKEW.seconds // 60} minutes after ({now.isoformat()}); it was "
                       f"{at.isoformat()}", "at")


@v1.delete("/subjects/{subject:path}/memories", response_model=Forgotten, tags=["write"])
async def forget(request: Request, key: Caller, subject: Subject,
                 body: Annotated[ForgetBody | None, Body()] = None,
           ids: Annotated[list[MemoryId] | None, Query(description="Memory ids (or `memory_ids` in the body).")] = None,
           contains: Annotated[str | None, Query(description="Every memory whose content holds this.")] = None,
           ) -> Forgotten:
    """Forget memories by id or by `contains`, and prove it: no point left, no Redis entry naming them, no
    point holding their words. The records of the turns they came from go with them where they hold their
    words (`records`); what else still holds them is named (`still_held`)."""
    allowed(key, subject, write=True)
    memory_ids = (body.memory_ids if body else None) or ids
    contains = (body.contains if body else None) or contains
    if not memory_ids and not contains:
        raise ApiError(422, "invalid_input", "name the memories: `memory_ids` or `contains`", "memory_ids")
    # front.forget_proven's two calls, each waited for on the event loop.
    report = await ask(request, rpc.FORGET, subject=subject, memory_ids=memory_ids, contains=contains)
    proof = await ask(request, rpc.VERIFY_FORGOTTEN, subject=subject, memory_ids=report.forgotten_ids)
    return Forgotten(**report.model_dump(), proof=proof)


# -- health and metrics ----------------------------------------------------------------------

ops = APIRouter(tags=["ops"], responses={421: ERRORS[421]})  # the Host check is in front of every route
# How long /healthz waits for a query worker's word.
HEALTH_WAIT_S = 2.0


@ops.get("/healthz", response_model=Health, responses={503: {"model": Health}})
async def healthz(request: Request, client: Client) -> JSONResponse:
    """Redis answers, a query worker answers, and its store does: 200 or 503, with `status` alone without a
    key (a load balancer needs no more), and what answers, the memory count and the error with any key.
    Answered whatever the other routes are doing: no place among their requests, threads of its own."""
    health = await _health(request, client)
    shown = health.model_dump(mode="json") if await _keyed(request) else {"status": health.status}
    return JSONResponse(shown, status_code=200 if health.status == "ok" else 503)


async def _keyed(request: Request) -> bool:
    """Whether the caller names a key that exists (any key: it sees no subject's data here), or keys are off."""
    if not request.app.state.auth:
        return True
    secret = bearer(request.headers.get("authorization"))
    try:
        return secret is not None and bool(await authenticate_async(request.app.state.keystore,
                                                                    request.app.state.redis, secret))
    except (ApiError, redis.RedisError):
        return False


async def _health(request: Request, client: Client) -> Health:
    auth: Literal["on", "off"] = "on" if request.app.state.auth else "off"
    try:
        await request.app.state.redis.ping()
    except redis.RedisError as exc:
        return Health(status="degraded", redis="unavailable", store="unknown", query_workers=0, auth=auth,
                      error=str(exc))
    edge: Edge = request.app.state.edge

    def count_and_ask() -> tuple[int, Any]:
        return client.query_workers(), client.send(rpc.HEALTH, timeout_s=HEALTH_WAIT_S)
    workers, sent = await to_thread.run_sync(count_and_ask, limiter=edge.health_threads)
    try:
        store = client.reply(sent, await client.wait_async(sent, request.app.state.replies))
        health = Health(status="ok" if store.store == "ok" else "degraded", redis="ok", store=store.store,
                        query_workers=workers, memories=store.memories, auth=auth, error=store.error)
    except RpcError as exc:
        health = Health(status="degraded", redis="ok", store="unknown", query_workers=workers, auth=auth,
                        error=str(exc))
    return health


@ops.get("/metrics", response_class=PlainTextResponse,
         responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}})
async def metrics(request: Request, key: Caller, client: Client) -> PlainTextResponse:
    """Prometheus text: per stage lag, pending and dead letters; search latency; LLM calls and fallbacks."""
    from memflow.shared.metrics import CONTENT_TYPE, render
    text = await blocking(request, partial(render, client.redis, client.keys, client.queue_redis))
    return PlainTextResponse(text, media_type=CONTENT_TYPE)


# -- errors ------------------------------------------------------------------------------------


def _reply(status: int, code: ErrorCode, message: str, field: str | None = None) -> JSONResponse:
    return ApiError(status, code, message, field).response()


def _field(loc: tuple[Any, ...]) -> str:
    """The field an error names, as the SDK names it: `ts`, `3.ts`, `subject`, without the location FastAPI puts
    first (`body`, `query`, `path`): only the first, since a field may be named `query` too."""
    if loc and loc[0] in ("body", "query", "path", "header", "cookie"):
        loc = loc[1:]
    return ".".join(str(p) for p in loc) or "body"


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        return _reply(400, "invalid_input", f"the body is not JSON: {first.get('msg')}", "body")
    return _reply(422, "invalid_input", str(first.get("msg")), _field(tuple(first.get("loc", ()))))


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _invalid_input(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidInput)
    return _reply(422, "invalid_input", exc.reason, exc.field)


_STATUS_CODES: dict[int, ErrorCode] = {401: "unauthorized", 403: "forbidden", 404: "not_found"}


async def _http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own refusals (no such route, method not allowed) in the same shape as ours."""
    assert isinstance(exc, StarletteHTTPException)
    return _reply(exc.status_code, _STATUS_CODES.get(exc.status_code, "invalid_input"), str(exc.detail))


async def _redis_down(request: Request, exc: Exception) -> JSONResponse:
    return _reply(503, "store_unavailable", f"Redis did not answer: {exc}")


async def _unexpected(request: Request, exc: Exception) -> JSONResponse:
    log.exception("%s %s failed", request.method, request.url.path)
    return _reply(500, "internal", f"{type(exc).__name__}: the server failed; its log has the details")


def _install_errors(app: FastAPI) -> None:
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(ApiError, _api_error)
    app.add_exception_handler(InvalidInput, _invalid_input)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    app.add_exception_handler(redis.RedisError, _redis_down)
    app.add_exception_handler(Exception, _unexpected)


class BodyLimit:
    """Refuse a body over `max_bytes` before anything reads it: by its Content-Length when it says one,
    else while it streams in."""

    def __init__(self, app: ASGIApp, max_bytes: int, per_path: dict[str, int] | None = None) -> None:
        self.app, self.default_bytes, self.per_path = app, max_bytes, per_path or {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        max_bytes = self.per_path.get(scope.get("path", ""), self.default_bytes)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > max_bytes:
            return await self._refuse(send, max_bytes)
        seen, refused = 0, False

        async def counted() -> Message:
            nonlocal seen, refused
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > max_bytes:
                refused = True
                raise _TooLarge()
            return message

        async def unless_refused(message: Message) -> None:
            if not refused:  # whatever the app makes of the cut-off body is replaced by the 413
                await send(message)
        try:
            await self.app(scope, counted, unless_refused)
        except _TooLarge:
            pass
        if refused:
            await self._refuse(send, max_bytes)

    async def _refuse(self, send: Send, max_bytes: int) -> None:
        response = _reply(413, "invalid_input", f"the body is over {max_bytes} bytes", "body")
        await response({"type": "http"}, _nothing, send)


class _TooLarge(Exception):
    pass


async def _nothing() -> Message:
    return {"type": "http.disconnect"}


# -- the app -------------------------------------------------------------------------------------

def create_app(settings: Settings, *, auth: bool = True, client: MemoryClient | None = None) -> FastAPI:
    """The API over the running system `settings` names (its Redis; its query workers answer reads)."""
    from memflow.workers.changes_api import close as close_feed  # built on this module
    from memflow.workers.changes_api import install as install_feed
    client = client or MemoryClient(settings)
    keystore = KeyStore(client.redis, client.keys)
    hosts = host_names(settings.http.host, settings.http.allowed_hosts.split(","))
    # The key lookups, on the event loop; and the replies of the query worker's calls (the RPC queues'
    # server: the streams' own unless MEMFLOW_REDIS_QUEUE_URL names another).
    # A request holds at most one connection of each at a time; /healthz has a few of its own beyond.
    options: dict[str, Any] = {"socket_timeout_s": client_socket_timeout_s(settings),
                               "connect_timeout_s": settings.client.connect_timeout_s,
                               "max_connections": settings.http.max_requests + HEALTH_CONNECTIONS}
    redis_async = connect_async(require_url(settings), cluster=settings.redis.cluster, **options)
    replies = connect_async(settings.redis.queue_url or require_url(settings), **options)
    # Every key's share of both doors, on the queues' server (the one whose queue it guards): with --no-auth, none.
    shares = KeyShares(replies, client.keys, share_limits(settings.http)) if auth else None
    mcp = http_endpoint(client, keystore, auth=auth, hosts=hosts, shares=shares)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with mcp.lifespan(app):  # the MCP SDK's session manager
            yield
        await app.state.redis.aclose()
        await app.state.replies.aclose()
        await close_feed(app)
    app = FastAPI(title="memflow", version="1", summary="Long-term memory for LLM agents: the HTTP API.",
                  openapi_url="/openapi.json", docs_url="/docs", redoc_url=None, lifespan=lifespan)
    app.state.client = client
    app.state.keystore = keystore
    app.state.edge = Edge(settings.http)
    app.state.redis, app.state.replies, app.state.shares = redis_async, replies, shares
    app.state.auth = auth
    _install_errors(app)
    app.include_router(v1)
    from memflow.workers.transfer_api import IMPORT_PATH, document_transfer, transfer_routes  # built on this module
    app.include_router(transfer_routes)
    install_feed(app, settings, client.keys)
    app.include_router(ops)
    app.add_route("/mcp", mcp.app, include_in_schema=False)  # type: ignore[arg-type]  # an ASGI app: every method
    from memflow.workers.inspector import pages  # here: the inspector's pages are built on this module
    app.include_router(pages)
    app.add_middleware(BodyLimit, max_bytes=settings.http.max_body_bytes,
                       per_path={IMPORT_PATH: settings.http.max_import_bytes})  # an export is bigger
    # The outermost: a page of another site, or of another port, gets nothing read.
    app.add_middleware(HostCheck, allowed=authorities(settings.http.host, settings.http.allowed_hosts.split(",")))
    _document_events(app)
    document_transfer(app)
    return app


def _document_events(app: FastAPI) -> None:
    """/v1/events reads its own body (`bounded_batch`): the schema it names, ChatEvent, joins the document."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        document = generate()
        event = ChatEvent.model_json_schema(ref_template="#/components/schemas/{model}")
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        schemas.update(event.pop("$defs", {}))
        schemas.setdefault("ChatEvent", event)
        return document
    app.openapi = openapi  # type: ignore[method-assign]


# How `memflow serve --workers N` tells its processes whether keys are checked ("off": --no-auth).
AUTH_VARIABLE = "MEMFLOW_SERVE_AUTH"


def app_from_environment() -> FastAPI:
    """The app of one process of `memflow serve --workers N` (uvicorn's factory): settings from MEMFLOW_*."""
    return create_app(get_settings(), auth=os.environ.get(AUTH_VARIABLE, "on") != "off")


def http_part(settings: Settings, *, auth: bool) -> Part:
    """The server as a part of `memflow up --serve`: uvicorn in a thread of the runner, stopped with the
    rest; a server that cannot listen (the port taken) dies like any part, and the runner says so."""
    import uvicorn

    def run(stop: threading.Event) -> None:
        server = uvicorn.Server(uvicorn.Config(create_app(settings, auth=auth), host=settings.http.host,
                                               port=settings.http.port, access_log=False,
                                               log_level=settings.log_level.lower()))

        def stop_with_the_rest() -> None:
            stop.wait()
            server.should_exit = True
        threading.Thread(target=stop_with_the_rest, daemon=True, name="memflow-http-stop").start()
        try:
            server.run()
        except SystemExit as exc:  # uvicorn's way of saying it could not start
            raise MemflowError(f"the HTTP server could not listen on {settings.http.host}:{settings.http.port}"
                               ) from exc
    return Part("http", run)

