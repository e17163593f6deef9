"""/healthz and /metrics: what a load balancer and Prometheus ask the HTTP API."""

from __future__ import annotations

from functools import partial
from typing import Any, Literal

import redis
from anyio import to_thread
from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse, PlainTextResponse

from memflow.pipeline.models import Wire
from memflow.shared.errors import RpcError
from memflow.shared.sdk import rpc
from memflow.workers.api_edge import ERRORS, Caller, Client, Edge, blocking
from memflow.workers.front import ApiError, authenticate_async, bearer


class Health(Wire):
    """Up or down for anyone; the rest (what answers, how many memories, the error) for a caller with a key."""

    status: Literal["ok", "degraded"]
    redis: Literal["ok", "unavailable"] | None = None
    store: Literal["ok", "unavailable", "unknown"] | None = None
    query_workers: int | None = None
    memories: int | None = None
    auth: Literal["on", "off"] | None = None
    error: str | None = None


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
    from memflow.shared.monitoring.metrics import CONTENT_TYPE, render
    text = await blocking(request, partial(render, client.redis, client.keys, client.queue_redis))
    return PlainTextResponse(text, media_type=CONTENT_TYPE)
