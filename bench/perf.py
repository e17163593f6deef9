"""Write-path latency and throughput, each next to the physical limit measured in the same run.

    python -m bench.perf [--events 300] [--probes 20]

- publish: the client's validate + XADD, against a bare XADD of the same bytes;
- publish → searchable: an explicit "remember" statement published, then searched for
  until found, against one query encode + one store query (what a search costs alone);
- ingest: realtime-triggered events per second through all four stages, against raw
  batched `encode()` of the same texts (the write path's limit, DESIGN §8).
Everything runs embedded, as `memflow up` does: a redis-server of its own, trigger and
extract as child processes, resolve + upsert + the query worker with an Edge shard here.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

from shared.client import MemoryClient
from shared.codec import encode
from shared.keys import FIELD
from shared.settings import Settings
from shared.store import MemoryFilter
from workers.embedded import embedded
from workers.runtime import Context


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(round(q * (len(ordered) - 1))))]


def ms(values: list[float], q: float) -> str:
    return f"{pct(values, q) * 1000:.3f} ms"


def event(i: int, text: str, at: datetime, subject: str = "bench") -> dict[str, object]:
    return {"event_id": f"b{i}", "subject": subject, "session_id": "s1", "kind": "message", "role": "user",
            "text": text, "ts": at + timedelta(milliseconds=i)}


def bench_publish(client: MemoryClient, n: int, at: datetime) -> None:
    events = [event(100_000 + i, f"just chatting about item {i}", at, "bench-pub") for i in range(n)]
    raw_payload = encode(client.validate(events[0]))
    bare, full = [], []
    for ev in events:
        t = time.perf_counter()
        client.redis.xadd(client.keys.stream("scratch"), {FIELD: raw_payload})
        bare.append(time.perf_counter() - t)
        t = time.perf_counter()
        client.publish(ev)
        full.append(time.perf_counter() - t)
    print(f"publish          p50 {ms(full, .5)}  p99 {ms(full, .99)}   | bare XADD p50 {ms(bare, .5)} "
          f"p99 {ms(bare, .99)}   ratio p99 {pct(full, .99) / pct(bare, .99):.2f}x")


def bench_searchable(ctx: Context, client: MemoryClient, probes: int, at: datetime) -> None:
    client.wait_idle(120)
    lat, alone = [], []
    for i in range(probes):
        token = f"zq{i}v"
        t = time.perf_counter()
        client.publish(event(200_000 + i, f"Remember: the probe word {token} opens locker {i}.", at, "bench-rt"))
        deadline = t + 30
        while not any(token in h.content for h in client.search("bench-rt", f"probe word {token}", 3,
                                                                  now=at + timedelta(days=1)).hits):
            if time.perf_counter() > deadline:
                raise SystemExit(f"probe {token} not searchable after 30 s")
            time.sleep(0.005)
        lat.append(time.perf_counter() - t)
        t = time.perf_counter()
        vector = ctx.embedder.encode([f"probe word {token}"])[0]
        ctx.store.query(MemoryFilter("bench-rt"), mode="hybrid", dense=vector, text=token, limit=5)
        alone.append(time.perf_counter() - t)
    print(f"publish→search   p50 {ms(lat, .5)}  p95 {ms(lat, .95)}   | encode+query alone p50 {ms(alone, .5)} "
          f"p95 {ms(alone, .95)}")


def bench_ingest(ctx: Context, client: MemoryClient, n: int, at: datetime) -> None:
    texts = [f"Remember: project {i} ships the {['red', 'blue', 'green'][i % 3]} widget number {i}." for i in range(n)]
    t = time.perf_counter()
    ctx.embedder.encode(texts)
    raw_rate = n / (time.perf_counter() - t)
    client.wait_idle(120)
    t = time.perf_counter()
    for i, text in enumerate(texts):
        client.publish(event(i, text, at, "bench-ingest"))
    client.wait_idle(600)
    rate = n / (time.perf_counter() - t)
    stored = ctx.store.count("bench-ingest")
    print(f"ingest           {rate:.1f} events/s ({stored} memories)   | raw batched encode {raw_rate:.1f} texts/s"
          f"   ratio {rate / raw_rate:.2f}x (target ≥ 0.8x)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=300)
    parser.add_argument("--probes", type=int, default=20)
    parser.add_argument("--publishes", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="memflow-bench-") as tmp:
        settings = Settings(data_dir=Path(tmp), stream_prefix="bench:")
        with embedded(settings) as system:
            at = datetime(2026, 6, 1, 9, 0, tzinfo=UTC)
            bench_publish(system.client, args.publishes, at)
            bench_searchable(system.ctx, system.client, args.probes, at)
            bench_ingest(system.ctx, system.client, args.events, at)


if __name__ == "__main__":
    main()
