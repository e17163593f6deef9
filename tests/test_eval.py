"""The scenario runner: scoring on hand-made results, parsing, and one small eval through the real pipeline."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import orjson
import pytest

from memflow.bench import scenarios
from memflow.bench.expectations import QueryOutcome, Returned, Seen, metrics, percentile, rate, returned, score
from memflow.bench.scenarios import (
    ScenarioFileError,
    evaluate,
    parse_lines,
    preflight,
    render,
    report_json,
    run_cli,
    unreached,
)
from memflow.pipeline.models import Hit, QueryPlan, Route, SearchResult

NOW = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def got(*contents: str, contested: tuple[str, ...] = (), intent: str | None = "general_chat",
        dirs: tuple[str, ...] = (), status: str = "ok") -> Returned:
    hits = [Seen(content=c, dir="preferences", contested=c in contested) for c in contents]
    return Returned(status=status if hits or status == "failed" else "empty", hits=hits, intent=intent,
                    dirs=list(dirs))


def verdicts(expect: dict, returned_: Returned) -> list[tuple[str, object, bool | None]]:
    return [(c.kind, c.expected, c.passed) for c in score(expect, returned_)]


# -- one expectation kind at a time ------------------------------------------------------


def test_intent_and_dirs_include() -> None:
    planned = got("x", intent="preference_query", dirs=("preferences", "general"))
    assert verdicts({"intent": "preference_query", "dirs_include": ["preferences"]}, planned) == [
        ("intent", "preference_query", True), ("dirs_include", "preferences", True)]
    assert verdicts({"intent": "rule_statement", "dirs_include": ["system"]}, planned) == [
        ("intent", "rule_statement", False), ("dirs_include", "system", False)]


def test_an_unscoped_plan_does_not_count_as_including_a_dir() -> None:
    [check] = score({"dirs_include": ["preferences"]}, got("I prefer tea"))
    assert check.passed is False
    assert "unscoped" in check.note and "preferences" in check.note


def test_hit_is_case_insensitive_and_scored_per_substring() -> None:
    result = got("We use PostgreSQL 16 for Atlas", "Deploys never on Fridays")
    assert verdicts({"hit": ["postgresql", "FRIDAYS", "mongodb"]}, result) == [
        ("hit", "postgresql", True), ("hit", "FRIDAYS", True), ("hit", "mongodb", False)]
    # One string where a list was meant is read as that one-item list.
    assert verdicts({"hit": "atlas"}, result) == [("hit", "atlas", True)]


def test_top1_looks_at_the_first_memory_only() -> None:
    result = got("My manager is Dana", "My manager is now Priya")
    assert verdicts({"top1": "dana"}, result) == [("top1", "dana", True)]
    [check] = score({"top1": "Priya"}, result)
    assert check.passed is False and check.got == "My manager is Dana"
    [nothing] = score({"top1": "Priya"}, got())
    assert nothing.passed is False and nothing.note == "nothing returned"


def test_absent_tolerates_a_contested_copy_but_not_a_current_one() -> None:
    assert verdicts({"absent": ["Beijing"]}, got("I live in Shanghai")) == [("absent", "Beijing", True)]
    assert verdicts({"absent": ["Beijing"]}, got()) == [("absent", "Beijing", True)]
    flagged = got("I live in Shanghai", "I live in Beijing", contested=("I live in Beijing",))
    assert verdicts({"absent": ["beijing"]}, flagged) == [("absent", "beijing", True)]
    [check] = score({"absent": ["Beijing"]}, got("I live in Shanghai", "I live in Beijing"))
    assert check.passed is False and check.got == ["I live in Beijing"] and check.note == "returned as current"


def test_contested_needs_a_returned_memory_holding_it_that_is_flagged() -> None:
    both = got("channel: WeChat", "channel: DingTalk", contested=("channel: WeChat",))
    assert verdicts({"contested": ["wechat"]}, both) == [("contested", "wechat", True)]
    [unflagged] = score({"contested": ["DingTalk"]}, both)
    assert unflagged.passed is False and unflagged.note == "returned but not flagged contested"
    [missing] = score({"contested": ["Slack"]}, both)
    assert missing.passed is False and missing.note == "not returned"


def test_empty_true_and_false() -> None:
    assert verdicts({"empty": True}, got()) == [("empty", True, True)]
    assert verdicts({"empty": True}, got("something")) == [("empty", True, False)]
    assert verdicts({"empty": False}, got("something")) == [("empty", False, True)]


def test_a_failed_search_fails_every_expectation_even_empty_and_absent() -> None:
    failed = Returned(status="failed", error="RpcError: no worker")
    checks = score({"empty": True, "absent": ["a", "b"], "hit": ["c"]}, failed)
    assert [(c.kind, c.expected, c.passed) for c in checks] == [
        ("empty", True, False), ("absent", "a", False), ("absent", "b", False), ("hit", "c", False)]
    assert all("no worker" in c.note for c in checks)


def test_unknown_or_misshapen_expectations_are_unsupported_not_scored() -> None:
    checks = score({"mrr": 0.5, "hit": 3, "empty": "yes", "top1": "x"}, got("x"))
    assert [(c.kind, c.passed) for c in checks] == [("mrr", None), ("hit", None), ("empty", None), ("top1", True)]
    assert rate(checks) == 1.0  # the unsupported ones count neither way


def test_returned_reads_plan_dirs_fallback_and_the_contested_flag() -> None:
    def hit(content: str, status: str = "active", contested: bool = False) -> Hit:
        return Hit(id=content, content=content, dir="preferences", mtype="preference", key=content, status=status,
                   tier="long_term", confidence=0.9, score=1.0, created_at=NOW, contested=contested)

    result = SearchResult(subject="u", query="q", status="ok", fallback=True,
                          hits=[hit("a"), hit("b", status="contested"), hit("c", contested=True)],
                          plan=QueryPlan(intent="preference_query",
                                         routes=[Route(text="q", dirs=["preferences"]), Route(text="q", dirs=["general"])]))
    seen = returned(result)
    assert seen.intent == "preference_query" and seen.dirs == ["general", "preferences"] and seen.fallback
    assert [h.contested for h in seen.hits] == [False, True, True]


# -- aggregates ----------------------------------------------------------------------------


def outcome(expect: dict, result: Returned, client_ms: float = 10.0, fallback: bool = False) -> QueryOutcome:
    return QueryOutcome(step=0, subject="u", text="q", status=result.status, hits=result.briefs(),
                        fallback=fallback, client_ms=client_ms, server_ms=client_ms / 2, checks=score(expect, result))


def test_metrics_are_null_where_no_expectation_applies() -> None:
    m = metrics([outcome({"hit": ["tea"]}, got("I like tea"))])
    assert m["recall_at_k"] == 1.0
    for name in ("intent_accuracy", "dir_hit_rate", "top1_accuracy", "temporal_correctness", "contested_detection",
                 "empty_accuracy"):
        assert m[name] is None, name
    assert metrics([])["search_p95_ms"] is None and metrics([])["empty_recall_rate"] is None


def test_empty_recall_counts_only_queries_that_expected_something() -> None:
    queries = [outcome({"hit": ["tea"]}, got()), outcome({"top1": "tea"}, got("tea")),
               outcome({"empty": True}, got()), outcome({"absent": ["x"]}, got(), fallback=True)]
    m = metrics(queries)
    assert m["empty_recall_rate"] == 0.5
    assert m["fallback_rate"] == 0.25
    assert m["recall_at_k"] == 0.0 and m["top1_accuracy"] == 1.0 and m["empty_accuracy"] == 1.0


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 21)]
    assert percentile(values, 0.5) == 10.0 and percentile(values, 0.95) == 19.0 and percentile(values, 1.0) == 20.0
    assert percentile([], 0.95) is None


# -- parsing ---------------------------------------------------------------------------------


def line(**scenario: object) -> str:
    return orjson.dumps({"id": "s", "subject": "u", "steps": [], **scenario}).decode()


def test_a_line_that_is_not_json_stops_the_run_naming_the_line() -> None:
    with pytest.raises(ScenarioFileError, match="line 3"):
        parse_lines([line(), "", "{not json"])
    with pytest.raises(ScenarioFileError, match="line 1: expected a JSON object"):
        parse_lines(["[1, 2]"])


def test_run_cli_exits_non_zero_when_it_cannot_run(tmp_path: Path, settings, capsys) -> None:
    assert run_cli(tmp_path / "missing.jsonl", as_json=True, ablation=False, settings=settings) == 2
    bad = tmp_path / "bad.jsonl"
    bad.write_text(line() + "\n" + "oops\n")
    assert run_cli(bad, as_json=False, ablation=False, settings=settings) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and "line 2" in captured.err


def test_the_format_is_read_liberally() -> None:
    [entry] = parse_lines([line(tags=["x"], steps=[
        {"at": "2026-01-05T09:00:00", "end_session": {"session": "s1"}, "note": "annotations are ignored"},
        {"at": "2026-01-05T10:00:00Z", "query": "what do I like?", "expect": {"hit": "tea"}},
        {"at": "2026-01-05T10:00:00Z", "query": {"text": "rules?", "dirs": ["system"]}},
        {"at": "2026-01-05T10:00:00Z", "pack": {"text": "q", "budget_tokens": 300}}])])
    assert entry.scenario is not None and preflight(entry) == []
    first, second, scoped, third = entry.scenario.steps
    assert scoped.query is not None and [d.value for d in scoped.query.dirs or []] == ["system"]
    assert first.at.tzinfo is not None and first.end_session == "s1"
    assert second.query is not None and second.query.text == "what do I like?" and second.query.k is None
    assert third.pack is not None and third.pack.budget == 300


def test_what_cannot_be_replayed_is_not_runnable_with_the_reason() -> None:
    entries = parse_lines([
        line(id="no-subject", subject=None),
        line(id="bad-subject", subject="has spaces"),
        line(id="steps", steps=[{"at": "2026-01-05T09:00:00Z", "feedback": {"ids": ["m1"]}},
                                {"at": "2026-01-05T09:00:00Z", "run": "reindex"},
                                {"at": "2026-01-05T09:00:00Z", "say": {"text": "hi"}, "query": {"text": "q"}},
                                {"at": "2026-01-05T09:00:00Z", "end_session": "s1", "expect": {"empty": True}},
                                {"at": "2026-01-05T09:00:00Z", "query": {"text": "q", "rerank": True}}]),
    ])
    assert [e.id for e in entries] == ["no-subject", "bad-subject", "steps"]
    assert "subject" in preflight(entries[0])[0] and "subject" in preflight(entries[1])[0]
    assert preflight(entries[2]) == [
        "step 0: unknown step kind 'feedback'", "step 1: job 'reindex' does not exist yet",
        "step 2: several actions (say, query)", "step 3: `expect` on a step that is not a query",
        "step 4: unknown query option(s) rerank"]


def test_queries_an_error_kept_from_running_fail_their_expectations() -> None:
    [entry] = parse_lines([line(steps=[
        {"at": "2026-01-05T09:00:00Z", "query": {"text": "early"}, "expect": {"hit": ["a"]}},
        {"at": "2026-01-05T09:00:00Z", "say": {"text": "hi"}},
        {"at": "2026-01-05T09:00:00Z", "subject": "other", "query": {"text": "late"},
         "expect": {"hit": ["a", "b"], "mystery": 1}}])])
    assert entry.scenario is not None
    [late] = unreached(entry.scenario.steps, 1, "u", "step 1 (say): Stalled: stuck")
    assert late.status == "not_reached" and late.subject == "other" and late.step == 2
    assert [(c.kind, c.expected, c.passed) for c in late.checks] == [("hit", "a", False), ("hit", "b", False),
                                                                    ("mystery", 1, None)]
    assert "stuck" in late.checks[0].note and late.checks[0].query == "late"
    assert metrics([late])["search_p95_ms"] is None and metrics([late])["recall_at_k"] == 0.0


# -- one small eval through the real pipeline ------------------------------------------------------

EVAL_FILE = [
    {"id": "pref", "subject": "u-en-pref", "steps": [
        {"at": "2026-03-02T09:00:00Z", "say": {"session": "s1", "role": "user",
                                               "text": "I prefer short answers with bullet points."}},
        {"at": "2026-03-02T09:30:00Z", "end_session": "s1"},
        {"at": "2026-03-03T09:00:00Z", "query": {"text": "how should answers be formatted?", "k": 5},
         "expect": {"hit": ["bullet points"], "absent": ["long essays"], "mystery": 1}},
        {"at": "2026-03-03T09:00:00Z", "subject": "u-other", "query": {"text": "how should answers be formatted?"},
         "expect": {"empty": True}}]},
    {"id": "decays", "subject": "u-en-decay", "steps": [
        {"at": "2026-03-02T09:00:00Z", "say": {"session": "s1", "text": "I'm tired today."}},
        {"at": "2026-03-09T09:00:00Z", "run": "decay"},
        {"at": "2026-03-09T09:00:01Z", "query": {"text": "how am I?"}, "expect": {"absent": ["tired"]}}]},
    {"id": "unknown-job", "subject": "u-en-unknown", "steps": [
        {"at": "2026-03-02T09:00:00Z", "say": {"session": "s1", "text": "I like tea."}},
        {"at": "2026-03-09T09:00:00Z", "run": "reindex"},
        {"at": "2026-03-09T09:00:01Z", "query": {"text": "what do I drink?"}, "expect": {"hit": ["tea"]}}]},
    {"id": "with-a-job", "subject": "u-en-job", "steps": [
        {"at": "2026-03-02T09:00:00Z", "say": {"session": "s1", "text": "Remember: never deploy on Fridays."}},
        {"at": "2026-03-04T09:00:00Z", "run": "test-noop"},
        {"at": "2026-03-04T09:00:01Z", "query": {"text": "when must we not deploy?"},
         "expect": {"top1": "fridays"}}]},
]


def test_a_small_eval_through_the_real_pipeline(settings, embedder, monkeypatch) -> None:
    ran: list[datetime] = []
    monkeypatch.setitem(scenarios.JOBS, "test-noop", lambda system, now: ran.append(now))
    entries = parse_lines([orjson.dumps(s).decode() for s in EVAL_FILE])

    report = evaluate(entries, settings, embedder, file="inline")

    pref, decays, unknown, job = report.scenarios
    assert [(c.kind, c.expected, c.passed) for c in pref.expectations] == [
        ("hit", "bullet points", True), ("absent", "long essays", True), ("mystery", 1, None), ("empty", True, True)]
    assert pref.passed is True and pref.queries[1].subject == "u-other"
    assert decays.runnable and decays.passed is True, decays.expectations  # "today" was over a week ago
    assert not unknown.runnable and "job 'reindex' does not exist yet" in (unknown.reason or "")
    assert job.runnable and ran == [datetime(2026, 3, 4, 9, tzinfo=UTC)] and job.error is None
    assert report.not_runnable == 1 and report.counts["ran"] == 3 and report.counts["unsupported"] == 1
    assert report.metrics["search_p95_ms"] is not None and report.metrics["intent_accuracy"] is None

    dumped = orjson.loads(orjson.dumps(report_json(report)))
    assert {"pass_rate", "metrics", "scenarios", "not_runnable"} <= dumped.keys()
    assert {"id", "passed", "expectations", "runnable", "reason"} <= dumped["scenarios"][0].keys()
    text = render(report)
    assert "NOT RUNNABLE" in text and "reindex" in text and "pass rate" in text
    # Each scenario's index is gone once its system stopped (28 scenarios' shards held 3 GB till the file's end).
    left = [p.name for p in (settings.store.data_dir / "qdrant").iterdir() if p.name.startswith("eval-")]
    assert left == [], left


PROBES = Path(__file__).parent.parent / "bench" / "probe-scenarios.jsonl"


@pytest.mark.timeout(300)  # a system per scenario: 40-70 s alone, 120 s+ beside the suite's other process
def test_the_probe_scenarios_hold(settings, paired) -> None:
    """28 scenarios written to probe generalisation (new wording, domains, distractors; zh and en):
    a regression guard on the whole write and read path. 53 of 56 expectations pass on a quiet run;
    the correction scenarios are timing-sensitive on a busy machine (a session's end and a later
    correction racing through resolve: seen as 51/56 in 1 run of 3), hence a margin of 2."""
    # The suite's 300 ms reclaim (for its crash tests) re-delivers a resolve batch still being embedded on a
    # busy machine; same-key candidates then race through re-resolves (a known write-path gap, issue 7).
    quiet = settings.replace(reclaim_idle_ms=60_000)
    report = evaluate(parse_lines(PROBES.read_text().splitlines()), quiet, paired, file=str(PROBES))
    failed = [(s.id, c.kind, c.expected) for s in report.scenarios for c in s.expectations if c.passed is False]
    assert report.not_runnable == 0
    assert len(failed) <= 5, failed


LIFECYCLE = Path(__file__).parent.parent / "bench" / "lifecycle-scenarios.jsonl"


@pytest.mark.timeout(300)  # a system per scenario: 40-70 s alone, 120 s+ beside the suite's other process
def test_the_lifecycle_scenarios_hold(settings, paired) -> None:
    """16 scenarios on how memories evolve over time (zh and en): expired events, fading session context,
    temporary wishes, corrections months later, a grumpy remark against a well-used preference, a preference
    restated in three sessions a year on, an archived topic mentioned again, a contest settled by review,
    forgetting, a rule a year on. All 38 expectations pass; none is known to fail."""
    quiet = settings.replace(reclaim_idle_ms=60_000)  # as for the probes (issue 7)
    report = evaluate(parse_lines(LIFECYCLE.read_text().splitlines()), quiet, paired, file=str(LIFECYCLE))
    failed = [(s.id, c.kind, c.expected) for s in report.scenarios for c in s.expectations if c.passed is False]
    assert report.not_runnable == 0 and report.counts["scenarios"] == 16
    assert failed == []
