"""`memflow bench profile`: what reading a subject's profile costs at `size` memories (issue 31: under 5 ms p95).

A fresh embedded system (its own Redis and store, the query worker in this process) and one `memflow serve`
process. One subject is filled with `size` memories straight through the store (random unit vectors), a mix
as a long-lived user's store holds it: what happened (episodes, events, session context: never in a profile),
old versions (superseded, archived), the user's facts, standing preferences, rules and decisions, facts about
some forty people in their life, and a few open contests. Then, `reads` times each, interleaved so that a noisy
moment on a shared machine hits them alike:

- `floor`: one GET of the kept profile's bytes from Redis on an event loop, the physical limit of a read;
- `cached`: the plain read as `GET /v1/subjects/{s}/profile` serves it, in process (shared/changes/profiles.py
  `served_async`: the same GET, the header checked, the bytes served as they are);
- `parsed`: a read asking for the prompt text (`max_tokens=600`, as the MCP tool does): parsed, `as_of`,
  the prompt built within its budget;
- `http`: the plain read over HTTP from the live server, a keep-alive connection (uvicorn, the key checked),
  next to `http_floor`: `GET /v1/subjects/{s}/traces?count=1` on the same connection (a key-checked route
  that reads one empty Redis list: the server's least work for a read).

Then the rebuild after a change, `rebuilds` times: one statement written through the real write path (gate,
resolve, upsert; the applier drops the kept profile as it announces the change), the pipeline left to go
idle, then the next plain read over HTTP (a query worker scrolls the subject, assembles, keeps) and the read
after it (served as kept again). And what one rebuild is made of, in process: the store's scroll, the
assembly, the serialization.
"""

from __future__ import annotations

import asyncio
import random
import time
import uuid
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import numpy as np
import redis.asyncio

from memflow.bench.api import serving
from memflow.bench.perf import AT, DAYS, NAMES, NOUNS, emit, machine, on_fresh_system, pct_ms, say
from memflow.pipeline import profile as assembly
from memflow.pipeline.models import SEARCHABLE_STATUSES, Dir, Memory, MType, Source, Status
from memflow.shared.admission.apikeys import KeyStore
from memflow.shared.changes import profiles
from memflow.shared.settings import Settings
from memflow.shared.storage.store import MemoryFilter
from memflow.workers.embedded import Embedded

SUBJECT = "bench-profile"
TARGET_P95_MS = 5.0
PEOPLE = ["wife", "mother", "father", "son", "daughter", "brother", "sister", "manager", "colleague", "friend"]
# The mix of a long-lived user's store, as shares of `size` (the rest: episodes).
#   (share, mtype, dir, about a person?, status)
MIX: list[tuple[float, MType, Dir, bool, Status]] = [
    (0.10, MType.event, Dir.events, False, Status.active),
    (0.05, MType.session_context, Dir.general, False, Status.active),
    (0.02, MType.temp_preference, Dir.preferences, False, Status.active),
    (0.10, MType.fact, Dir.entities, False, Status.superseded),
    (0.03, MType.fact, Dir.entities, False, Status.archived),
    (0.15, MType.fact, Dir.entities, False, Status.active),
    (0.08, MType.preference, Dir.preferences, False, Status.active),
    (0.03, MType.rule, Dir.system, False, Status.active),
    (0.02, MType.decision, Dir.general, False, Status.active),
    (0.12, MType.fact, Dir.entities, True, Status.active),
]
CONTESTS = 10  # pairs of the user's facts contesting each other
OPENERS = {MType.preference: "I prefer", MType.rule: "Always remember to", MType.decision: "We decided to use",
           MType.temp_preference: "For today I'd like", MType.session_context: "Right now I am working on"}


# -- the subject ----------------------------------------------------------------------------------


def mix(size: int, rng: random.Random) -> list[Memory]:
    """`size` memories of SUBJECT in the MIX's shares, CONTESTS contested pairs among the user's facts."""
    kinds = [(mtype, dir_, person, status) for share, mtype, dir_, person, status in MIX
             for _ in range(int(share * size))]
    kinds += [(MType.episode, Dir.events, False, Status.active)] * (size - len(kinds))
    memories = [_memory(i, *kind, rng) for i, kind in enumerate(kinds)]
    own_facts = [m for m in memories if m.mtype is MType.fact and m.about == "self" and m.status is Status.active]
    for a, b in zip(own_facts[:CONTESTS], own_facts[CONTESTS:2 * CONTESTS], strict=True):
        a.status = b.status = Status.contested
        a.conflicts_with, b.conflicts_with = [b.id], [a.id]
    return memories


def _memory(i: int, mtype: MType, dir_: Dir, person: bool, status: Status, rng: random.Random) -> Memory:
    about = f"{rng.choice(PEOPLE)}:{rng.choice(NAMES).lower()}" if person else "self"
    who = f"My {about.split(':')[0]} {about.split(':')[1].title()}" if person else "I"
    opener = OPENERS.get(mtype, f"{who} {'keeps' if person else 'keep'}")
    text = (f"{opener} the {rng.choice(NOUNS)} of {rng.choice(NAMES)} in mind on {rng.choice(DAYS)}s, "
            f"item {i}")
    at = AT - timedelta(minutes=i)  # one a minute, the newest at AT
    return Memory(id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{SUBJECT}/{i}")), subject=SUBJECT,
                  uri=f"mem://{SUBJECT}/{dir_.value}/bench.{i}", dir=dir_, mtype=mtype, key=f"bench.{i}",
                  content=text, confidence=0.9, source=Source.explicit, status=status, about=about,
                  created_at=at, updated_at=at, source_event_ids=[f"bench-{i}"])


def seed(system: Embedded, size: int, batch: int = 5000) -> dict[str, int]:
    """SUBJECT filled with `size` memories of the mix through the store, with random unit vectors."""
    rng, draw = random.Random(size), np.random.default_rng(size)
    memories = mix(size, rng)
    dim = system.ctx.embedder.dim
    for start in range(0, len(memories), batch):
        part = memories[start:start + batch]
        vectors = draw.standard_normal((len(part), dim), dtype=np.float32)
        vectors /= np.linalg.norm(vectors, axis=1, keepdims=True)
        system.ctx.store.put(part, vectors.tolist())
    return {"memories": size, "searchable": sum(m.status in SEARCHABLE_STATUSES for m in memories)}


# -- reading it -----------------------------------------------------------------------------------


def figures(seconds: list[float]) -> dict[str, float]:
    return {"p50_ms": pct_ms(seconds, 0.5), "p95_ms": pct_ms(seconds, 0.95), "max_ms": pct_ms(seconds, 1.0)}


async def _timed(fn: Callable[[], Awaitable[object]]) -> tuple[float, object]:
    started = time.perf_counter()
    got = await fn()
    return time.perf_counter() - started, got


async def in_process(system: Embedded, reads: int) -> dict[str, Any]:
    """floor, cached and parsed, interleaved, on one event loop as the route runs them."""
    keys, url = system.client.keys, system.settings.redis.url or ""
    aclient = redis.asyncio.Redis.from_url(url)
    times: dict[str, list[float]] = {"floor": [], "cached": [], "parsed": []}

    async def parsed() -> object:
        found = await profiles.cached_async(aclient, keys, SUBJECT, datetime.now(UTC))
        assert found is not None
        return await profiles.reply_async(aclient, keys, found, None, 600)

    ways: dict[str, Callable[[], Awaitable[object]]] = {
        "floor": lambda: aclient.get(keys.profile(SUBJECT)),
        "cached": lambda: profiles.served_async(aclient, keys, SUBJECT, datetime.now(UTC)),
        "parsed": parsed}
    order, rng = list(ways), random.Random(reads)
    try:
        for _ in range(reads):
            rng.shuffle(order)  # a noisy moment, or a thread taking the GIL back after a parse, hits each alike
            for name in order:
                way = ways[name]
                took, got = await _timed(way)
                if got is None:
                    raise SystemExit(f"the {name} read found no kept profile")
                times[name].append(took)
    finally:
        await aclient.aclose()
    return {name: figures(t) for name, t in times.items()}


def over_http(http: httpx.Client, reads: int) -> dict[str, Any]:
    times: dict[str, list[float]] = {"http": [], "http_floor": []}
    paths = [("http", f"/v1/subjects/{SUBJECT}/profile"), ("http_floor", f"/v1/subjects/{SUBJECT}/traces?count=1")]
    rng = random.Random(reads)
    for _ in range(reads):
        rng.shuffle(paths)
        for name, path in paths:
            started = time.perf_counter()
            reply = http.get(path)
            times[name].append(time.perf_counter() - started)
            if reply.status_code != 200:
                raise SystemExit(f"GET {path}: {reply.status_code} {reply.text[:200]}")
    return {name: figures(t) for name, t in times.items()}


def rebuilds(system: Embedded, http: httpx.Client, n: int) -> dict[str, Any]:
    """One write through the real path, idle, then the next plain read (the rebuild) and the one after it."""
    client, key = system.client, system.client.keys.profile(SUBJECT)
    first: list[float] = []
    after: list[float] = []
    for i in range(n):
        client.write(SUBJECT, f"I prefer {NOUNS[i % len(NOUNS)]} talks on {DAYS[i % len(DAYS)]} number {i}.",
                     ts=AT + timedelta(minutes=i + 1), event_id=f"bench-write-{i}")
        if not client.wait_idle(120):
            raise SystemExit("the pipeline did not go idle after a write")
        if client.redis.get(key) is not None:
            raise SystemExit("the write did not drop the kept profile")
        for times in (first, after):
            started = time.perf_counter()
            reply = http.get(f"/v1/subjects/{SUBJECT}/profile")
            times.append(time.perf_counter() - started)
            if reply.status_code != 200:
                raise SystemExit(f"the profile read: {reply.status_code} {reply.text[:200]}")
        if f"number {i}" not in reply.text:
            raise SystemExit(f"the read after write {i} does not show it")
    return {"writes": n, "next_read": figures(first), "read_after": figures(after)}


def rebuild_parts(system: Embedded, n: int) -> dict[str, Any]:
    """What one rebuild is made of, in process: the scroll, the assembly, the serialization."""
    parts: dict[str, list[float]] = {"scroll": [], "assemble": [], "serialize": []}
    for _ in range(n):
        started = time.perf_counter()
        memories = system.ctx.store.get(MemoryFilter(SUBJECT))  # every status, as shared/changes/profiles.py reads
        scrolled = time.perf_counter()
        found = assembly.assemble(SUBJECT, "0-0", memories, datetime.now(UTC))
        assembled = time.perf_counter()
        profiles.stored(found)
        parts["scroll"].append(scrolled - started)
        parts["assemble"].append(assembled - scrolled)
        parts["serialize"].append(time.perf_counter() - assembled)
    return {name: figures(t) for name, t in parts.items()}


def measure(system: Embedded, *, size: int, reads: int, writes: int) -> dict[str, Any]:
    report: dict[str, Any] = {"machine": machine(), "target_p95_ms": TARGET_P95_MS}
    say(f"{size} memories into one subject ...")
    report["subject"] = seed(system, size)
    built = system.client.profile(SUBJECT)  # kept by the query worker, as the first read after a change does
    kept = system.client.redis.get(system.client.keys.profile(SUBJECT)) or b""
    report["profile"] = {"items": len(assembly.items(built)), "people": len(built.people),
                         "contested": len(built.contested), "kept_bytes": len(kept)}
    say(f"{reads} reads in process: floor, cached, parsed ...")
    report["read"] = asyncio.run(in_process(system, reads))
    key = KeyStore(system.client.redis, system.client.keys).create("bench", ["*"], read_only=False,
                                                                   now=datetime.now(UTC))[1]
    # One key reads back to back: its per-key rate is lifted, the figure is the read's, not the limiter's.
    lifted = system.settings.replace(http_key_rate_per_s=1e9, http_key_burst=10**9)
    with serving(lifted) as (url, _), \
            httpx.Client(base_url=url, headers={"Authorization": f"Bearer {key}"}, timeout=60) as http:
        served = http.get(f"/v1/subjects/{SUBJECT}/profile").json()
        report["http_same_as_rebuild"] = served == built.model_dump(mode="json")
        say(f"{reads} reads over HTTP ...")
        report["read"].update(over_http(http, reads))
        say(f"{writes} writes, each followed by the rebuilding read ...")
        report["rebuild"] = rebuilds(system, http, writes)
    report["rebuild"]["parts"] = rebuild_parts(system, 5)
    cached, floor = report["read"]["cached"], report["read"]["floor"]
    report["cached_over_floor_p50"] = round(cached["p50_ms"] / max(floor["p50_ms"], 1e-6), 2)
    report["meets_target"] = cached["p95_ms"] < TARGET_P95_MS
    return report


def print_report(r: dict[str, Any]) -> None:
    p, s = r["profile"], r["subject"]
    print(f"profile at {s['memories']} memories ({s['searchable']} searchable): {p['items']} items, "
          f"{p['people']} people, {p['contested']} contested, {p['kept_bytes'] / 1024:.0f} KB kept")
    for name, f in r["read"].items():
        print(f"  {name:<11} p50 {f['p50_ms']:>8.3f} ms  p95 {f['p95_ms']:>8.3f} ms  max {f['max_ms']:>8.3f} ms")
    print(f"  cached / floor (p50): {r['cached_over_floor_p50']}x; target p95 < {r['target_p95_ms']} ms: "
          f"{'met' if r['meets_target'] else 'NOT met'}; HTTP read == rebuild: {r['http_same_as_rebuild']}")
    b = r["rebuild"]
    print(f"rebuild after a write ({b['writes']} writes): next read p50 {b['next_read']['p50_ms']} ms "
          f"p95 {b['next_read']['p95_ms']} ms max {b['next_read']['max_ms']} ms; the read after it "
          f"p50 {b['read_after']['p50_ms']} ms")
    print("  one rebuild in process: " + ", ".join(f"{k} p50 {v['p50_ms']} ms" for k, v in b["parts"].items()))


def run_cli(*, size: int, reads: int, writes: int, as_json: bool, settings: Settings) -> int:
    report = on_fresh_system(settings, "profile", lambda system: measure(system, size=size, reads=reads,
                                                                          writes=writes))
    return emit(report, as_json, print_report)
