"""Provable forgetting: forget a memory everywhere memflow kept its words, and prove it.

`forget` (workers/query.py) soft-deletes and purges the points from the index. The words also
live on in Redis: in the session buffer of the turn, in the acknowledged entries of the work
streams that carried it (events → extract → resolve → upsert), in dead letters and in the
`changes` feed. `scrub` removes those, except entries still pending (a stage is working on
them). A receipt per forgotten memory (its id, its source events, the SHA-256 of its content:
never the content) is kept so that `verify` can prove, later and without the words, that the
store holds no point for it and that no stream, buffer or feed still names it.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

import orjson
import redis

from memflow.pipeline.forgetting import Reach, reach, still_holding
from memflow.pipeline.models import Candidate, DeleteOp, Memory, MType, MutationOp, PatchOp, Status
from memflow.pipeline.pending import Said, drafts, pending_id
from memflow.pipeline.writes import content_hash, mutation
from memflow.shared.errors import MemflowError
from memflow.shared.redisdb.connections import NotDurable, safe_url
from memflow.shared.redisdb.durability import fsync_timeout_ms
from memflow.shared.redisdb.keys import STAGES, Keys
from memflow.shared.storage.store import MemoryFilter, Store
from memflow.shared.unstored import fates
from memflow.shared.unstored import pending as pending_layer
from memflow.shared.unstored.buffers import SessionBuffers
from memflow.shared.writer.applier import Applier
from memflow.workers.runtime import Context
from memflow.workers.trigger import buffers

log = logging.getLogger(__name__)
PAGE = 1000
# The action of a deletion's announcement on `changes`: it names the memory, never its words, and is
# the one entry naming a forgotten memory that scrub keeps (a consumer mirroring the feed must learn of it).
FORGET = "forget"


@dataclass(frozen=True)
class Places:
    """The Redis places that can hold a subject's words besides the store: its partition's work and dead-letter
    streams, the `changes` feed, its session buffers (found by the subject's own index of them, `SessionBuffers.of`,
    not a SCAN of the keyspace) and its pending layer; and the forget ledger."""

    client: redis.Redis
    keys: Keys
    buffers: SessionBuffers
    # WAITAOF's timeout for the tombstones (keep_receipts), None when the server cannot be waited on.
    fsync_timeout_ms: int | None = None

    @classmethod
    def of(cls, ctx: Context) -> Places:
        r = ctx.settings.redis
        # A cluster's pipeline spans nodes, and WAITAOF answers for one: there, the nodes' own fsync policy.
        timeout_ms = None if r.cluster else fsync_timeout_ms(ctx.client, safe_url(ctx.settings), r.wait_aof,
                                                             r.wait_aof_timeout_ms)
        return cls(ctx.client, ctx.keys, buffers(ctx), timeout_ms)


def forget(applier: Applier, places: Places, subject: str, memory_ids: list[str] | None, contains: str | None,
           now: datetime) -> dict[str, Any]:
    """Soft-delete (status deleted, announced on `changes`), purge from the index, then scrub the words
    from Redis (`scrub`). After it returns no search, pack or inspect can return these
    memories: they are not in the index, and no write can put them back: what to forget is read, its
    tombstones left and its deletion applied under the subject's write lock, and every later write
    reads the tombstones (`keep_receipts`). A receipt of each (never its words) is kept for `verify`.

    The forget reaches the words (pipeline/forgetting.py): the records of the turns the named memories were
    distilled from go with them where they hold their words (`records`), and the records around those turns
    stop quoting them; what still holds the words after that is named (`still_held`), not forgotten unasked."""
    if memory_ids is None and not contains:
        raise MemflowError("forget needs memory ids or a `contains` text")
    client, keys = places.client, places.keys
    with applier.holding(subject) as held:
        named = _forget_targets(applier.store, subject, memory_ids, contains)
        reached = _reach(applier.store, subject, named, contains)
        targets = [*named, *reached.records]
        said = _pending_targets(client, keys, subject, memory_ids, contains)
        keep_receipts(client, keys, subject, targets, events=[s.turn.event_id for s in said], at=now,
                      fsync_timeout_ms=places.fsync_timeout_ms, fingerprints=reached.fingerprints)
        deleted = {"status": Status.deleted.value}
        ops: list[MutationOp] = [*(PatchOp(id=m.id, expected_rev=m.rev, set=deleted, why="forget requested")
                                   for m in targets), *(DeleteOp(id=m.id) for m in targets), *reached.unsaid]
        if ops:  # the wish wins over any change made since the targets were read ("rebase")
            held.apply(mutation(subject, FORGET, "forget requested", now, ops, on_stale="rebase"))
    scrubbed = scrub(places, subject, targets, events=[s.turn.event_id for s in said])
    if contains:
        for place, n in scrub_words(places, subject, contains).items():
            scrubbed[place] = scrubbed.get(place, 0) + n
    shown = [i for s in said for i in _pending_ids(subject, s)]
    return {"count": len(named) + len(said), "ids": [m.id for m in named] + shown,
            "records": [r.id for r in reached.records], "still_held": reached.still_held, "scrubbed": scrubbed}


def _reach(store: Store, subject: str, named: list[Memory], contains: str | None) -> Reach:
    """What forgetting `named` reaches among the subject's points (every one is read: a turn's record, the
    records quoting it and any other point holding its words may each be anywhere)."""
    if not named:
        return Reach()
    return reach(named, store.get(MemoryFilter(subject)), contains)


def scrub_words(places: Places, subject: str, words: str) -> dict[str, int]:
    """Remove the raw copies of `words` that no memory holds: a secret is redacted from every memory, so the
    memories `contains` finds never name the entries that still carry it (written before publish redacted,
    or by a client that does not). The subject's partition's work and dead-letter streams (not entries a stage
    is still working on), and its session buffers. Then the AOF is compacted (`compact_aof`): until rewritten
    it still holds every command that wrote the words."""
    client, keys = places.client, places.keys
    marks = _word_marks(words)
    removed = {stream: _scrub_stream(client, keys, stream, subject, marks, unacked)
               for stream, unacked in _streams(client, keys, subject) if stream != keys.changes}
    removed["session_buffers"] = sum(_scrub_buffer_words(client, key, marks) for key in places.buffers.of(subject))
    removed["fates"] = _scrub_buffer_words(client, keys.fates(subject), marks)  # a dead letter's reason may quote them
    found = {place: n for place, n in removed.items() if n}
    if found:
        compact_aof(client)
    return found


def compact_aof(client: Any) -> bool:
    """Start an AOF rewrite (BGREWRITEAOF) on the server and on each of its replicas: the new files hold the data
    as it is now, without the commands that wrote forgotten words. A replica keeps its own AOF, written from the
    replication stream: rewriting the master's alone left the words on every replica's disk. False when the server
    refuses (a rewrite already running, a managed Redis that forbids the command): `memflow compact-aof` is then
    the way to run it later; a replica that refuses or cannot be reached is logged."""
    started = _rewrite(client)
    for replica in _replicas(client):
        address = replica.connection_pool.connection_kwargs
        if not _rewrite(replica):
            log.warning("the AOF of replica %s:%s was not rewritten: run `memflow compact-aof` against it",
                        address.get("host"), address.get("port"))
        replica.close()
    return started


# How long a compaction waits for the replicas to hold what was just scrubbed: rewritten before that, a replica's
# new file would hold the words still.
REPLICA_WAIT_MS = 5000


def _replicas(client: Any) -> list[redis.Redis]:
    """Connections to the replicas `client`'s server names (INFO replication), once they have caught up (WAIT). A
    cluster client: none (each node's replicas are its own, and `memflow compact-aof` is run per node)."""
    if not isinstance(client, redis.Redis):
        return []
    try:
        found = [v for k, v in client.info("replication").items() if k.startswith("slave") and isinstance(v, dict)]
        if found:
            client.wait(len(found), REPLICA_WAIT_MS)
    except redis.RedisError as exc:
        log.warning("cannot list the replicas to rewrite their AOF: %s", exc)
        return []
    auth = client.connection_pool.connection_kwargs
    return [redis.Redis(host=str(r["ip"]), port=int(r["port"]), username=auth.get("username"),
                        password=auth.get("password"), socket_timeout=5, socket_connect_timeout=5) for r in found]


def _rewrite(client: Any) -> bool:
    try:
        client.bgrewriteaof()
    except redis.RedisError:
        return False
    return True


def _word_marks(words: str) -> list[bytes]:
    """How words appear in a payload: as written, and inside a JSON string (quotes and non-ASCII escaped)."""
    return list(dict.fromkeys([words.encode(), orjson.dumps(words)[1:-1]]))


def _scrub_buffer_words(client: redis.Redis, key: str, marks: list[bytes]) -> int:
    doomed = [field for field, value in client.hgetall(key).items() if any(m in value for m in marks)]
    return int(client.hdel(key, *doomed)) if doomed else 0


def _holding(client: redis.Redis, key: str, marks: list[bytes]) -> int:
    return sum(1 for value in client.hgetall(key).values() if any(m in value for m in marks))


def residue_of_words(places: Places, subject: str, words: str) -> dict[str, int]:
    """Where raw copies of `words` are still held for the subject: streams (any entry, pending ones too),
    session buffers, the pending layer."""
    client, keys = places.client, places.keys
    marks = _word_marks(words)
    found = {stream: sum(1 for _ in _naming(client, keys, stream, subject, marks))
             for stream, _ in _streams(client, keys, subject) if stream != keys.changes}
    found["session_buffers"] = sum(_holding(client, key, marks) for key in places.buffers.of(subject))
    found["pending"] = _holding(client, keys.pending(subject), marks)
    found["fates"] = _holding(client, keys.fates(subject), marks)
    return {place: n for place, n in found.items() if n}


def _pending_targets(client: redis.Redis, keys: Keys, subject: str, ids: list[str] | None,
                     contains: str | None) -> list[Said]:
    """What the subject said that is not stored yet and the forget names: by a pending hit's id, or by its words.
    Its event is marked forgotten with the stored memories' (nothing is written from it once it lands) and its
    entry deleted."""
    wanted = set(ids or ())
    return [s for s in pending_layer.read(client, keys, subject)
            if wanted & set(_pending_ids(subject, s)) or (contains and contains.lower() in s.turn.text.lower())]


def _pending_ids(subject: str, entry: Said) -> list[str]:
    return [pending_id(entry.turn.event_id, n) for n in range(len(drafts(subject, entry)))]


def _forget_targets(store: Store, subject: str, ids: list[str] | None, contains: str | None) -> list[Memory]:
    found = store.get(MemoryFilter(subject, ids=ids))
    if contains:
        found = [m for m in found if contains.lower() in m.content.lower()]
    return found


def receipt(memory: Memory, fingerprints: Sequence[str] = ()) -> dict[str, Any]:
    """`words`: the fingerprints of the normalised sentences it was forgotten for (pipeline/forgetting.py), so
    that `verify` can tell, without the words, whether a point still holds them."""
    return {"id": memory.id, "events": memory.source_event_ids, "sha256": content_hash(memory.content),
            "words": list(fingerprints)}


def keep_receipts(client: redis.Redis, keys: Keys, subject: str, memories: Iterable[Memory],
                  events: Iterable[str] = (), *, at: datetime, fsync_timeout_ms: int | None = None,
                  fingerprints: Mapping[str, Sequence[str]] | None = None) -> None:
    """A receipt per memory, and the tombstones every later write reads (pipeline/writes.py Tombstones): its
    source events (and `events`: pending ones) marked forgotten, and its words (by hash) forgotten `at`. A
    write still in flight that carries them (a session's end being extracted, a redelivered upsert, a batch
    decided before the forget) must not write the memory back. With `fsync_timeout_ms`, it returns once the
    server's AOF holds them on disk (WAITAOF): before the store deletes what they guard, so that a kill -9 of
    the server cannot take them back while the deletion stays (NotDurable past the timeout: nothing deleted).
    `fingerprints`: per memory id, those of the words it was forgotten for (its receipt's `words`)."""
    memories = list(memories)
    mapping = {m.id: orjson.dumps(receipt(m, (fingerprints or {}).get(m.id, ()))).decode() for m in memories}
    events = {e for m in memories for e in m.source_event_ids} | set(events)
    # Not one MULTI: the keys are the subject's, in several cluster slots. Every write is idempotent
    # and comes before any deletion, so a forget cut short between them is reported failed and redone.
    pipe = client.pipeline(transaction=False)
    if mapping:
        pipe.hset(keys.forgotten(subject), mapping=mapping)  # type: ignore[arg-type]
        pipe.hset(keys.forgotten_contents(subject),
                  mapping={content_hash(m.content): at.isoformat() for m in memories})
    if events:
        pipe.sadd(keys.forgotten_events(subject), *events)
    if fsync_timeout_ms is not None:
        pipe.waitaof(1, 0, fsync_timeout_ms)
    replies = pipe.execute()
    if fsync_timeout_ms is not None and replies[-1][0] < 1:
        raise NotDurable(f"the server did not fsync {subject}'s forget tombstones within {fsync_timeout_ms} ms "
                         "(MEMFLOW_REDIS_WAIT_AOF_TIMEOUT_MS): nothing was deleted; forget again")


def unforgotten(client: redis.Redis, keys: Keys, candidates: Sequence[Candidate]) -> list[bool]:
    """For each candidate, whether it may be written: False when every event it was read from was forgotten."""
    pipe = client.pipeline(transaction=False)
    for c in candidates:
        pipe.smismember(keys.forgotten_events(c.subject), c.source_event_ids)
    return [not all(flags) for flags in pipe.execute()]


def scrub(places: Places, subject: str, memories: list[Memory], events: Iterable[str] = ()) -> dict[str, int]:
    """Remove every trace of these memories' words (and of `events`') from Redis; the count removed per place."""
    said = {e for m in memories for e in m.source_event_ids} | set(events)
    marks = _marks([m.id for m in memories], said)
    client, keys = places.client, places.keys
    removed = {"session_buffers": _scrub_buffers(places, subject, said),
               "pending": int(client.hdel(keys.pending(subject), *said)) if said else 0,
               "fates": fates.forget(client, keys, subject, said)}  # they name the memories forgotten
    for stream, unacked in _streams(client, keys, subject):
        removed[stream] = _scrub_stream(client, keys, stream, subject, marks, unacked)
    return {place: n for place, n in removed.items() if n}


def verify(store: Store, places: Places, subject: str, memory_ids: list[str],
           contains: str | None = None) -> dict[str, Any]:
    """The proof: no point for these ids in the store (any status), no Redis place naming them, and no point
    still holding their words (`still_held`, by the receipts' fingerprints: pipeline/forgetting.py); with
    `contains`, no Redis place of the subject's still holding those words raw either."""
    client, keys = places.client, places.keys
    raw = client.hmget(keys.forgotten(subject), memory_ids) if memory_ids else []
    receipts = [orjson.loads(r) for r in raw if r]
    unknown = sorted(set(memory_ids) - {r["id"] for r in receipts})
    events = {e for r in receipts for e in r["events"]}
    in_store = [m.id for m in store.get(MemoryFilter(subject, ids=memory_ids))] if memory_ids else []
    marks = _marks(memory_ids, events)
    residue = {stream: n for stream, _ in _streams(client, keys, subject)
               if (n := sum(1 for _ in _naming(client, keys, stream, subject, marks)))}
    buffered = _buffered(places, subject, events)
    if buffered:
        residue["session_buffers"] = buffered
    held = _still_pending(client, keys, subject, events)
    if held:
        residue["pending"] = held
    profile = client.get(keys.profile(subject))  # dropped by the forget's announcement (shared/changes/profiles.py)
    if profile and any(mark in profile for mark in marks):
        residue["profile"] = 1
    others = [m for m in store.get(MemoryFilter(subject)) if m.id not in memory_ids] if receipts else []
    quoting = _quoting(others, {r["sha256"] for r in receipts})
    if quoting:
        residue["record_context"] = quoting
    if contains:
        for place, n in residue_of_words(places, subject, contains).items():
            residue[f"raw:{place}"] = n
    still_held = still_holding(others, {w for r in receipts for w in r.get("words", ())})
    return {"subject": subject, "ids": memory_ids, "unknown": unknown, "in_store": in_store, "residue": residue,
            "still_held": still_held, "verified": not unknown and not in_store and not residue and not still_held}


def _still_pending(client: redis.Redis, keys: Keys, subject: str, events: set[str]) -> int:
    """How many of these events are still served as said and not stored (shared/unstored/pending.py)."""
    if not events:
        return 0
    return sum(1 for held in client.hmget(keys.pending(subject), sorted(events)) if held)


def _quoting(points: list[Memory], hashes: set[str]) -> int:
    """How many records still quote a forgotten turn in their context (by the receipts' hashes)."""
    if not hashes:
        return 0
    records = [m for m in points if m.mtype is MType.episode]
    return sum(any(hashlib.sha256(line.encode()).hexdigest() in hashes for line in r.context.split("\n"))
               for r in records)


def _marks(ids: Iterable[str], events: Iterable[str]) -> list[bytes]:
    """How a payload names a memory or an event: as a JSON string."""
    return [orjson.dumps(x) for x in (*ids, *events)]


def _streams(client: redis.Redis, keys: Keys, subject: str) -> list[tuple[str, set[str]]]:
    """Every stream that can hold the subject's words, with the entries still pending in it: the work
    and dead-letter streams of its partition (no other one carries its work), and the changes feed.
    The work streams hold what was acknowledged for the retention window only: what a scrub reads is
    bounded by that window's traffic in one partition, not by all history."""
    partition = keys.partition(subject)
    work = [(keys.input_of(stage, partition), _pending(client, keys, stage, partition)) for stage in STAGES]
    return work + [(keys.dlq(stage, partition), set()) for stage in STAGES] + [(keys.changes, set())]


def _pending(client: redis.Redis, keys: Keys, stage: str, partition: int) -> set[str]:
    stream = keys.input_of(stage, partition)
    if not client.exists(stream):
        return set()
    try:
        found = client.xpending_range(stream, keys.group(stage), min="-", max="+", count=1_000_000)
    except redis.ResponseError as exc:  # published to, never read: no stage has made its group yet
        if "NOGROUP" not in str(exc):
            raise
        return set()
    return {_text(p["message_id"]) for p in found}


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


# One page of a stream searched inside Redis: its last id, then the ids of the entries of the subject (ARGV[4]: a
# field of the entry, or of the dead letter's payload, is a JSON object naming it) whose values hold one of the
# marks (ARGV[5..]), but, on the `changes` feed (ARGV[3] = 1), the announcements of deletions. A partition's streams
# carry many subjects: a word or an event id one subject forgets may be another's, whose entries are not its to
# scrub, nor its to be told of. Only ids come back: a scrub of a partition's retention window moves no payload.
_NAMING_PAGE = """
local page = redis.call('XRANGE', KEYS[1], ARGV[1], '+', 'COUNT', ARGV[2])
local out = {#page > 0 and page[#page][1] or ''}
local function theirs(values)
  for _, value in ipairs(values) do
    local ok, said = pcall(cjson.decode, value)
    if ok and type(said) == 'table' and said['subject'] == ARGV[4] then return said end
  end
  return nil
end
for _, entry in ipairs(page) do
  local values = {}
  for i = 2, #entry[2], 2 do values[#values + 1] = entry[2][i] end
  local blob = table.concat(values, ' ')
  for m = 5, #ARGV do
    if string.find(blob, ARGV[m], 1, true) then
      local said = theirs(values)
      if said and (ARGV[3] ~= '1' or said['action'] ~= 'forget') then
        out[#out + 1] = entry[1]
      end
      break
    end
  end
end
return out
"""


def _naming(client: redis.Redis, keys: Keys, stream: str, subject: str, marks: list[bytes]) -> Iterator[str]:
    """The ids of the subject's entries of `stream` whose payload names one of `marks`, but for the announcements
    of deletions on `changes`: searched in Redis a page at a time, only the ids read back."""
    search = client.register_script(_NAMING_PAGE)
    feed = "1" if stream == keys.changes else "0"
    start = "-"
    while True:
        last, *found = search(keys=[stream], args=[start, PAGE, feed, subject, *marks])
        yield from (_text(i) for i in found)
        if not last:
            return
        start = "(" + _text(last)


def _scrub_stream(client: redis.Redis, keys: Keys, stream: str, subject: str, marks: list[bytes],
                  pending: set[str]) -> int:
    doomed = [entry_id for entry_id in _naming(client, keys, stream, subject, marks) if entry_id not in pending]
    return int(client.xdel(stream, *doomed)) if doomed else 0


def _scrub_buffers(places: Places, subject: str, events: set[str]) -> int:
    if not events:
        return 0
    return sum(int(places.client.hdel(key, *events)) for key in places.buffers.of(subject))


def _buffered(places: Places, subject: str, events: set[str]) -> int:
    if not events:
        return 0
    return sum(sum(1 for e in events if places.client.hexists(key, e)) for key in places.buffers.of(subject))
