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
"""

from __future__ import annotations

import logging
import os
import threading
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from datetime import datetime
from typing import Annotated, Any, Literal

import redis
from fastapi import APIRouter, Body, Depends, FastAPI, Query, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, PlainTextResponse, Response
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from pydantic import Discriminator, Field, Tag
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memflow.pipeline.models import ChatEvent, MemoryId, PackedPrompt, SearchRequest, SearchResult, Subject, Trace, Wire
from memflow.pipeline.scopes import single_subject
from memflow.shared import rpc
from memflow.shared.apikeys import OPEN, ApiKey, KeyStore
from memflow.shared.client import MemoryClient
from memflow.shared.connections import connect_async, require_url
from memflow.shared.errors import InvalidInput, MemflowError, RpcError
from memflow.shared.settings import Settings, get_settings
from memflow.shared.status import recent_traces
from memflow.workers.front import (
    ApiError,
    ErrorCode,
    ErrorReply,
    Forgotten,
    allowed,
    authenticate_async,
    error_line,
    forget_proven,
)
from memflow.workers.mcp import http_endpoint
from memflow.workers.system import Part

log = logging.getLogger("memflow.api")

# -- bodies and replies (the SDK's models where it has them) ------------------------------

def _one_or_many(value: Any) -> str:
    return "many" if isinstance(value, list) else "one"


Events = Annotated[Annotated[ChatEvent, Tag("one")] | Annotated[list[ChatEvent], Tag("many")],
                   Discriminator(_one_or_many)]


class Published(Wire):
    """The stream ids of the events appended, in the order given. Processing happens after the reply."""

    ids: list[str]


class WriteRequest(Wire):
    """`MemoryClient.write`: remember `content` explicitly (it still passes the gate, resolve and upsert)."""

    subject: Subject
    content: str = Field(min_length=1)
    session_id: str = "api"
    external_ref: str | None = None
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
    status: Literal["ok", "degraded"]
    redis: Literal["ok", "unavailable"]
    store: Literal["ok", "unavailable", "unknown"]
    query_workers: int
    memories: int | None = None
    auth: Literal["on", "off"]
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


def ask(client: MemoryClient, call: rpc.Rpc[Any, rpc.Rep], **fields: Any) -> rpc.Rep:
    try:
        return client.call(call, **fields)
    except RpcError as exc:
        raise _rpc_failure(exc) from exc


# -- the routes -----------------------------------------------------------------------------

ERRORS: dict[int | str, dict[str, Any]] = {
    status: {"model": ErrorReply, "description": what} for status, what in (
        (400, "The body is not JSON (`invalid_input`)."),
        (401, "No key, or an unknown or revoked one (`unauthorized`)."),
        (403, "The key may not touch this subject, or is read-only (`forbidden`)."),
        (404, "No such memory for this key (`not_found`)."),
        (413, "The body is over the limit, or a batch too long (`invalid_input`)."),
        (422, "A field is invalid (`invalid_input`, naming the field)."),
        (503, "The store or the query worker failed (`store_unavailable`)."),
        (504, "No query worker answered in time (`timeout`)."))}

v1 = APIRouter(prefix="/v1", responses=ERRORS)


@v1.post("/events", status_code=202, response_model=Published, tags=["write"])
def publish_events(key: Caller, client: Client, events: Annotated[Events, Body()]) -> Published:
    """Publish one event or a batch (a JSON array) of what an agent saw or said. Validated all or nothing,
    appended in order, answered before any processing."""
    batch = events if isinstance(events, list) else [events]
    if len(batch) > client.settings.http.max_batch:
        raise ApiError(413, "invalid_input", f"at most {client.settings.http.max_batch} events per request", "body")
    for i, event in enumerate(batch):
        allowed(key, event.subject, write=True, field=f"{i}.subject" if isinstance(events, list) else "subject")
    return Published(ids=client.publish_many(batch))


@v1.post("/memories", status_code=202, response_model=Written, tags=["write"])
def write_memory(key: Caller, client: Client, body: WriteRequest) -> Written:
    """Remember `content` explicitly (`MemoryClient.write`); it is searchable once the pipeline has it."""
    event_id = body.event_id or f"write-{uuid.uuid4()}"
    stream_id = client.write(allowed(key, body.subject, write=True), body.content, session_id=body.session_id,
                             external_ref=body.external_ref, ts=body.ts, event_id=event_id)
    return Written(id=stream_id, event_id=event_id)


@v1.post("/search", response_model=SearchResult, tags=["read"],
         responses={503: {"model": SearchFailed}, 504: {"model": SearchFailed}})
def search(key: Caller, client: Client, body: SearchRequest) -> Response:
    """Search a subject's memories: `status` is ok, empty (nothing remembered matches) or failed (could not
    look: 503 or 504, never an empty list)."""
    allowed(key, body.subject)
    try:
        found = client.call(rpc.SEARCH, **body.model_dump(exclude_none=True))
        # Validated as it came back: written out as it is, not checked again against the response model.
        return Response(found.model_dump_json(), media_type="application/json")
    except RpcError as exc:
        failure = _rpc_failure(exc)
        failed = SearchFailed(subject=body.subject, query=body.query, status="failed", error=failure.message,
                              code=failure.code)
        return JSONResponse(failed.model_dump(mode="json"), status_code=failure.status)


@v1.post("/pack", response_model=PackedPrompt, tags=["read"])
def pack(key: Caller, client: Client, body: rpc.PackRequest) -> PackedPrompt:
    """The memories that matter for a task, packed into a prompt within `budget_tokens`."""
    allowed(key, body.subject)
    return ask(client, rpc.PACK, **body.model_dump())


@v1.get("/subjects", response_model=rpc.SubjectList, tags=["read"])
def subjects(key: Caller, client: Client) -> rpc.SubjectList:
    """The subjects with memories that this key may see."""
    found = ask(client, rpc.SUBJECTS)
    return rpc.SubjectList(subjects=[s for s in found.subjects if key.may_see(s)])


@v1.get("/subjects/{subject:path}/memories", response_model=rpc.InspectReport, tags=["read"])
def inspect(key: Caller, client: Client, subject: Subject, now: datetime | None = None) -> rpc.InspectReport:
    """Every memory of a subject with its type, tier, strength, uses and status (`MemoryClient.inspect`)."""
    return ask(client, rpc.INSPECT, subject=allowed(key, subject), now=now)


@v1.get("/subjects/{subject:path}/people", response_model=rpc.People, tags=["read"])
def people(key: Caller, client: Client, subject: Subject) -> rpc.People:
    """The people the subject has talked about ("wife", "mother", "friend:小李"), each with what is known of them
    now: a search restricted to one of them is `about=` that holder."""
    report = ask(client, rpc.INSPECT, subject=allowed(key, subject))
    return rpc.People(subject=report.subject, people=report.people)


@v1.get("/subjects/{subject:path}/traces", response_model=list[Trace], tags=["read"])
def traces(key: Caller, client: Client, subject: Subject,
           count: Annotated[int, Query(ge=1, le=200)] = 20) -> list[Trace]:
    """How the subject's last searches were answered (query redacted): plan, candidates, chosen, latency."""
    return recent_traces(client.redis, client.keys, allowed(key, subject), count)


@v1.get("/memories/{memory_id}/history", response_model=rpc.History, tags=["read"])
def history(key: Caller, client: Client, memory_id: MemoryId, subject: Subject | None = None) -> rpc.History:
    """Every version of a memory and why each changed. A memory of a subject the key may not see is
    answered 404, as one that does not exist."""
    if subject is not None:
        allowed(key, subject)
    # A key for one subject looks there only; otherwise the worker looks in every subject, and the
    # answer is checked against the key below.
    found = ask(client, rpc.HISTORY, memory_id=memory_id, subject=subject or single_subject(key.subjects))
    if not key.may_see(found.subject):
        raise ApiError(404, "not_found", "no such memory for this key")
    return found


@v1.post("/feedback", response_model=rpc.Adopted, tags=["write"])
def feedback(key: Caller, client: Client, body: rpc.FeedbackRequest) -> rpc.Adopted:
    """Count memories as used in an answer (their strength grows); ids of other subjects count nothing."""
    allowed(key, body.subject, write=True)
    return ask(client, rpc.FEEDBACK, **body.model_dump())


@v1.delete("/subjects/{subject:path}/memories", response_model=Forgotten, tags=["write"])
def forget(key: Caller, client: Client, subject: Subject, body: Annotated[ForgetBody | None, Body()] = None,
           ids: Annotated[list[MemoryId] | None, Query(description="Memory ids (or `memory_ids` in the body).")] = None,
           contains: Annotated[str | None, Query(description="Every memory whose content holds this.")] = None,
           ) -> Forgotten:
    """Forget memories by id or by `contains`, and prove it: no point left, no Redis entry naming them."""
    allowed(key, subject, write=True)
    memory_ids = (body.memory_ids if body else None) or ids
    contains = (body.contains if body else None) or contains
    if not memory_ids and not contains:
        raise ApiError(422, "invalid_input", "name the memories: `memory_ids` or `contains`", "memory_ids")
    try:
        return forget_proven(client, subject, memory_ids, contains)
    except RpcError as exc:
        raise _rpc_failure(exc) from exc


# -- health and metrics ----------------------------------------------------------------------

ops = APIRouter(tags=["ops"])


@ops.get("/healthz", response_model=Health, responses={503: {"model": Health}})
def healthz(request: Request, client: Client) -> Health | JSONResponse:
    """Redis answers, a query worker answers, and its store does. No key needed; no subject's data shown."""
    auth: Literal["on", "off"] = "on" if request.app.state.auth else "off"
    try:
        client.redis.ping()
    except redis.RedisError as exc:
        down = Health(status="degraded", redis="unavailable", store="unknown", query_workers=0, auth=auth,
                      error=str(exc))
        return JSONResponse(down.model_dump(mode="json"), status_code=503)
    workers = client.query_workers()
    try:
        store = client.call(rpc.HEALTH, timeout_s=2.0)
        health = Health(status="ok" if store.store == "ok" else "degraded", redis="ok", store=store.store,
                        query_workers=workers, memories=store.memories, auth=auth, error=store.error)
    except RpcError as exc:
        health = Health(status="degraded", redis="ok", store="unknown", query_workers=workers, auth=auth,
                        error=str(exc))
    if health.status == "ok":
        return health
    return JSONResponse(health.model_dump(mode="json"), status_code=503)


@ops.get("/metrics", response_class=PlainTextResponse,
         responses={200: {"content": {"text/plain": {}}, "description": "Prometheus text format."}})
def metrics(key: Caller, client: Client) -> PlainTextResponse:
    """Prometheus text: per stage lag, pending and dead letters; search latency; LLM calls and fallbacks."""
    from memflow.shared.metrics import CONTENT_TYPE, render
    return PlainTextResponse(render(client.redis, client.keys, client.queue_redis), media_type=CONTENT_TYPE)


# -- errors ------------------------------------------------------------------------------------


def _reply(status: int, code: ErrorCode, message: str, field: str | None = None) -> JSONResponse:
    return ApiError(status, code, message, field).response()


def _field(loc: tuple[Any, ...]) -> str:
    """The field an error names, as the SDK names it: `ts`, `3.ts`, `subject` (no `body`, no union tag)."""
    parts = [str(p) for p in loc if p not in ("body", "query", "path", "one", "many")]
    return ".".join(parts) or "body"


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

    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        declared = dict(scope["headers"]).get(b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > self.max_bytes:
            return await self._refuse(send)
        seen, refused = 0, False

        async def counted() -> Message:
            nonlocal seen, refused
            message = await receive()
            seen += len(message.get("body", b""))
            if seen > self.max_bytes:
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
            await self._refuse(send)

    async def _refuse(self, send: Send) -> None:
        response = _reply(413, "invalid_input", f"the body is over {self.max_bytes} bytes", "body")
        await response({"type": "http"}, _nothing, send)


class _TooLarge(Exception):
    pass


async def _nothing() -> Message:
    return {"type": "http.disconnect"}


# -- the app -------------------------------------------------------------------------------------

def create_app(settings: Settings, *, auth: bool = True, client: MemoryClient | None = None) -> FastAPI:
    """The API over the running system `settings` names (its Redis; its query workers answer reads)."""
    client = client or MemoryClient(settings)
    keystore = KeyStore(client.redis, client.keys)
    mcp = http_endpoint(client, keystore, auth=auth)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        async with mcp.lifespan(app):  # the MCP SDK's session manager
            yield
        await app.state.redis.aclose()
    app = FastAPI(title="memflow", version="1", summary="Long-term memory for LLM agents: the HTTP API.",
                  openapi_url="/openapi.json", docs_url="/docs", redoc_url=None, lifespan=lifespan)
    app.state.client = client
    app.state.keystore = keystore
    # The key lookups, on the event loop.
    app.state.redis = connect_async(require_url(settings), cluster=settings.redis.cluster)
    app.state.auth = auth
    _install_errors(app)
    app.include_router(v1)
    app.include_router(ops)
    app.add_route("/mcp", mcp.app, include_in_schema=False)  # type: ignore[arg-type]  # an ASGI app: every method
    from memflow.workers.inspector import pages  # here: the inspector's pages are built on this module
    app.include_router(pages)
    app.add_middleware(BodyLimit, max_bytes=settings.http.max_body_bytes)
    return app


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

