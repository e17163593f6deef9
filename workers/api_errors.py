"""How the HTTP API says no: every refusal and failure as JSON with a stable code (`ErrorReply`, workers/front.py),
never a stack trace; and a body over the limit refused before anything reads it (`BodyLimit`)."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import redis
from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memflow.pipeline import wording
from memflow.shared.errors import InvalidInput
from memflow.workers.front import ApiError, ErrorCode

log = logging.getLogger("memflow.api")


def _reply(status: int, code: ErrorCode, message: str, field: str | None = None) -> JSONResponse:
    return ApiError(status, code, message, field).response()


def field_of(loc: tuple[Any, ...]) -> str:
    """The field an error names, as the SDK names it: `ts`, `3.ts`, `subject`, without the location FastAPI puts
    first (`body`, `query`, `path`): only the first, since a field may be named `query` too."""
    if loc and loc[0] in ("body", "query", "path", "header", "cookie"):
        loc = loc[1:]
    return ".".join(str(p) for p in loc) or "body"


def invalid(errors: Sequence[Any], at: str = "") -> ApiError:
    """The 422 that pydantic's `errors` (of a body, a query, an item `at` of a batch: "3.") answer with: the first,
    naming its field as the caller sent it, in plain words (pipeline/wording.py)."""
    first = errors[0]
    named = field_of(tuple(first.get("loc", ())))
    field = at.rstrip(".") if at and named == "body" else at + named  # an item of a batch that is no object: "3"
    if first.get("type") == "missing" and field == "body":
        return ApiError(422, "invalid_input", "the body is empty: send a JSON object, with "
                        "`Content-Type: application/json`", field)
    return ApiError(422, "invalid_input", wording.sentence(field, wording.reason(first)), field)


async def _invalid(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, RequestValidationError)
    first = exc.errors()[0]
    if first.get("type") == "json_invalid":
        said = (first.get("ctx") or {}).get("error") or first.get("msg")  # json's own words: "Expecting value"
        return _reply(400, "invalid_input", f"the body is not JSON: {said}", "body")
    return invalid(exc.errors()).response()


async def _api_error(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, ApiError)
    return exc.response()


async def _invalid_input(request: Request, exc: Exception) -> JSONResponse:
    assert isinstance(exc, InvalidInput)
    return _reply(422, "invalid_input", wording.sentence(exc.field, wording.plain(exc.reason)), exc.field)


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


def install_errors(app: FastAPI) -> None:
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
