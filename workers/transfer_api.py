"""Export and import over HTTP (docs/export-format.md), under the key's scopes: `GET /v1/subjects/{s}/export`
streams a subject's export as JSON Lines; `POST /v1/import` takes one (MEMFLOW_HTTP_MAX_IMPORT_BYTES at most),
reads and checks all of it, refuses it whole if the key may not write one of its subjects, then imports
subject by subject through the query worker, as `memflow import` does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime
from functools import partial
from typing import Any

from fastapi import APIRouter, Depends, FastAPI, Request
from fastapi.responses import StreamingResponse

from memflow.pipeline import export
from memflow.pipeline.export import End, FormatError, Header, Parsed, Record
from memflow.pipeline.models import Subject
from memflow.shared import rpc
from memflow.shared.transfer import TRANSFER_TIMEOUT_S, Steps, import_steps, imported_before, page_size
from memflow.workers.api import ERRORS, Caller, admitted, ask, blocking, fair_share
from memflow.workers.front import ApiError, allowed

IMPORT_PATH = "/v1/import"
NDJSON = "application/x-ndjson"
# Memories one import request may carry: reading and checking them holds a thread of the server (~40 µs a
# memory); a bigger export is posted in parts (each part whole subjects: a subject is never split by a door).
MAX_IMPORT_MEMORIES = 20_000

transfer_routes = APIRouter(prefix="/v1", responses=ERRORS, dependencies=[Depends(admitted), Depends(fair_share)],
                            tags=["transfer"])

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
    return await ask(request, rpc.EXPORT, subject=subject, with_vectors=with_vectors, after=after,
                     limit=page_size(with_vectors), timeout_s=TRANSFER_TIMEOUT_S)


@transfer_routes.post(IMPORT_PATH.removeprefix("/v1"), response_model=rpc.ImportReport,
                      openapi_extra={"requestBody": {"required": True, **_LINES}})
async def import_export(request: Request, key: Caller) -> rpc.ImportReport:
    """Import an export: each subject gets the memories it lacks, through the one write path, whole or not at
    all. Refused whole (422 naming the line and field, 403 naming a subject) before anything is written; the
    same file twice changes nothing; a memory forgotten here is not brought back."""
    if key.read_only:
        allowed(key, "", write=True)
    parsed = await blocking(request, partial(_read, await request.body()))
    for subject in parsed.subjects:
        allowed(key, subject, write=True, field="memory.subject")
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
    """`shared.transfer.run` on the event loop: each call through the query worker, as the key's request."""
    try:
        fields = next(steps)
        while True:
            try:
                reply = await ask(request, rpc.IMPORT, timeout_s=TRANSFER_TIMEOUT_S, **fields)
            except Exception as exc:
                fields = steps.throw(exc)
                continue
            fields = steps.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _read(body: bytes) -> Parsed:
    try:
        return export.read(body.splitlines(), max_records=MAX_IMPORT_MEMORIES)
    except FormatError as exc:
        raise ApiError(422, "invalid_input", str(exc), exc.field) from None


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
