"""The MCP server (`memflow mcp`): memory as tools for Claude Desktop and Code, Cursor, the OpenAI Agents
SDK, LangGraph — over stdio for desktop clients, and over streamable HTTP at `/mcp` of `memflow serve`.

Seven tools, each a thin call of `MemoryClient`: `remember` (an explicit write), `recall` (search),
`context` (pack for a task), `profile` (what holds now), `forget` (with its proof), `publish_turns` (a client
reporting its conversation) and `event_fate` (what became of an event `remember` or `publish_turns` named).
No tool takes a subject: a model can be talked into any argument, so the subject comes
from what it cannot touch — the server's configuration over stdio (`--subject`, MEMFLOW_MCP_SUBJECT, or
the one subject of the MEMFLOW_API_KEY key), the request's key and its `X-Memflow-Subject` header over
HTTP — and `resolve_caller` checks it against the key's patterns, the rule the HTTP API applies.

Over HTTP the SDK runs stateless, with JSON replies: every POST stands alone, so the key and subject are
resolved per request by `Gate` (a revoked key is refused by the next request) and any number of `serve`
processes can share the load.
"""

from __future__ import annotations

import hashlib
import inspect
import logging
import re
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractAsyncContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Annotated, Any, Literal

import anyio.to_thread
import redis
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.mcpserver.tools import Tool
from mcp.server.mcpserver.utilities.func_metadata import ArgModelBase
from mcp.server.transport_security import TransportSecuritySettings
from mcp_types import ToolAnnotations
from pydantic import BaseModel, ConfigDict, Field
from starlette.datastructures import Headers
from starlette.types import ASGIApp, Receive, Scope, Send

from memflow.pipeline.fates import EventFate
from memflow.pipeline.models import SUBJECT_PATTERN, Kind, MType, Role, SearchResult
from memflow.pipeline.scopes import single_subject
from memflow.shared.admission.apikeys import OPEN, ApiKey, KeyStore
from memflow.shared.admission.fairness import Refused
from memflow.shared.admission.shares import KeyShares, Place
from memflow.shared.errors import InvalidInput, RpcError
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.sdk.rpc import PACK, PROFILE, SEARCH, MemoryId, Rep, Rpc
from memflow.shared.settings import Settings
from memflow.shared.unstored import fates
from memflow.workers.front import (
    ANY_HOST,
    JSON,
    ApiError,
    Forgotten,
    allowed,
    authenticate,
    error_line,
    forget_proven,
    presented,
    sdk_hosts,
    unread_media,
)

log = logging.getLogger("memflow.mcp")

SUBJECT_HEADER = "X-Memflow-Subject"
STDIO_SUBJECT = "--subject (or MEMFLOW_MCP_SUBJECT)"
# Where Gate leaves the caller it resolved, in the ASGI scope the SDK hands each tool call as its request.
CALLER_SCOPE = "memflow.caller"
SUBJECT_ID = re.compile(SUBJECT_PATTERN)


# -- who is asking --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Caller:
    """The subject a client speaks for, whether its key may change anything, and the key (its share of the
    doors is counted by its id)."""

    subject: str
    read_only: bool
    key_id: str | None = field(default=None, compare=False)


def resolve_caller(key: ApiKey, named: str | None, *, where: str) -> Caller:
    """The caller a key and a named subject make: the subject named (`where` says how: the stdio flag or
    the HTTP header), which the key's patterns must cover, else the key's only subject. A key over many
    subjects (and --no-auth, over all) must name one; none comes from a tool argument."""
    subject = named or single_subject(key.subjects)
    if subject is None:
        raise ApiError(400, "invalid_input", f"name the subject this client speaks for with {where} "
                       "(the key does not name exactly one)", where)
    if not SUBJECT_ID.fullmatch(subject):
        raise ApiError(400, "invalid_input", f"{subject!r} is no subject id (letters, digits, . _ : / -)", where)
    return Caller(allowed(key, subject, field=where), key.read_only, key.id)


class StdioCaller:
    """The caller of a stdio server: its configured subject, under the MEMFLOW_API_KEY key when one is set
    (without one, whoever reaches Redis may touch every subject anyway). Resolved again for each call."""

    def __init__(self, keystore: KeyStore, secret: str | None, subject: str | None) -> None:
        self.keystore, self.secret, self.subject = keystore, secret, subject

    def resolve(self) -> Caller:
        key = OPEN if self.secret is None else authenticate(self.keystore, self.secret)
        return resolve_caller(key, self.subject, where=STDIO_SUBJECT)

    def __call__(self, ctx: Context) -> Caller:
        return self.resolve()


def from_request(ctx: Context) -> Caller:
    """The caller `Gate` resolved for the HTTP request this tool call came in, or the refusal of the subject
    it found there, raised for `told` to answer as a tool error."""
    request = ctx.request_context.request
    caller = None if request is None else request.scope.get(CALLER_SCOPE)
    if isinstance(caller, ApiError):
        raise caller
    if not isinstance(caller, Caller):
        raise ApiError(401, "unauthorized", "this request passed no key check")
    return caller


@dataclass
class Turn:
    """One tool call's caller, and its key's place while the call holds it (None: none taken, or handed on to
    a call still running)."""

    caller: Caller
    place: Place | None = None


# -- what the tools answer -------------------------------------------------------------------------


class Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Remembered(Reply):
    event_id: str = Field(description="The id of the write; the memory's id is given by recall once written.")
    note: str


class Recollection(Reply):
    id: str = Field(description="Pass it to forget to remove this memory.")
    content: str
    type: MType = Field(description="What kind of memory: preference, fact, rule, event, ...")
    date: datetime = Field(description="When it was remembered.")
    pending: bool = Field(default=False, description="Just said, not stored yet: it is being written.")
    replaces: str | None = Field(default=None, description="The id of the memory this new value is replacing.")
    about: str = Field(default="self", description='Whom it is about: "self" (the user) or a person in their life '
                                                   '("mother", "wife.sister", "friend:小李").')


class Recalled(Reply):
    status: Literal["ok", "empty"] = Field(description="empty: nothing remembered matches (the search did look).")
    note: str
    memories: list[Recollection] = Field(description="Best first.")


class Packed(Reply):
    text: str = Field(description="The memories that matter for the task, ready to put in a prompt.")
    tokens: int
    memory_ids: list[str]
    note: str


class ProfileText(Reply):
    text: str = Field(description="What holds now for the user, as prompt text within the budget.")
    revision: str = Field(description="The profile's revision: the user's last change on the change feed.")
    contested: int = Field(description="Statements of the user's that contradict each other, not settled.")
    note: str


class TurnIn(Reply):
    role: Role
    text: str = Field(min_length=1)
    ts: datetime | None = Field(default=None, description="When it was said (with its offset); default now.")


class Published(Reply):
    ids: list[str] = Field(description="The stream ids, in order.")
    event_ids: list[str]
    note: str


# -- the tools -------------------------------------------------------------------------------------


@contextmanager
def told() -> Iterator[None]:
    """Failures a model can act on, as a tool error in words it reads (never an empty answer)."""
    try:
        yield
    except InvalidInput as exc:
        raise ToolError(f"invalid {exc.field}: {exc.reason}") from exc
    except ApiError as exc:
        raise ToolError(exc.message) from exc
    except (RpcError, redis.RedisError) as exc:
        raise ToolError(f"memory unavailable: {error_line(exc)}") from exc


class MemoryTools:
    """The tools (their docstrings are what a model reads to decide when to call them), for the caller
    `caller_of` finds for each call; over HTTP, each call takes a place among its key's requests to every door
    (`shares`: the HTTP API's own limits, one budget per key)."""

    def __init__(self, client: MemoryClient, caller_of: Callable[[Context], Caller],
                 shares: KeyShares | None = None) -> None:
        self.client, self.caller_of, self.shares = client, caller_of, shares

    @contextmanager
    def _serving(self, ctx: Context, *, write: bool = False) -> Iterator[Turn]:
        """The caller of this call, while its key's place is held; its failures as tool errors (`told`)."""
        with told():
            caller = self.caller_of(ctx)
            if write and caller.read_only:
                raise ApiError(403, "forbidden", "this key is read-only: it may recall and get context, not "
                               "remember, forget or publish")
            with self._share(caller) as turn:
                yield turn

    @contextmanager
    def _share(self, caller: Caller) -> Iterator[Turn]:
        """A place among the key's requests in flight, from the server's event loop (a tool runs in a thread of
        it); refused as a tool error that says when to try again, as the API's 429 does with Retry-After."""
        if self.shares is None or caller.key_id is None:
            yield Turn(caller)
            return
        place = anyio.from_thread.run(self.shares.admit, caller.key_id)
        if isinstance(place, Refused):
            raise ToolError(f"rate limited: {place.reason}; try again in {place.retry_after_s} s "
                            f"(Retry-After: {place.retry_after_s})")
        turn = Turn(caller, place)
        try:
            yield turn
        finally:
            if turn.place is not None:  # else handed on to the call still running (`_asked`)
                anyio.from_thread.run(self.shares.release, place)

    def _asked(self, turn: Turn, call: Rpc[Any, Rep], *, timeout_s: float | None = None, **fields: Any) -> Rep:
        """One call of the query worker for `turn`. Past its timeout (RpcError), a worker may still be running
        it: the key's place is given back when it is done, not now, as over HTTP."""
        sent = self.client.send(call, timeout_s=timeout_s, **fields)
        result = self.client.wait(sent)
        if result is None and self.shares is not None and turn.place is not None:
            place, turn.place = turn.place, None
            anyio.from_thread.run_sync(self.shares.release_when_done, place, self.client, sent)
        return self.client.reply(sent, result)

    def remember(self, content: Annotated[str, Field(min_length=1, description="One self-contained statement.")],
                 ctx: Context) -> Remembered:
        """Remember one thing about the user for later conversations: a preference, a fact, a decision, a rule.
        Use it when the user asks you to remember something, or says something that will matter again."""
        with self._serving(ctx, write=True) as turn:
            event_id = f"mcp-{uuid.uuid4()}"
            self.client.write(turn.caller.subject, content, session_id="mcp", event_id=event_id)
        return Remembered(event_id=event_id, note="accepted: searchable at once (as pending until it is written); "
                          "event_fate with this event_id says what became of it")

    def event_fate(self, event_id: Annotated[str, Field(min_length=1, max_length=256, description=(
                       "An event_id remember or publish_turns gave."))], ctx: Context) -> EventFate:
        """What became of something you remembered or published, by its event_id: accepted (not decided yet),
        stored (as memory_ids, which forget takes), nothing_to_remember, dropped or dead_lettered, and why. Use it
        when the user asks whether something was saved."""
        with self._serving(ctx) as turn:
            found = fates.read(self.client.redis, self.client.keys, turn.caller.subject, event_id)
        if found is None:
            raise ToolError(f"no event {event_id!r} for this user (never published here, or its fate has expired "
                            "a week after the last publish)")
        return found

    def recall(self, query: Annotated[str, Field(min_length=1, description="What you want to know, in words.")],
               ctx: Context, k: Annotated[int, Field(ge=1, le=50, description="At most this many.")] = 5) -> Recalled:
        """Search what is remembered about the user. Use it before answering anything that may depend on
        their preferences, past decisions or facts about them, or when they ask what you remember."""
        with self._serving(ctx) as turn:
            try:
                result = self._asked(turn, SEARCH, timeout_s=self.client.settings.client.search_timeout_s,
                                     subject=turn.caller.subject, query=query, k=k)
            except RpcError as exc:
                result = SearchResult(subject=turn.caller.subject, query=query, status="failed", error=str(exc))
        if result.status == "failed":
            raise ToolError(f"memory unavailable: the search could not look ({error_line(result.error or '')}); "
                            "this does not mean nothing is remembered")
        found = [Recollection(id=h.id, content=h.content, type=h.mtype, date=h.created_at, pending=h.pending,
                              replaces=h.superseding, about=h.about) for h in result.hits]
        note = f"{len(found)} memories, best first" if found else "nothing remembered matches this query"
        return Recalled(status="ok" if found else "empty", note=note, memories=found)

    def context(self, task: Annotated[str, Field(min_length=1, description="The task or question at hand.")],
                ctx: Context, budget_tokens: Annotated[int, Field(ge=50, le=8000)] = 800) -> Packed:
        """The memories that matter for a task, packed into prompt text within a token budget. Use it at the
        start of a task or conversation to bring in the user's preferences, rules and relevant facts."""
        with self._serving(ctx) as turn:
            packed = self._asked(turn, PACK, subject=turn.caller.subject, query=task, budget_tokens=budget_tokens)
        note = "ready to use" if packed.used_ids else "nothing remembered bears on this task"
        return Packed(text=packed.system, tokens=packed.tokens, memory_ids=packed.used_ids, note=note)

    def profile(self, ctx: Context, max_tokens: Annotated[int, Field(ge=50, le=8000)] = 600) -> ProfileText:
        """What is known of the user that holds now, without a query: who they are, their standing preferences
        and rules, the people in their life, and what is contested. Use it at the start of a conversation."""
        with self._serving(ctx) as turn:
            found = self._asked(turn, PROFILE, subject=turn.caller.subject, max_tokens=max_tokens)
        text = found.prompt or ""
        return ProfileText(text=text, revision=found.revision, contested=len(found.contested),
                           note="ready to use" if text else "nothing is known of the user yet")

    def forget(self, ctx: Context,
               memory_ids: Annotated[list[MemoryId] | None, Field(description="Ids from recall.")] = None,
               contains: Annotated[str | None, Field(description="Forget every memory holding this.")] = None,
               ) -> Forgotten:
        """Forget memories for good: by id (from recall) or every one whose content holds a phrase. Use it when
        the user asks you to forget something or says a memory is wrong. The verbatim records of the turns they
        came from go too where they hold the words (`records`). Returns the proof nothing is left; `still_held`
        names other memories still holding the words: forget those too if the user wants the words gone."""
        if not memory_ids and not contains:
            raise ToolError("name what to forget: memory_ids (from recall) or contains (a phrase)")
        with self._serving(ctx, write=True) as turn:
            return forget_proven(self.client, turn.caller.subject, memory_ids, contains)

    def publish_turns(self, turns: Annotated[list[TurnIn], Field(min_length=1, description=(
                          "The turns, oldest first: at most as many as the HTTP API takes in one batch (500)."))],
                      session_id: Annotated[str, Field(min_length=1, max_length=200, description=(
                          "This conversation's id, the same in every call for it."))],
                      ctx: Context, end_session: bool = False) -> Published:
        """Report turns of this conversation so memory can learn from them (it picks what is worth keeping).
        Use it after each exchange, or in batches; set end_session when the conversation is over."""
        most = self.client.settings.http.max_batch
        if len(turns) > most:  # the HTTP API's bound (MEMFLOW_HTTP_MAX_BATCH): one door is no wider than another
            raise ToolError(f"at most {most} turns per call ({len(turns)} given): report them in batches")
        with self._serving(ctx, write=True) as turn:
            events = turn_events(turn.caller.subject, session_id, turns, end_session=end_session,
                                 now=datetime.now(UTC))
            ids = self.client.publish_many(events)
        return Published(ids=ids, event_ids=[e["event_id"] for e in events],
                         note=f"{len(ids)} events accepted; what the user said is found at once (pending till "
                              "written); event_fate with an event_id says what became of it")


def turn_events(subject: str, session_id: str, turns: Sequence[TurnIn], *, end_session: bool,
                now: datetime) -> list[dict[str, Any]]:
    """The events a batch of turns makes. An event's id is a digest of what it says and where, so a client
    that reports the same batch again (a retry) rewrites the same turns instead of adding copies."""
    events = [{"event_id": _digest("turn", subject, session_id, str(i), t.role.value, (t.ts or now).isoformat(),
                                   t.text),
               "subject": subject, "session_id": session_id, "kind": Kind.message, "role": t.role, "text": t.text,
               "ts": t.ts or now, "meta": {"via": "mcp"}} for i, t in enumerate(turns)]
    if end_session:
        last = max([now, *(t.ts for t in turns if t.ts is not None)])
        events.append({"event_id": _digest("end", subject, session_id), "subject": subject,
                       "session_id": session_id, "kind": Kind.session_end, "ts": last, "meta": {"via": "mcp"}})
    return events


def _digest(*parts: str) -> str:
    return "mcp-" + hashlib.sha256("\x1f".join(parts).encode()).hexdigest()[:32]


READS = ToolAnnotations(read_only_hint=True, open_world_hint=False)
WRITES = ToolAnnotations(read_only_hint=False, destructive_hint=False, open_world_hint=False)
ERASES = ToolAnnotations(read_only_hint=False, destructive_hint=True, idempotent_hint=True, open_world_hint=False)

INSTRUCTIONS = ("Long-term memory of the user you are talking with (memflow). Call context at the start of a task, "
                "recall before answers that may depend on what you know of them, remember what they ask you to "
                "keep, forget what they ask you to drop, and publish_turns to let memory learn from the conversation.")


def build_server(tools: MemoryTools) -> MCPServer:
    return MCPServer("memflow", version="1", instructions=INSTRUCTIONS, log_level="WARNING", tools=[
        strict(fn, hints) for fn, hints in ((tools.remember, WRITES), (tools.recall, READS), (tools.context, READS),
                                            (tools.profile, READS), (tools.forget, ERASES),
                                            (tools.publish_turns, WRITES), (tools.event_fate, READS))])


def strict(fn: Callable[..., Any], hints: ToolAnnotations) -> Tool:
    """The tool `fn` is, refusing any argument it does not name. The SDK's argument model ignores unknown
    ones, and an ignored argument misleads: `forget(contains=..., subject="team-b/x")` forgot in the caller's
    own subject while the model believed it acted on another. The SDK has no switch for it: the model it
    built is subclassed with extra="forbid", and the schema the client is shown says so too."""
    tool = Tool.from_function(fn, description=inspect.getdoc(fn), annotations=hints, structured_output=True)
    loose = tool.fn_metadata.arg_model
    config = ConfigDict(**{**loose.model_config, "extra": "forbid"})
    forbidding: type[ArgModelBase] = type(loose.__name__, (loose,), {"model_config": config,
                                                                    "__module__": loose.__module__})
    tool.fn_metadata.arg_model = forbidding
    tool.parameters = forbidding.model_json_schema(by_alias=True)
    return tool


# -- over stdio ------------------------------------------------------------------------------------


def run_stdio(settings: Settings, subject: str | None) -> None:
    """Serve the tools on stdin/stdout until the client closes them. A subject or key that cannot be used
    is told at once on stderr, and the server serves anyway: every tool call answers the same message as
    a tool error. Exiting instead left the client (and the model, and its user) only "Connection closed"."""
    client = MemoryClient(settings)
    secret = settings.http.api_key.get_secret_value() if settings.http.api_key else None
    caller_of = StdioCaller(KeyStore(client.redis, client.keys), secret, subject)
    try:
        caller = caller_of.resolve()
        log.info("memflow mcp over stdio: subject %s%s", caller.subject, " (read-only)" if caller.read_only else "")
    except ApiError as exc:
        log.error("memflow mcp: %s (every tool call answers this until it is fixed)", exc.message)
    build_server(MemoryTools(client, caller_of)).run("stdio")


# -- over streamable HTTP ---------------------------------------------------------------------------


class Gate:
    """In front of the SDK at /mcp: the request's key and subject, resolved before MCP sees the request.
    A key that is no key is refused here, with the API's JSON error (`{"error": {code, message, field}}`)
    and its 401. A subject the key cannot speak for (none named by a key over many, or one it does not cover)
    is left for each tool call to answer as a tool error, as over stdio: an MCP client shows a tool error's
    words to its user and model, while it turns an HTTP refusal into a transport failure (an ExceptionGroup
    in the Python SDK) that hides the server's sentence."""

    def __init__(self, inner: ASGIApp, keystore: KeyStore, *, auth: bool) -> None:
        self.inner, self.keystore, self.auth = inner, keystore, auth

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return await self.inner(scope, receive, send)
        headers = Headers(scope=scope)
        try:
            # The key store is blocking Redis: off the event loop, like the API's sync routes.
            scope[CALLER_SCOPE] = await anyio.to_thread.run_sync(self.resolve, headers)
            # A message posted as another type: the API's 415 saying what to send, not the SDK's bare 400.
            if scope["method"] == "POST" and (refused := unread_media(headers, (JSON,))) is not None:
                raise refused
        except ApiError as exc:
            return await exc.response()(scope, receive, send)
        await self.inner(scope, receive, send)

    def resolve(self, headers: Headers) -> Caller | ApiError:
        key = authenticate(self.keystore, presented(headers.get("authorization"))) if self.auth else OPEN
        try:
            return resolve_caller(key, headers.get(SUBJECT_HEADER), where=SUBJECT_HEADER)
        except ApiError as refused:
            return refused


@dataclass(frozen=True)
class HttpEndpoint:
    """The ASGI app to route `/mcp` to, and the lifespan that runs the SDK's session manager."""

    app: ASGIApp
    lifespan: Callable[[Any], AbstractAsyncContextManager[None]]


def http_endpoint(client: MemoryClient, keystore: KeyStore, *, auth: bool, hosts: frozenset[str],
                  shares: KeyShares | None = None) -> HttpEndpoint:
    """`/mcp`, answering only to `hosts` (front.host_names): `serve` checks Host and Origin on every route
    already, and the SDK's own rebinding protection checks them again here, with the same names. Each tool
    call counts against its key's `shares` as an API request does (None: --no-auth, nothing to share)."""
    server = build_server(MemoryTools(client, from_request, shares))
    allowed_hosts, allowed_origins = sdk_hosts(hosts)
    security = TransportSecuritySettings(enable_dns_rebinding_protection=ANY_HOST not in hosts,
                                         allowed_hosts=allowed_hosts, allowed_origins=allowed_origins)
    server.streamable_http_app(stateless_http=True, json_response=True, transport_security=security)
    manager = server.session_manager
    return HttpEndpoint(Gate(manager.handle_request, keystore, auth=auth), lambda _app: manager.run())
