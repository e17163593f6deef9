"""Export and import as a client does them (`MemoryClient.export` / `import_`, `memflow export|import`, the
HTTP routes): one call of the query worker per subject to export, and per slice of a subject to import, the
whole file read and checked first (docs/export-format.md). The format itself is pipeline/export.py."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from datetime import datetime
from itertools import chain
from typing import TYPE_CHECKING, Any

from memflow.pipeline import export
from memflow.pipeline.export import Parsed, Record
from memflow.shared.rpc import (
    EXPORT,
    IMPORT,
    MAX_EXPORT_PAGE,
    MAX_IMPORT_RECORDS,
    ExportedSubject,
    Imported,
    ImportReport,
)

if TYPE_CHECKING:
    from memflow.shared.client import MemoryClient

# An import call embeds up to MAX_IMPORT_RECORDS memories on a busy machine: minutes, not the searches' seconds.
TRANSFER_TIMEOUT_S = 600.0


# Points a page of an export carries: with vectors (~17 KB a point at 768 dims) a tenth as many.
PAGE = MAX_EXPORT_PAGE
PAGE_WITH_VECTORS = MAX_EXPORT_PAGE // 10


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


def read(lines: Iterable[bytes | str]) -> Parsed:
    """A whole export, read and checked (export.FormatError naming the line and field)."""
    return export.read(lines)


def import_parsed(client: MemoryClient, parsed: Parsed,
                  allowed: Callable[[str], object] = lambda subject: None) -> ImportReport:
    """Import every subject of `parsed` (`allowed` is asked about each before anything is written: the
    HTTP door's scope check), a slice of at most MAX_IMPORT_RECORDS memories per call."""
    for subject in parsed.subjects:
        allowed(subject)
    return ImportReport(subjects=[_import_subject(client, parsed, s, records)
                                  for s, records in parsed.subjects.items()])


def _import_subject(client: MemoryClient, parsed: Parsed, subject: str, records: list[Record]) -> Imported:
    return total(subject, [client.call(IMPORT, timeout_s=TRANSFER_TIMEOUT_S, **fields)
                           for fields in import_calls(parsed, subject, records)])


def import_calls(parsed: Parsed, subject: str, records: list[Record]) -> list[dict[str, Any]]:
    """The requests that import `records` of `subject`: at most MAX_IMPORT_RECORDS memories each."""
    head = parsed.header
    return [{"subject": subject, "exported_at": head.exported_at, "model": head.model, "dim": head.dim,
             "records": records[start:start + MAX_IMPORT_RECORDS]}
            for start in range(0, len(records), MAX_IMPORT_RECORDS)]


def total(subject: str, parts: Sequence[Imported]) -> Imported:
    """What the calls importing one subject did, added up."""
    counts = {name: sum(getattr(p, name) for p in parts) for name in Imported.model_fields if name != "subject"}
    return Imported(subject=subject, **counts)
