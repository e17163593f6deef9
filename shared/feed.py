"""Reading the `changes` stream for a feed reader (pipeline/feed.py): a page of it, its end, and what was trimmed;
with the blocking client (`MemoryClient.changes`) and on an event loop (`GET /v1/changes`, workers/changes_api.py).

A page reads at most `scan` entries of the stream (MAX_SCAN): a key that sees one subject among many pays for the
entries it passes over, so the page says where it stopped (`next`) and a reader asks again from there."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import redis
import redis.asyncio

from memflow.pipeline import feed
from memflow.pipeline.feed import ChangesPage
from memflow.shared.codec import json_object
from memflow.shared.errors import DecodeError
from memflow.shared.keys import FIELD, Keys

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
    """One page's assembly over reads of the stream (the same for both clients)."""

    def __init__(self, after: str, visible: Callable[[str], bool], limit: int, ends: Ends) -> None:
        self.visible, self.limit = visible, limit
        after = feed.cursor(after)
        self.page = ChangesPage(next=after, gap=ends.gap(after))
        self.scanned, self.done = 0, False

    def bounds(self) -> tuple[str, int]:
        """The range to read next: exclusive of the cursor; at most what is left of the scan."""
        return f"({self.page.next}", min(SCAN_BATCH, MAX_SCAN - self.scanned)

    def add(self, raw: Raw, asked: int) -> None:
        found, last, full = feed.take(decoded(raw), self.visible, self.limit - len(self.page.entries))
        self.page.entries.extend(found)
        self.page.next = last or self.page.next
        self.scanned += len(raw or ())
        ended = len(raw or ()) < asked
        self.page.more = full or not ended
        self.done = full or ended or self.scanned >= MAX_SCAN or len(self.page.entries) >= self.limit


def page(client: redis.Redis, keys: Keys, after: str, visible: Callable[[str], bool], limit: int) -> ChangesPage:
    """The visible entries after `after`, at most `limit` (MemoryClient.changes)."""
    pager = Pager(after, visible, limit, ends_of(_info(client, keys)))
    while not pager.done:
        low, count = pager.bounds()
        pager.add(client.xrange(keys.changes, low, "+", count=count), count)
    return pager.page


async def page_async(client: redis.asyncio.Redis, keys: Keys, after: str, visible: Callable[[str], bool],
                     limit: int) -> ChangesPage:
    """`page` on an event loop (GET /v1/changes)."""
    pager = Pager(after, visible, limit, ends_of(await _info_async(client, keys)))
    while not pager.done:
        low, count = pager.bounds()
        pager.add(await client.xrange(keys.changes, low, "+", count=count), count)
    return pager.page


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
