"""Export and import over HTTP (docs/export-format.md), under the key's scopes: `GET /v1/subjects/{s}/export`
streams a subject's export as JSON Lines; `POST /v1/import` takes one (MEMFLOW_HTTP_MAX_IMPORT_BYTES at most),
reads and checks all of it as it arrives (refused at its first bad line, the rest unread), refuses it whole if the
key may not write one of its subjects, then imports subject by subject through the query worker, as `memflow
import` does. Reading an import costs the server at most a few seconds of one thread: an import lane per process,
beside the threads the other routes use (docs/export-format.md#what-the-door-bounds)."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable
from datetime import UTC, datetime
from functools import partial
from typing import Annotated, Any, TypeVar, cast

import anyio
from anyio import to_thread
from fastapi import APIRouter, Depends, FastAPI, Query, Request
from fastapi.responses import StreamingResponse

from memflow.pipeline import export
from memflow.pipeline.export import End, FormatError, Header, Parsed, Record
from memflow.pipeline.models import Subject
from memflow.shared.admission.fairness import Refused
from memflow.shared.admission.shares import KeyShares, Place
from memflow.shared.sdk import rpc
from memflow.shared.sdk.transfer import (
    TRANSFER_TIMEOUT_S,
    Framing,
    Steps,
    import_steps,
    imported_before,
    moved,
    page_size,
)
from memflow.workers.api_edge import ERRORS, RETRY_AFTER_S, BodyRoute, Caller, Edge, admitted, ask, fair_share
from memflow.workers.front import ApiError, allowed

T = TypeVar("T")
IMPORT_PATH = "/v1/import"
NDJSON = "application/x-ndjson"
# Memories one import request may carry, and characters in their strings: the gate reads those at ~2.5 µs each
# (measured), so reading an import takes at most ~5 s of one thread, refused or not. A bigger export is posted in
# parts (each part whole subjects: a subject is never split by a door).
MAX_IMPORT_MEMORIES = 20_000
MAX_IMPORT_CHARS = 2_000_000
# The longest line: a memory with a 3,072-dim vector is ~70 KB.
MAX_LINE_BYTES = 1_048_576
# Seconds a transfer waits before its next call of a query worker, per second the call before took, and an import
# after each step of its reading in the lane: a key's export or import holds at most half of one query worker's time
# or of the lane (and of the machine's cores), so that another key's search p99 stays within 3× idle while it loops
# (`memflow bench http`: exporting, 3.0-3.3× at full pace, 2.4× paced; posting refused 16 MiB imports, 3.4× and 1.8×).
PAUSE_PER_CALL = 1.0
# Threads of one server process reading imports (the import lane), beside the MEMFLOW_HTTP_THREADS of the routes:
# however many imports arrive, their reading holds at most these, and no other route waits for them.
IMPORT_THREADS = 1

transfer_routes = APIRouter(prefix="/v1", responses=ERRORS, dependencies=[Depends(admitted), Depends(fair_share)],
                            tags=["transfer"], route_class=BodyRoute)  # an import's body: NDJSON, as documented

_LINES = {"description": "JSON Lines: an `ExportHeader` line, one `ExportRecord` line per stored point, and an "
                         "`ExportEnd` line counting them (docs/export-format.md).",
          "content": {NDJSON: {"schema": {"oneOf": [{"$ref": "#/components/schemas/ExportHeader"},
                                                    {"$ref": "#/components/schemas/ExportRecord"},
                                                    {"$ref": "#/components/schemas/ExportEnd"}]}}}}


@transfer_routes.get("/subjects/{subject:path}/export", response_class=StreamingResponse, responses={200: _LINES})
async def export_subject(request: Request, key: Caller, subject: Subject, with_vectors: bool = False
                         ) -> StreamingResponse:
    """Every stored point of a subject with its versions, history, provenance and lifecycle state, as JSON
    Lines, streamed a page at a time; `with_vectors`: each point's dense vector too, and the model that made it
    in the header. The last line counts the records: a stream that broke off has none, and is refused by import."""
    first = await _page(request, allowed(key, subject), with_vectors, None)
    head = export.header(datetime.now(UTC), [subject], first.model, first.dim)

    async def streamed() -> AsyncIterator[bytes]:
        yield export.line(head)
        reply, count = first, 0
        while True:
            for record in reply.records:
                yield export.line(record)
            count += len(reply.records)
            if reply.next is None:
                break
            reply = await _page(request, subject, with_vectors, reply.next)
        yield export.line(End(memories=count))
    name = subject.replace("/", "_")
    return StreamingResponse(streamed(), media_type=NDJSON,
                             headers={"Content-Disposition": f'attachment; filename="{name}.jsonl"'})


async def _page(request: Request, subject: str, with_vectors: bool, after: str | None) -> rpc.ExportedSubject:
    return await _call(request, rpc.EXPORT, subject=subject, with_vectors=with_vectors, after=after,
                       limit=page_size(with_vectors))


@transfer_routes.post(IMPORT_PATH.removeprefix("/v1"), response_model=rpc.ImportReport,
                      openapi_extra={"requestBody": {"required": True, **_LINES}})
async def import_export(request: Request, key: Caller, as_subject: Annotated[Subject | None, Query(description=(
        "Import the file's one subject as this subject: new ids, provenance kept, the file's subject untouched "
        "(docs/export-format.md#as-another-subject). The key must be allowed to write it."))] = None,
                        ) -> rpc.ImportReport:
    """Import an export: each subject gets the memories it lacks, through the one write path, whole or not at
    all. Refused whole (422 naming the line and field, 403 naming a subject) before anything is written; the
    same file twice changes nothing; a memory forgotten here is not brought back."""
    if key.read_only:
        allowed(key, "", write=True)
    if as_subject is not None:  # before the body is read: a key that may not write it is told so at once
        allowed(key, as_subject, write=True, field="as_subject")
    parsed = moved(await _read(request), as_subject)
    for subject in parsed.subjects:
        allowed(key, subject, write=True, field="as_subject" if as_subject else "memory.subject")
    at, done = datetime.now(UTC), []
    for subject, records in parsed.subjects.items():
        try:
            done.append(await _run(request, import_steps(parsed, subject, records, at)))
        except ApiError as exc:  # the refusal says what became of its subject, and of those before it
            notes = [*getattr(exc, "__notes__", []), *([imported_before(done)] if done else [])]
            raise ApiError(exc.status, exc.code, "; ".join([exc.message, *notes]), exc.field,
                           retry_after_s=exc.retry_after_s) from exc
    return rpc.ImportReport(subjects=done)


async def _run(request: Request, steps: Steps) -> rpc.Imported:
    """`shared.sdk.transfer.run` on the event loop: each call through the query worker, as the key's request."""
    try:
        fields = next(steps)
        while True:
            try:
                reply = await _call(request, rpc.IMPORT, **fields)
            except Exception as exc:
                fields = steps.throw(exc)
                continue
            fields = steps.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


async def _call(request: Request, call: rpc.Rpc[Any, rpc.Rep], **fields: Any) -> rpc.Rep:
    """One call of a query worker for a transfer (an export's page, an import's check, write or undo), paced: the
    next waits PAUSE_PER_CALL times as long as this one took, and takes a token of the key's rate (`_paced`)."""
    await _paced(request)
    started = time.monotonic()
    try:
        return await ask(request, call, timeout_s=TRANSFER_TIMEOUT_S, **fields)
    finally:
        request.state.transfer_pause_s = (time.monotonic() - started) * PAUSE_PER_CALL


async def _paced(request: Request) -> None:
    """Before each call of the query worker after a transfer's first: the pause the call before earned, then a token
    of its key's rate, as a search takes (the first came with its place); past the rate the transfer waits for its
    token rather than stop halfway."""
    calls = getattr(request.state, "transfer_calls", 0)
    request.state.transfer_calls = calls + 1
    shares: KeyShares | None = request.app.state.shares
    place: Place | None = getattr(request.state, "share", None)
    if calls == 0:
        return
    await anyio.sleep(getattr(request.state, "transfer_pause_s", 0.0))
    while shares is not None and place is not None and isinstance(refused := await shares.spend(place.key_id),
                                                                   Refused):
        await anyio.sleep(refused.retry_after_s)


async def _read(request: Request) -> Parsed:
    """The body framed chunk by chunk as it arrives, then its words checked (`Framing`), all in the import lane."""
    framing = Framing(MAX_IMPORT_MEMORIES, MAX_LINE_BYTES, MAX_IMPORT_CHARS)
    try:
        async for chunk in request.stream():
            await _in_lane(request, partial(framing.feed, chunk))
        lines = await _in_lane(request, framing.close)
        return await _in_lane(request, partial(export.read, lines, max_records=MAX_IMPORT_MEMORIES))
    except FormatError as exc:
        raise ApiError(422, "invalid_input", str(exc), exc.field) from None


async def _in_lane(request: Request, work: Callable[[], T]) -> T:
    """`work` in the import lane (one of IMPORT_THREADS threads of this process, made on first use), then a pause
    PAUSE_PER_CALL times as long (an import's reading holds at most half the lane); 503 `busy` when no thread frees
    within MEMFLOW_HTTP_THREAD_WAIT_S, as for the routes' threads."""
    state, edge = request.app.state, cast(Edge, request.app.state.edge)
    if getattr(state, "import_lane", None) is None:  # on the event loop: no other task runs in between
        state.import_lane = (anyio.CapacityLimiter(IMPORT_THREADS), anyio.CapacityLimiter(IMPORT_THREADS))
    tickets, threads = state.import_lane
    ticket, held = object(), False
    with anyio.move_on_after(edge.thread_wait_s):
        await tickets.acquire_on_behalf_of(ticket)
        held = True
    if not held:
        raise ApiError(503, "busy", f"the server is at its bound (the import lane: no thread free within "
                       f"{edge.thread_wait_s} s): try again shortly", retry_after_s=RETRY_AFTER_S)
    started = time.monotonic()
    try:
        done = await to_thread.run_sync(work, limiter=threads)
    finally:
        tickets.release_on_behalf_of(ticket)
    await anyio.sleep((time.monotonic() - started) * PAUSE_PER_CALL)  # the lane free meanwhile: paced as a call
    return done


def document_transfer(app: FastAPI) -> None:
    """The lines' schemas join the OpenAPI document (the routes name them in their JSON Lines bodies)."""
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        document = generate()
        schemas = document.setdefault("components", {}).setdefault("schemas", {})
        for name, model in (("ExportHeader", Header), ("ExportRecord", Record), ("ExportEnd", End)):
            schema = model.model_json_schema(ref_template="#/components/schemas/{model}")
            schemas.update(schema.pop("$defs", {}))
            schemas.setdefault(name, schema)
        return document
    app.openapi = openapi  # type: ignore[method-assign]
