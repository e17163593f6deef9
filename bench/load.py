"""`memflow bench load`: a burst from many publishers at once, and whether the pipeline holds it.

N events (default 10,000) from P concurrent publishers (default 8, threads with a client each),
each publisher its own subjects and sessions closed by session_end. Reported: how fast the
burst was accepted, the sustained rate the pipeline processed it at, the peak lag seen per
stage, the time from the last publish to idle, the peak RSS of every process, and the
accounting: every event is processed (its verbatim record stored) or dead-lettered with a
reason. Runs embedded, as `memflow up` does.
"""

from __future__ import annotations

import contextlib
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson

from memflow.bench.perf import AT, SESSION_TURNS, message, peak_rss_mb, realistic_turns, say
from memflow.pipeline.gate import gate
from memflow.pipeline.models import MType, Role
from memflow.shared.redisdb.cluster import start_cluster
from memflow.shared.redisdb.keys import STAGES
from memflow.shared.redisdb.server import start_redis
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings
from memflow.shared.storage.store import MemoryFilter
from memflow.shared.streaming import dlq
from memflow.shared.streaming.backlog import backlog
from memflow.workers.embedded import Embedded, embedded

SUBJECTS_PER_PUBLISHER = 4


def plan(n: int, publishers: int) -> list[list[dict[str, Any]]]:
    """Each publisher's events: realistic turns in sessions of SESSION_TURNS, each session closed."""
    texts = realistic_turns(n)
    share: list[list[dict[str, Any]]] = [[] for _ in range(publishers)]
    said = [0] * publishers
    for i, text in enumerate(texts):
        p = i % publishers
        mine, said[p] = said[p], said[p] + 1
        session_n = mine // SESSION_TURNS  # a session is one subject's
        subject, session = f"load-{p}-{session_n % SUBJECTS_PER_PUBLISHER}", f"p{p}-s{session_n}"
        share[p].append(message(f"ld{i}", subject, session, text, AT + timedelta(seconds=i)))
        if (mine + 1) % SESSION_TURNS == 0 or i >= n - publishers:
            share[p].append({"event_id": f"end-{session}-{subject}", "subject": subject, "session_id": session,
                             "kind": "session_end", "ts": AT + timedelta(seconds=i, milliseconds=1)})
    return share


def burst(settings: Settings, share: Sequence[list[dict[str, Any]]]) -> float:
    """Publish every share from its own thread and client at once; the seconds it took."""
    clients = [MemoryClient(settings) for _ in share]
    threads = [threading.Thread(target=lambda c=c, events=events: [c.publish(e) for e in events])
               for c, events in zip(clients, share, strict=True)]
    started = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - started


def watch(system: Embedded, stop: threading.Event, peaks: dict[str, int], every_s: float = 0.25) -> None:
    """Keep the highest unread + pending count seen per stage until `stop`."""
    while not stop.wait(every_s):
        for stage, (lag, pending) in backlog(system.client.redis, system.client.keys, STAGES).items():
            peaks[stage] = max(peaks.get(stage, 0), lag + pending)


def account(system: Embedded, events: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Events whose verbatim record is stored, and dead letters: together they must be every message."""
    subjects = sorted({e["subject"] for e in events})
    stored: set[str] = set()
    doubled = 0  # events recorded verbatim more than once: a redelivery written twice
    for subject in subjects:
        said = Counter(e for m in system.ctx.store.get(MemoryFilter(subject, mtypes=[MType.episode]))
                       for e in m.source_event_ids)
        stored.update(said)
        doubled += sum(1 for n in said.values() if n > 1)
    # The gate drops filler ("Thanks!") on purpose: those are expected to leave no record.
    messages = {e["event_id"] for e in events if e["kind"] == "message" and gate(e["text"], Role.user).keep}
    dead = sum(dlq.count(system.client.redis, system.client.keys, stage) for stage in STAGES)
    missing = len(messages - stored)
    return {"messages": len(messages), "stored": len(messages & stored), "dead_letters": dead,
            "lost": max(0, missing - dead), "doubled": doubled}


@contextlib.contextmanager
def on_local_cluster(settings: Settings) -> Iterator[Settings]:
    """The settings on a Valkey cluster started here (3 masters with a replica each, every write held by a
    replica before it is acknowledged), the RPC queue on a server of its own (RQ runs on no cluster), and
    two consumers per stage: two processes each for trigger and extract, two threads each for resolve and
    upsert (the Edge shard is one process's; with a Qdrant server they would be processes too)."""
    data = settings.store.data_dir
    cluster = start_cluster(data / "cluster", binary=settings.redis.server)
    queue = start_redis(data / "queue", binary=settings.redis.server)
    try:
        yield settings.replace(redis_url=cluster.url, redis_cluster=True, redis_queue_url=queue.url,
                               redis_wait_replicas=1, partitions=16, consumers=2)
    finally:
        queue.stop()
        cluster.stop()


def deployment(settings: Settings, processes: int) -> dict[str, Any]:
    r = settings.redis
    return {"cluster": r.cluster, "partitions": r.partitions, "wait_replicas": r.wait_replicas,
            "light_stage_processes": processes, "store_stage_threads": settings.consumer.consumers}


def measure(system: Embedded, n: int, publishers: int) -> dict[str, Any]:
    share = plan(n, publishers)
    peaks: dict[str, int] = {}
    stop = threading.Event()
    watcher = threading.Thread(target=watch, args=(system, stop, peaks), daemon=True)
    watcher.start()
    started = time.perf_counter()
    accept_s = burst(system.settings, share)
    after_publish = time.perf_counter()
    if not system.client.wait_idle(timeout_s=7200):
        raise SystemExit("the pipeline did not drain within two hours")
    done = time.perf_counter()
    stop.set()
    watcher.join()
    events = [e for events in share for e in events]
    return {"events": len(events), "messages": n, "publishers": publishers,
            "accepted_per_s": round(len(events) / accept_s, 1),
            "sustained_per_s": round(len(events) / (done - started), 1),
            "drain_after_last_publish_s": round(done - after_publish, 1), "total_s": round(done - started, 1),
            "peak_backlog": peaks, "accounting": account(system, events), "rss_mb": peak_rss_mb(system.child_pids)}


def run_cli(*, events: int, publishers: int, as_json: bool, settings: Settings, cluster: bool = False) -> int:
    with tempfile.TemporaryDirectory(prefix="memflow-load-") as tmp:
        base = settings.replace(data_dir=Path(tmp), redis_url=None, stream_prefix="load:",
                                qdrant_url=None)
        with contextlib.ExitStack() as stack:
            processes = 1
            if cluster:
                base, processes = stack.enter_context(on_local_cluster(base)), 2
            system = stack.enter_context(embedded(base, light_processes=processes))
            say(f"load: {events} events from {publishers} publishers"
                + (f" on {base.redis.url} (a cluster), {processes} consumers per stage" if cluster else "") + " ...")
            report = measure(system, events, publishers)
            report["deployment"] = deployment(base, processes)
    if as_json:
        print(orjson.dumps(report).decode())
    else:
        acc = report["accounting"]
        print(f"load: {report['events']} events ({report['messages']} messages) from {report['publishers']} "
              f"publishers; accepted at {report['accepted_per_s']}/s, processed at {report['sustained_per_s']}/s "
              f"sustained; drained {report['drain_after_last_publish_s']} s after the last publish "
              f"(total {report['total_s']} s)")
        print(f"peak backlog (unread + pending) per stage: {report['peak_backlog']}")
        print(f"accounting: {acc['stored']}/{acc['messages']} messages stored, {acc['dead_letters']} dead letters, "
              f"{acc['lost']} lost, {acc['doubled']} doubled")
        print("peak RSS (MB): " + ", ".join(f"{k} {v}" for k, v in report["rss_mb"].items()))
    return 0 if report["accounting"]["lost"] == report["accounting"]["doubled"] == 0 else 1
