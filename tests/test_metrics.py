"""Prometheus metrics (`GET /metrics`, shared/monitoring/metrics.py), read from Redis at scrape time on a real system.

The module's system and `memflow serve` process are test_api's (`served`); the figures are
compared before and after each test's own actions, and the text is always parsed by
prometheus_client's own parser.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from prometheus_client.parser import text_string_to_metric_families

from memflow.pipeline.models import Trace
from memflow.shared.inference.llm import count_usage
from memflow.shared.monitoring import metrics
from memflow.shared.redisdb.keys import FIELD, STAGES
from tests import test_api
from tests.conftest import wait_for
from tests.test_api import Served, remembered, subject

served = test_api.served  # the module's system and `memflow serve` process (a fixture)

Samples = dict[tuple[str, frozenset[tuple[str, str]]], float]


def scrape(served: Served) -> Samples:
    """Every sample of one render, by name and labels (the text parsed as Prometheus parses it)."""
    client = served.system.client
    text = metrics.render(client.redis, client.keys).decode()
    return {(s.name, frozenset(s.labels.items())): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(samples: Samples, name: str, **labels: str) -> float:
    return samples.get((name, frozenset(labels.items())), 0.0)


def searches(samples: Samples, status: str) -> float:
    return value(samples, "memflow_search_latency_seconds_count", status=status)


def test_the_latency_histogram_counts_every_search_by_status(served: Served) -> None:
    subj, client = subject(), served.system.client
    assert remembered(served, subj, "I prefer tea over coffee in the morning.")
    before = scrape(served)
    for _ in range(3):
        assert client.search(subj, "what do I drink in the morning?").status == "ok"
    for _ in range(2):
        assert client.search(subject(), "anything at all").status == "empty"
    after = scrape(served)
    assert searches(after, "ok") - searches(before, "ok") == 3
    assert searches(after, "empty") - searches(before, "empty") == 2
    assert searches(after, "failed") == searches(before, "failed")
    for status in ("ok", "empty"):
        buckets = sorted((float(dict(labels)["le"]), n) for (name, labels), n in after.items()
                         if name == "memflow_search_latency_seconds_bucket" and dict(labels)["status"] == status)
        assert [le for le, _ in buckets][:1] == [0.001] and buckets[-2][0] == 10.0
        assert [n for _, n in buckets] == sorted(n for _, n in buckets)  # cumulative
        assert buckets[-1] == (float("inf"), searches(after, status))
        assert value(after, "memflow_search_latency_seconds_sum", status=status) > 0


def test_a_latency_lands_in_the_first_bucket_that_holds_it(served: Served) -> None:
    client = served.system.client
    before = scrape(served)
    pipe = client.redis.pipeline(transaction=False)
    for latency_s in (0.001, 0.0011, 20.0):
        metrics.record_search(pipe, client.keys, "failed", latency_s)
    pipe.execute()
    after = scrape(served)

    def gained(le: str) -> float:
        bucket = "memflow_search_latency_seconds_bucket"
        return value(after, bucket, status="failed", le=le) - value(before, bucket, status="failed", le=le)

    assert (gained("0.001"), gained("0.0025"), gained("10.0"), gained("+Inf")) == (1, 2, 2, 3)
    assert searches(after, "failed") - searches(before, "failed") == 3


def test_a_search_sends_its_trace_and_its_latency_in_one_round_trip(served: Served) -> None:
    ctx = served.system.ctx
    trace = Trace(subject=subject(), query="q", intent="general", source="heuristic", status="ok", latency_ms=5.0,
                  now=datetime.now(UTC))
    traced, before = ctx.transient.xlen(ctx.keys.traces), scrape(served)
    pipe = ctx.transient.pipeline(transaction=False)
    ctx.trace(trace, via=pipe)
    metrics.record_search(pipe, ctx.keys, "ok", 0.005)
    assert ctx.transient.xlen(ctx.keys.traces) == traced  # nothing sent before the round trip
    pipe.execute()
    assert ctx.transient.xlen(ctx.keys.traces) == traced + 1
    assert searches(scrape(served), "ok") == searches(before, "ok") + 1


def test_a_dead_letter_shows_in_its_stage_and_the_stage_gauges_are_there(served: Served) -> None:
    client = served.system.client
    before = scrape(served)
    client.redis.xadd(client.keys.input_of("extract", 0), {FIELD: b"{poisoned"})
    wait_for(lambda: value(scrape(served), "memflow_stage_dead_letters", stage="extract")
             == value(before, "memflow_stage_dead_letters", stage="extract") + 1, what="the dead letter")
    after = scrape(served)
    for stage in STAGES:
        for name in ("memflow_stage_lag", "memflow_stage_pending", "memflow_stage_stream_length"):
            assert (name, frozenset({("stage", stage)})) in after
        if stage != "extract":
            assert value(after, "memflow_stage_dead_letters", stage=stage) == value(
                before, "memflow_stage_dead_letters", stage=stage)
    assert value(after, "memflow_stage_stream_length", stage="extract") >= 1
    assert value(after, "memflow_query_workers") >= 1
    assert ("memflow_queue_length", frozenset({("queue", "query")})) in after


def test_llm_calls_and_fallbacks_are_totals_over_every_day_kept(served: Served) -> None:
    client = served.system.client
    today = datetime.now(UTC)
    for day, calls in ((today - timedelta(days=35), 2), (today, 3)):
        count_usage(client.redis, client.keys, subject(),
                    {"calls": calls, "calls:extract": calls, "prompt_tokens": 100 * calls,
                     "completion_tokens": 10 * calls, "fallbacks": 1, "fallback:timeout": 1, "events": 4,
                     "candidates": 2, "dropped_items": 1}, at=day)
    count_usage(client.redis, client.keys, subject(), {"calls": 1, "calls:resolve": 1, "fallbacks": 1,
                                                       "fallback:http_503": 1})
    samples = scrape(served)
    assert value(samples, "memflow_llm_calls_total", purpose="extract") == 5
    assert value(samples, "memflow_llm_calls_total", purpose="resolve") == 1
    assert value(samples, "memflow_llm_fallbacks_total", reason="timeout") == 2
    assert value(samples, "memflow_llm_fallbacks_total", reason="http_503") == 1
    assert value(samples, "memflow_llm_tokens_total", kind="prompt") == 500
    assert value(samples, "memflow_llm_tokens_total", kind="completion") == 50
    assert value(samples, "memflow_llm_events_total") == 8
    assert value(samples, "memflow_llm_candidates_total") == 4
    assert value(samples, "memflow_llm_unusable_items_total", kind="dropped_items") == 2


def test_get_metrics_needs_a_key_any_key(served: Served) -> None:
    with served.http(served.key("team-a/*", read_only=True)) as http:
        reply = http.get("/metrics")
    assert reply.status_code == 200, reply.text
    assert reply.headers["content-type"].startswith("text/plain")
    names = {family.name for family in text_string_to_metric_families(reply.text)}
    assert {"memflow_stage_lag", "memflow_stage_dead_letters", "memflow_search_latency_seconds",
            "memflow_llm_calls", "memflow_llm_fallbacks", "memflow_query_workers"} <= names
    with served.http(None) as http:
        refused = http.get("/metrics")
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "unauthorized"
