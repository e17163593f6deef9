"""What the front doors (the HTTP API, /mcp, the inspector page) share: who is asking, which subjects
their key may touch, the error every refusal is, and forgetting with its proof.

One rule in one place: a request names a key, the key is looked up on every request (a revoked key is
refused by the next one), and it may touch only the subjects its patterns allow.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Literal
from urllib.parse import urlsplit

import redis.asyncio
from pydantic import BaseModel
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

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


# -- which host names the server answers to ----------------------------------------------------------
#
# DNS rebinding: a page of attacker.example, its name re-pointed at 127.0.0.1, reaches a server on this
# machine as the same origin and reads what it answers (every subject, under --no-auth). The browser
# still names the page's host in Host and Origin, so a server that answers only to its own names is out
# of the page's reach, key or no key.

# The names a server answers to wherever it listens; `*` among the allowed names turns the check off.
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
ANY_HOST = "*"
# Addresses that mean "every interface": no name a client uses.
WILDCARD_BINDS = ("0.0.0.0", "::", "")


def host_names(bind: str, extra: Iterable[str]) -> frozenset[str]:
    """The host names a server bound to `bind` answers to: the local ones, the bind address (unless it is a
    wildcard), and `extra` (MEMFLOW_HTTP_ALLOWED_HOSTS: the names it is reached by through a proxy or DNS)."""
    names = {host_name(n) for n in (*LOCAL_NAMES, bind, *extra)}
    return frozenset(names - set(WILDCARD_BINDS))


def host_name(authority: str) -> str:
    """The host of a Host header (`name`, `name:port`, `[v6]:port`): lowercased, without its port, brackets
    or a final dot."""
    value = authority.strip().lower()
    if value.startswith("["):
        value = value[1:].partition("]")[0]
    elif value.count(":") == 1:  # more than one: a bare IPv6 address, no port
        value = value.partition(":")[0]
    return value.rstrip(".")


def host_refusal(names: frozenset[str], host: str | None, origin: str | None) -> ApiError | None:
    """Why a request with these Host and Origin headers is refused, or None. No Host at all passes: a
    browser always sends one, so its absence is no rebinding (and HTTP/1.0 tools send none)."""
    if ANY_HOST in names:
        return None
    if host is not None and host_name(host) not in names:
        return ApiError(421, "forbidden", f"this server does not answer to the host {host_name(host)!r} (a page "
                        "of another site may be calling it): if that name is this server's, add it to "
                        "MEMFLOW_HTTP_ALLOWED_HOSTS", "Host")
    if origin is not None and (urlsplit(origin).hostname or "").rstrip(".") not in names:
        return ApiError(403, "forbidden", f"requests from pages of {origin!r} are refused: a page of another site "
                        "may not call this server (add its host to MEMFLOW_HTTP_ALLOWED_HOSTS if it is yours)",
                        "Origin")
    return None


class HostCheck:
    """In front of every route of `serve` (the API, /mcp, the inspector, /healthz): a request naming a host
    or origin the server does not answer to is refused before anything reads it, with or without keys."""

    def __init__(self, app: ASGIApp, names: frozenset[str]) -> None:
        self.app, self.names = app, names

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            refusal = host_refusal(self.names, headers.get("host"), headers.get("origin"))
            if refusal is not None:
                return await refusal.response()(scope, receive, send)
        await self.app(scope, receive, send)


def sdk_hosts(names: frozenset[str]) -> tuple[list[str], list[str]]:
    """The same names as the MCP SDK's rebinding protection takes them: Host values and origins, each with
    any port (`name:*`), an IPv6 address in brackets."""
    quoted = [f"[{n}]" if ":" in n else n for n in sorted(names)]
    hosts = [h for q in quoted for h in (q, f"{q}:*")]
    origins = [f"{scheme}://{h}" for scheme in ("http", "https") for h in hosts]
    return hosts, origins
