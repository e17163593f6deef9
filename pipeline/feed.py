"""The change feed as an API key sees it (`GET /v1/changes`, `MemoryClient.changes`): the `changes` stream's
entries (shared/writer/applier.py announces one per change, in revision order) cut down to ids and kinds, filtered to
what the reader may see, in pages or as Server-Sent Events (docs/changes.md).

An entry of the stream carries the memory's words before and after; an entry of the feed never does: a consumer
mirrors the feed by fetching what it is allowed to read (`history`, `inspect`), and a forgotten memory's words
are not kept anywhere by a feed reader that stored them. The cursor is the stream id: a reader resumes after the
last id it saw (`after`, or SSE's `Last-Event-ID`), and sees nothing twice and misses nothing the stream still
holds; `gap` says when the stream was trimmed (MEMFLOW_CHANGES_MAXLEN) past the cursor.

A stream tells its reader the ids of its own entries only: never one of another key's entries, never when one
was made (an entry it may not see changes nothing it sends, nor when). Where it has none to give (a stream
opened from now), its cursor is a moment of the stream's clock (`since`): after every entry made before it.
A page's `next` is the same: its own last entry's id, or a moment of the clock (`since`), or, where a page
stopped among entries it may not see, that place `Sealed`: a cursor the server opens and the reader cannot."""

from __future__ import annotations

import base64
import hashlib
import hmac
import re
from collections.abc import Callable, Iterable, Mapping
from datetime import datetime
from typing import Any

from pydantic import Field, ValidationError, field_validator

from memflow.pipeline.checks import aware
from memflow.pipeline.models import Subject, Wire

# A stream id, `<ms>-<seq>` (or `<ms>`, read as `<ms>-0`); "0": from the oldest entry the stream holds. At most
# 19 digits each: every such number is a valid part of a stream id (under 2^64), so no cursor reaches Redis bad.
# Or a sealed place (`Sealed`): `~` and 59 characters of base64url.
CURSOR_PATTERN = r"^(?:[0-9]{1,19}(?:-[0-9]{1,19})?|~[A-Za-z0-9_-]{59})$"
# A revision of the feed (a profile's `revision`, an entry's id): what a profile's `since` takes. A sealed place
# is no revision: only the feed opens one.
REVISION_PATTERN = r"^[0-9]{1,19}(?:-[0-9]{1,19})?$"
_CURSOR = re.compile(CURSOR_PATTERN)
SEALED = "~"
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
    following page (the last entry's id, a moment of the stream's clock, or a sealed place: never another key's
    entry); `more`: ask again now (a full page, or one that stopped among entries this key may not see);
    `gap`: the stream was trimmed past the cursor asked with, so entries between it and the first one here were
    dropped before this reader saw them (read the subject again, `inspect`, and follow from here)."""

    entries: list[FeedEntry] = Field(default_factory=list)
    next: str
    more: bool = False
    gap: bool = False


def cursor(text: str) -> str:
    """`text` as a full stream id (`<ms>-<seq>`; a sealed one as it is: `Sealed.open` reads it), or ValueError
    saying what a cursor is."""
    if not _CURSOR.match(text):
        raise ValueError(f"a cursor is a stream id such as 1767225600000-0 (an entry's `id`), a page's `next`, or 0;"
                         f" not {text!r}")
    return text if "-" in text or text.startswith(SEALED) else f"{text}-0"


def is_sealed(text: str) -> bool:
    return text.startswith(SEALED)


class Sealed:
    """Places of the stream a reader may resume from but not read: where a page stopped among entries its key may
    not see, whose ids would date another's writes. A place is sealed as `~` and base64url of a random nonce (12
    bytes), the place's 16 bytes XORed with HMAC-SHA256(key, nonce) and a 16-byte HMAC-SHA256 tag over both; the key
    is derived from the deployment's secret (shared/redisdb/keys.py `id_space`), so every server process opens what any
    of them sealed, and a reader can neither read one nor make one up."""

    NONCE, _PLACE, _TAG = 12, 16, 16

    def __init__(self, secret: bytes) -> None:
        self._key = hmac.new(secret, b"memflow changes cursor", hashlib.sha256).digest()

    def __repr__(self) -> str:  # never the key: it would reach logs and tracebacks
        return "Sealed(<key>)"

    def seal(self, stream_id: str, nonce: bytes) -> str:
        """`stream_id` sealed with `nonce` (NONCE random bytes, drawn by the caller: nothing here reads the OS)."""
        if len(nonce) != self.NONCE:
            raise ValueError(f"a nonce has {self.NONCE} bytes")
        ms, seq = order(stream_id)
        hidden = bytes(a ^ b for a, b in zip(ms.to_bytes(8, "big") + seq.to_bytes(8, "big"), self._pad(nonce),
                                             strict=False))
        tag = self._tag(nonce + hidden)
        return SEALED + base64.urlsafe_b64encode(nonce + hidden + tag).decode().rstrip("=")

    def open(self, text: str) -> str:
        """The stream id sealed in `text`, or ValueError: not one this deployment sealed."""
        try:
            raw = base64.urlsafe_b64decode(text.removeprefix(SEALED) + "=")
        except ValueError:
            raw = b""
        nonce, hidden, tag = raw[:self.NONCE], raw[self.NONCE:-self._TAG], raw[-self._TAG:]
        if len(raw) != self.NONCE + self._PLACE + self._TAG or not hmac.compare_digest(tag, self._tag(nonce + hidden)):
            raise ValueError("this cursor was not given by this deployment: ask with a page's `next` as it came")
        place = bytes(a ^ b for a, b in zip(hidden, self._pad(nonce), strict=False))
        return f"{int.from_bytes(place[:8], 'big')}-{int.from_bytes(place[8:], 'big')}"

    def _pad(self, nonce: bytes) -> bytes:
        return hmac.new(self._key, b"pad" + nonce, hashlib.sha256).digest()[:self._PLACE]

    def _tag(self, sealed: bytes) -> bytes:
        return hmac.new(self._key, b"tag" + sealed, hashlib.sha256).digest()[:self._TAG]


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
