"""The export format and what an import of it does: pure (docs/export-format.md).

An export is JSON Lines: a header line (the format and its version, when it was made, and — when the
vectors travel — the model that made them and their dimension), then one line per stored point of a
memory: its whole payload (every version is a point of its own; statuses, holder, provenance, lifecycle
state and the revisions that are its history), and optionally its dense vector.

An import is a set of puts through the one write path (shared/writer/applier.py): a point the target lacks is
written as it was exported, one it already holds stays as it is there, and one whose events or words were
forgotten there is not written back (the applier reads forget's tombstones for every put). Ids are the target's
to give: a record keeps its id only where the target would give it that id in that subject (`named`).
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from itertools import groupby
from typing import Any, Literal, TypeVar

from pydantic import Field, ValidationError, field_validator

from memflow.pipeline import wording
from memflow.pipeline.checks import aware, finite_vector
from memflow.pipeline.gate import injected, redact_secrets
from memflow.pipeline.ids import IdSpace
from memflow.pipeline.models import (
    SUBJECT_PATTERN,
    DeleteOp,
    Memory,
    Mutation,
    PatchOp,
    PutOp,
    Revision,
    Status,
    Subject,
    Wire,
)
from memflow.pipeline.prefixes import is_full_id
from memflow.pipeline.writes import mutation, op_key

FORMAT: Literal["memflow.export"] = "memflow.export"
# A reader refuses a version it does not know rather than half-read it; a change that an older reader
# could misread takes a new version (docs/export-format.md#versions).
FORMAT_VERSION = 1
# Puts per mutation: one store write each, and one line of the feed per put (a subject's import is several).
PUTS_PER_MUTATION = 256
# The action the `changes` feed and the history name an imported point's arrival by.
IMPORT_ACTION = "import"
# ... and its removal when the import of its subject was refused after it was written (`undo`).
UNDO_ACTION = "import-undone"


class FormatError(ValueError):
    """A line the reader cannot take: its number (1 is the header), the field, and why."""

    def __init__(self, line: int, field_name: str, reason: str) -> None:
        # A fault of the line as a whole (not JSON, too long) is named by its number alone: "line 1: line: …" twice.
        super().__init__(f"line {line}: {reason}" if field_name == "line" else f"line {line}: {field_name}: {reason}")
        self.line, self.field, self.reason = line, field_name, reason


class Header(Wire):
    """The first line of an export."""

    kind: Literal["header"] = "header"
    format: Literal["memflow.export"] = FORMAT
    version: int = FORMAT_VERSION
    exported_at: datetime
    subjects: list[Subject] = Field(default_factory=list)
    # The embedding model that made the vectors and their dimension: set when the lines carry vectors.
    model: str | None = None
    dim: int | None = Field(default=None, ge=1)

    _aware = field_validator("exported_at")(aware)

    @field_validator("version")
    @classmethod
    def _known(cls, version: int) -> int:
        if version != FORMAT_VERSION:
            raise ValueError(f"format version {version} is not one this memflow reads ({FORMAT_VERSION})")
        return version


class Record(Wire):
    """One stored point: its payload as the store keeps it, and optionally its dense vector."""

    kind: Literal["memory"] = "memory"
    memory: Memory
    vector: list[float] | None = None

    @field_validator("memory")
    @classmethod
    def _not_deleted(cls, memory: Memory) -> Memory:
        # A deleted point is a forget under way: its words are about to go, never to travel.
        if memory.status is Status.deleted:
            raise ValueError("a deleted memory is never exported")
        return memory

    @field_validator("vector")
    @classmethod
    def _finite(cls, vector: list[float] | None) -> list[float] | None:
        return finite_vector(vector)


class End(Wire):
    """The last line: how many records came before it, so that a file cut short (a stream that broke, a disk
    that filled) is refused rather than imported in part."""

    kind: Literal["end"] = "end"
    memories: int = Field(ge=0)


@dataclass
class Parsed:
    """A whole file, read and checked: its header and its records by subject, in file order."""

    header: Header
    subjects: dict[str, list[Record]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return sum(len(r) for r in self.subjects.values())


def header(exported_at: datetime, subjects: Sequence[str], model: str | None = None,
           dim: int | None = None) -> Header:
    return Header(exported_at=exported_at, subjects=list(subjects), model=model, dim=dim)


def ordered(records: Iterable[Record]) -> list[Record]:
    """The order a subject's lines are written in: oldest first, ties by id (two exports of one store match)."""
    return sorted(records, key=lambda r: (r.memory.created_at, r.memory.id))


def cursor(record: Record) -> str:
    """Where a page of an export ends: the next page starts after it, in `ordered`'s order."""
    return f"{record.memory.created_at.isoformat()}|{record.memory.id}"


def page(records: Iterable[Record], after: str | None, limit: int) -> tuple[list[Record], str | None]:
    """The `limit` records after `after` (a `cursor`; None: from the first), in `ordered`'s order, and the cursor
    of the last one when more follow (a cursor that names no record starts after where it would be)."""
    key = _cursor_key(after) if after is not None else None
    rest = [r for r in ordered(records) if key is None or (r.memory.created_at, r.memory.id) > key]
    shown = rest[:limit]
    return shown, cursor(shown[-1]) if len(rest) > limit else None


def _cursor_key(after: str) -> tuple[datetime, str]:
    at, _, memory_id = after.partition("|")
    try:
        return datetime.fromisoformat(at), memory_id
    except ValueError:
        raise ValueError(f"after: {after!r:.60} is no cursor of an export page") from None


def line(item: Header | Record | End) -> bytes:
    """One line of the file, newline included (None fields written: a reader sees every field named)."""
    return item.model_dump_json().encode() + b"\n"


def lines(head: Header, records: Iterable[Record]) -> Iterator[bytes]:
    """The whole file: the header, the records as they come, and the end line counting them."""
    yield line(head)
    count = 0
    for record in records:
        count += 1
        yield line(record)
    yield line(End(memories=count))


def read(text_lines: Iterable[bytes | str], max_records: int | None = None) -> Parsed:
    """Read and check a whole export (FormatError naming the line and the field at the first problem):
    nothing of a file is taken until all of it is read. Blank lines are skipped; `max_records` bounds it."""
    parsed: Parsed | None = None
    seen: set[str] = set()
    end: End | None = None
    number = 0
    for number, raw in enumerate(text_lines, start=1):
        if not raw.strip():
            continue
        value = _value(raw, number)
        if parsed is None:
            parsed = Parsed(framed(Header, value, number))
        elif end is not None:
            raise FormatError(number, "kind", "a line after the end line")
        elif value.get("kind") == "end":
            end = _counted(framed(End, value, number), len(seen), number)
        else:
            _take(parsed, framed(Record, value, number), number, seen, max_records)
    if parsed is None:
        raise FormatError(1, "kind", "an empty file: no header line")
    if end is None:
        raise FormatError(number + 1, "kind", "no end line: the file was cut short")
    return parsed


def _take(parsed: Parsed, record: Record, number: int, seen: set[str], max_records: int | None) -> None:
    _check(record, parsed.header, number, seen)
    parsed.subjects.setdefault(record.memory.subject, []).append(record)
    if max_records is not None and len(seen) > max_records:
        raise FormatError(number, "memory", f"more than {max_records} memories in one import")


def _counted(end: End, count: int, number: int) -> End:
    if end.memories != count:
        raise FormatError(number, "memories", f"the end line counts {end.memories} memories, the file holds {count}")
    return end


L = TypeVar("L", Header, Record, End)


def _value(raw: bytes | str, number: int) -> dict[str, Any]:
    try:
        value = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise FormatError(number, "line", f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise FormatError(number, "line", f"a JSON {type(value).__name__}, not an object")
    return value


def framed(model: type[L], value: dict[str, Any], number: int) -> L:
    """`value` as a `model` line, or FormatError naming the line, the field and why (the kind first)."""
    expected = {Header: "header", Record: "memory", End: "end"}[model]
    if value.get("kind") != expected:
        raise FormatError(number, "kind", f"expected a {expected} line, found {value.get('kind')!r:.40}")
    try:
        return model.model_validate(value)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "line"
        raise FormatError(number, where, wording.reason(first)) from None


def _check(record: Record, head: Header, number: int, seen: set[str]) -> None:
    memory = record.memory
    _check_ids(memory, number)
    if memory.id in seen:
        raise FormatError(number, "memory.id", f"{memory.id} appears twice")
    seen.add(memory.id)
    if head.subjects and memory.subject not in head.subjects:
        raise FormatError(number, "memory.subject", f"{memory.subject!r} is not among the header's subjects")
    check_words(memory, number)
    if record.vector is not None and (head.model is None or head.dim is None):
        raise FormatError(number, "vector", "a vector, but the header names no model and dim")
    if record.vector is not None and len(record.vector) != head.dim:
        raise FormatError(number, "vector", f"{len(record.vector)} numbers, the header says dim {head.dim}")


def _check_ids(memory: Memory, number: int) -> None:
    """Every id a record names is a UUID, as the store names its points: an id edited by hand is refused here,
    naming its line, before the store meets it (its engine refuses it with a traceback)."""
    named: dict[str, list[str | None]] = {"memory.id": [memory.id], "memory.supersedes": [memory.supersedes],
             "memory.superseded_by": [memory.superseded_by], "memory.conflicts_with": [*memory.conflicts_with]}
    for where, ids in named.items():
        for memory_id in ids:
            if memory_id is not None and not is_full_id(memory_id):
                raise FormatError(number, where, f"{memory_id!r:.60} is no memory id (a UUID, lowercase)")


# Fields whose type leaves no room for words (a UUID, a subject, a date, a number, one of a few names): the model
# checked them. Every other string of a record, nested ones included, is stored or shown somewhere (the point's
# payload, the changes feed, the inspector's history page), so it passes the gate like the content does.
_TYPED = frozenset({"id", "subject", "dir", "mtype", "source", "status", "tier", "created_at", "updated_at",
                    "last_accessed_at", "strength_at", "expires_at", "valid_from", "valid_to", "extractor",
                    "about", "supersedes", "superseded_by", "conflicts_with", "last_op", "last_count"})
# Names (a key, a uri, the ids a client chose for events and sessions; an episode's key holds its event's id): a
# long run of digits there is an id (a snowflake), not a card number.
_NAMES = frozenset({"key", "uri", "source_event_ids", "context_event_ids", "session_ids"})
_NUMBERS = frozenset({"bank_card", "ssn", "id_card", "passport"})


def check_words(memory: Memory, number: int) -> None:
    """An import writes what a file says, past the gate that every other way in passes
    (docs/write-path.md#gate): what the gate never lets become memory — an injected instruction, a secret — is
    refused here, naming the line and the field, in every field that is stored or shown (not only the content),
    so that a file cannot plant what a conversation could not."""
    for where, text in _texts(memory.model_dump(mode="json", exclude=set(_TYPED)), "memory"):
        if injected(text):
            raise FormatError(number, where, "an injected instruction: memflow never stores one")
        kinds = [k for k in redact_secrets(text)[1]
                 if not (k in _NUMBERS and where.split(".")[1] in _NAMES)]
        if kinds:
            raise FormatError(number, where, f"holds a secret ({', '.join(kinds)}): memflow never stores one")


def _texts(value: Any, where: str) -> Iterator[tuple[str, str]]:
    """Every non-empty string inside `value` (a record's JSON), with its path ("memory.revisions.0.why")."""
    if isinstance(value, str):
        if value.strip():
            yield where, value
    elif isinstance(value, dict):
        for name, inner in value.items():
            yield from _texts(inner, f"{where}.{name}")
    elif isinstance(value, list):
        for i, inner in enumerate(value):
            yield from _texts(inner, f"{where}.{i}")


def named_ids(records: Iterable[Record]) -> list[str]:
    """Every id the records name: their own and those they point at (what `named` asks the store about)."""
    return list(dict.fromkeys(i for r in records for i in (r.memory.id, *_references(r.memory))))


def named(space: IdSpace, subject: str, records: Sequence[Record], held: Collection[str]) -> list[Record]:
    """The records as this store names them in `subject` (docs/write-path.md#ids-belong-to-their-subject).

    An id is kept where it is the one `space` gives that record in that subject (`IdSpace.record_id`: an export of
    this store), or where a point of the subject already bears it (`held`: the subject's own, named before the
    secret or before its events grew); every other id is minted (`IdSpace.minted`, bound to the subject), and so is
    every reference to it (supersedes, superseded_by, conflicts_with). A file therefore never puts an id that
    another subject holds or will be given, and the same file imported again names its records alike."""
    keep = set(held) | {r.memory.id for r in records if r.memory.id == space.record_id(r.memory)}

    def name(memory_id: str) -> str:
        return memory_id if memory_id in keep else space.minted(subject, memory_id)

    return [r.model_copy(update={"memory": _renamed(r.memory, name)}) for r in records]


def as_subject(parsed: Parsed, subject: str) -> Parsed:
    """The file's memories as `subject`'s (`memflow import --as`, docs/export-format.md#as-another-subject): each
    record moved to `subject`, its provenance kept (events, sessions, versions, history) and its move recorded as a
    revision whose `before` names the subject and id it had. Its id is the target's to give (`named`: minted from
    the subject and the id it had, so the same file imported again names it alike). ValueError when `subject` is no
    subject id, or the file holds more than one subject: which would become which is not the file's to say."""
    if re.fullmatch(SUBJECT_PATTERN, subject) is None:
        raise ValueError(f"{subject!r} is no subject id (1 to 128 letters, digits or . _ : / -)")
    held = list(dict.fromkeys([*parsed.header.subjects, *parsed.subjects]))
    if len(held) > 1:
        raise ValueError(f"the file holds {len(held)} subjects ({', '.join(held)}): an import as another subject "
                         "takes one subject's export (`memflow export SUBJECT`)")
    moved = {subject: [_moved(r, subject, parsed.header.exported_at) for rs in parsed.subjects.values() for r in rs]}
    head = parsed.header.model_copy(update={"subjects": [subject]})
    return Parsed(head, moved if parsed.subjects else {})


def _moved(record: Record, subject: str, exported_at: datetime) -> Record:
    """`record` as `subject`'s, with a revision saying whose it was: dated when the export was made, so that every
    run of the same file writes it alike (an import's puts are a function of the file alone, `mutations`)."""
    memory = record.memory
    if memory.subject == subject:
        return record
    was = {"subject": memory.subject, "id": memory.id, "uri": memory.uri}
    moved = Revision(rev=memory.rev + 1, at=exported_at, before=was,
                     why=f"imported as {subject} from {memory.subject}'s memory {memory.id}")
    uri = memory.uri.replace(f"mem://{memory.subject}/", f"mem://{subject}/", 1)
    return record.model_copy(update={"memory": memory.model_copy(update={
        "subject": subject, "uri": uri, "rev": moved.rev, "revisions": [*memory.revisions, moved]})})


def _references(memory: Memory) -> list[str]:
    return [i for i in (memory.supersedes, memory.superseded_by, *memory.conflicts_with) if i is not None]


def _renamed(memory: Memory, name: Callable[[str], str]) -> Memory:
    return memory.model_copy(update={
        "id": name(memory.id),
        "supersedes": None if memory.supersedes is None else name(memory.supersedes),
        "superseded_by": None if memory.superseded_by is None else name(memory.superseded_by),
        "conflicts_with": [name(i) for i in memory.conflicts_with]})


def mutations(subject: str, records: Sequence[Record], exported_at: datetime) -> list[Mutation]:
    """The puts that import `records` of `subject`, through the applier: one mutation per instant the
    memories were made, so that forget's tombstones judge each by when it was said (`Tombstones.bury`: words
    forgotten after they were said stay forgotten; said again after the forget they are new).

    A function of the records alone, never of what the store holds: a second run of the same file makes the
    same mutations, so each put it meets already written is recognised as its own (`op_keys`) and announced if
    the run before was cut short between its write and its announcement. A put meeting a point held before
    the import says nothing (`announce_found`)."""
    found: list[Mutation] = []
    why = f"imported from an export made at {exported_at.isoformat()}"
    for at, group in groupby(ordered(records), key=lambda r: r.memory.created_at):
        memories = [_as_put(r.memory, subject) for r in group]
        for start in range(0, len(memories), PUTS_PER_MUTATION):
            puts = [PutOp(memory=m) for m in memories[start:start + PUTS_PER_MUTATION]]
            found.append(mutation(subject, IMPORT_ACTION, why, at, puts).model_copy(update={"announce_found": False}))
    return found


def op_keys(found: Sequence[Mutation]) -> dict[str, str]:
    """The op key each put of an import's `mutations` stamps on its point, by memory id: a point that still
    bears it was written by this import (this run or one of the same file before) and changed by nothing since."""
    return {op.memory.id: op_key(m, i) for m in found for i, op in enumerate(m.ops) if isinstance(op, PutOp)}


def written_by(held: Iterable[Memory], keys: Mapping[str, str]) -> list[Memory]:
    """The points among `held` that an import whose puts have `keys` wrote and nothing changed since."""
    return [m for m in held if m.last_op is not None and keys.get(m.id) == m.last_op]


def undo(subject: str, ours: Sequence[Memory], at: datetime) -> Mutation | None:
    """Take back an import's points (`written_by`) when its subject's import was refused after they were
    written: each is marked deleted on the revision it has (announced on `changes`, so a feed and the profile
    follow), then purged (`purge`). No tombstone is left: the same file imported again writes them again."""
    ops = [PatchOp(id=m.id, expected_rev=m.rev, set={"status": Status.deleted.value},
                   why="the import of this subject was refused: what it had written is taken back") for m in ours]
    return mutation(subject, UNDO_ACTION, "import refused", at, ops) if ops else None


def purge(subject: str, memory_ids: Sequence[str], at: datetime) -> Mutation | None:
    """Remove from the index the points `undo` marked deleted (their deletion announced)."""
    ops = [DeleteOp(id=i) for i in memory_ids]
    return mutation(subject, UNDO_ACTION, "import refused", at, ops) if ops else None


def _as_put(memory: Memory, subject: str) -> Memory:
    if memory.subject != subject:
        raise ValueError(f"memory {memory.id} is of {memory.subject}, not {subject}")
    # The op that last wrote it in the store it came from names nothing here; the put stamps its own.
    return memory.model_copy(update={"last_op": None})


def usable_vectors(head_model: str | None, head_dim: int | None, records: Sequence[Record],
                   model: str, dim: int) -> dict[str, list[float]]:
    """The exported vectors that can be stored as they are: made by the store's own model, at its dimension.
    The rest are encoded again (a vector of another model means nothing in this index)."""
    if head_model != model or head_dim != dim:
        return {}
    return {r.memory.id: r.vector for r in records if r.vector is not None}
