"""The change feed as a key holder reads it (`GET /v1/changes`, `MemoryClient.changes`): the `changes` stream's
entries (shared/applier.py announces one per change, in revision order) cut down to ids and kinds, filtered to
what the reader may see, in pages or as Server-Sent Events (docs/changes.md).

An entry of the stream carries the memory's words before and after; an entry of the feed never does: a consumer
mirrors the feed by fetching what it is allowed to read (`history`, `inspect`), and a forgotten memory's words
are not kept anywhere by a feed reader that stored them. The cursor is the stream id: a reader resumes after the
last id it saw (`after`, or SSE's `Last-Event-ID`), and sees nothing twice and misses nothing the stream still
holds; `gap` says when the stream was trimmed (MEMFLOW_CHANGES_MAXLEN) past the cursor.

A stream tells its reader the ids of its own entries only: never one of another key's entries, never when one
was made (an entry it may not see changes nothing it sends, nor when). Where it has none to give (a stream
opened from now), its cursor is a moment of the stream's clock (`since`): after every entry made before it."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from pydantic import Field, ValidationError, field_validator

from memflow.pipeline.models import Subject, Wire, aware

# A stream id, `<ms>-<seq>` (or `<ms>`, read as `<ms>-0`); "0": from the oldest entry the stream holds. At most
# 19 digits each: every such number is a valid part of a stream id (under 2^64), so no cursor reaches Redis bad.
CURSOR_PATTERN = r"^[0-9]{1,19}(-[0-9]{1,19})?$"
_CURSOR = re.compile(CURSOR_PATTERN)
START = "0-0"
# The highest sequence number a cursor's pattern lets through (19 digits, under 2^64): `since`'s.
_LAST_SEQ = 10**19 - 1
# The most entries one page holds, and the default.
MAX_PAGE = 1000
DEFAULT_PAGE = 100


class FeedEntry(Wire):
    """One change to one memory: which (`memory_id` of `subject`), what kind (`add`, `supersede`, `contest`,
    `forget`, a lifecycle step…), the memory's revision after it (none: the memory was deleted) and when.
    `id` is the cursor: the stream id of the entry."""

    id: str
    memory_id: str
    subject: Subject
    kind: str
    revision: int | None = None
    at: datetime

    _aware = field_validator("at")(aware)


class ChangesPage(Wire):
    """A page of the feed: `entries` in the order they were made; `next` is the cursor to ask with for the
    following page (past entries this key may not see as well); `more`: the stream holds entries after `next`;
    `gap`: the stream was trimmed past the cursor asked with, so entries between it and the first one here were
    dropped before this reader saw them (read the subject again, `inspect`, and follow from here)."""

    entries: list[FeedEntry] = Field(default_factory=list)
    next: str
    more: bool = False
    gap: bool = False


def cursor(text: str) -> str:
    """`text` as a full stream id (`<ms>-<seq>`), or ValueError saying what a cursor is."""
    if not _CURSOR.match(text):
        raise ValueError(f"a cursor is a stream id such as 1767225600000-0 (an entry's `id`), or 0; not {text!r}")
    return text if "-" in text else f"{text}-0"


def since(now_ms: int) -> str:
    """The cursor of the moment `now_ms` of the stream's clock: past every id made before that millisecond,
    before every one made from it on. It names no entry, so it says nothing of who wrote when."""
    return f"{max(0, now_ms - 1)}-{_LAST_SEQ}"


def order(stream_id: str) -> tuple[int, int]:
    ms, _, seq = stream_id.partition("-")
    return int(ms), int(seq or 0)


def trimmed_past(after: str, first: str | None, trimmed: bool) -> bool:
    """Whether entries after `after` may have been trimmed away: the stream was trimmed and now starts past
    it. (Trimming leaves no trace of what it dropped: a cursor on the very entry before the oldest kept one,
    itself trimmed, is told so too, and loses nothing.)"""
    return trimmed and first is not None and order(first) > order(after)


def entry(stream_id: str, change: Mapping[str, Any]) -> FeedEntry:
    """The feed's entry of one `changes` entry (a Change as JSON): ids, kind, revision and time, nothing of
    the memory's words (`before`, `after`, `why`)."""
    return FeedEntry(id=stream_id, memory_id=change["memory_id"], subject=change["subject"],
                     kind=change["action"], revision=change.get("rev"), at=change["at"])


def take(read: Iterable[tuple[str, Mapping[str, Any] | None]], visible: Callable[[str], bool],
         room: int) -> tuple[list[FeedEntry], str | None, bool]:
    """The visible entries of `read` (stream id and decoded Change; None: an entry that is not one), at most
    `room`; the id of the last entry consumed (None: none); whether `room` filled before `read` ended. An entry
    that does not read as a change is passed over (the cursor moves past it): a feed reader cannot repair it."""
    found: list[FeedEntry] = []
    last: str | None = None
    for stream_id, change in read:
        if len(found) >= room:
            return found, last, True
        last = stream_id
        if change is None or not visible(str(change.get("subject", ""))):
            continue
        try:
            found.append(entry(stream_id, change))
        except (KeyError, ValidationError):
            continue
    return found, last, False


# -- Server-Sent Events (https://html.spec.whatwg.org/multipage/server-sent-events.html) -----------------

KEEP_ALIVE = b": keep-alive\n\n"


def sse_event(found: FeedEntry) -> bytes:
    """One entry as an SSE event: `id:` the cursor (a reconnecting EventSource sends it back as Last-Event-ID)."""
    return f"id: {found.id}\nevent: change\ndata: {found.model_dump_json()}\n\n".encode()


def sse_opening(cursor: str | None) -> bytes:
    """A stream's first line, a keep-alive: with `id:` the cursor it starts from (`since` its opening) when the
    reader gave none, so a reader that reconnects before any change of its own resumes from there."""
    return KEEP_ALIVE if cursor is None else f"id: {cursor}\n{KEEP_ALIVE.decode()}".encode()


def sse_gap(after: str) -> bytes:
    """The stream was trimmed past `after`: changes after it were dropped before this reader saw them."""
    return f"event: gap\ndata: {{\"after\": \"{after}\"}}\n\n".encode()
