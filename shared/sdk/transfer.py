"""Export and import as a client does them (`MemoryClient.export` / `import_`, `memflow export|import`, the
HTTP routes): one call of the query worker per page of a subject to export; to import, the whole file read and
checked first, then per subject every slice checked, every slice written, and the written ones taken back if a
later one is refused (docs/export-format.md#a-subject-whole-or-not-at-all). The format is pipeline/export.py."""

from __future__ import annotations

import uuid
from collections.abc import Callable, Generator, Iterable, Iterator, Sequence
from datetime import UTC, datetime
from itertools import chain
from typing import TYPE_CHECKING, Any

import orjson

from memflow.pipeline import export
from memflow.pipeline.export import End, FormatError, Header, Parsed, Record
from memflow.shared.errors import InvalidInput
from memflow.shared.sdk.rpc import (
    EXPORT,
    IMPORT,
    MAX_EXPORT_PAGE,
    MAX_IMPORT_RECORDS,
    ExportedSubject,
    Imported,
    ImportReport,
)

if TYPE_CHECKING:
    from memflow.shared.sdk.client import MemoryClient

# An import call embeds up to MAX_IMPORT_RECORDS memories on a busy machine: minutes, not the searches' seconds.
TRANSFER_TIMEOUT_S = 600.0


# Points a page of an export carries, and memories an import call: with vectors (~17 KB a point at 768 dims) at most
# 50. A page or a call is one JSON document, encoded and decoded each in one call that holds the interpreter of its
# process: ~75 ms at 50 points with vectors, and the worker's other searches wait as long. At 200, another key's
# searches took 4× as long as idle while one key exported in a loop; at 50, 1.5× (`memflow bench http`).
PAGE = MAX_EXPORT_PAGE
PAGE_WITH_VECTORS = 50


def export_lines(client: MemoryClient, subjects: Sequence[str], with_vectors: bool, now: datetime) -> Iterator[bytes]:
    """The export of `subjects`, line by line: the header (with the model of the vectors, known from the first
    page), each subject's points oldest first, a page at a time, then the end line."""
    pages = (reply for s in subjects for reply in pages_of(lambda **f: client.call(EXPORT, **f), s, with_vectors))
    first = next(pages, None)
    model, dim = (first.model, first.dim) if first is not None else (None, None)
    records = (r for reply in ([first] if first is not None else []) for r in reply.records)
    yield from export.lines(export.header(now, subjects, model, dim),
                            chain(records, (r for reply in pages for r in reply.records)))


def pages_of(call: Callable[..., ExportedSubject], subject: str, with_vectors: bool,
             limit: int | None = None) -> Iterator[ExportedSubject]:
    """One subject's export pages, each asked after the one before (`call`: the EXPORT call, sync)."""
    after: str | None = None
    while True:
        reply = call(subject=subject, with_vectors=with_vectors, after=after, limit=limit or page_size(with_vectors),
                     timeout_s=TRANSFER_TIMEOUT_S)
        yield reply
        if reply.next is None:
            return
        after = reply.next


def page_size(with_vectors: bool) -> int:
    return PAGE_WITH_VECTORS if with_vectors else PAGE


def read(lines: Iterable[bytes | str], as_subject: str | None = None) -> Parsed:
    """A whole export, read and checked (export.FormatError naming the line and field); `as_subject`: its one
    subject's memories as that subject's (`export.as_subject`; InvalidInput naming `as_subject` when it cannot be)."""
    return moved(export.read(lines), as_subject)


def moved(parsed: Parsed, as_subject: str | None) -> Parsed:
    """`parsed` as `as_subject`'s (None: as it is), or InvalidInput naming `as_subject`: each door's refusal."""
    if as_subject is None:
        return parsed
    try:
        return export.as_subject(parsed, as_subject)
    except ValueError as exc:
        raise InvalidInput("as_subject", str(exc)) from None


class Framing:
    """An import read as it arrives (the HTTP door's, docs/export-format.md#what-the-door-bounds): each line is
    framed as soon as it is whole (JSON, its kind in its place, its model) and the end line's count checked, so a
    file is refused at its first bad line without reading on. The words are checked after (`export.read`, once the
    whole file is framed): the gate costs ~2.5 µs a character, 40 times the rest, and a file refused at its last
    line by its frame never pays it. Bounded: a line at most `max_line_bytes` (refused as soon as it grows past them),
    `max_records` records, and `max_chars` characters in the strings of their memories: what the gate reads."""

    def __init__(self, max_records: int, max_line_bytes: int, max_chars: int) -> None:
        self.max_records, self.max_line_bytes, self.max_chars = max_records, max_line_bytes, max_chars
        self.lines: list[bytes] = []
        self._rest = b""
        self._header: Header | None = None
        self._end: End | None = None
        self._records = self._chars = 0

    def feed(self, chunk: bytes) -> None:
        """Frame the lines `chunk` completes (FormatError at the first bad one, or a line past its bound)."""
        *whole, self._rest = (self._rest + chunk).split(b"\n")
        for line in whole:
            self._line(line.removesuffix(b"\r"))
        if len(self._rest) > self.max_line_bytes:
            raise FormatError(len(self.lines) + 1, "line", f"longer than {self.max_line_bytes} bytes")

    def close(self) -> list[bytes]:
        """The body ended: its last line framed, and the file's lines (what `export.read` reads, numbered alike)."""
        if self._rest.strip():
            self._line(self._rest)
        if self._header is None:
            raise FormatError(1, "kind", "an empty file: no header line")
        if self._end is None:
            raise FormatError(len(self.lines) + 1, "kind", "no end line: the file was cut short")
        return self.lines

    def _line(self, raw: bytes) -> None:
        self.lines.append(raw)
        number = len(self.lines)
        if len(raw) > self.max_line_bytes:
            raise FormatError(number, "line", f"longer than {self.max_line_bytes} bytes")
        if not raw.strip():
            return
        value = _object(raw, number)
        if self._header is None:
            self._header = export.framed(Header, value, number)
        elif self._end is not None:
            raise FormatError(number, "kind", "a line after the end line")
        elif value.get("kind") == "end":
            self._end = export.framed(End, value, number)
            if self._end.memories != self._records:
                raise FormatError(number, "memories", f"the end line counts {self._end.memories} memories, "
                                                      f"the file holds {self._records}")
        else:
            export.framed(Record, value, number)
            self._records += 1
            self._chars += _chars(value["memory"])
            if self._records > self.max_records:
                raise FormatError(number, "memory", f"more than {self.max_records} memories in one import: "
                                                    "post the file in parts, whole subjects each")
            if self._chars > self.max_chars:
                raise FormatError(number, "memory", f"more than {self.max_chars} characters of memories in one "
                                                    "import: post the file in parts, whole subjects each")


def _object(raw: bytes, number: int) -> dict[str, Any]:
    try:
        value = orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        raise FormatError(number, "line", f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise FormatError(number, "line", f"a JSON {type(value).__name__}, not an object")
    return value


def _chars(value: object) -> int:
    """The characters of every string in `value` (a line's memory, as JSON), keys aside."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(_chars(v) for v in value.values())
    if isinstance(value, list):
        return sum(_chars(v) for v in value)
    return 0


def import_parsed(client: MemoryClient, parsed: Parsed, allowed: Callable[[str], object] = lambda subject: None,
                  at: datetime | None = None) -> ImportReport:
    """Import every subject of `parsed` (`allowed` is asked about each before anything is written: the
    HTTP door's scope check), each whole or not at all (`import_steps`); `at`: when an undo says it happened."""
    for subject in parsed.subjects:
        allowed(subject)

    def call(**fields: Any) -> Imported:
        return client.call(IMPORT, timeout_s=TRANSFER_TIMEOUT_S, **fields)
    when = at or datetime.now(UTC)
    done: list[Imported] = []
    for subject, records in parsed.subjects.items():
        try:
            done.append(run(import_steps(parsed, subject, records, when), call))
        except Exception as refused:
            if done:
                refused.add_note(imported_before(done))
            raise
    return ImportReport(subjects=done)


def imported_before(done: Sequence[Imported]) -> str:
    """What a refusal's note says of the subjects of the file imported before the refused one."""
    return f"imported before it, each whole: {', '.join(d.subject for d in done)}"


# The calls an import of one subject makes, one at a time: each yielded call's reply is sent back, its error thrown
# in. The same steps for the SDK (`run`) and the HTTP door (an async driver of its own).
Steps = Generator[dict[str, Any], Imported, Imported]


def import_steps(parsed: Parsed, subject: str, records: list[Record], at: datetime) -> Steps:
    """Import one subject whole or not at all, a slice of at most MAX_IMPORT_RECORDS memories per IMPORT call:
    every slice is checked before any is written, and when a slice is refused as it is written (a point of
    another subject appeared meanwhile, a compare-and-write lost, no worker answered) the slices written up to
    it are taken back (step `undo`, its deletions announced `at`) and the refusal raised. If taking back fails
    too, what was written stays, and the same file imported again completes it (each call is idempotent)."""
    attempt = uuid.uuid4().hex  # this run: its undo fences its own slices, never another run's
    slices = [{**fields, "attempt": attempt} for fields in import_calls(parsed, subject, records)]
    try:
        for fields in slices:
            yield {"step": "check", **fields}
    except Exception as refused:
        refused.add_note(f"{subject}: nothing imported (refused before any write)")
        raise
    done: list[Imported] = []
    try:
        for fields in slices:
            done.append((yield fields))
    except Exception as refused:
        try:
            for fields in slices[:len(done) + 1]:  # the refused one too: it may have written a part
                yield {"step": "undo", "at": at, **fields}
        except Exception as failed:
            refused.add_note(f"{subject}: partly imported, and taking it back failed ({failed}): import the same "
                             "file again to complete it")
            raise refused from failed
        refused.add_note(f"{subject}: nothing imported (what its slices had written was taken back)")
        raise
    return total(subject, done)


def run(steps: Steps, call: Callable[..., Imported]) -> Imported:
    """Make `steps`' calls with `call` (sync), each reply sent back and each error thrown in."""
    try:
        fields = next(steps)
        while True:
            try:
                reply = call(**fields)
            except Exception as exc:
                fields = steps.throw(exc)
                continue
            fields = steps.send(reply)
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def import_calls(parsed: Parsed, subject: str, records: list[Record]) -> list[dict[str, Any]]:
    """The requests that import `records` of `subject`: at most MAX_IMPORT_RECORDS memories each (PAGE_WITH_VECTORS
    when the file carries vectors), the same slices on every run of the same file (what makes a second run meet the
    first's puts as its own)."""
    head = parsed.header
    vectors = any(r.vector is not None for r in records)
    size = min(PAGE_WITH_VECTORS, MAX_IMPORT_RECORDS) if vectors else MAX_IMPORT_RECORDS
    return [{"subject": subject, "exported_at": head.exported_at, "model": head.model, "dim": head.dim,
             "records": records[start:start + size]}
            for start in range(0, len(records), size)]


def total(subject: str, parts: Sequence[Imported]) -> Imported:
    """What the calls importing one subject did, added up."""
    counts = {name: sum(getattr(p, name) for p in parts) for name in Imported.model_fields if name != "subject"}
    return Imported(subject=subject, **counts)
