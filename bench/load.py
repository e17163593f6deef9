"""`memflow bench load`: a burst from many publishers at once, and whether the pipeline holds it.

N events (default 10,000) from P concurrent publishers (default 8, threads with a client each),
each publisher its own subjects and sessions closed by session_end. Reported: how fast the
burst was accepted, the sustained rate the pipeline processed it at, the peak lag seen per
stage, the time from the last publish to idle, the peak RSS of every process, and the
accounting: every event is processed (its verbatim record stored) or dead-lettered with a
reason. Runs embedded, as `memflow up` does.
"""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson

from memflow.bench.perf import AT, SESSION_TURNS, message, peak_rss_mb, realistic_turns, say
from memflow.pipeline.gate import gate
from memflow.pipeline.models import MType, Role
from memflow.shared import dlq
from memflow.shared.client import MemoryClient
from memflow.shared.keys import STAGES
from memflow.shared.settings import Settings
from memflow.shared.store import MemoryFilter
from memflow.shared.streams import backlog
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
    for subject in subjects:
        for m in system.ctx.store.get(MemoryFilter(subject, mtypes=[MType.episode])):
            stored.update(m.source_event_ids)
    # The gate drops filler ("Thanks!") on purpose: those are expected to leave no record.
    messages = {e["event_id"] for e in events if e["kind"] == "message" and gate(e["text"], Role.user).keep}
    dead = sum(dlq.count(system.client.redis, system.client.keys, stage) for stage in STAGES)
    missing = len(messages - stored)
    return {"messages": len(messages), "stored": len(messages & stored), "dead_letters": dead,
            "lost": max(0, missing - dead)}


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


def run_cli(*, events: int, publishers: int, as_json: bool, settings: Settings) -> int:
    with tempfile.TemporaryDirectory(prefix="memflow-load-") as tmp:
        base = settings.replace(data_dir=Path(tmp), redis_url=None, stream_prefix="load:",
                                qdrant_url=None)
        with embedded(base) as system:
            say(f"load: {events} events from {publishers} publishers ...")
            report = measure(system, events, publishers)
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
              f"{acc['lost']} lost")
        print("peak RSS (MB): " + ", ".join(f"{k} {v}" for k, v in report["rss_mb"].items()))
    return 0 if report["accounting"]["lost"] == 0 else 1
