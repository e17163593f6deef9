"""What the pipeline is doing now: per stage how much waits, how much failed and how fast it reads;
the RQ queues and the query workers serving them. Read-only: `memflow status` prints it.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import redis
from rq import Queue, Worker

from memflow.pipeline.models import LLMTrace, Trace
from memflow.shared.codec import encode, json_object, validated
from memflow.shared.inference.llm import usage as llm_usage
from memflow.shared.redisdb.durability import durability
from memflow.shared.redisdb.keys import FIELD, STAGES, Keys
from memflow.shared.streaming.backlog import backlog
from memflow.shared.streaming.dlq import server_now_ms

WINDOW_MS = 60_000
_COUNT_PAGE = 1_000

# One page of a stream counted inside Redis: the count and the last id, never the payloads.
_COUNT_ONE_PAGE = """
local page = redis.call('XRANGE', KEYS[1], ARGV[1], ARGV[2], 'COUNT', ARGV[3])
if #page == 0 then return {0, ''} end
return {#page, page[#page][1]}
"""


@dataclass(frozen=True)
class StageStatus:
    stage: str
    length: int  # entries in the stage's input streams (acknowledged ones are kept for the retention window)
    lag: int  # entries the group has not read yet
    pending: int  # read but not acknowledged
    dead: int  # entries in dlq:<stage>
    read_per_s: float | None  # None: Redis lost count (entries deleted from the stream)
    memory_bytes: int = 0  # what the input streams take in Redis (MEMORY USAGE)


@dataclass(frozen=True)
class PipelineStatus:
    stages: list[StageStatus]
    query_queue: int  # searches waiting for a query worker
    jobs_queue: int  # maintenance jobs waiting for one
    query_workers: int  # query workers alive now (their RQ heartbeat key has not expired)
    # How read_per_s was measured: "window" (the last minute) or "sample" (over sample_s).
    throughput: str
    sample_s: float | None = None
    # What an acknowledged publish survives on this server (shared/redisdb/durability.py), and whether that is less
    # than docs/guarantees.md's "fsynced before acknowledged".
    durability: str = ""
    durability_weaker: bool = False
    # Everyone's LLM counters over the last days (shared/inference/llm.py summarise): calls, mean wait per call,
    # fallbacks by reason. Calls are 0 where no LLM is configured.
    llm: dict[str, Any] = field(default_factory=dict)


def read_status(client: redis.Redis, keys: Keys, sample_s: float | None = None,
                queue: redis.Redis | None = None, wait_aof: bool = True) -> PipelineStatus:
    """A snapshot of the pipeline; with `sample_s`, read rates measured over that long (it waits).
    `queue`: the RPC queues' server, when it is not the streams' (it holds the LLM usage too); `wait_aof`:
    MEMFLOW_REDIS_WAIT_AOF, for what an acknowledged publish survives."""
    waiting = backlog(client, keys, STAGES)
    lengths, dead, memory = _stream_sizes(client, keys)
    rates = sampled_rates(client, keys, sample_s) if sample_s else window_rates(client, keys)
    stages = [StageStatus(s, lengths[s], *waiting[s], dead[s], rates[s], memory[s]) for s in STAGES]
    query, jobs = (Queue(name, connection=queue or client) for name in (keys.query_queue, keys.jobs_queue))
    found = durability(client)
    return PipelineStatus(stages, query.count, jobs.count, len(Worker.all(queue=query)),
                          "sample" if sample_s else "window", sample_s or None,
                          found.promise(wait_aof), found.is_weaker(wait_aof), llm_usage(queue or client, keys, None))


def _stream_sizes(client: redis.Redis, keys: Keys) -> tuple[dict[str, int], dict[str, int], dict[str, int]]:
    """(input streams' length, DLQs' length, input streams' bytes) per stage, over the partitions, in
    one pipeline."""
    pipe = client.pipeline(transaction=False)
    for stage in STAGES:
        for p in range(keys.partitions):
            pipe.xlen(keys.input_of(stage, p))
            pipe.xlen(keys.dlq(stage, p))
            pipe.memory_usage(keys.input_of(stage, p), samples=0)  # 0: every entry, not a sample of them
    replies = iter(pipe.execute())
    sizes: dict[str, list[int]] = {stage: [0, 0, 0] for stage in STAGES}
    for stage in STAGES:
        for _ in range(keys.partitions):
            for i in range(3):
                sizes[stage][i] += int(next(replies) or 0)
    return ({s: v[0] for s, v in sizes.items()}, {s: v[1] for s, v in sizes.items()},
            {s: v[2] for s, v in sizes.items()})


# -- throughput ------------------------------------------------------------------------------
#
# Redis keeps no history of when a group read what, so a rate is either inferred from ids or
# measured by waiting:
# - window (the default, no wait): the entries that arrived in the last minute and that the group
#   has already read, per second — an entry id carries its arrival time, and a group reads in id
#   order, so these are the ids between now − 60 s and the group's last-delivered id. For a stage
#   that keeps up this is its read rate over the last minute. A stage behind by more than a minute
#   is reading older entries and shows less than it reads — its lag says so.
# - sample (`sample_s`): XINFO GROUPS `entries-read` (exact on streams nothing deletes from
#   but the retention's trimming of what was read) read twice, `sample_s` apart: what every group reads right now,
#   behind or not, at the price of the wait.


def window_rates(client: redis.Redis, keys: Keys) -> dict[str, float | None]:
    start_id = f"{server_now_ms(client) - WINDOW_MS}-0"
    rates: dict[str, float | None] = {}
    for stage in STAGES:
        read = 0
        for p in range(keys.partitions):
            group = _group(client, keys, stage, p)
            last_id = _text(group["last-delivered-id"]) if group else "0-0"
            read += _count_between(client, keys.input_of(stage, p), start_id, last_id)
        rates[stage] = read * 1000 / WINDOW_MS
    return rates


def _count_between(client: redis.Redis, stream: str, first_id: str, last_id: str) -> int:
    """Entries with ids in [first_id, last_id], counted a page at a time in Redis."""
    count_page = client.register_script(_COUNT_ONE_PAGE)
    total, start = 0, first_id
    while True:
        counted, last = count_page(keys=[stream], args=[start, last_id, _COUNT_PAGE])
        total += int(counted)
        if int(counted) < _COUNT_PAGE:
            return total
        start = "(" + _text(last)


def sampled_rates(client: redis.Redis, keys: Keys, sample_s: float) -> dict[str, float | None]:
    before, started = _entries_read(client, keys), time.monotonic()
    time.sleep(sample_s)
    after, elapsed_s = _entries_read(client, keys), time.monotonic() - started
    return {stage: _rate(before[stage], after[stage], elapsed_s) for stage in STAGES}


def _rate(before: int | None, after: int | None, elapsed_s: float) -> float | None:
    return None if before is None or after is None else (after - before) / elapsed_s


def _entries_read(client: redis.Redis, keys: Keys) -> dict[str, int | None]:
    counts: dict[str, int | None] = {}
    for stage in STAGES:
        read = [_read_count(_group(client, keys, stage, p)) for p in range(keys.partitions)]
        counts[stage] = None if None in read else sum(c for c in read if c is not None)
    return counts


def _read_count(group: dict[Any, Any] | None) -> int | None:
    # A group that has read nothing (or does not exist yet) answers nil, not 0. Every supported
    # server has the count (shared.redisdb.connections.MIN_VERSION); nil after reads means Redis lost track
    # of it (entries deleted from the stream), and then no rate can be told.
    if group is None or _text(group["last-delivered-id"]) == "0-0":
        return 0
    value = group.get("entries-read")
    return None if value is None else int(value)


def _group(client: redis.Redis, keys: Keys, stage: str, partition: int) -> dict[Any, Any] | None:
    """The stage's consumer group on one partition as XINFO GROUPS describes it; None before it exists."""
    try:
        groups: Any = client.xinfo_groups(keys.input_of(stage, partition))
    except redis.ResponseError:  # no such key: nothing was ever written to the stream
        return None
    return next((g for g in groups if _text(g["name"]) == keys.group(stage)), None)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


# The subject's index of its search traces in the shared feed (Keys.traces_of): its newest ids, this many,
# kept this long after its last search. A read of the subject's traces reads these, never a scan of the feed.
TRACES_PER_SUBJECT = 100
TRACES_KEEP_S = 7 * 24 * 3600


@dataclass(frozen=True)
class Traces:
    """The capped `traces` feed (searches, LLM calls) and each subject's index of its searches in it."""

    client: redis.Redis
    keys: Keys
    maxlen: int

    def add(self, entry: Trace | LLMTrace, via: redis.Redis | None = None) -> None:
        """An entry of the feed; `via`: a pipeline the caller sends with more (a search's latency), else sent now."""
        client = self.client if via is None else via
        client.xadd(self.keys.traces, {FIELD: encode(entry)}, maxlen=self.maxlen, approximate=True)

    def remember(self, subject: str, entry_id: bytes | str) -> None:
        remember_trace(self.client, self.keys, subject, entry_id)


def remember_trace(client: redis.Redis, keys: Keys, subject: str, entry_id: bytes | str) -> None:
    """Index a search trace just added to the feed under its subject (bounded, expiring)."""
    key = keys.traces_of(subject)
    pipe = client.pipeline(transaction=True)  # one key
    pipe.lpush(key, entry_id)
    pipe.ltrim(key, 0, TRACES_PER_SUBJECT - 1)
    pipe.expire(key, TRACES_KEEP_S)
    pipe.execute()


def recent_traces(client: redis.Redis, keys: Keys, subject: str, count: int) -> list[Trace]:
    """The subject's last `count` search traces (at most TRACES_PER_SUBJECT), newest first: those its index
    names still in the feed (the feed is capped; a quiet subject's old searches may have left it)."""
    ids = [_text(i) for i in client.lrange(keys.traces_of(subject), 0, min(count, TRACES_PER_SUBJECT) - 1)]
    if not ids:
        return []
    pipe = client.pipeline(transaction=False)
    for entry_id in ids:
        pipe.xrange(keys.traces, min=entry_id, max=entry_id)
    found: list[Trace] = []
    for page in pipe.execute():
        for _, fields in page:
            record = json_object(fields[FIELD.encode()])
            if record.get("kind") == "search" and record.get("subject") == subject:
                found.append(validated(record, Trace))
    return found


# -- one subject's footprint in Redis ------------------------------------------------------------


@dataclass(frozen=True)
class SubjectKey:
    what: str  # what the key holds (its owner's name for it)
    key: str
    bytes: int  # MEMORY USAGE (every element counted)
    ttl_s: int | None  # None: kept until deleted (forget's receipts and tombstones)


@dataclass(frozen=True)
class SubjectFootprint:
    """Every key memflow keeps for one subject that exists now, with its size and what is left of its life.
    Not listed: its work in the shared partition streams and feeds (`stages` above), and the LLM plan cache
    (`Keys.plan_cache`, one key per query, each expiring MEMFLOW_PLAN_CACHE_TTL_S after it was written)."""

    subject: str
    keys: list[SubjectKey]

    @property
    def bytes(self) -> int:
        return sum(k.bytes for k in self.keys)


# What of a subject's keys lives on the queues' server, beside the queues (docs/architecture.md "Which writes are
# durable"): what a search writes.
TRANSIENT_KEYS = frozenset({"utilisation", "llm-usage", "traces"})


def subject_keys(client: redis.Redis, keys: Keys, subject: str) -> list[tuple[str, str]]:
    """(what, key) of every key a subject may have, by its owners' layouts (shared/redisdb/keys.py); those named in
    TRANSIENT_KEYS are on the queues' server."""
    sessions = sorted(_text(s) for s in client.smembers(keys.session_buffers(subject)))
    return [("pending", keys.pending(subject)), ("sessions", keys.session_buffers(subject)),
            *((f"session-buffer:{s}", keys.session_buffer(subject, s)) for s in sessions),
            ("utilisation", keys.utilisation(subject)), ("llm-usage", keys.llm_usage(subject)),
            ("uses", keys.uses(subject)), ("uses-folding", keys.uses_folding(subject)),
            ("uses-seen", keys.uses_seen(subject)), ("traces", keys.traces_of(subject)),
            ("forgotten", keys.forgotten(subject)), ("forgotten-events", keys.forgotten_events(subject)),
            ("forgotten-contents", keys.forgotten_contents(subject))]


def subject_footprint(client: redis.Redis, keys: Keys, subject: str,
                      queue: redis.Redis | None = None) -> SubjectFootprint:
    """What `subject` takes in Redis now (`memflow status --subject`); `queue`: the queues' server when not `client`."""
    named = subject_keys(client, keys, subject)
    durable = [(what, key) for what, key in named if what not in TRANSIENT_KEYS]
    transient = [(what, key) for what, key in named if what in TRANSIENT_KEYS]
    found = _sizes(client, durable) + _sizes(queue or client, transient)
    return SubjectFootprint(subject, sorted(found, key=lambda k: named.index((k.what, k.key))))


def _sizes(client: redis.Redis, named: list[tuple[str, str]]) -> list[SubjectKey]:
    """The keys of `named` that exist on `client`, with their bytes and time left."""
    pipe = client.pipeline(transaction=False)
    for _, key in named:
        pipe.memory_usage(key, samples=0)
        pipe.ttl(key)
    replies = pipe.execute()
    return [SubjectKey(what, key, int(size), None if int(ttl) == -1 else int(ttl))
            for (what, key), size, ttl in zip(named, replies[::2], replies[1::2], strict=True) if size is not None]
