"""Operations on the dead-letter streams: look, put back, throw away.

Every operation acts on a selection: explicit entry ids, a `Where` filter (reason, subject,
age), both (an entry must be named and match), or — with neither — the whole DLQ.
"""

from __future__ import annotations

import heapq
import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from itertools import islice
from typing import Any

import redis

from memflow.shared.codec import json_object
from memflow.shared.errors import DecodeError, InvalidInput
from memflow.shared.redisdb.keys import FIELD, Keys
from memflow.shared.settings import PendingSettings
from memflow.shared.unstored import fates, pending

# The one table both ways: "15m" → 900,000 ms, and 900,000 ms → "15m".
UNIT_MS = {"d": 86_400_000, "h": 3_600_000, "m": 60_000, "s": 1_000}
_DURATION = re.compile(r"(\d+)\s*([dhms])")
_ENTRY_ID = re.compile(r"\d+(-\d+)?")
_PAGE = 500


@dataclass(frozen=True)
class DeadLetter:
    id: str
    stage: str
    error: str
    attempts: int
    source: str
    source_id: str
    payload: bytes
    # The subject inside the payload; None when the payload is not a JSON object naming one.
    subject: str | None = None
    # The dead-letter stream it is in: its stage's, of its subject's partition.
    stream: str = ""


@dataclass(frozen=True)
class Where:
    """Which dead letters to act on; a field left None does not filter."""

    error: str | None = None  # substring of the reason, any case
    subject: str | None = None  # the payload's subject, exactly
    older_than_ms: int | None = None  # at least this old
    newer_than_ms: int | None = None  # younger than this

    @property
    def is_empty(self) -> bool:
        return self == Where()


# -- pure: durations, subjects, matching ----------------------------------------------


def parse_duration_ms(text: str) -> int:
    """'30s', '15m', '2h', '7d' (or a sum such as '1h30m') in milliseconds."""
    compact = text.strip().lower()
    parts = _DURATION.findall(compact)
    if not parts or "".join(n + u for n, u in parts) != compact.replace(" ", ""):
        raise InvalidInput("duration", f"{text!r} is not a duration such as 30s, 15m, 2h or 7d")
    return sum(int(n) * UNIT_MS[u] for n, u in parts)


def format_duration(ms: int) -> str:
    """A duration in its largest unit and, when not zero, the next one: '45s', '15m', '2h5m', '3d'."""
    ms = max(ms, 0)  # an entry stamped a moment after Redis answered TIME
    shown: list[str] = []
    units_left = 2
    for unit, size in UNIT_MS.items():
        amount, ms = divmod(ms, size)
        if amount or (unit == "s" and not shown):
            shown.append(f"{amount}{unit}")
        units_left -= bool(shown)
        if not units_left:
            break
    return "".join(shown)


def entry_ms(entry_id: str) -> int:
    """The millisecond timestamp Redis put in a stream entry id: when it was dead-lettered."""
    return int(entry_id.split("-", 1)[0])


def subject_of(payload: bytes) -> str | None:
    # The payload is the stage's message as it arrived, possibly the very reason it was
    # dead-lettered (not JSON, not an object, no subject): then it has no subject.
    try:
        subject = json_object(payload).get("subject")
    except DecodeError:
        return None
    return subject if isinstance(subject, str) else None


def matches(letter: DeadLetter, where: Where, now_ms: int) -> bool:
    age_ms = now_ms - entry_ms(letter.id)
    return ((where.error is None or where.error.casefold() in letter.error.casefold())
            and (where.subject is None or where.subject == letter.subject)
            and (where.older_than_ms is None or age_ms >= where.older_than_ms)
            and (where.newer_than_ms is None or age_ms < where.newer_than_ms))


# -- reading ------------------------------------------------------------------------------


def _decode(stream: str, entry_id: Any, fields: Any) -> DeadLetter:
    def text(name: str) -> str:
        return str(fields.get(name.encode(), b"").decode(errors="replace"))

    payload = fields.get(b"payload", b"")
    return DeadLetter(entry_id.decode(), text("stage"), text("error"), int(text("attempts") or 0),
                      text("source"), text("source_id"), payload, subject_of(payload), stream)


def server_now_ms(client: redis.Redis) -> int:
    # Ages are measured on the clock that stamped the ids (Redis's), not this machine's.
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000


def _scan(client: redis.Redis, stream: str) -> Iterator[DeadLetter]:
    """Every entry, oldest first, a page at a time."""
    start = "-"
    while True:
        page: Any = client.xrange(stream, min=start, max="+", count=_PAGE)
        yield from (_decode(stream, eid, f) for eid, f in page)
        if len(page) < _PAGE:
            return
        start = "(" + page[-1][0].decode()


def _named(client: redis.Redis, streams: Sequence[str], ids: Iterable[str]) -> list[DeadLetter]:
    """The named entries still in the DLQs; an id that is gone, or no entry id at all, names nothing.

    Each partition's DLQ numbers its own entries: two partitions could each hold an entry of the same
    id (written in the same millisecond), and that id then names both."""
    wanted = [(stream, i) for i in dict.fromkeys(ids) if _ENTRY_ID.fullmatch(i) for stream in streams]
    pipe = client.pipeline(transaction=False)
    for stream, entry_id in wanted:
        pipe.xrange(stream, min=entry_id, max=entry_id)
    return sorted((_decode(stream, *found[0]) for (stream, _), found in zip(wanted, pipe.execute(), strict=True)
                   if found), key=lambda letter: entry_key(letter.id))


def entry_key(entry_id: str) -> tuple[int, int]:
    """An entry id as a number pair, to order the entries of several streams by time."""
    ms, _, seq = entry_id.partition("-")
    return int(ms), int(seq or 0)


def select(client: redis.Redis, keys: Keys, stage: str, ids: Sequence[str] | None = None,
           where: Where = Where()) -> Iterator[DeadLetter]:
    """The dead letters of `stage` (all its partitions', oldest first) that are named in `ids` (all when
    None) and match `where`."""
    streams = keys.dlqs(stage)
    found = (heapq.merge(*(_scan(client, s) for s in streams), key=lambda letter: entry_key(letter.id))
             if ids is None else iter(_named(client, streams, ids)))
    if where.is_empty:
        return found
    now_ms = server_now_ms(client)
    return (letter for letter in found if matches(letter, where, now_ms))


def count(client: redis.Redis, keys: Keys, stage: str) -> int:
    """How many dead letters `stage` holds, over its partitions."""
    return sum(int(client.xlen(stream)) for stream in keys.dlqs(stage))


def list_dead(client: redis.Redis, keys: Keys, stage: str, count: int = 100,
              where: Where = Where()) -> list[DeadLetter]:
    return list(islice(select(client, keys, stage, where=where), count))


def show(client: redis.Redis, keys: Keys, stage: str, entry_id: str) -> DeadLetter | None:
    return next(select(client, keys, stage, [entry_id]), None)


# -- acting -------------------------------------------------------------------------------

# One dead letter back on its stream, only by the call that removes it from the DLQ: a second
# replay of the same entry (again, or at the same time from another shell) finds it gone and
# adds nothing. Entries never change once written, so the payload read beforehand is current.
_REPLAY_ONE = """
if redis.call('XDEL', KEYS[1], ARGV[1]) == 0 then return 0 end
redis.call('XADD', KEYS[2], '*', ARGV[2], ARGV[3])
return 1
"""


def replay(client: redis.Redis, keys: Keys, stage: str, ids: Sequence[str] | None = None,
           where: Where = Where(), *, settings: PendingSettings | None = None) -> int:
    """Put the selected dead letters back on the stream they came from; how many went back. What a replayed
    letter says is served as pending again until it lands, as a publish is (`settings`: the pending layer's).

    The selection is read in full first: a replayed entry that fails again lands at the end of
    the same DLQ and must not be met, and replayed, again by this call.
    """
    script = client.register_script(_REPLAY_ONE)
    replayed = 0
    for letter in list(select(client, keys, stage, ids, where)):
        # The source is a stream of the DLQ's partition (same slot): where the entry failed.
        source = letter.source or keys.input_of(stage, keys.partition_in(letter.stream))
        served = pending.serve_again(client, keys, settings or PendingSettings(), stage, letter.payload)
        fates.replayed(client, keys, stage, letter.payload)  # accepted again, before its stage can decide anew
        back = int(script(keys=[letter.stream, source], args=[letter.id, FIELD, letter.payload]))
        if not back:  # replayed or dropped meanwhile by another shell: not served on our word
            pending.settle(client, keys, served)
        replayed += back
    return replayed


def drop(client: redis.Redis, keys: Keys, stage: str, ids: Sequence[str] | None = None,
         where: Where = Where()) -> int:
    """Delete the selected dead letters; how many were still there to delete."""
    doomed: dict[str, list[str]] = {}
    for letter in select(client, keys, stage, ids, where):
        doomed.setdefault(letter.stream, []).append(letter.id)
    return sum(int(client.xdel(stream, *found)) for stream, found in doomed.items())
