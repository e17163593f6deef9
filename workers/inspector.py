"""The memory inspector page (`/` of `memflow serve`): what memflow remembers, for a person to read.

Read-only and server-rendered: the subjects a key may see and the dead letters per stage (`/`); a
subject's memories with type, tier, strength, uses, status and contested flag, then its people, its
profile and its recent changes, each linked to its memory's history (`/subjects/{subject}`,
inspector_subject.py); a search typed there with its scores, plan and trace
(`/subjects/{subject}/search?q=…`); a memory's versions and why each changed (`/memories/{id}/history`).
Only GET pages and links; the two POSTs set and clear the key cookie.

Every page passes the API's own checks (`principal`, `allowed`, the `/v1` handlers for inspect and
history), so it shows what the API would answer and refuses what the API refuses: a subject outside
the key's patterns is a 403 page, an id of another subject's memory a 404 page. The key rides in the
`memflow_key` cookie (HttpOnly, SameSite=Strict), which `principal` honours for GET only.

Memories are user text, so markup is written by `el` alone (inspector_html.py), which escapes every child
and attribute value that is not already `Html`; and the Content-Security-Policy lets no script run at all
(the page brings none): a `<script>` a user once said shows as the words it is.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Coroutine
from datetime import UTC, datetime
from functools import partial
from typing import Annotated, Any
from urllib.parse import parse_qs

import redis
from fastapi import APIRouter, Depends, Request, Response
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, RedirectResponse
from fastapi.routing import APIRoute
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from starlette.concurrency import run_in_threadpool

from memflow.pipeline.feed import FeedEntry
from memflow.pipeline.models import Hit, QueryPlan, SearchResult, Status, Subject, Trace
from memflow.pipeline.scopes import single_subject
from memflow.shared.admission.apikeys import ApiKey, KeyStore
from memflow.shared.changes import profiles
from memflow.shared.changes.feed import recent_async
from memflow.shared.errors import InvalidInput
from memflow.shared.monitoring.status import StageStatus, read_status, recent_traces
from memflow.shared.sdk import rpc
from memflow.workers.api_edge import Client, ask, blocking, key_place, principal
from memflow.workers.front import ApiError, allowed
from memflow.workers.inspector_html import (
    STYLE,
    Html,
    badge,
    cell,
    el,
    history_url,
    num,
    respond,
    subject_url,
    table,
    when,
)
from memflow.workers.inspector_subject import changes_section, people_section, profile_section
from memflow.workers.memories_api import history as history_of
from memflow.workers.memories_api import inspect as inspect_of
from memflow.workers.memories_api import subjects as subjects_of

COOKIE = "memflow_key"
SEARCH_K = 10
TRACE_SCAN = 50  # the subject's last traces searched for the one of this page's search
RECENT_CHANGES = 20  # the subject page's recent changes, newest first

# -- the frame of every page -------------------------------------------------------------------------


def who(key: ApiKey | None, auth: bool) -> Html:
    if not auth:
        return el("span", "no auth: every subject is shown to anyone who can connect", class_="who")
    if key is None:
        return el("span", class_="who")
    logout = el("form", el("button", "Log out", type="submit"), method="post", action="/logout")
    return Html(el("span", "key ", el("strong", key.name), " · sees ", el("code", ", ".join(key.subjects)),
                   class_="who") + logout)


def layout(title: str, *body: object, key: ApiKey | None = None, auth: bool = True) -> Html:
    head = el("head", el("meta", charset="utf-8"), el("meta", name="viewport", content="width=device-width"),
              el("title", f"{title} · memflow"), el("style", STYLE))
    bar = el("header", el("a", "memflow inspector", href="/", class_="brand"), who(key, auth))
    return Html("<!doctype html>" + el("html", head, el("body", bar, el("main", el("h1", title), *body)), lang="en"))


def login_page(problem: str | None = None) -> Html:
    form = el("form", el("input", type="password", name="key", placeholder="mf_…", autocomplete="off",
                         required=True, aria_label="API key"),
              el("button", "Open", type="submit"), method="post", action="/login", class_="inline")
    note = el("p", "Paste an API key (", el("code", "memflow keys create --name me --subjects 'team-a/*'"),
              "). The page shows only the subjects the key may see.", class_="mute")
    return layout("Log in", el("div", el("strong", problem) if problem else "", form, note,
                               class_="card error" if problem else "card"), auth=True)


ERROR_TITLES = {403: "Not for this key", 404: "Not found", 413: "Too large", 422: "Invalid input",
                429: "Too many requests from this key", 503: "The store did not answer",
                504: "No query worker answered in time"}


def error_page(request: Request, exc: ApiError) -> HTMLResponse:
    if exc.status == 401:
        asked = request.cookies.get(COOKIE) or request.headers.get("authorization")
        return respond(login_page(exc.message if asked else "Log in with a key to see this page."), 401)
    body = el("div", el("p", el("strong", exc.message)), el("p", el("a", "Back to the subjects", href="/")),
              class_="card error")
    page = respond(layout(ERROR_TITLES.get(exc.status, "Failed"), body, auth=request.app.state.auth), exc.status)
    if exc.retry_after_s is not None:
        page.headers["Retry-After"] = str(exc.retry_after_s)
    return page


class PageRoute(APIRoute):
    """A page's failures are pages too: the API's errors (403, 404, 503, 504, a bad path) as HTML."""

    def get_route_handler(self) -> Callable[[Request], Coroutine[Any, Any, Response]]:
        handler = super().get_route_handler()

        async def page(request: Request) -> Response:
            try:
                return await handler(request)
            except ApiError as exc:
                return error_page(request, exc)
            except (RequestValidationError, InvalidInput) as exc:
                return error_page(request, ApiError(422, "invalid_input", _invalid(exc)))
            except redis.RedisError as exc:
                return error_page(request, ApiError(503, "store_unavailable", f"Redis did not answer: {exc}"))
        return page


def _invalid(exc: RequestValidationError | InvalidInput) -> str:
    if isinstance(exc, InvalidInput):
        return f"{exc.field}: {exc.reason}"
    first = exc.errors()[0]
    return f"{first.get('loc', ('?',))[-1]}: {first.get('msg')}"


# -- who is looking ------------------------------------------------------------------------------

_bearer = HTTPBearer(auto_error=False)


async def visitor(request: Request,
                  credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> ApiKey | None:
    """The caller's key (the cookie, as the API reads it); None when a browser came with no key at all."""
    if request.app.state.auth and credentials is None and COOKIE not in request.cookies:
        return None
    return await principal(request, credentials)


Visitor = Annotated[ApiKey | None, Depends(visitor)]


async def page_share(request: Request, key: Visitor) -> AsyncIterator[None]:
    """A page that calls the query worker takes a place among its key's requests, as the API's routes and /mcp
    do: the inspector is no third door past a key's limits (issue 30). A 429 is a page saying so."""
    async with key_place(request, key):
        yield


SHARED = [Depends(page_share)]


def need(key: ApiKey | None) -> ApiKey:
    if key is None:
        raise ApiError(401, "unauthorized", "no API key")
    return key


def frame(request: Request, key: ApiKey, title: str, *body: object, status: int = 200) -> HTMLResponse:
    return respond(layout(title, *body, key=key, auth=request.app.state.auth), status)


def crumbs(*links: tuple[str, str]) -> Html:
    parts: list[object] = [el("a", "subjects", href="/")]
    for text, href in links:
        parts += [" / ", el("a", text, href=href)]
    return el("p", parts, class_="crumbs")


pages = APIRouter(include_in_schema=False, route_class=PageRoute, default_response_class=HTMLResponse)


# -- log in, log out --------------------------------------------------------------------------------


def same_origin(request: Request) -> bool:
    """Posted by this server's own form (or by a client that sends no Origin, such as curl): a page of
    another site cannot log a browser in with a key of its choosing."""
    origin = request.headers.get("origin")
    return origin is None or origin == f"{request.url.scheme}://{request.url.netloc}"


@pages.post("/login")
async def login(request: Request) -> Response:
    if not same_origin(request):
        return error_page(request, ApiError(403, "forbidden", "a login posted from another site is refused"))
    if not request.app.state.auth:
        return RedirectResponse("/", status_code=303)
    secret = parse_qs((await request.body()).decode(errors="replace")).get("key", [""])[0].strip()
    keystore: KeyStore = request.app.state.keystore
    if not secret or await run_in_threadpool(keystore.lookup, secret) is None:
        return respond(login_page("unknown or revoked API key"), 401)
    done = RedirectResponse("/", status_code=303)
    done.set_cookie(COOKIE, secret, httponly=True, samesite="strict", path="/", secure=request.url.scheme == "https")
    return done


@pages.post("/logout")
def logout(request: Request) -> Response:
    if not same_origin(request):
        return error_page(request, ApiError(403, "forbidden", "a logout posted from another site is refused"))
    done = RedirectResponse("/", status_code=303)
    done.delete_cookie(COOKIE, path="/", httponly=True, samesite="strict")
    return done


# -- the subjects and the dead letters ----------------------------------------------------------------


@pages.get("/", dependencies=SHARED)
async def home(request: Request, key: Visitor, client: Client, subject: str = "") -> Response:
    if key is None:
        return respond(login_page())
    if subject.strip():
        return RedirectResponse(subject_url(subject.strip()), status_code=303)
    status = await blocking(request, partial(read_status, client.redis, client.keys, queue=client.queue_redis))
    return frame(request, key, "Subjects", await subject_list(request, key), subject_box(),
                 dead_letters(status.stages))


async def subject_list(request: Request, key: ApiKey) -> Html:
    try:
        seen = (await subjects_of(request, key)).subjects
    except ApiError as exc:
        return el("div", el("strong", "Could not list the subjects: "), exc.message, class_="card error")
    # A key made for one subject shows it before it has any memory.
    own = single_subject(key.subjects)
    names = sorted({*seen, own} if own else seen)
    if not names:
        return el("p", "No memories yet under the subjects this key may see.", class_="mute")
    return el("ul", [el("li", el("a", s, href=subject_url(s))) for s in names], class_="subjects")


def subject_box() -> Html:
    box = el("input", type="text", name="subject", placeholder="a subject id", aria_label="subject id")
    return Html(el("h2", "Open a subject by its id") +
                el("form", box, el("button", "Open", type="submit"), method="get", action="/", class_="inline"))


def dead_letters(stages: list[StageStatus]) -> Html:
    rows = [[cell(el("strong", s.stage)), num(s.lag), num(s.pending),
             num(badge(s.dead, "dead") if s.dead else 0)] for s in stages]
    note = el("p", "Entries a stage gave up on after its retries (", el("code", "memflow dlq list STAGE"),
              " shows them; ", el("code", "memflow dlq replay"), " sends them back).", class_="mute")
    return Html(el("h2", "Pipeline and dead letters") +
                table("dlq", ["stage", "waiting", "pending", "dead letters"], rows) + note)


# -- a subject's memories ---------------------------------------------------------------------------


def search_box(subject: str, query: str = "") -> Html:
    box = el("input", type="search", name="q", value=query, placeholder="search this subject's memories",
             aria_label="query", required=True)
    return el("form", box, el("button", "Search", type="submit"), method="get",
              action=subject_url(subject, "/search"), class_="inline")


def contested(status: Status, conflicts_with: list[str]) -> Html | str:
    return badge("contested") if status == Status.contested or conflicts_with else ""


def memory_row(subject: str, m: rpc.MemoryState) -> list[object]:
    return [cell(m.content, class_="content"), badge(m.mtype.value, "type"), "" if m.about == "self" else m.about,
            badge(m.tier.value),
            num(f"{m.strength_now:.2f}"), num(m.access_count), badge(m.status.value),
            contested(m.status, m.conflicts_with),
            cell(when(m.last_change.at), el("br"), el("span", m.last_change.why, class_="mute")),
            el("a", "history", href=history_url(m.id, subject))]


def memory_table(subject: str, memories: list[rpc.MemoryState]) -> Html:
    head = ["memory", "type", "about", "tier", "strength", "uses", "status", "contested", "last change", ""]
    return table("memories", head, [memory_row(subject, m) for m in memories])


# Registered before the subject page: a `{subject:path}` would swallow the `/search` too.
@pages.get("/subjects/{subject:path}/search", dependencies=SHARED)
async def search_page(request: Request, key: Visitor, client: Client, subject: Subject, q: str = "") -> HTMLResponse:
    key = need(key)
    allowed(key, subject)
    top = [crumbs((subject, subject_url(subject))), search_box(subject, q)]
    if not q.strip():
        return frame(request, key, f"Search {subject}", *top, el("p", "Type a query.", class_="mute"))
    now = datetime.now(UTC)
    try:
        result = await ask(request, rpc.SEARCH, subject=subject, query=q, k=SEARCH_K, now=now)
    except ApiError as exc:
        return frame(request, key, f"Search {subject}", *top, could_not_search(exc.message), status=exc.status)
    if result.status == "failed":
        return frame(request, key, f"Search {subject}", *top, could_not_search(result.error or "failed"),
                     status=503)
    traced = await blocking(request, partial(recent_traces, client.queue_redis, client.keys, subject, TRACE_SCAN))
    trace = next((t for t in traced if t.now == now), None)
    return frame(request, key, f"Search {subject}", *top, hits_section(subject, result),
                 explain(subject, result, trace))


def could_not_search(why: str) -> Html:
    """Never shown as "no results": nothing was looked at."""
    return el("div", el("strong", "Could not search: "), why, el("p", "Nothing was looked at, so this says "
              "nothing about what is remembered. Try again, or check ", el("a", "/healthz", href="/healthz"), "."),
              class_="card error")


def hit_row(subject: str, rank: int, hit: Hit) -> list[object]:
    scores = ", ".join(f"{name} {value:.3f}" for name, value in hit.scores.items())
    return [num(rank), cell(hit.content, el("div", scores, class_="scores"), class_="content"),
            badge(hit.mtype.value, "type"), badge(hit.tier.value), badge(hit.status.value),
            badge("contested") if hit.contested else "", num(f"{hit.score:.3f}"),
            el("a", "history", href=history_url(hit.id, subject))]


def hits_section(subject: str, result: SearchResult) -> Html:
    if not result.hits:
        return el("p", "No memories match (the search looked, and found nothing).", class_="card")
    summary = el("p", f"{len(result.hits)} hits in {result.latency_ms:.0f} ms", class_="mute")
    head = ["#", "memory (score factors)", "type", "tier", "status", "contested", "score", ""]
    return Html(summary + table("hits", head, [hit_row(subject, i, h) for i, h in enumerate(result.hits, 1)]))


def explain(subject: str, result: SearchResult, trace: Trace | None) -> Html:
    """The plan the search followed and the trace the query worker recorded of it (`/v1/.../traces`)."""
    plan = result.plan
    cards = el("div", plan_card(plan, result), trace_card(trace), class_="pair")
    routes = table("routes", ["route", "strategy", "dirs", "weight", "keys"], route_rows(plan)) if plan else ""
    return el("section", el("h2", "How it was answered"), cards, routes,
              candidates(subject, trace, result) if trace else "", class_="trace")


def plan_card(plan: QueryPlan | None, result: SearchResult) -> Html:
    if plan is None:
        return el("div", el("h3", "Plan"), el("p", "No plan was recorded.", class_="mute"), class_="card")
    facts = el("dl", el("dt", "intent"), el("dd", plan.intent), el("dt", "planned by"), el("dd", plan.source),
               el("dt", "fallback"), el("dd", "yes" if result.fallback or plan.fallback else "no"),
               el("dt", "period"), el("dd", plan.period.label if plan.period else "—"))
    return el("div", el("h3", "Plan"), facts, class_="card")


def route_rows(plan: QueryPlan) -> list[list[object]]:
    return [[cell(r.text, class_="content"), r.strategy, ", ".join(d.value for d in r.dirs) or "all",
             num(f"{r.weight:g}"), ", ".join(r.keys) or "—"] for r in plan.routes]


def trace_card(trace: Trace | None) -> Html:
    if trace is None:
        return el("div", el("h3", "Trace"), el("p", "Its trace has already left the capped trace feed.",
                                                class_="mute"), class_="card")
    facts = el("dl", el("dt", "status"), el("dd", trace.status), el("dt", "latency"),
               el("dd", f"{trace.latency_ms:.1f} ms"), el("dt", "candidates"),
               el("dd", f"{len(trace.candidates)}, {len(trace.chosen)} chosen"),
               el("dt", "plan error"), el("dd", trace.plan_error or "—"))
    return el("div", el("h3", "Trace"), facts, class_="card")


def candidates(subject: str, trace: Trace, result: SearchResult) -> Html:
    """The fused candidates the trace lists (ids only: a trace keeps no content); the chosen ones with
    their content and every factor of their score."""
    content = {h.id: h.content for h in result.hits}
    chosen = set(trace.chosen)
    rows = [[cell(memory_link(str(c.get("id", "")), subject), el("div", content.get(str(c.get("id")), ""))),
             num(f"{float(c.get('score', 0)):.3f}"), badge("chosen", "ok") if c.get("id") in chosen else "",
             cell(factors(c), class_="scores")] for c in trace.candidates]
    return Html(el("h3", "Candidates") + table("candidates", ["memory", "fused score", "", "factors"], rows))


def factors(candidate: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                     for k, v in candidate.items() if k not in ("id", "score"))


@pages.get("/subjects/{subject:path}", dependencies=SHARED)
async def subject_page(request: Request, key: Visitor, client: Client, subject: Subject) -> HTMLResponse:
    key = need(key)
    report = await inspect_of(request, key, subject)
    active = sum(m.status in (Status.active, Status.contested) for m in report.memories)
    summary = el("p", f"{len(report.memories)} memories, {active} active or contested (searchable).",
                 class_="mute")
    listing = memory_table(subject, report.memories) if report.memories else el("p", "No memories yet.",
                                                                              class_="mute")
    return frame(request, key, subject, crumbs(), search_box(subject), summary, listing,
                 people_section(subject, report.people), await profile_of(request, client, subject),
                 changes_section(subject, await recent_of(request, client, subject)))


async def profile_of(request: Request, client: Client, subject: str) -> Html:
    """The profile as the API's `/profile` reads it: the kept one if current, else a query worker builds it.
    Called after `inspect_of`, which checked the key may see `subject`."""
    try:
        found = await profiles.cached_async(request.app.state.redis, client.keys, subject, datetime.now(UTC))
        if found is None:
            found = await ask(request, rpc.PROFILE, subject=subject, since=None, max_tokens=None)
    except ApiError as exc:
        return profile_section(subject, None, exc.message)
    return profile_section(subject, found)


async def recent_of(request: Request, client: Client, subject: str) -> list[FeedEntry]:
    # This subject's entries only, whatever else the key may see: the page is one subject's.
    return await recent_async(request.app.state.redis, client.keys, lambda s: s == subject, RECENT_CHANGES)


# -- a memory's versions ------------------------------------------------------------------------------


def memory_link(memory_id: str | None, subject: str) -> Html | str:
    return el("a", el("span", memory_id, class_="id"), href=history_url(memory_id, subject)) if memory_id else "—"


def revision_rows(version: rpc.Version) -> list[list[object]]:
    replaced = [", ".join(f"{k}: {'—' if v is None else v}" for k, v in r.before.items()) or "—"
                for r in version.revisions]
    return [[num(r.rev), when(r.at), cell(r.why, class_="content"), cell(b, class_="scores")]
            for r, b in zip(version.revisions, replaced, strict=True)]


def version_section(found: rpc.History, v: rpc.Version) -> Html:
    facts = el("dl", el("dt", "source"), el("dd", v.source.value, f" · confidence {v.confidence:.2f}"),
               el("dt", "written"), el("dd", when(v.created_at), " · updated ", when(v.updated_at)),
               el("dt", "supersedes"), el("dd", memory_link(v.supersedes, found.subject)),
               el("dt", "superseded by"), el("dd", memory_link(v.superseded_by, found.subject)),
               el("dt", "conflicts with"), el("dd", [memory_link(c, found.subject) for c in v.conflicts_with] or "—"),
               el("dt", "id"), el("dd", el("span", v.id, class_="id")))
    changes = (table("revisions", ["rev", "at", "why it changed", "values it replaced"], revision_rows(v))
               if v.revisions else el("p", "Unchanged since it was written.", class_="mute"))
    title = el("h2", f"Version {v.version} ", badge(v.status.value), " ", badge(v.tier.value))
    return el("section", title, el("blockquote", v.content), facts, changes,
              class_="card version asked" if v.id == found.asked else "card version")


@pages.get("/memories/{memory_id}/history", dependencies=SHARED)
async def history_page(request: Request, key: Visitor, memory_id: str,
                       subject: Subject | None = None) -> HTMLResponse:
    key = need(key)
    found = await history_of(request, key, memory_id, subject)
    intro = el("p", f"{len(found.versions)} versions of ", el("code", found.key), ", oldest first.", class_="mute")
    return frame(request, key, "History", crumbs((found.subject, subject_url(found.subject))), intro,
                 [version_section(found, v) for v in found.versions])
