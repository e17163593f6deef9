"""The HTTP API (`memflow serve`): the front door for agents that are not Python.

It talks to the running system exactly as `MemoryClient` does — a write is one XADD and the
reply is 202 (the pipeline works off the response path); reads are RPCs of the query worker —
and speaks its vocabulary: bodies and replies are the SDK's models (`subject`, `content`,
`query`, `k`, `now`, `hits`, `status`, …). Every request names a key (`Authorization: Bearer
mf_…`, shared/admission/apikeys.py) and may touch only the subjects its patterns allow; an id of
another subject's memory is answered as if it did not exist. Errors are JSON with a stable
code (`ErrorReply`), never a stack trace.

FastAPI (on Starlette and uvicorn): request models are the pydantic models the SDK already
has, so validation, the field named in an error and the OpenAPI document come from one
source; Starlette alone would have us write all three by hand.

Bounded at the edge (docs/conventions.md#bounded-at-the-edge). The routes are `async def`: a call of the query worker
is enqueued in a thread (RQ is sync: milliseconds) and its reply waited for on the event loop (redis.asyncio),
so a search waiting 10 s for a busy worker holds no thread. The blocking Redis calls (an enqueue, a
publish, a traces read) run in a pool of MEMFLOW_HTTP_THREADS threads of the API's own, each call
bounded by its connection's socket timeout. At most MEMFLOW_HTTP_MAX_REQUESTS requests are worked on
at once; past it, or when no thread frees within MEMFLOW_HTTP_THREAD_WAIT_S, a request is refused at
once (503 `busy`, Retry-After) rather than queued. `/healthz` takes no place among them and has
threads of its own: it answers whatever the other routes wait for.

This module builds the app. Beside it: api_edge.py (the key, the bounds, the calls of the query worker),
api_errors.py (how a refusal is answered), and the routes: memories_api.py (/v1's memory routes),
transfer_api.py (export, import), changes_api.py (the change feed), ops_api.py (/healthz, /metrics),
inspector.py (the pages) and mcp.py (/mcp).
"""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI

from memflow.pipeline.models import ChatEvent
from memflow.shared.admission.apikeys import KeyStore
from memflow.shared.admission.shares import KeyShares, share_limits
from memflow.shared.errors import MemflowError
from memflow.shared.redisdb.connections import client_socket_timeout_s, connect_async, require_queue_url, require_url
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings, get_settings
from memflow.workers.api_edge import HEALTH_CONNECTIONS, Edge
from memflow.workers.api_errors import BodyLimit, install_errors
from memflow.workers.changes_api import close as close_feed
from memflow.workers.changes_api import install as install_feed
from memflow.workers.front import HostCheck, authorities, host_names
from memflow.workers.inspector import pages
from memflow.workers.mcp import HttpEndpoint, http_endpoint
from memflow.workers.memories_api import v1
from memflow.workers.ops_api import ops
from memflow.workers.system import Part
from memflow.workers.transfer_api import IMPORT_PATH, document_transfer, transfer_routes

# -- the app -------------------------------------------------------------------------------------

def create_app(settings: Settings, *, auth: bool = True, client: MemoryClient | None = None) -> FastAPI:
    """The API over the running system `settings` names (its Redis; its query workers answer reads)."""
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
    replies = connect_async(require_queue_url(settings), **options)
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
    install_errors(app)
    _include_routes(app, settings, mcp)
    app.add_middleware(BodyLimit, max_bytes=settings.http.max_body_bytes,
                       per_path={IMPORT_PATH: settings.http.max_import_bytes})  # an export is bigger
    # The outermost: a page of another site, or of another port, gets nothing read.
    app.add_middleware(HostCheck, allowed=authorities(settings.http.host, settings.http.allowed_hosts.split(",")))
    _document_events(app)
    document_transfer(app)
    return app


def _include_routes(app: FastAPI, settings: Settings, mcp: HttpEndpoint) -> None:
    """The routes, in the order the document lists them: /v1's memory routes (workers/memories_api.py), export
    and import (transfer_api.py), the change feed (changes_api.py), /healthz and /metrics (ops_api.py); then /mcp
    and the inspector's pages (inspector.py)."""
    app.include_router(v1)
    app.include_router(transfer_routes)
    install_feed(app, settings, app.state.client.keys)
    app.include_router(ops)
    app.add_route("/mcp", mcp.app, include_in_schema=False)  # type: ignore[arg-type]  # an ASGI app: every method
    app.include_router(pages)


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
