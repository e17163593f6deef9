"""What the front doors (the HTTP API, /mcp, the inspector page) share: who is asking, which subjects
their key may touch, the error every refusal is, and forgetting with its proof.

One rule in one place: a request names a key, the key is looked up on every request (a revoked key is
refused by the next one), and it may touch only the subjects its patterns allow.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import redis.asyncio
from pydantic import BaseModel
from starlette.responses import JSONResponse

from memflow.shared import rpc
from memflow.shared.apikeys import ApiKey, KeyStore
from memflow.shared.client import MemoryClient
from memflow.shared.errors import MemflowError

ErrorCode = Literal["invalid_input", "unauthorized", "forbidden", "not_found", "store_unavailable", "timeout",
                    "busy", "rate_limited", "internal"]


class ErrorBody(BaseModel):
    code: ErrorCode
    message: str
    field: str | None = None


class ErrorReply(BaseModel):
    error: ErrorBody


class ApiError(MemflowError):
    """A refusal: its HTTP status and stable code, the field it is about, and (a server too busy to take
    the request on) after how many seconds to try again."""

    def __init__(self, status: int, code: ErrorCode, message: str, field: str | None = None, *,
                 retry_after_s: int | None = None) -> None:
        super().__init__(message)
        self.status, self.code, self.message, self.field = status, code, message, field
        self.retry_after_s = retry_after_s

    def response(self) -> JSONResponse:
        headers = {"WWW-Authenticate": "Bearer"} if self.status == 401 else {}
        if self.retry_after_s is not None:
            headers["Retry-After"] = str(self.retry_after_s)
        body = ErrorReply(error=ErrorBody(code=self.code, message=self.message, field=self.field))
        return JSONResponse(body.model_dump(), status_code=self.status, headers=headers or None)


def error_line(error: Exception | str) -> str:
    """An error as one line: a failed call's message ends with the worker's traceback, and only its
    last line (the error itself) is for a caller to read."""
    lines = str(error).strip().splitlines()
    return lines[-1] if lines else "unknown error"


def bearer(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header."""
    scheme, _, secret = (authorization or "").partition(" ")
    return (secret.strip() or None) if scheme.lower() == "bearer" else None


def authenticate(keystore: KeyStore, secret: str | None) -> ApiKey:
    """The key `secret` is, looked up now; 401 when there is none, or none by that secret."""
    return _known(keystore.lookup(_given(secret)))


async def authenticate_async(keystore: KeyStore, client: redis.asyncio.Redis, secret: str | None) -> ApiKey:
    """`authenticate` on the server's event loop."""
    return _known(await keystore.lookup_async(client, _given(secret)))


def _given(secret: str | None) -> str:
    if not secret:
        raise ApiError(401, "unauthorized", "no API key: send `Authorization: Bearer <key>`")
    return secret


def _known(key: ApiKey | None) -> ApiKey:
    if key is None:
        raise ApiError(401, "unauthorized", "unknown or revoked API key")
    return key


def allowed(key: ApiKey, subject: str, *, write: bool = False, field: str = "subject") -> str:
    """`subject`, if the key may touch it (and write, when asked); 403 otherwise."""
    if not key.may_see(subject):
        raise ApiError(403, "forbidden", f"this key may not touch subject {subject!r}", field)
    if write and key.read_only:
        raise ApiError(403, "forbidden", "this key is read-only: it may search, pack and inspect, not write, "
                       "feed back or forget")
    return subject


class Forgotten(rpc.ForgetReport):
    """What was forgotten, and the proof (`verify_forgotten`) that nothing of it is left."""

    proof: rpc.ForgetProof


def forget_proven(client: MemoryClient, subject: str, memory_ids: Sequence[str] | None,
                  contains: str | None) -> Forgotten:
    """Forget, then prove it: no point left in the store, no Redis entry naming what was forgotten."""
    report = client.call(rpc.FORGET, subject=subject, memory_ids=memory_ids, contains=contains)
    proof = client.call(rpc.VERIFY_FORGOTTEN, subject=subject, memory_ids=report.ids)
    return Forgotten(**report.model_dump(), proof=proof)
