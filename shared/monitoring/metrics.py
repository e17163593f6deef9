"""Prometheus metrics of the whole deployment (`GET /metrics` of `memflow serve`).

Everything is read from Redis at scrape time, where every process of the deployment already
writes it: the streams and their groups (lag, pending, dead letters), the RQ queues and worker
heartbeats, the LLM counters (shared/inference/llm.py) and the search latencies the query workers record
here (`record_search`). The API process keeps no figure of its own, so any number of `serve`
processes answer alike and a restart loses nothing. Each render builds a fresh registry around
one collector: nothing is global to the process.
"""

from __future__ import annotations

import math
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from typing import Any

import redis
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric
from prometheus_client.registry import Collector

from memflow.shared.monitoring.status import PipelineStatus, read_status
from memflow.shared.redisdb.keys import Keys

CONTENT_TYPE = CONTENT_TYPE_LATEST

# Upper bounds in seconds, 1 ms to 10 s: a search of a small subject answers in milliseconds, one
# behind an LLM planner or a slow store in seconds, and the client gives up at 10 s by default
# (MEMFLOW_SEARCH_TIMEOUT_S). +Inf is implied.
LATENCY_BUCKETS_S = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)
SEARCH_STATUSES = ("ok", "empty", "failed")


# -- recording (the query worker, once per search) -------------------------------------------

def bucket_of(latency_s: float) -> float:
    """The smallest bound that holds `latency_s` (Prometheus buckets are `le`: less or equal)."""
    index = bisect_left(LATENCY_BUCKETS_S, latency_s)
    return LATENCY_BUCKETS_S[index] if index < len(LATENCY_BUCKETS_S) else math.inf


def record_search(pipe: redis.Redis, keys: Keys, status: str, latency_s: float) -> None:
    """Queue one search's latency on `pipe`, which the caller sends with its trace (one round trip).

    The hash holds the count of the one bucket each search fell in (`ok:0.05`) and the sum
    (`ok:sum`); `render` adds the buckets up. Two commands per search instead of one per bound, and
    the count is the +Inf bucket's, so count and buckets can never disagree.
    """
    pipe.hincrby(keys.search_latency, f"{status}:{_le(bucket_of(latency_s))}", 1)
    pipe.hincrbyfloat(keys.search_latency, f"{status}:sum", latency_s)


# -- rendering -------------------------------------------------------------------------------

def render(client: redis.Redis, keys: Keys, queue: redis.Redis | None = None) -> bytes:
    """The Prometheus text of the deployment now (`queue`: the RPC queues' server, when not the streams')."""
    registry = CollectorRegistry(auto_describe=False)  # no describe(): registering reads nothing
    registry.register(_Snapshot(client, keys, queue or client))
    return generate_latest(registry)


class _Snapshot(Collector):
    def __init__(self, client: redis.Redis, keys: Keys, queue: redis.Redis) -> None:
        self.client, self.keys, self.queue = client, keys, queue

    def collect(self) -> Iterator[Metric]:
        # read_status without `sample_s`: its read rates come from stream ids, a scrape never waits.
        yield from pipeline_families(read_status(self.client, self.keys, queue=self.queue))
        # what searches and LLM calls count is kept beside the queues (docs/architecture.md "Which writes are durable")
        yield search_family(self.queue.hgetall(self.keys.search_latency))
        yield from llm_families(self.queue.hgetall(self.keys.llm_usage(None)))


_STAGE_GAUGES = (
    ("memflow_stage_stream_length", "length", "Entries in the stage's input stream (work streams are not trimmed)."),
    ("memflow_stage_lag", "lag", "Entries of the stage's input stream its group has not read yet."),
    ("memflow_stage_pending", "pending", "Entries the stage has read and not acknowledged yet."),
    ("memflow_stage_dead_letters", "dead", "Entries in the stage's dead-letter stream (memflow dlq list STAGE)."),
)


def pipeline_families(status: PipelineStatus) -> Iterator[Metric]:
    for name, attribute, documentation in _STAGE_GAUGES:
        family = GaugeMetricFamily(name, documentation, labels=["stage"])
        for stage in status.stages:
            family.add_metric([stage.stage], getattr(stage, attribute))
        yield family
    rates = GaugeMetricFamily("memflow_stage_read_per_second",
                              "Entries of the last minute the stage has read, per second (absent: Redis lost count).",
                              labels=["stage"])
    for stage in status.stages:
        if stage.read_per_s is not None:
            rates.add_metric([stage.stage], stage.read_per_s)
    yield rates
    queues = GaugeMetricFamily("memflow_queue_length", "RQ jobs waiting: searches and other RPCs (query), "
                               "maintenance jobs (jobs).", labels=["queue"])
    queues.add_metric(["query"], status.query_queue)
    queues.add_metric(["jobs"], status.jobs_queue)
    yield queues
    yield GaugeMetricFamily("memflow_query_workers", "Query workers alive (their RQ heartbeat has not expired).",
                            value=status.query_workers)


def search_family(raw: Mapping[bytes | str, bytes | str]) -> HistogramMetricFamily:
    counts, sums = _latency_fields(raw)
    family = HistogramMetricFamily("memflow_search_latency_seconds",
                                   "Searches the query workers ran, by outcome, and how long each took.",
                                   labels=["status"])
    for status in sorted({*SEARCH_STATUSES, *counts}):
        family.add_metric([status], _cumulative(counts.get(status, {})), sums.get(status, 0.0))
    return family


def _latency_fields(raw: Mapping[bytes | str, bytes | str]) -> tuple[dict[str, dict[float, int]], dict[str, float]]:
    """Per status: the count of each bucket (by bound) and the sum, from `record_search`'s fields."""
    counts: dict[str, dict[float, int]] = {}
    sums: dict[str, float] = {}
    for field, amount in raw.items():
        status, _, bound = _text(field).partition(":")
        if bound == "sum":
            sums[status] = float(amount)
        else:
            counts.setdefault(status, {})[float(bound)] = int(amount)
    return counts, sums


def _cumulative(counts: Mapping[float, int]) -> list[tuple[str, float]]:
    # Every bound ever recorded is shown, not only today's: a count recorded under bounds since
    # changed still adds up to the right +Inf.
    total, buckets = 0, []
    for bound in sorted({*LATENCY_BUCKETS_S, math.inf, *counts}):
        total += counts.get(bound, 0)
        buckets.append((_le(bound), float(total)))
    return buckets


# shared/inference/llm.py's counters, per day `{day}:{name}`, as Prometheus counters: the sum over every day
# still kept, or the running totals once kept (shared/inference/llm.py count_usage; the hash expires whole
# USAGE_KEEP_DAYS after its last write; Prometheus reads that as a reset). A name `calls:<purpose>` or
# `fallback:<reason>` is labelled by what follows the colon; `calls` and `fallbacks` alone are their
# sums, left to PromQL's sum().
_LLM_FAMILIES: dict[str, tuple[str, str | None]] = {
    "memflow_llm_calls": ("LLM calls answered, by what they were for.", "purpose"),
    "memflow_llm_fallbacks": ("Times the rules stood in for the LLM, by reason (timeout, rate_limited, "
                              "http_<status>, connection, budget, empty, or why its reply was refused).", "reason"),
    "memflow_llm_tokens": ("Tokens the LLM server reported, by kind (prompt, completion).", "kind"),
    "memflow_llm_events": ("Events the trigger saw while an LLM was configured (cost per event).", None),
    "memflow_llm_candidates": ("Candidate memories the LLM wrote.", None),
    "memflow_llm_unusable_items": ("Items of LLM replies that could not be used, by kind.", "kind"),
    "memflow_llm_latency_ms": ("Milliseconds spent waiting for answered LLM calls (over calls: the mean).", None),
}
_LLM_LABELLED = {"calls": "memflow_llm_calls", "fallback": "memflow_llm_fallbacks"}
_LLM_NAMED = {
    "prompt_tokens": ("memflow_llm_tokens", "prompt"), "completion_tokens": ("memflow_llm_tokens", "completion"),
    "events": ("memflow_llm_events", ""), "candidates": ("memflow_llm_candidates", ""),
    "dropped_items": ("memflow_llm_unusable_items", "dropped_items"),
    "unreadable_verdicts": ("memflow_llm_unusable_items", "unreadable_verdicts"),
    "latency_ms": ("memflow_llm_latency_ms", ""),
}


def llm_families(raw: Mapping[bytes | str, bytes | str]) -> Iterator[Metric]:
    totals = _llm_totals(raw)
    for name, (documentation, label) in _LLM_FAMILIES.items():
        if label is None:
            yield CounterMetricFamily(name, documentation, value=totals.get((name, ""), 0))
            continue
        family = CounterMetricFamily(name, documentation, labels=[label])
        for (family_name, value), amount in sorted(totals.items()):
            if family_name == name:
                family.add_metric([value], amount)
        yield family


def _llm_totals(raw: Mapping[bytes | str, bytes | str]) -> dict[tuple[str, str], int]:
    """(metric, label value) → the running total (`total:<name>`; before those were kept, the sum over the
    days kept); a field no metric shows is left out."""
    fields = {_text(f): a for f, a in raw.items()}
    running = {f: a for f, a in fields.items() if f.startswith("total:")}
    totals: dict[tuple[str, str], int] = {}
    for field, amount in (running or fields).items():
        sample = _llm_sample(field.partition(":")[2])
        if sample is not None:
            totals[sample] = totals.get(sample, 0) + int(amount)
    return totals


def _llm_sample(name: str) -> tuple[str, str] | None:
    head, colon, tail = name.partition(":")
    if colon:
        return (_LLM_LABELLED[head], tail) if head in _LLM_LABELLED else None
    return _LLM_NAMED.get(name)


def _le(bound: float) -> str:
    """A bucket's bound as Prometheus writes it: `0.05`, `10.0`, `+Inf`."""
    return "+Inf" if bound == math.inf else repr(bound)


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)
