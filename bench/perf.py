"""`memflow bench perf`: speed, each figure next to the physical limit measured in the same run.

- publish: the client's validate + XADD, next to a bare XADD of the same bytes;
- publish → searchable at idle: an explicit "remember" statement published, then
  searched for until found, next to one query encode + one store query;
- ingest: N realistic turns (LoCoMo's, read in place when ../shared/datasets has it,
  else generated) in sessions closed by session_end, time until the pipeline is idle,
  next to raw batched `encode_passages()` of the same texts (docs/architecture.md#performance-targets),
  and next to raw encoding of what the pipeline had to encode: every memory it stored, a text each;
- search through the RPC path at each store size (memories bulk-loaded through the
  store into ONE subject, the worst case for a subject filter; their dense vectors are
  random unit vectors, their text real words), next to one in-process encode + one
  hybrid store query on the same data; with the store process's RSS after loading and
  the time the index job takes to build the search indexes (HNSW) of what was loaded;
- with 1,000,000 among the sizes, the same for 10,000 subjects of 100 memories each
  (`1m_10k_subjects`, on a store of its own): many agents rather than one large one;
- peak RSS of every process;
- with --disk-load, at the largest size: search and publish idle, then while another process writes and fsyncs
  files on the data dir's filesystem (bench/diskload.py), in the same run; publish next to a bare durable XADD
  (XADD + WAITAOF 1 0, what publish waits for) measured beside it (issue 42).
Everything runs embedded, as `memflow up` does: its own redis-server, trigger and
extract as child processes, resolve + upsert + the query worker (with the model and the
Edge shard) in this one.
"""

from __future__ import annotations

import random
import resource
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
import orjson

from memflow.bench.diskload import Bound, disk_load
from memflow.pipeline.models import Dir, Memory, MType, Source
from memflow.shared.codec import encode
from memflow.shared.inference.embedder import uncached
from memflow.shared.redisdb.connections import replicated
from memflow.shared.redisdb.keys import FIELD
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings
from memflow.shared.storage.store import MemoryFilter
from memflow.workers import jobs
from memflow.workers.embedded import Embedded, embedded

AT = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
SEARCHED = "bench-search"
LOCOMO = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "locomo10.json"
SESSION_TURNS = 20


def pct_ms(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))] * 1000, 3)


def said(figures: dict[str, Any]) -> dict[str, Any]:
    """`figures`, also told on stderr as soon as they exist: a run of hours that dies keeps what it measured."""
    say(orjson.dumps(figures).decode())
    return figures


def timed(fn: Callable[[], object]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def say(err: str) -> None:
    print(err, file=sys.stderr, flush=True)


def message(event_id: str, subject: str, session: str, text: str, ts: datetime) -> dict[str, Any]:
    return {"event_id": event_id, "subject": subject, "session_id": session, "kind": "message", "role": "user",
            "text": text, "ts": ts}


# -- publish -------------------------------------------------------------------------


def bench_publish(client: MemoryClient, n: int, *, durable: bool = False, tag: str = "p") -> dict[str, float]:
    """`durable`: also a bare durable XADD (XADD then WAITAOF 1 0 on the same connection, as `publish` sends
    it, shared/sdk/client.py `_append`), interleaved with the others, and the p95s."""
    events = [message(f"{tag}{i}", "bench-pub", "s1", f"just chatting about item {i}", AT) for i in range(n)]
    raw = encode(client.validate(events[0]))
    scratch = client.keys.stream("scratch")
    bare, full, fsynced = [], [], []
    for ev in events:  # interleaved, so that warm-up and noise fall on all alike
        bare.append(timed(lambda: client.redis.xadd(scratch, {FIELD: raw})))
        full.append(timed(lambda ev=ev: client.publish(ev)))  # type: ignore[misc]
        if durable:
            fsynced.append(timed(lambda: _durable_xadd(client, scratch, raw)))
    client.redis.delete(scratch)
    figures = {"p50_ms": pct_ms(full, .5), "p99_ms": pct_ms(full, .99),
               "bare_xadd_p50_ms": pct_ms(bare, .5), "bare_xadd_p99_ms": pct_ms(bare, .99)}
    if durable:
        figures |= {"p95_ms": pct_ms(full, .95), "durable_xadd_p50_ms": pct_ms(fsynced, .5),
                    "durable_xadd_p95_ms": pct_ms(fsynced, .95), "durable_xadd_p99_ms": pct_ms(fsynced, .99),
                    "p99_vs_durable_xadd": round(pct_ms(full, .99) / max(pct_ms(fsynced, .99), 1e-6), 2)}
    return figures


def _durable_xadd(client: MemoryClient, stream: str, raw: bytes) -> None:
    """One XADD acknowledged once the server's AOF holds it on disk: what `publish` waits for, without the rest."""
    replicated(client.redis, stream, lambda pipe: pipe.xadd(stream, {FIELD: raw}), replicas=0, timeout_ms=0,
               fsync_timeout_ms=client.settings.redis.wait_aof_timeout_ms)


# -- publish → searchable --------------------------------------------------------------


def bench_searchable(system: Embedded, probes: int) -> dict[str, float]:
    client = system.client
    client.wait_idle(600)
    latencies, alone = [], []
    for i in range(probes):
        token = f"zq{i}v"
        latencies.append(_until_found(client, i, token))
        alone.append(timed(lambda t=token: _search_in_process(system, "bench-rt", f"probe word {t}")))  # type: ignore[misc]
    return {"p50_ms": pct_ms(latencies, .5), "p95_ms": pct_ms(latencies, .95),
            "limit_p50_ms": pct_ms(alone, .5), "limit_p95_ms": pct_ms(alone, .95)}


def _until_found(client: MemoryClient, i: int, token: str) -> float:
    started = time.perf_counter()
    client.publish(message(f"rt{i}", "bench-rt", "s1", f"Remember: the probe word {token} opens locker {i}.",
                           AT + timedelta(milliseconds=i)))
    while not any(token in h.content for h in client.search("bench-rt", f"probe word {token}", 3,
                                                              now=AT + timedelta(days=1)).hits):
        if time.perf_counter() - started > 30:
            raise SystemExit(f"probe {token} not searchable after 30 s")
        time.sleep(0.002)  # polling a search: what an agent waiting for its write would do
    return time.perf_counter() - started


def _search_in_process(system: Embedded, subject: str, text: str) -> None:
    vector = system.ctx.embedder.encode_queries([text])[0]
    system.ctx.store.query(MemoryFilter(subject), mode="hybrid", dense=vector, text=text, limit=50)


# -- ingest --------------------------------------------------------------------------


def realistic_turns(n: int) -> list[str]:
    """Conversation turns: LoCoMo's when the team's dataset folder is beside the repo, else generated."""
    if LOCOMO.exists():
        samples = orjson.loads(LOCOMO.read_bytes())
        turns = [t["text"] for s in samples for key, sess in s["conversation"].items()
                 if key.startswith("session_") and isinstance(sess, list) for t in sess]
        return (turns * (n // len(turns) + 1))[:n]
    rng = random.Random(7)
    return [f"I {rng.choice(VERBS)} the {rng.choice(NOUNS)} with {rng.choice(NAMES)} last {rng.choice(DAYS)}."
            for _ in range(n)]


def bench_ingest(system: Embedded, n: int) -> dict[str, float]:
    texts = realistic_turns(n)
    # The model itself, not through the process's passage cache: the limit is the model's speed, and the
    # pipeline must not find the turns it is about to encode kept already.
    encode_s = timed(lambda: uncached(system.ctx.embedder).encode_passages(texts))
    system.client.wait_idle(600)
    before = system.ctx.store.count("bench-ingest")
    started = time.perf_counter()
    for i, text in enumerate(texts):
        session = f"s{i // SESSION_TURNS}"
        system.client.publish(message(f"in{i}", "bench-ingest", session, text, AT + timedelta(seconds=i)))
        if (i + 1) % SESSION_TURNS == 0 or i == n - 1:
            system.client.publish({"event_id": f"end-{session}", "subject": "bench-ingest", "session_id": session,
                                   "kind": "session_end", "ts": AT + timedelta(seconds=i + 1)})
    if not system.client.wait_idle(3600):
        raise SystemExit("ingest did not finish within an hour")
    elapsed = time.perf_counter() - started
    stored = [m.content for m in system.ctx.store.get(MemoryFilter("bench-ingest"))]
    return {"events": n, "seconds": round(elapsed, 2), "events_per_s": round(n / elapsed, 1),
            "encode_per_s": round(n / encode_s, 1), "ratio": round((n / elapsed) / (n / encode_s), 3),
            "memories": len(stored) - before, "texts_per_turn": round((len(stored) - before) / n, 3),
            **own_encode(system, stored, elapsed)}


def own_encode(system: Embedded, stored: list[str], elapsed: float, sample: int = 1000) -> dict[str, float]:
    """What the pipeline had to encode: each memory it stored is one text through the model (a turn gives
    its verbatim record and its statements, about 1.2 texts). Timed raw on a sample of them and scaled
    to all: `own_ratio` is the share of the ingest's wall time that this encoding alone would take, so
    1 - own_ratio is what the pipeline costs beyond the model."""
    picked = random.Random(len(stored)).sample(stored, min(sample, len(stored)))
    seconds = timed(lambda: uncached(system.ctx.embedder).encode_passages(picked)) * len(stored) / max(1, len(picked))
    return {"own_encode_s": round(seconds, 2), "own_ratio": round(seconds / elapsed, 3)}


# -- search at size ------------------------------------------------------------------


def bulk_load(system: Embedded, subject: str, target: int, batch: int = 5000) -> None:
    """Fill `subject` up to `target` memories straight through the store (no pipeline)."""
    store, dim, rng = system.ctx.store, system.ctx.embedder.dim, random.Random(target)
    draw = np.random.default_rng(target)
    have = store.count(subject)
    while have < target:
        size = min(batch, target - have)
        store.put([_synthetic_memory(subject, have + i, rng) for i in range(size)], _units(draw, size, dim))
        have += size


def bulk_load_subjects(system: Embedded, subjects: int, each: int, batch: int = 5000) -> list[str]:
    """`subjects` subjects of `each` memories, loaded `batch` memories (several subjects) per write; their names."""
    names = [f"bench-agent-{i:05d}" for i in range(subjects)]
    store, dim, rng = system.ctx.store, system.ctx.embedder.dim, random.Random(subjects)
    draw = np.random.default_rng(subjects)
    per_batch = max(1, batch // each)
    for start in range(0, subjects, per_batch):
        memories = [_synthetic_memory(name, i, rng) for name in names[start:start + per_batch] for i in range(each)]
        store.put(memories, _units(draw, len(memories), dim))
    return names


def _units(rng: np.random.Generator, n: int, dim: int) -> list[list[float]]:
    """`n` random unit vectors (numpy: a million of them in seconds, where Python's random takes minutes)."""
    v = rng.standard_normal((n, dim), dtype=np.float32)
    v /= np.linalg.norm(v, axis=1, keepdims=True)
    return v.tolist()  # type: ignore[no-any-return]


def _synthetic_memory(subject: str, i: int, rng: random.Random) -> Memory:
    text = f"{rng.choice(NAMES)} {rng.choice(VERBS)} the {rng.choice(NOUNS)} on {rng.choice(DAYS)} ({i})"
    return Memory(id=str(uuid.uuid5(uuid.NAMESPACE_URL, f"{subject}/{i}")), subject=subject,
                  uri=f"mem://{subject}/general/bulk.{i}", dir=Dir.general, mtype=MType.fact, key=f"bulk.{i}",
                  content=text, confidence=0.9, source=Source.explicit, created_at=AT, updated_at=AT,
                  source_event_ids=[f"bulk-{i}"])


def bench_search(system: Embedded, size: int, queries: int) -> dict[str, float]:
    bulk_load(system, SEARCHED, size)
    return {"memories": size, **loaded(system), **search_figures(system, search_questions(size, queries))}


def search_questions(size: int, queries: int) -> list[tuple[str, str]]:
    rng = random.Random(size)
    return [(SEARCHED, f"what did {rng.choice(NAMES)} do with the {rng.choice(NOUNS)}") for _ in range(queries)]


def bench_many_subjects(system: Embedded, subjects: int, each: int, queries: int) -> dict[str, float]:
    """Searches of random subjects among `subjects` of `each` memories: many agents, each with a small store."""
    names = bulk_load_subjects(system, subjects, each)
    rng = random.Random(subjects)
    asked = [(rng.choice(names), f"what did {rng.choice(NAMES)} do with the {rng.choice(NOUNS)}")
             for _ in range(queries)]
    return {"memories": subjects * each, "subjects": subjects, **loaded(system), **search_figures(system, asked)}


def loaded(system: Embedded) -> dict[str, float]:
    """The store process's RSS after loading, then the index job's build of what was loaded (timed) and the RSS
    after it: what serving that store costs in memory, and how long the build held the process."""
    rss = rss_now_mb()
    started = time.perf_counter()
    jobs.run(system.ctx, "index", None, AT, dry_run=False)
    return {"rss_mb": rss, "index_build_s": round(time.perf_counter() - started, 2), "rss_indexed_mb": rss_now_mb()}


def search_figures(system: Embedded, asked: list[tuple[str, str]]) -> dict[str, float]:
    now = AT + timedelta(days=1)
    rpc = [timed(lambda s=s, t=t: system.client.search(s, t, 5, now=now)) for s, t in asked]  # type: ignore[misc]
    alone = [timed(lambda s=s, t=t: _search_in_process(system, s, t)) for s, t in asked]  # type: ignore[misc]
    return {"p50_ms": pct_ms(rpc, .5), "p95_ms": pct_ms(rpc, .95), "p99_ms": pct_ms(rpc, .99),
            "limit_p50_ms": pct_ms(alone, .5), "limit_p95_ms": pct_ms(alone, .95),
            "ratio": round(pct_ms(rpc, .95) / max(pct_ms(alone, .95), 1e-6), 2)}


# -- under disk load --------------------------------------------------------------------


def bench_disk_load(system: Embedded, size: int, queries: int, publishes: int,
                    bound: Bound | None = None) -> dict[str, Any]:
    """Search and publish at `size` memories, idle and then while another process writes and fsyncs files on the
    data dir's filesystem (bench/diskload.py), in this one run on this one store (issue 42): each figure next to
    its limit measured in the same phase, and what the writer applied."""
    asked = search_questions(size, queries)
    idle = _phase(system, asked, publishes, "idle-p")
    with disk_load(system.settings.store.data_dir / "diskload", bound) as load:
        under = _phase(system, asked, publishes, "load-p")
    if load.report.get("stopped_by") != "stop":
        say(f"the disk writer ended before the phase did ({load.report}): its figures are partly idle")
    search_idle, search_under = idle["search"]["p99_ms"], under["search"]["p99_ms"]
    return {"memories": size, "writer": load.report, "idle": idle, "under_load": under,
            "search_p99_under_load_vs_idle": round(search_under / max(search_idle, 1e-6), 2)}


def _phase(system: Embedded, asked: list[tuple[str, str]], publishes: int, tag: str) -> dict[str, Any]:
    """Searches (with their limit) and then publishes (next to a bare and a bare durable XADD), each started once
    the pipeline is idle, so that neither phase serves the other's ingest."""
    system.client.wait_idle(600)
    search = search_figures(system, asked)
    system.client.wait_idle(600)
    return {"search": search, "publish": bench_publish(system.client, publishes, durable=True, tag=tag)}


# -- memory ----------------------------------------------------------------------------


def rss_now_mb() -> float:
    """This process's resident memory now (not its peak)."""
    status = Path("/proc/self/status").read_text()
    return round(int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1024, 1)


def peak_rss_mb(pids: dict[str, int]) -> dict[str, float]:
    rss = {"store_and_query_process": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}
    for name, pid in pids.items():
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        hwm = [line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")]
        if hwm:
            rss[name] = round(int(hwm[0]) / 1024, 1)
    return rss


# -- the command -------------------------------------------------------------------------


# The second shape of a million memories: many agents with small stores, rather than one with a large one.
MILLION, AGENTS = 1_000_000, 10_000


def run_cli(*, events: int, queries: int, probes: int, publishes: int, sizes: list[int], as_json: bool,
            settings: Settings, with_disk_load: bool = False, bound: Bound | None = None) -> int:
    report = on_fresh_system(settings, "perf", lambda system: measure(
        system, events=events, queries=queries, probes=probes, publishes=publishes, sizes=sizes,
        with_disk_load=with_disk_load, bound=bound))
    if MILLION in sizes:
        say(f"search over {AGENTS} subjects of {MILLION // AGENTS} memories ...")
        report["search"][f"{_size_label(MILLION)}_{_size_label(AGENTS)}_subjects"] = said(on_fresh_system(
            settings, "perf", lambda system: bench_many_subjects(system, AGENTS, MILLION // AGENTS, queries)))
    return emit(report, as_json, print_report)


def run_embedded(settings: Settings, name: str, measure: Callable[[Embedded], dict[str, Any]],
                 print_report: Callable[[dict[str, Any]], None], as_json: bool) -> int:
    """Measure on a fresh embedded system in a temp dir (its own Redis and store), then print the report:
    JSON, or for a person."""
    report = on_fresh_system(settings, name, measure)
    return emit(report, as_json, print_report)


def on_fresh_system(settings: Settings, name: str, measure: Callable[[Embedded], dict[str, Any]]) -> dict[str, Any]:
    """`measure` on a fresh embedded system in a temp dir (its own Redis and store), gone afterwards."""
    with tempfile.TemporaryDirectory(prefix=f"memflow-{name}-") as tmp:
        base = settings.replace(data_dir=Path(tmp), redis_url=None, stream_prefix=f"{name}:", qdrant_url=None)
        with embedded(base) as system:
            return measure(system)


def measure(system: Embedded, *, events: int, queries: int, probes: int, publishes: int,
            sizes: list[int], with_disk_load: bool = False, bound: Bound | None = None) -> dict[str, Any]:
    report: dict[str, Any] = {"machine": machine()}
    say("publish ...")
    report["publish"] = said(bench_publish(system.client, publishes))
    say("publish → searchable ...")
    report["publish_to_searchable"] = said(bench_searchable(system, probes))
    say(f"ingest {events} turns ...")
    report["ingest"] = said(bench_ingest(system, events))
    report["search"] = {}
    for size in sorted(sizes):
        say(f"search at {size} memories ...")
        report["search"][_size_label(size)] = said(bench_search(system, size, queries))
    if with_disk_load and sizes:
        say(f"search and publish at {max(sizes)} memories, idle then under disk load ...")
        report["disk_load"] = said(bench_disk_load(system, max(sizes), queries, publishes, bound))
    report["rss_mb"] = peak_rss_mb(system.child_pids)
    return report


def _size_label(size: int) -> str:
    if size % 1_000_000 == 0:
        return f"{size // 1_000_000}m"
    return f"{size // 1000}k" if size % 1000 == 0 else str(size)


def emit(report: dict[str, Any], as_json: bool, print_report: Callable[[dict[str, Any]], None]) -> int:
    """A bench's report on stdout: one JSON line, or its table; the command's exit status."""
    if as_json:
        print(orjson.dumps(report).decode())
    else:
        print_report(report)
    return 0


def machine() -> dict[str, Any]:
    import os
    import platform

    return {"cpus": os.cpu_count(), "python": platform.python_version(), "platform": platform.platform(),
            "date": datetime.now(UTC).date().isoformat()}


def print_report(r: dict[str, Any]) -> None:
    pub, rt, ing = r["publish"], r["publish_to_searchable"], r["ingest"]
    print(f"machine: {r['machine']}")
    print(f"publish            p50 {pub['p50_ms']} ms  p99 {pub['p99_ms']} ms   | bare XADD p50 "
          f"{pub['bare_xadd_p50_ms']} ms  p99 {pub['bare_xadd_p99_ms']} ms")
    print(f"publish→searchable p50 {rt['p50_ms']} ms  p95 {rt['p95_ms']} ms   | encode+query alone p95 "
          f"{rt['limit_p95_ms']} ms")
    print(f"ingest             {ing['events_per_s']} events/s ({ing['events']} turns, {ing['memories']} memories, "
          f"{ing['seconds']} s)   | raw batched encode {ing['encode_per_s']} texts/s   ratio {ing['ratio']}x")
    print(f"                   {ing['texts_per_turn']} texts encoded per turn: encoding them alone takes "
          f"{ing['own_encode_s']} s   own ratio {ing['own_ratio']}x")
    for label, s in r["search"].items():
        print(f"search @ {label:<9} p50 {s['p50_ms']} ms  p95 {s['p95_ms']} ms  p99 {s['p99_ms']} ms   | "
              f"encode+query alone p95 {s['limit_p95_ms']} ms   ratio p95 {s['ratio']}x   | RSS {s['rss_mb']} MB "
              f"loaded, {s['rss_indexed_mb']} MB indexed; index build {s['index_build_s']} s")
    if "disk_load" in r:
        print_disk_load(r["disk_load"])
    print("peak RSS (MB): " + ", ".join(f"{k} {v}" for k, v in r["rss_mb"].items()))


def print_disk_load(d: dict[str, Any]) -> None:
    w = d["writer"]
    print(f"disk load @ {_size_label(d['memories'])}: another process wrote {w.get('mb')} MB in {w.get('seconds')} s "
          f"({w.get('mb_per_s')} MB/s, {w.get('fsyncs')} fsyncs, fsync p50 {w.get('fsync_p50_ms')} ms max "
          f"{w.get('fsync_max_ms')} ms, stopped by {w.get('stopped_by')})")
    for name, phase in (("idle", d["idle"]), ("under load", d["under_load"])):
        s, p = phase["search"], phase["publish"]
        print(f"  search  {name:<10} p50 {s['p50_ms']} ms  p95 {s['p95_ms']} ms  p99 {s['p99_ms']} ms   | "
              f"encode+query alone p50 {s['limit_p50_ms']} ms  p95 {s['limit_p95_ms']} ms   ratio p95 {s['ratio']}x")
        print(f"  publish {name:<10} p50 {p['p50_ms']} ms  p95 {p['p95_ms']} ms  p99 {p['p99_ms']} ms   | "
              f"bare durable XADD p50 {p['durable_xadd_p50_ms']} ms  p95 {p['durable_xadd_p95_ms']} ms  p99 "
              f"{p['durable_xadd_p99_ms']} ms   ratio p99 {p['p99_vs_durable_xadd']}x   | bare XADD p99 "
              f"{p['bare_xadd_p99_ms']} ms")
    print(f"  search p99 under load / idle: {d['search_p99_under_load_vs_idle']}x")


NAMES = ["Ana", "Bo", "Chen", "Dara", "Eli", "Farah", "Goro", "Hana", "Ivo", "Jun", "Kai", "Lena", "Mo", "Noor"]
VERBS = ["repaired", "painted", "sold", "borrowed", "planned", "cooked", "tested", "moved", "shipped", "reviewed"]
NOUNS = ["bicycle", "garden", "database", "report", "kitchen", "guitar", "roadmap", "invoice", "server", "novel",
         "telescope", "budget", "website", "recipe", "contract", "camera"]
DAYS = ["Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday", "weekend", "month"]
