"""Export and import, run in the query worker (it holds the store, the embedder and the applier).

The format and the puts an import makes are pure (pipeline/export.py, docs/export-format.md). An import
writes only what the subject lacks, through the applier under the subject's write lock: a point already
held stays as this store has it, and a put of something forgotten here is not written (the applier reads
forget's tombstones). A second import of the same file makes the same puts, finds every point held and
writes nothing; what an earlier run wrote but never announced (it died between) it announces. The caller
checks every slice of a subject before writing any, and takes back the slices written when a later one is
refused (`undo`, shared/sdk/transfer.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from memflow.pipeline import export
from memflow.pipeline.export import FormatError, Record
from memflow.pipeline.ids import IdSpace
from memflow.pipeline.models import Memory, Status
from memflow.shared.errors import InvalidInput, Permanent
from memflow.shared.inference.embedder import Embedder
from memflow.shared.sdk.rpc import MAX_EXPORT_PAGE, ImportRequest
from memflow.shared.sdk.transfer import TRANSFER_TIMEOUT_S
from memflow.shared.storage.store import MemoryFilter, PointLookup, Store
from memflow.shared.writer.applier import Applier

# How long an undone import run's fence is kept: a slice's call may wait in the queue, then run, for its timeout
# each (shared/sdk/client.py: the job's ttl and timeout), the undo having started at the earliest when it was sent.
UNDONE_KEEP_S = 2 * math.ceil(TRANSFER_TIMEOUT_S) + 60
# Bookkeeping of the store a point was written in, not of the memory: two stores holding one memory differ in it.
_OWN_BOOKKEEPING = frozenset({"last_op", "last_count"})


def export_subject(store: Store, embedder: Embedder, subject: str, with_vectors: bool, after: str | None = None,
                   limit: int = MAX_EXPORT_PAGE) -> dict[str, Any]:
    """A page of the stored points of `subject` (a deleted one is a forget under way: left out), oldest first,
    after the cursor `after`; vectors are read for that page only. Each page reads the subject's payloads
    again (as `inspect` does): a page is bounded, the reads are not."""
    memories = [m for m in store.get(MemoryFilter(subject)) if m.status is not Status.deleted]
    try:
        shown, following = export.page((Record(memory=m) for m in memories), after, limit)
    except ValueError as exc:
        raise InvalidInput("after", str(exc)) from None
    if with_vectors and shown:
        vectors = _lookup(store).vectors(subject, [r.memory.id for r in shown])
        shown = [r.model_copy(update={"vector": vectors.get(r.memory.id)}) for r in shown]
    model, dim = (embedder.model_id, embedder.dim) if with_vectors else (None, None)
    return {"subject": subject, "model": model, "dim": dim, "records": shown, "next": following}


def import_subject(applier: Applier, embedder: Embedder, space: IdSpace, req: ImportRequest) -> dict[str, Any]:
    """The `step` of `req` (shared/sdk/rpc.ImportRequest): check, write or undo these records of the subject (through
    `applier`; the vectors a file lacks encoded by `embedder`; their ids as this store names them in `space`)."""
    if req.step == "undo":  # touches only points of the subject that bear this import's op keys
        return _undo(applier, _named(applier.store, space, req))
    _refuse_other_subjects(req.subject, req.records)
    req = _named(applier.store, space, req)
    if req.step == "check":
        return _report(req, {}, written=0, forgotten=[], reembedded=set())
    return _write(applier, embedder, req)


def _write(applier: Applier, embedder: Embedder, req: ImportRequest) -> dict[str, Any]:
    """Put the memories of `req` the subject lacks; a point this import wrote before (a run of the same file
    cut short) is met as its own and announced if it was not; say what became of each."""
    records, store = req.records, applier.store
    found = export.mutations(req.subject, records, req.exported_at)  # the same on every run of the file
    vectors = _vectors(embedder, req, _absent(store, req.subject, records))
    with applier.holding(req.subject) as held:
        if req.attempt is not None and applier.client.exists(applier.keys.import_undone(req.attempt)):
            raise Permanent(f"this import of {req.subject} was taken back before this slice came: nothing written")
        held_now = _held(store, req.subject, records)  # under the lock: what the puts will meet
        absent = [r for r in records if r.memory.id not in held_now]
        vectors |= _vectors(embedder, req, [r for r in absent if r.memory.id not in vectors])
        forgotten: list[str] = []
        for mutation in found:
            forgotten += held.apply(mutation, vectors).forgotten
    reembedded = set(vectors) - set(export.usable_vectors(req.model, req.dim, records, embedder.model_id,
                                                          embedder.dim))
    return _report(req, held_now, written=len(absent) - len(forgotten), forgotten=forgotten,
                   reembedded=reembedded - set(forgotten) - set(held_now))


def _undo(applier: Applier, req: ImportRequest) -> dict[str, Any]:
    """Take back what an import of these records wrote (`export.undo`): marked deleted and announced, then purged.
    A point changed since by anything else is no longer the import's alone and stays."""
    if req.at is None:
        raise InvalidInput("at", "an undo says when it happened")
    keys = export.op_keys(export.mutations(req.subject, req.records, req.exported_at))
    with applier.holding(req.subject) as held:
        if req.attempt is not None:  # first, under the lock: a slice of the run that comes later writes nothing
            applier.client.set(applier.keys.import_undone(req.attempt), 1, ex=UNDONE_KEEP_S)
        ours = export.written_by(_held(applier.store, req.subject, req.records).values(), keys)
        marked = export.undo(req.subject, ours, req.at)
        stale = set(held.apply(marked).stale) if marked is not None else set()
        purged = export.purge(req.subject, [m.id for m in ours if m.id not in stale], req.at)
        if purged is not None:
            held.apply(purged)
    return _report(req, {}, written=0, forgotten=[], reembedded=set())


def _report(req: ImportRequest, held: dict[str, Memory], written: int, forgotten: Sequence[str],
            reembedded: set[str]) -> dict[str, Any]:
    already = sum(1 for r in req.records if r.memory.id in held and _same(r.memory, held[r.memory.id]))
    return {"subject": req.subject, "memories": len(req.records), "written": written, "already": already,
            "kept": len(held) - already, "forgotten": len(forgotten), "reembedded": len(reembedded)}


def _refuse_other_subjects(subject: str, records: Sequence[Record]) -> None:
    """A record of another subject, and one the gate would never store (export.check_words), refused, naming the
    record. Nothing here looks at another subject's points: what is refused says nothing of them."""
    for i, record in enumerate(records):
        if record.memory.subject != subject:
            raise InvalidInput(f"records.{i}.memory.subject", f"{record.memory.subject!r} in an import of {subject!r}")
        try:  # checked where the file was read too; again here, whoever enqueued the call
            export.check_words(record.memory, i)
        except FormatError as exc:
            raise InvalidInput(f"records.{i}.{exc.field}", exc.reason) from None


def _named(store: Store, space: IdSpace, req: ImportRequest) -> ImportRequest:
    """The request with this store's ids for its records in its subject (`export.named`): each step of an import,
    and each run of the same file, names them alike, so the puts, their op keys and an undo agree. Only records of
    the subject are named (another subject's is refused by the check, and an undo touches only the subject's)."""
    records = [r for r in req.records if r.memory.subject == req.subject]
    wanted = export.named_ids(records)
    held = {m.id for m in store.get(MemoryFilter(req.subject, ids=wanted))} if wanted else set()
    return req.model_copy(update={"records": export.named(space, req.subject, records, held)})


def _lookup(store: Store) -> PointLookup:
    if not isinstance(store, PointLookup):
        raise InvalidInput("store", f"{type(store).__name__} cannot be exported from or imported into by id")
    return store


def _held(store: Store, subject: str, records: Sequence[Record]) -> dict[str, Memory]:
    ids = [r.memory.id for r in records]
    return {m.id: m for m in store.get(MemoryFilter(subject, ids=ids))} if ids else {}


def _absent(store: Store, subject: str, records: Sequence[Record]) -> list[Record]:
    held = _held(store, subject, records)
    return [r for r in records if r.memory.id not in held]


def _vectors(embedder: Embedder, req: ImportRequest, records: Sequence[Record]) -> dict[str, list[float]]:
    """A vector for each of `records`: the file's when this store's model made it, else encoded here."""
    found = export.usable_vectors(req.model, req.dim, records, embedder.model_id, embedder.dim)
    missing = [r.memory for r in records if r.memory.id not in found]
    if missing:
        found |= dict(zip([m.id for m in missing], embedder.encode_passages([m.content for m in missing]),
                          strict=True))
    return found


def _same(ours: Memory, theirs: Memory) -> bool:
    return ours.model_dump(exclude=set(_OWN_BOOKKEEPING)) == theirs.model_dump(exclude=set(_OWN_BOOKKEEPING))
