"""What the front doors (the HTTP API, /mcp, the inspector page) share: who is asking, which subjects
their key may touch, the error every refusal is, and forgetting with its proof.

One rule in one place: a request names a key, the key is looked up on every request (a revoked key is
refused by the next one), and it may touch only the subjects its patterns allow.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

import redis.asyncio
from pydantic import BaseModel
from starlette.datastructures import Headers
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Receive, Scope, Send

from memflow.shared.admission.apikeys import ApiKey, KeyStore
from memflow.shared.errors import MemflowError
from memflow.shared.sdk import rpc
from memflow.shared.sdk.client import MemoryClient

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


def presented(authorization: str | None) -> str | None:
    """The key of an `Authorization: Bearer <key>` header, None without one. A header of another form (the key
    alone, `Basic …`, `Bearer` with nothing after it) is refused 401 saying what to send: it is no missing key."""
    if not (authorization or "").strip():
        return None
    secret = bearer(authorization)
    if secret is None:
        raise ApiError(401, "unauthorized", f"{_unframed(authorization or '')}: send `Authorization: Bearer <key>`",
                       "Authorization")
    return secret


def _unframed(authorization: str) -> str:
    """What is wrong with an Authorization header that holds no Bearer key (never echoing it: it may be the key)."""
    scheme, _, rest = authorization.strip().partition(" ")
    if scheme.lower() == "bearer":
        return "the Authorization header names the Bearer scheme but no key after it"
    if not rest.strip():
        return "the Authorization header holds a value without the `Bearer ` scheme before it"
    return "the Authorization header is of another scheme than Bearer"


# The media type every route that reads a body reads, unless its document names others (an import: JSON Lines).
JSON = "application/json"


def unread_media(headers: Mapping[str, str], media_types: tuple[str, ...]) -> ApiError | None:
    """The 415 a request with a body whose Content-Type is none of `media_types` gets (JSON: with any parameters,
    and `application/*+json` too), saying what to send; no body (a DELETE naming its ids in the query) is not asked
    for one. 415 as RFC 9110 has it: the body may be fine, its declared type is not one the route reads."""
    if headers.get("content-length", "0") == "0" and "transfer-encoding" not in headers:
        return None
    sent = headers.get("content-type", "")
    media = sent.partition(";")[0].strip().lower()
    if media in media_types or (JSON in media_types and media.startswith("application/") and media.endswith("+json")):
        return None
    return ApiError(415, "invalid_input", f"this route reads {' or '.join(media_types)}: send the body with "
                    f"`Content-Type: {media_types[0]}` (it came {f'as {sent!r}' if sent else 'with no Content-Type'})",
                    "Content-Type")


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
    """Forget, then prove it: no point left in the store, no Redis entry naming what was forgotten, no point
    still holding its words."""
    report = client.call(rpc.FORGET, subject=subject, memory_ids=memory_ids, contains=contains)
    proof = client.call(rpc.VERIFY_FORGOTTEN, subject=subject, memory_ids=report.forgotten_ids)
    return Forgotten(**report.model_dump(), proof=proof)


# -- which host names the server answers to ----------------------------------------------------------
#
# DNS rebinding: a page of attacker.example, its name re-pointed at 127.0.0.1, reaches a server on this
# machine as the same origin and reads what it answers (every subject, under --no-auth). The browser
# still names the page's host in Host and Origin, so a server that answers only to its own names is out
# of the page's reach, key or no key.
#
# A page of another port of this machine (http://127.0.0.1:9999, any local dev server) names an allowed
# host too: its Origin differs from the server's own in the port alone, and a `Content-Type: text/plain`
# post skips the browser's preflight. So an Origin is compared whole: scheme, host and port (issue 38).

# The names a server answers to wherever it listens; `*` among the allowed names turns the check off.
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
ANY_HOST = "*"
# Addresses that mean "every interface": no name a client uses.
WILDCARD_BINDS = ("0.0.0.0", "::", "")
# The port a URL of each scheme means when it names none (an Origin names its port only when it is another).
DEFAULT_PORTS = {"http": 80, "https": 443}


def host_names(bind: str, extra: Iterable[str]) -> frozenset[str]:
    """The host names a server bound to `bind` answers to: the local ones, the bind address (unless it is a
    wildcard), and `extra` (MEMFLOW_HTTP_ALLOWED_HOSTS: the names it is reached by through a proxy or DNS),
    whatever port an entry names."""
    names = {host_name(n) for n in (*LOCAL_NAMES, bind, *extra)}
    return frozenset(names - set(WILDCARD_BINDS))


@dataclass(frozen=True)
class Authorities:
    """Where a server is reached: `names` on its own port and scheme; `proxied`, a name on a port of its own
    (a MEMFLOW_HTTP_ALLOWED_HOSTS entry `name:port`: a proxy in front, which decides the scheme); `anything`
    (`*`): no check at all."""

    names: frozenset[str]
    proxied: frozenset[tuple[str, int]] = frozenset()
    anything: bool = False

    def host(self, value: str, own_port: int | None) -> bool:
        """Whether a Host header names this server. One without a port names the scheme's default: it reaches
        this port only through something that forwards it here (a proxy), never from a page of another port,
        whose browser names that port. An own port of None (a Unix socket: a proxy in front) is not compared."""
        name, port = authority(value)
        if port is None:
            return name in self.names or any(name == n for n, _ in self.proxied)
        return (name in self.names and own_port in (port, None)) or (name, port) in self.proxied

    def origin(self, value: str, own_scheme: str, own_port: int | None) -> bool:
        """Whether an Origin header names a page of this server: the same scheme, host and port."""
        try:
            parts = urlsplit(value)
            port = parts.port or DEFAULT_PORTS.get(parts.scheme)
        except ValueError:  # a port that is no number, or out of range
            return False
        name = (parts.hostname or "").rstrip(".")
        if port is None or not name:  # `null` (a sandboxed page or a file), a scheme of no web page
            return False
        return (name in self.names and parts.scheme == own_scheme and own_port in (port, None)) \
            or (name, port) in self.proxied


def authorities(bind: str, extra: Iterable[str]) -> Authorities:
    """Where a server bound to `bind` is reached: `host_names` on its own port, and the entries of `extra` that
    name a port of their own (`memory.example.org:443`) on that port."""
    entries = [authority(e) for e in extra if e.strip()]
    proxied = frozenset((name, port) for name, port in entries if port is not None)
    own = [n for n, port in entries if port is None]
    return Authorities(host_names(bind, own), proxied, ANY_HOST in host_names(bind, extra))


def authority(value: str) -> tuple[str, int | None]:
    """The host and port of a Host header or an allowed-hosts entry (`name`, `name:port`, `[v6]:port`, a bare
    IPv6 address); a port that is no number is -1, which no server listens on."""
    value = value.strip()
    if value.startswith("["):
        _, _, port = value.partition("]")
        port = port.removeprefix(":")
    elif value.count(":") == 1:  # more than one: a bare IPv6 address, no port
        port = value.partition(":")[2]
    else:
        port = ""
    if not port:
        return host_name(value), None
    return host_name(value), int(port) if port.isdigit() and int(port) <= 65535 else -1


def host_name(authority: str) -> str:
    """The host of a Host header (`name`, `name:port`, `[v6]:port`): lowercased, without its port, brackets
    or a final dot."""
    value = authority.strip().lower()
    if value.startswith("["):
        value = value[1:].partition("]")[0]
    elif value.count(":") == 1:  # more than one: a bare IPv6 address, no port
        value = value.partition(":")[0]
    return value.rstrip(".")


def host_refusal(allowed: Authorities, host: str | None, origin: str | None, *, scheme: str = "http",
                 port: int | None) -> ApiError | None:
    """Why a request with these Host and Origin headers, come to a server at `port` over `scheme`, is refused,
    or None. No Host at all passes: a browser always sends one, so its absence is no rebinding (and HTTP/1.0
    tools send none); no Origin passes too (curl, the SDKs: no page)."""
    if allowed.anything:
        return None
    if host is not None and not allowed.host(host, port):
        return ApiError(421, "forbidden", f"this server does not answer to the host {host.strip().lower()!r} (a "
                        "page of another site may be calling it): if that name is this server's, add it to "
                        "MEMFLOW_HTTP_ALLOWED_HOSTS (`name:port` for a port other than its own)", "Host")
    if origin is not None and not allowed.origin(origin, scheme, port):
        return ApiError(403, "forbidden", f"requests from pages of {origin!r} are refused: only a page of this "
                        "server (its scheme, host and port) may call it (add the page's host to "
                        "MEMFLOW_HTTP_ALLOWED_HOSTS, as `name:port`, if it is yours)", "Origin")
    return None


class HostCheck:
    """In front of every route of `serve` (the API, /mcp, the inspector, /healthz): a request naming a host
    or origin the server does not answer to is refused before anything reads it, with or without keys. The
    server's own port and scheme are the connection's (uvicorn's: whatever `--port` says, TLS or a trusted
    proxy's X-Forwarded-Proto)."""

    def __init__(self, app: ASGIApp, allowed: Authorities) -> None:
        self.app, self.allowed = app, allowed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = Headers(scope=scope)
            server = scope.get("server") or (None, None)
            refusal = host_refusal(self.allowed, headers.get("host"), headers.get("origin"),
                                   scheme=scope.get("scheme", "http"), port=server[1])
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
