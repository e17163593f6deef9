"""Reading the `changes` stream for a feed reader (pipeline/feed.py): a page of it, its end, and what was trimmed;
with the blocking client (`MemoryClient.changes`) and on an event loop (`GET /v1/changes`, workers/changes_api.py).

A page reads at most `scan` entries of the stream (MAX_SCAN): a key that sees one subject among many pays for the
entries it passes over, so the page says where it stopped (`next`) and a reader asks again from there.

What a page tells its key of where it ends is the key's own (pipeline/feed.py): a full page ends at its last entry
and says `more`, whatever follows; a page that read to the stream's end ends at the moment it began reading on the
stream's clock (`feed.since`), or its last entry if later; only one that stopped at MAX_SCAN among entries its key
may not see names where, sealed (`feed.Sealed`): the server reads on from there, the key learns nothing of it."""

from __future__ import annotations

import secrets
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from memflow.pipeline import feed
from memflow.pipeline.feed import ChangesPage
from memflow.shared.codec import json_object
from memflow.shared.errors import DecodeError
from memflow.shared.redisdb.keys import FIELD, Keys

# The most stream entries one page reads (orjson reads 5,000 in a few milliseconds), and in how many reads.
MAX_SCAN = 5000
SCAN_BATCH = 500

Raw = Sequence[tuple[Any, Any]] | None


@dataclass(frozen=True)
class Ends:
    """The stream's newest id (START: empty), its oldest kept (None: empty) and whether it was ever trimmed."""

    last: str
    first: str | None
    trimmed: bool

    def gap(self, after: str) -> bool:
        return after != feed.START and feed.trimmed_past(after, self.first, self.trimmed)


def decoded(raw: Raw) -> list[tuple[str, dict[str, Any] | None]]:
    """Stream entries as (id, Change as JSON); None for an entry that is not JSON."""
    out: list[tuple[str, dict[str, Any] | None]] = []
    for stream_id, fields in raw or ():
        payload = fields.get(FIELD.encode(), fields.get(FIELD))
        try:
            out.append((_text(stream_id), json_object(payload) if payload is not None else None))
        except DecodeError:
            out.append((_text(stream_id), None))
    return out


def ends_of(info: dict[str, Any] | None) -> Ends:
    """The ends XINFO STREAM tells (trimming leaves `entries-added` past `length`, Redis 7.0 on)."""
    if info is None:
        return Ends(feed.START, None, False)
    first = info.get("first-entry")
    added = info.get("entries-added")
    return Ends(_text(info.get("last-generated-id") or feed.START), _text(first[0]) if first else None,
                added is None or int(added) > int(info.get("length") or 0))


class Pager:
    """One page's assembly over reads of the stream (the same for both clients): from `after` (a stream id, a
    sealed one opened) and `opened`, the moment the reading began (`feed.since`)."""

    def __init__(self, after: str, visible: Callable[[str], bool], limit: int, ends: Ends, opened: str) -> None:
        after = feed.cursor(after)
        self.visible, self.limit, self.after, self.opened = visible, limit, after, opened
        self.page = ChangesPage(next=after, gap=ends.gap(after))
        self.read_to = after  # the last entry read, the key's or not: never told to the key as it is
        self.scanned, self.ended = 0, False

    @property
    def done(self) -> bool:
        return self.ended or self.scanned >= MAX_SCAN or len(self.page.entries) >= self.limit

    def bounds(self) -> tuple[str, int]:
        """The range to read next: exclusive of the last entry read; at most what is left of the scan."""
        return f"({self.read_to}", min(SCAN_BATCH, MAX_SCAN - self.scanned)

    def add(self, raw: Raw, asked: int) -> None:
        found, last, _ = feed.take(decoded(raw), self.visible, self.limit - len(self.page.entries))
        self.page.entries.extend(found)
        self.read_to = last or self.read_to
        self.scanned += len(raw or ())
        self.ended = len(raw or ()) < asked

    def finish(self) -> str | None:
        """Sets `next` and `more` from the key's own entries and the clock; the place to seal into `next` (a page
        that stopped at MAX_SCAN among entries its key may not see), or None."""
        own = self.page.entries[-1].id if self.page.entries else self.after
        self.page.more = len(self.page.entries) >= self.limit or not self.ended
        if len(self.page.entries) >= self.limit:  # full: whether anything follows is not the key's to know
            self.page.next = own
        elif self.ended:  # read to the end: nothing of the key's between its last entry and the opening moment
            self.page.next = max(own, self.opened, key=feed.order)
        else:
            return self.read_to
        return None


def page(client: redis.Redis, keys: Keys, after: str, visible: Callable[[str], bool], limit: int,
         sealed: Callable[[], feed.Sealed] | None = None) -> ChangesPage:
    """The visible entries after `after` (a stream id: a sealed one opened), at most `limit` (MemoryClient.changes);
    `sealed` is asked for only by a page that stops among entries it may not see (None: a caller that tells no key
    where a page ended, shared/changes/profiles.py, gets the place as it is)."""
    pager = Pager(after, visible, limit, *opening(client, keys))
    while not pager.done:
        low, count = pager.bounds()
        pager.add(client.xrange(keys.changes, low, "+", count=count), count)
    if (place := pager.finish()) is not None:
        pager.page.next = place if sealed is None else sealed().seal(place, _nonce())
    return pager.page


async def page_async(client: redis.asyncio.Redis, keys: Keys, after: str, visible: Callable[[str], bool],
                     limit: int, sealed: Callable[[], Awaitable[feed.Sealed]] | None = None) -> ChangesPage:
    """`page` on an event loop (GET /v1/changes)."""
    pager = Pager(after, visible, limit, *await opening_async(client, keys))
    while not pager.done:
        low, count = pager.bounds()
        pager.add(await client.xrange(keys.changes, low, "+", count=count), count)
    if (place := pager.finish()) is not None:
        pager.page.next = place if sealed is None else (await sealed()).seal(place, _nonce())
    return pager.page


def opening(client: redis.Redis, keys: Keys) -> tuple[Ends, str]:
    """`opening_async` with the blocking client (a page of MemoryClient.changes)."""
    if isinstance(client, redis.RedisCluster):  # the clock of the node that holds the stream
        seconds, micros = client.time(target_nodes=client.get_node_from_key(keys.changes))
    else:
        seconds, micros = client.time()
    return ends_of(_info(client, keys)), feed.since(int(seconds) * 1000 + int(micros) // 1000)


async def opening_async(client: redis.asyncio.Redis, keys: Keys) -> tuple[Ends, str]:
    """The stream's ends, and the cursor of the moment just before they were read (`feed.since`, on the clock of
    the Redis server that holds the stream: its ids' clock, a cluster's node included): every entry made after
    the ends were read comes after it."""
    if isinstance(client, redis.asyncio.RedisCluster):  # the clock of the node that holds the stream
        await client.initialize()  # its slots known (once: a no-op after)
        seconds, micros = await client.time(target_nodes=client.get_node_from_key(keys.changes))
    else:
        seconds, micros = await client.time()
    ends = ends_of(await _info_async(client, keys))
    return ends, feed.since(int(seconds) * 1000 + int(micros) // 1000)


def _info(client: redis.Redis, keys: Keys) -> dict[str, Any] | None:
    try:
        return client.xinfo_stream(keys.changes)
    except redis.ResponseError:  # no such key: nothing was ever announced
        return None


async def _info_async(client: redis.asyncio.Redis, keys: Keys) -> dict[str, Any] | None:
    try:
        return await client.xinfo_stream(keys.changes)
    except redis.ResponseError:
        return None


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def _nonce() -> bytes:
    """A sealed cursor's nonce: fresh each time, so two seals of one place differ."""
    return secrets.token_bytes(feed.Sealed.NONCE)


async def recent_async(client: redis.asyncio.Redis, keys: Keys, visible: Callable[[str], bool], limit: int,
                       scan: int = SCAN_BATCH) -> list[feed.FeedEntry]:
    """The newest visible entries, newest first, among the stream's last `scan` (the inspector's recent changes):
    one bounded read a page, so a subject quiet among busy others shows fewer or none, never a slower page."""
    found, _, _ = feed.take(decoded(await client.xrevrange(keys.changes, "+", "-", count=scan)), visible, limit)
    return found
