"""A subject's materialized profile (pipeline/profile.py, docs/profile.md), kept current from the `changes` feed.

The applier, in the one step that announces a change, records the subject's last entry on the feed (its
revision) and drops its materialized profile (shared/writer/applier.py). The next read builds it once from the store
(one scroll of the subject's memories, and its forgotten events: pipeline.profile.undistilled) and keeps it,
but only if the subject's revision is still the one it read before the scroll: a build that raced a change
never stores a profile that change made stale (a forget's words included). Every read after that is one GET
until the subject changes again.

What is kept is the reply itself as the HTTP route serves it (a header line first: the moment its first item
stops holding). A plain read before that moment serves those bytes as they are: they were validated when the
profile was built, and parsing them again on every read was most of its cost (issue 31: 5 ms p50 at 1,000
items, against 0.2 ms for the GET). A read asking for `since` or `max_tokens`, or one after an item stopped
holding, parses them.

"Changed since revision R" is read off the feed: the memories of the subject changed after R, looked up in the
profile as it is now (pipeline.profile.since)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime

import redis
import redis.asyncio
from pydantic import ValidationError

from memflow.pipeline import feed
from memflow.pipeline import profile as assembly
from memflow.pipeline.profile import Profile, ProfileReply, SinceRevision
from memflow.shared.changes.feed import page, page_async
from memflow.shared.redisdb.keys import Keys
from memflow.shared.storage.store import MemoryFilter, Store

# A profile nobody read for a week is dropped (the next read builds it again).
CACHE_TTL_S = 7 * 24 * 3600
# The materialized form's header: this tag, the moment its first item stops holding (ISO 8601, or NEVER), "\n".
# A value without it (an older form) is built again.
FORM = b"profile/1 "
NEVER = b"-"
# Pages of the feed one "since" reads (each MAX_PAGE entries of the subject, at most MAX_SCAN of the stream).
SINCE_PAGES = 10
_KEEP = """
local now = redis.call('HGET', KEYS[1], ARGV[1]) or ARGV[4]
if now ~= ARGV[2] then return 0 end
redis.call('SET', KEYS[2], ARGV[3], 'EX', ARGV[5])
return 1
"""


def revision(client: redis.Redis, keys: Keys, subject: str) -> str:
    raw = client.hget(keys.revisions, subject)
    return raw.decode() if isinstance(raw, bytes) else (raw or feed.START)


def stored(found: Profile) -> bytes:
    """The materialized form of a profile: its header, then the reply the HTTP route serves for a plain read."""
    ends = [i.until for i in assembly.items(found).values() if i.until is not None]
    head = min(ends).isoformat().encode() if ends else NEVER
    return FORM + head + b"\n" + ProfileReply(**dict(found)).model_dump_json().encode()


def served(raw: bytes | str | None, now: datetime) -> bytes | None:
    """The reply's bytes as stored, when they hold at `now` as they are (no item of it stopped holding); else
    None (none stored, an older form, or one to read through `as_of`)."""
    if isinstance(raw, str):
        raw = raw.encode()
    if raw is None or not raw.startswith(FORM):
        return None
    head, _, body = raw[len(FORM):].partition(b"\n")
    if head != NEVER and now >= datetime.fromisoformat(head.decode()):
        return None
    return body


def parsed(raw: bytes | str | None) -> Profile | None:
    """A stored profile, or None (none stored, or one of an older form or shape: built again)."""
    if isinstance(raw, str):
        raw = raw.encode()
    if raw is None or not raw.startswith(FORM):
        return None
    try:
        reply = ProfileReply.model_validate_json(raw[len(FORM):].partition(b"\n")[2])
    except ValidationError:
        return None
    return Profile(**{name: getattr(reply, name) for name in Profile.model_fields})


def current(store: Store, client: redis.Redis, keys: Keys, subject: str, now: datetime) -> Profile:
    """The subject's profile at `now`: the materialized one, or built from the store and kept."""
    found = parsed(client.get(keys.profile(subject)))
    if found is None:
        at = revision(client, keys, subject)  # before the scroll: a change after it makes what is built stale
        # Every status: what no longer holds still says which turns were distilled (assembly.undistilled).
        memories = store.get(MemoryFilter(subject))
        forgotten = [e.decode() if isinstance(e, bytes) else e for e in client.smembers(keys.forgotten_events(subject))]
        found = assembly.assemble(subject, at, memories, now, forgotten)
        client.eval(_KEEP, 2, keys.revisions, keys.profile(subject), subject, at, stored(found), feed.START,
                    CACHE_TTL_S)
    return assembly.as_of(found, now)


async def served_async(client: redis.asyncio.Redis, keys: Keys, subject: str, now: datetime) -> bytes | None:
    """The plain reply's bytes as stored, read on an event loop (one GET, no parse: `served`); None when they
    cannot be served as they are."""
    return served(await client.get(keys.profile(subject)), now)


async def cached_async(client: redis.asyncio.Redis, keys: Keys, subject: str, now: datetime) -> Profile | None:
    """The materialized profile at `now`, read on an event loop; None when there is none (a worker builds it)."""
    found = parsed(await client.get(keys.profile(subject)))
    return None if found is None else assembly.as_of(found, now)


def reply(client: redis.Redis, keys: Keys, found: Profile, since: str | None, max_tokens: int | None
          ) -> ProfileReply:
    """The profile with its prompt text (`max_tokens`) and what changed after `since`, as asked."""
    changes = None
    if since is not None:
        pages = [page(client, keys, since, _of(found.subject), feed.MAX_PAGE)]
        while len(pages) < SINCE_PAGES and pages[-1].more and not pages[-1].gap:
            pages.append(page(client, keys, pages[-1].next, _of(found.subject), feed.MAX_PAGE))
        changes = _since(found, since, pages)
    return _reply(found, changes, max_tokens)


async def reply_async(client: redis.asyncio.Redis, keys: Keys, found: Profile, since: str | None,
                      max_tokens: int | None) -> ProfileReply:
    """`reply` on an event loop."""
    changes = None
    if since is not None:
        pages = [await page_async(client, keys, since, _of(found.subject), feed.MAX_PAGE)]
        while len(pages) < SINCE_PAGES and pages[-1].more and not pages[-1].gap:
            pages.append(await page_async(client, keys, pages[-1].next, _of(found.subject), feed.MAX_PAGE))
        changes = _since(found, since, pages)
    return _reply(found, changes, max_tokens)


def _since(found: Profile, since: str, pages: list[feed.ChangesPage]) -> SinceRevision:
    ids = [e.memory_id for p in pages for e in p.entries]
    complete = bool(pages) and not pages[-1].more and not any(p.gap for p in pages)
    return assembly.since(found, since, ids, complete)


def _reply(found: Profile, changes: SinceRevision | None, max_tokens: int | None) -> ProfileReply:
    text = assembly.prompt(found, max_tokens) if max_tokens is not None else None
    return ProfileReply(**dict(found), prompt=text, changes=changes)


def _of(subject: str) -> Callable[[str], bool]:
    return lambda s: s == subject
