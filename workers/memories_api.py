"""The memory routes of the HTTP API, under /v1: publish events, write a memory, search, pack, the subjects a key
sees and what each holds (memories, people, profile, traces), a memory's history, feedback and forget. Bodies and
replies are the SDK's models where it has them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import Annotated, Any, TypeVar

import orjson
from fastapi import APIRouter, Body, Depends, Query, Request
from fastapi.responses import JSONResponse, Response
from pydantic import BaseModel, Field, ValidationError

from memflow.pipeline.checks import MAX_META_TEXT
from memflow.pipeline.fates import EventFate
from memflow.pipeline.feed import REVISION_PATTERN
from memflow.pipeline.models import ChatEvent, PackedPrompt, SearchRequest, SearchResult, Subject, Trace, Wire
from memflow.pipeline.profile import ProfileReply
from memflow.pipeline.scopes import single_subject
from memflow.shared.admission.apikeys import ApiKey
from memflow.shared.changes import profiles
from memflow.shared.errors import RpcError
from memflow.shared.monitoring.status import recent_traces
from memflow.shared.sdk import rpc
from memflow.shared.sdk.rpc import MemoryId, MemoryRef
from memflow.shared.unstored import fates
from memflow.workers.api_edge import (
    ERRORS,
    BodyRoute,
    Caller,
    Client,
    admitted,
    ask,
    blocking,
    called,
    fair_share,
    rpc_failure,
)
from memflow.workers.api_errors import invalid
from memflow.workers.front import ApiError, ErrorCode, Forgotten, allowed

W = TypeVar("W", bound=BaseModel)

# -- bodies and replies (the SDK's models where it has them) ------------------------------

class Published(Wire):
    """The stream ids of the events appended, in the order given. Processing happens after the reply: what became
    of each event is asked by its `event_id` (`GET /v1/events/{event_id}`)."""

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


# -- the routes -----------------------------------------------------------------------------

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
    raw = await request.body()
    if not raw.strip():
        raise ApiError(422, "invalid_input", "the body is empty: send an event (a JSON object) or a JSON array of "
                       "events, with `Content-Type: application/json`", "body")
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise ApiError(400, "invalid_input", f"the body is not JSON: {exc}", "body") from None
    if isinstance(body, dict):
        return [body], False
    if not isinstance(body, list):
        raise ApiError(422, "invalid_input", "the body must be an event (a JSON object) or a JSON array of events",
                       "body")
    if len(body) > max_batch:
        raise ApiError(413, "invalid_input", f"at most {max_batch} events per request ({len(body)} sent)", "body")
    return body, True


def _validated(model: type[W], value: Any, at: str) -> W:
    """`value` as `model`, or 422 naming the field (`3.ts`) as the rest of the API does."""
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        raise invalid(exc.errors(), at) from None


# `:path`: an event id is the publisher's own string, and may hold a slash.
@v1.get("/events/{event_id:path}", response_model=EventFate, tags=["read"])
async def event_fate(request: Request, key: Caller, client: Client, event_id: str,
                     subject: Annotated[Subject | None, Query(description=(
                         "The subject the event was published for; a key for one subject need not say it."))] = None,
                     ) -> EventFate:
    """What became of a published event, by its `event_id` (docs/front-doors.md#an-events-fate): `accepted`
    (not decided yet), `stored` (as `memory_ids`), `nothing_to_remember`, `dropped` or `dead_lettered`, and
    why (`reason`). An event of a subject the key may not see is answered 404, as one never published."""
    named = subject or single_subject(key.subjects)
    if named is None:
        raise ApiError(422, "invalid_input", "name the subject the event was published for (`subject`): this key "
                       "covers more than one", "subject")
    found = await blocking(request, partial(fates.read, client.redis, client.keys, named, event_id)) \
        if key.may_see(named) else None
    if found is None:
        raise ApiError(404, "not_found", f"no event {event_id!r} published for this key's subject (or its fate has "
                       "expired, a week after the subject's last publish)")
    return found


@v1.post("/memories", status_code=202, response_model=Written, tags=["write"])
async def write_memory(request: Request, key: Caller, client: Client, body: WriteRequest) -> Written:
    """Remember `content` explicitly (`MemoryClient.write`); it is searchable once the pipeline has it. What the
    gate would drop (an instruction to the assistant, filler, a secret) is refused, 422 naming `content` with the
    reason, and not published."""
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
        failure = rpc_failure(exc)
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
    traces = partial(recent_traces, client.queue_redis, client.keys, allowed(key, subject), count)
    return await blocking(request, traces)


# `:path`: an id with a slash in it (`..%2F..%2Fetc%2Fpasswd`) is answered as a bad id (422 naming it), not as
# no such route.
@v1.get("/memories/{memory_id:path}/history", response_model=rpc.History, tags=["read"])
async def history(request: Request, key: Caller, memory_id: MemoryRef,
                  subject: Subject | None = None) -> rpc.History:
    """Every version of a memory and why each changed: its id, or the start of it the inspector shows (8
    characters, found among the key's subjects only). A memory of a subject the key may not see is answered 404,
    as one that does not exist."""
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
