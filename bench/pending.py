"""`memflow bench pending`: what the read-your-writes layer (issue 18, shared/unstored/pending.py) adds to a search.

Per store size, two subjects are bulk-loaded with the same memories (bench/perf.py's `bulk_load`) and the
search indexes built (`loaded`): `bench-quiet`, which never has a pending entry, and `bench-live`, into which
a live session is published: ~40 user turns without a realtime signal (pending until the session ends),
realtime statements and one correction. Each query is asked of both subjects back to back, in alternating
order: on a shared 2-core machine the difference is a few milliseconds in searches of tens, and only figures
taken at the same moment (same backlog, same neighbours' load) can show it.

Reported per subject ("without" = quiet, "with" = live), each next to the limit measured in the same run:
- the search through the RPC path (`MemoryClient.search`), p50 / p95;
- the limit: one in-process query encode + one hybrid store query (as bench perf);
- the layer alone, in process: reading the subject's pending entries, then `about_to_be_written` and
  `with_pending` over the routes' candidates (found beforehand, untimed) — what `pipeline.search.retrieve`
  adds; for the quiet subject that is the read of an empty hash;
- how many entries were pending at each search ("with": never 0, else the figure measures nothing).
Idle: after the live session's realtime statements are stored (at idle they are pending for tens of ms; the
turns without a signal stay pending until the session ends). Under a burst: `burst` events of other subjects
(small talk and realtime statements, sessions closed) are published at once (a second or two), a new live
session right behind them, and queries run while the pipeline has a backlog (`shared.streaming.backlog.backlog`,
sampled before each query); the burst's figures cover only those queries.
"""

from __future__ import annotations

import os
import random
import statistics
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from memflow.bench.perf import (
    AT,
    DAYS,
    NAMES,
    NOUNS,
    SESSION_TURNS,
    _search_in_process,
    _size_label,
    bulk_load,
    emit,
    loaded,
    machine,
    message,
    on_fresh_system,
    pct_ms,
    realistic_turns,
    say,
    timed,
)
from memflow.pipeline.gate import gate
from memflow.pipeline.models import QueryPlan, Role, SearchRequest
from memflow.pipeline.pending import Said
from memflow.pipeline.score import Found
from memflow.pipeline.search import dated, plan_for, query_vectors
from memflow.pipeline.triggers import realtime_signals
from memflow.shared.redisdb.keys import STAGES
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.search.pending import Shown
from memflow.shared.search.reader import PendingRoutes, pending_of, profile_for, run_routes
from memflow.shared.settings import Settings
from memflow.shared.streaming.backlog import backlog
from memflow.workers.embedded import Embedded

QUIET, LIVE = "bench-quiet", "bench-live"
NOW = AT + timedelta(days=1)
SMALL_TALK = 40  # turns without a realtime signal in a live session: all pending until it ends
IDLE_S = 900.0


# -- what is said -----------------------------------------------------------------------------


def quiet_turns(n: int, round_: int) -> list[str]:
    """`n` realistic user turns the gate keeps and that carry no realtime signal (each stays pending until its
    session ends), other ones each round: the passage cache keeps what an earlier round's searches encoded,
    and the first search after a session would find its turns' vectors kept."""
    kept = [t for t in realistic_turns(20 * n * (round_ + 1)) if not realtime_signals(t) and gate(t, Role.user).keep]
    return (kept * ((round_ + 1) * n // max(1, len(kept)) + 1))[round_ * n:(round_ + 1) * n]


def live_session(round_: int) -> list[dict[str, Any]]:
    """One live session of the searched subject: small talk, four realtime statements spread in it, and a
    correction of one of them near its end."""
    cities = ["Berlin", "Lisbon", "Porto", "Oslo", "Kyoto", "Quito"]
    before, after = cities[round_ % len(cities)], cities[(round_ + 1) % len(cities)]
    signalled = {5: f"Remember: I live in {before}.", 15: f"Remember: my badge number is {4471 + round_}.",
                 25: f"I prefer short answers with at most {3 + round_} bullet points.",
                 35: f"Remember: the spare key of studio {round_} is under the blue pot.",
                 SMALL_TALK - 2: f"Correction: I moved to {after}."}
    texts = quiet_turns(SMALL_TALK, round_)
    for at in sorted(signalled, reverse=True):
        texts.insert(at, signalled[at])
    start, session = AT + timedelta(hours=round_), f"live-{round_}"
    return [message(f"live-{round_}-{i}", LIVE, session, text, start + timedelta(seconds=i))
            for i, text in enumerate(texts)]


def session_end(events: Sequence[dict[str, Any]]) -> dict[str, Any]:
    last = events[-1]
    return {"event_id": f"end-{last['session_id']}", "subject": last["subject"], "session_id": last["session_id"],
            "kind": "session_end", "ts": last["ts"] + timedelta(seconds=1)}


def burst_events(n: int, round_: int) -> list[dict[str, Any]]:
    """`n` events of 8 other subjects: realistic turns with a realtime statement every fourth, each subject's
    turns in sessions of SESSION_TURNS closed by their session_end."""
    events: list[dict[str, Any]] = []
    start = AT + timedelta(hours=round_)
    for i, text in enumerate(realistic_turns(n)):
        subject, turn = f"burst-{i % 8}", i // 8
        said = f"Remember: box {i} goes on shelf {i % 17}." if i % 4 == 0 else text
        events.append(message(f"burst-{round_}-{i}", subject, f"b{round_}-{subject}-{turn // SESSION_TURNS}", said,
                              start + timedelta(seconds=i)))
        if turn % SESSION_TURNS == SESSION_TURNS - 1:
            events.append(session_end(events[-1:]))
    return events[:n]


def questions(size: int, n: int) -> list[str]:
    """`n` distinct questions (at most 2,016). Distinct on purpose: the layer encodes the stored memories
    nearest a question (its neighbours, `about_to_be_written`) through the process's passage cache, and a
    question asked again would find them kept."""
    asked = [f"what did {name} do with the {noun} on {day}" for name in NAMES for noun in NOUNS for day in DAYS]
    return random.Random(size).sample(asked, min(n, len(asked)))


@dataclass(frozen=True)
class Asked:
    """One phase's questions: those searched through the RPC path (and for the limit), and as many others
    for the layer timed alone (the same ones would find their neighbours' vectors kept by the RPC search)."""

    searched: list[str]
    layer: list[str]


def asked_in(size: int, queries: int) -> tuple[Asked, Asked]:
    """The idle phase's questions and the burst's, all distinct."""
    q = questions(size, 4 * queries)
    n = len(q) // 4
    return Asked(q[:n], q[n:2 * n]), Asked(q[2 * n:3 * n], q[3 * n:4 * n])


# -- measuring ------------------------------------------------------------------------------------


@dataclass
class Side:
    """One subject's figures over the queries asked: RPC search (and how many failed), the in-process limit,
    the layer alone (as the search met it, then again with every vector it needed kept), and the pending
    entries it had."""

    rpc: list[float] = field(default_factory=list)
    failed: int = 0
    limit: list[float] = field(default_factory=list)
    layer: list[float] = field(default_factory=list)
    layer_kept: list[float] = field(default_factory=list)
    pending: list[int] = field(default_factory=list)

    def searched(self, system: Embedded, subject: str, query: str) -> None:
        started = time.perf_counter()
        # A search the worker could not answer in time comes back `failed` after the client's timeout: timed
        # all the same (the agent waited that long), and counted.
        self.failed += system.client.search(subject, query, 5, now=NOW).status == "failed"
        self.rpc.append(time.perf_counter() - started)

    def figures(self) -> dict[str, Any]:
        return {"p50_ms": pct_ms(self.rpc, .5), "p95_ms": pct_ms(self.rpc, .95), "failed": self.failed,
                "limit_p50_ms": pct_ms(self.limit, .5), "limit_p95_ms": pct_ms(self.limit, .95),
                "layer_p50_ms": pct_ms(self.layer, .5), "layer_p95_ms": pct_ms(self.layer, .95),
                "layer_kept_p50_ms": pct_ms(self.layer_kept, .5), "layer_kept_p95_ms": pct_ms(self.layer_kept, .95),
                "pending_min": min(self.pending), "pending_max": max(self.pending)}


@dataclass
class Phase:
    without: Side = field(default_factory=Side)
    with_: Side = field(default_factory=Side)
    backlogs: list[int] = field(default_factory=list)
    first: Side = field(default_factory=Side)  # the live subject's first search after its session was published

    def figures(self) -> dict[str, Any]:
        added = [w - o for w, o in zip(self.with_.rpc, self.without.rpc, strict=True)]
        return {"queries": len(self.without.rpc), "without": self.without.figures(),
                "with": {**self.with_.figures(), "added_p50_ms": round(statistics.median(added) * 1000, 3),
                         "first_search_ms": pct_ms(self.first.rpc, .5), "first_search_failed": self.first.failed},
                "backlog_max": max(self.backlogs)}


def ask(system: Embedded, phase: Phase, query: str, alone: str, i: int) -> None:
    """One query of both subjects, in alternating order, each its RPC search and its limit; then the layer
    alone for `alone`, another question."""
    pairs = [(QUIET, phase.without), (LIVE, phase.with_)]
    for subject, side in pairs if i % 2 == 0 else pairs[::-1]:
        side.pending.append(int(system.ctx.client.hlen(system.ctx.keys.pending(subject))))
        side.searched(system, subject, query)
        side.limit.append(timed(lambda s=subject: _search_in_process(system, s, query)))  # type: ignore[misc]
    for subject, side in pairs:
        met, kept = layer_seconds(system, subject, alone)
        side.layer.append(met)
        side.layer_kept.append(kept)


def layer_seconds(system: Embedded, subject: str, query: str) -> tuple[float, float]:
    """The time `pipeline.search.retrieve` spends on the pending layer for this search: the read of the pending
    entries, then (when there are some) the ranking of what is pending among the routes' candidates, found
    in between and not timed. Twice: as this search meets it, and again at once, when every passage vector
    it needed is in the process's cache: the difference is what the model spent encoding."""
    ctx = system.ctx
    said: list[Said] = []
    read_s = timed(lambda: said.extend(pending_of(ctx.settings.pending, ctx.client, ctx.keys, subject)))
    if not said:
        return read_s, timed(lambda: pending_of(ctx.settings.pending, ctx.client, ctx.keys, subject))
    req = SearchRequest(subject=subject, query=query, k=5, now=NOW)
    profile = profile_for(ctx.settings, ctx.ranking, query)
    plan = dated(profile, plan_for(profile, req), query, NOW)
    vectors = query_vectors(ctx.search_reader, profile, [query, *(r.text for r in plan.routes
                                                                  if r.strategy == "semantic")])
    found = run_routes(ctx.store, profile.fusion, req, plan.routes, vectors, max(profile.candidate_pool, req.k * 4))
    met = read_s + timed(lambda: ranked_with(system, req, plan, vectors, found, said))
    return met, read_s + timed(lambda: ranked_with(system, req, plan, vectors, found, said))


def ranked_with(system: Embedded, req: SearchRequest, plan: QueryPlan, vectors: dict[str, list[float]],
                found: Sequence[Found], said: Sequence[Said]) -> Shown:
    """What `retrieve` does with the pending entries it read: the same object (`PendingRoutes`)."""
    ctx = system.ctx
    layer = PendingRoutes.of(ctx.embedder, ctx.settings.write.duplicate_threshold, req, vectors, found, said)
    for route, f in zip(plan.routes, found, strict=True):
        layer.route(route, f)
    return layer.shown


def backlog_now(system: Embedded) -> int:
    return sum(lag + pending for lag, pending in backlog(system.client.redis, system.client.keys, STAGES).values())


def idle(system: Embedded) -> None:
    if not system.client.wait_idle(IDLE_S):
        raise SystemExit(f"the pipeline was not idle after {IDLE_S:.0f} s")


def publish(client: MemoryClient, events: Sequence[dict[str, Any]]) -> None:
    for event in events:
        client.publish(event)


def first_search(system: Embedded, phase: Phase) -> None:
    """The first search of the live subject after its session was published: the one that reads every turn
    still pending for the first time (the rules' drafts and their vectors are kept for the next searches)."""
    phase.first.searched(system, LIVE, "what did I say about my week")


def idle_phase(system: Embedded, asked: Asked, round_: int) -> Phase:
    """Every query at idle, with the live session's turns pending (its realtime statements stored)."""
    session = live_session(round_)
    publish(system.client, session)
    idle(system)
    phase = Phase()
    first_search(system, phase)
    for i, (query, alone) in enumerate(zip(asked.searched, asked.layer, strict=True)):
        phase.backlogs.append(backlog_now(system))
        ask(system, phase, query, alone, i)
    publish(system.client, [session_end(session)])
    idle(system)
    return phase


def burst_phase(system: Embedded, asked: Asked, round_: int, events: int) -> Phase:
    """Queries while a burst of other subjects' events is worked off (at least one, at most every query).
    The live session is published right behind the burst, so that its realtime statements wait in the same
    streams: pending for as long as the backlog ahead of them."""
    session = live_session(round_)
    publish(MemoryClient(system.settings), burst_events(events, round_))
    publish(system.client, session)
    phase = Phase()
    first_search(system, phase)
    for i, (query, alone) in enumerate(zip(asked.searched, asked.layer, strict=True)):
        waiting = backlog_now(system)
        if i and not waiting:
            break  # the burst is worked off: what follows would be idle
        phase.backlogs.append(waiting)
        ask(system, phase, query, alone, i)
    publish(system.client, [session_end(session)])
    idle(system)
    return phase


def bench_size(system: Embedded, size: int, queries: int, events: int, round_: int) -> dict[str, Any]:
    for subject in (QUIET, LIVE):
        bulk_load(system, subject, size)
    report: dict[str, Any] = {"memories": size, **loaded(system)}
    at_idle, in_burst = asked_in(size, queries)
    say(f"  idle, {len(at_idle.searched)} queries of each subject ...")
    idle_figures = idle_phase(system, at_idle, 2 * round_)
    say(f"  under a burst of {events} events ...")
    burst_figures = burst_phase(system, in_burst, 2 * round_ + 1, events)
    report["pending_entries"] = max(idle_figures.with_.pending)
    report["idle"] = idle_figures.figures()
    report["burst"] = {"events": events, **burst_figures.figures()}
    return report


def load_avg() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def measure(system: Embedded, *, sizes: Sequence[int], queries: int, burst: int) -> dict[str, Any]:
    report: dict[str, Any] = {"machine": {**machine(), "load_avg": load_avg()}, "sizes": {}}
    for round_, size in enumerate(sorted(sizes)):
        say(f"{size} memories in each of two subjects ...")
        report["sizes"][_size_label(size)] = bench_size(system, size, queries, burst, round_)
    report["machine"]["load_avg_end"] = load_avg()
    return report


# -- the command ------------------------------------------------------------------------------------


def run_cli(*, sizes: list[int], queries: int, burst: int, as_json: bool, settings: Settings) -> int:
    report = on_fresh_system(settings, "pending",
                             lambda system: measure(system, sizes=sizes, queries=queries, burst=burst))
    return emit(report, as_json, print_report)


def print_report(r: dict[str, Any]) -> None:
    print(f"machine: {r['machine']}")
    for label, s in r["sizes"].items():
        print(f"@ {label} memories per subject (index build {s['index_build_s']} s), "
              f"{s['pending_entries']} entries pending at idle")
        for phase in ("idle", "burst"):
            p = s[phase]
            first = p["with"]["first_search_ms"], " (failed)" if p["with"]["first_search_failed"] else ""
            print(f"  {phase}: {p['queries']} queries, backlog max {p['backlog_max']}; the live subject's first "
                  f"search after its session {first[0]} ms{first[1]}")
            for side in ("without", "with"):
                print("    " + _side_line(side, p[side]))


def _side_line(side: str, f: dict[str, Any]) -> str:
    added = f" (+{f['added_p50_ms']} ms p50, paired)" if "added_p50_ms" in f else ""
    return (f"{side:<8} search p50 {f['p50_ms']} ms  p95 {f['p95_ms']} ms{added}, {f['failed']} failed   | limit "
            f"(encode + one query) p50 {f['limit_p50_ms']} ms  p95 {f['limit_p95_ms']} ms   | layer p50 "
            f"{f['layer_p50_ms']} ms  p95 {f['layer_p95_ms']} ms (vectors kept: p50 {f['layer_kept_p50_ms']} ms), "
            f"{f['pending_min']}–{f['pending_max']} pending")
