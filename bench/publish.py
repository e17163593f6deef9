"""`memflow bench publish`: what an fsynced acknowledgement costs a publish, next to the raw XADD limit.

Each variant runs on a fresh server of its own (shared/redisdb/server.py, its AOF on this machine's
disk): the server's `appendfsync` policy, and whether `publish` waits on WAITAOF 1 0
(MEMFLOW_REDIS_WAIT_AOF). Measured per variant:
- one at a time, p50 / p99 ms: a bare XADD of the same bytes (the limit), and `MemoryClient.publish`
  (validate, the pending layer's entry, XADD, and the WAITAOF when it waits), interleaved so that
  noise falls on both alike;
- `threads` publishers at once (a client each): XADDs per second and publishes per second;
- `publish_many` in batches of `batch`: events per second (one WAITAOF per batch and partition).

The variants: everysec without WAITAOF (memflow before issue 29: the fastest, and what a kill -9 under
a busy disk loses), always without and with WAITAOF (memflow's own server now), and everysec with
WAITAOF (a deployment's own server at Redis' default, with memflow's default settings).
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from memflow.bench.perf import AT, emit, machine, message, pct_ms, say
from memflow.shared.codec import encode
from memflow.shared.redisdb.connections import connect
from memflow.shared.redisdb.keys import FIELD
from memflow.shared.redisdb.server import start_redis
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings

# (name, the server's arguments, publish waits on WAITAOF). `hz`: how often the server's cron runs, which is
# when an everysec server fsyncs for a client blocked in WAITAOF (10 by default: a wait of up to 100 ms).
VARIANTS = [("everysec", ("--appendfsync", "everysec"), False), ("always", ("--appendfsync", "always"), False),
            ("always+waitaof", ("--appendfsync", "always"), True),
            ("everysec+waitaof", ("--appendfsync", "everysec"), True),
            ("everysec+waitaof+hz100", ("--appendfsync", "everysec", "--hz", "100"), True),
            ("everysec+waitaof+hz500", ("--appendfsync", "everysec", "--hz", "500"), True)]


def run_variant(settings: Settings, args: tuple[str, ...], wait_aof: bool, *, n: int, threads: int, batch: int,
                budget_s: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="memflow-bench-publish-") as tmp:
        server = start_redis(Path(tmp) / "redis", binary=settings.redis.server,
                             extra_args=args)
        try:
            mine = settings.replace(redis_url=server.url, stream_prefix="benchpub:", data_dir=Path(tmp),
                                    redis_wait_aof=wait_aof)
            return measure(mine, n=n, threads=threads, batch=batch, budget_s=budget_s)
        finally:
            server.stop()


def measure(settings: Settings, *, n: int, threads: int, batch: int, budget_s: float) -> dict[str, Any]:
    client = MemoryClient(settings)
    raw = encode(client.validate(event(0, 0)))
    scratch = client.keys.stream("scratch")
    bare, full = [], []
    began = time.perf_counter()
    for i in range(n):  # interleaved, so that warm-up and noise fall on both alike
        bare.append(_timed(lambda: client.redis.xadd(scratch, {FIELD: raw})))
        full.append(_timed(lambda i=i: client.publish(event(0, i))))  # type: ignore[misc]
        if time.perf_counter() - began > budget_s:
            break
    clients = [MemoryClient(settings) for _ in range(threads)]
    bare_rate = _rate(threads, budget_s, lambda c, i: clients[c].redis.xadd(scratch, {FIELD: raw}))
    publish_rate = _rate(threads, budget_s, lambda c, i: clients[c].publish(event(c + 1, i)))
    batch_rate = batch * _rate(1, budget_s, lambda c, i: client.publish_many(
        [event(1000 + j % 50, i * batch + j) for j in range(batch)]))
    return {"one_at_a_time": len(full),
            "xadd_p50_ms": pct_ms(bare, .5), "xadd_p99_ms": pct_ms(bare, .99),
            "publish_p50_ms": pct_ms(full, .5), "publish_p99_ms": pct_ms(full, .99),
            "threads": threads, "xadd_per_s": round(bare_rate, 1), "publish_per_s": round(publish_rate, 1),
            "batch": batch, "publish_many_events_per_s": round(batch_rate, 1),
            "durability": _promise(settings)}


def _promise(settings: Settings) -> str:
    from memflow.shared.redisdb.durability import durability

    return durability(connect(settings.redis.url or "")).promise(settings.redis.wait_aof)


def event(c: int, i: int) -> dict[str, Any]:
    return message(f"pub-{c}-{i}", f"bench-pub-{c}", "s1", f"just chatting about item {i}", AT)


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _rate(threads: int, budget_s: float, work: Callable[[int, int], object]) -> float:
    """Operations per second of `threads` threads each calling work(thread, i) until budget_s is spent."""
    done = [0] * threads
    start = threading.Barrier(threads + 1)
    deadline: list[float] = []

    def run(c: int) -> None:
        start.wait()
        while time.perf_counter() < deadline[0]:
            work(c, done[c])
            done[c] += 1
    workers = [threading.Thread(target=run, args=(c,)) for c in range(threads)]
    for w in workers:
        w.start()
    deadline.append(time.perf_counter() + budget_s)
    began = time.perf_counter()
    start.wait()
    for w in workers:
        w.join()
    return sum(done) / (time.perf_counter() - began)


def run_cli(*, n: int, threads: int, batch: int, budget_s: float, variants: list[str], as_json: bool,
            settings: Settings) -> int:
    report: dict[str, Any] = {"machine": machine(), "variants": {}}
    for name, args, wait_aof in VARIANTS:
        if name in variants:
            say(f"publish on {' '.join(args)}{', WAITAOF' if wait_aof else ''} ...")
            report["variants"][name] = run_variant(settings, args, wait_aof, n=n, threads=threads, batch=batch,
                                                   budget_s=budget_s)
    return emit(report, as_json, print_report)


def print_report(r: dict[str, Any]) -> None:
    print(f"machine: {r['machine']}")
    print(f"{'variant':<22} {'XADD p50/p99 ms':>16} {'publish p50/p99 ms':>19} {'XADD/s':>9} {'publish/s':>10} "
          f"{'batched ev/s':>13}")
    for name, v in r["variants"].items():
        print(f"{name:<22} {v['xadd_p50_ms']:>7} / {v['xadd_p99_ms']:<7} {v['publish_p50_ms']:>8} / "
              f"{v['publish_p99_ms']:<8} {v['xadd_per_s']:>9} {v['publish_per_s']:>10} "
              f"{v['publish_many_events_per_s']:>13}")
    first = next(iter(r["variants"].values()), None)
    if first:
        print(f"one at a time: up to {first['one_at_a_time']} of each, interleaved; /s: {first['threads']} threads "
              f"at once; batched: publish_many of {first['batch']}")
    for name, v in r["variants"].items():
        print(f"  {name}: {v['durability']}")
