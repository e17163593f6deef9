"""Scoring behaviour scenarios: pure functions from (expectation, what a search returned) to verdicts.

Nothing here talks to Redis or the store, so every rule of docs/ranking.md#scenarios is tested on hand-made
results. A list expectation (`hit`, `absent`, `contested`, `dirs_include`) yields one verdict
per listed item: "2 of 3 substrings found" is more information than one failed line.
An expectation this module does not know is reported "unsupported", never guessed at and
never counted as passed or failed: the format may grow faster than the scorer.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from memflow.pipeline.models import SearchResult

BRIEF_CHARS = 60
BRIEF_HITS = 5

# Which aggregate each expectation kind feeds (docs/ranking.md#scenarios).
METRIC_OF = {
    "intent": "intent_accuracy",
    "dirs_include": "dir_hit_rate",
    "hit": "recall_at_k",
    "top1": "top1_accuracy",
    "absent": "temporal_correctness",
    "contested": "contested_detection",
    "empty": "empty_accuracy",
}
# A query with one of these expects something back: it counts in the empty-recall rate.
EXPECTS_HITS = ("hit", "top1", "contested")


class Seen(BaseModel):
    """One returned memory, as far as scoring cares."""

    model_config = ConfigDict(frozen=True)

    content: str
    dir: str = ""
    contested: bool = False

    def brief(self) -> str:
        text = self.content if len(self.content) <= BRIEF_CHARS else self.content[:BRIEF_CHARS - 1] + "…"
        return f"{text} [contested]" if self.contested else text

    def holds(self, needle: str) -> bool:
        return needle.casefold() in self.content.casefold()


class Returned(BaseModel):
    """What one search returned, reduced to what the expectations look at."""

    model_config = ConfigDict(frozen=True)

    status: Literal["ok", "empty", "failed"] = "ok"
    hits: list[Seen] = []
    intent: str | None = None
    dirs: list[str] = []  # the directories the plan scoped its routes to
    fallback: bool = False
    error: str | None = None

    def briefs(self) -> list[str]:
        return [h.brief() for h in self.hits[:BRIEF_HITS]]


def returned(result: SearchResult) -> Returned:
    plan = result.plan
    dirs = sorted({d.value for route in plan.routes for d in route.dirs}) if plan else []
    hits = [Seen(content=h.content, dir=h.dir.value, contested=h.contested or h.status.value == "contested")
            for h in result.hits]
    return Returned(status=result.status, hits=hits, intent=plan.intent if plan else None, dirs=dirs,
                    fallback=result.fallback or bool(plan and plan.fallback), error=result.error)


class Check(BaseModel):
    """The verdict on one expectation (one item of a list expectation), with what was returned.

    `passed` is None for an expectation that could not be scored (unknown kind, bad shape).
    """

    kind: str
    expected: Any
    passed: bool | None
    got: Any = None
    note: str = ""
    step: int | None = None
    query: str | None = None


def _check(kind: str, expected: Any, ok: bool, got: Any, note: str = "") -> Check:
    return Check(kind=kind, expected=expected, passed=ok, got=got, note=note)


def unsupported(kind: str, expected: Any, note: str) -> Check:
    return Check(kind=kind, expected=expected, passed=None, note=note)


class BadExpectation(ValueError):
    """An expectation whose value has the wrong shape (reported, not scored)."""


def _strings(value: Any) -> list[str]:
    # Liberal: one string where a list was meant is that one-item list.
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return value
    raise BadExpectation("expected a string or a list of strings")


def _string(value: Any) -> str:
    if isinstance(value, str):
        return value
    raise BadExpectation("expected a string")


# -- one function per expectation kind --------------------------------------------


def check_intent(expected: Any, got: Returned) -> list[Check]:
    want = _string(expected)
    return [_check("intent", want, got.intent == want, got.intent)]


def check_dirs(expected: Any, got: Returned) -> list[Check]:
    # The plan must name the directory. An unscoped route searches every directory, which
    # would make this metric pass trivially and say nothing about the planner.
    seen = ", ".join(dict.fromkeys(h.dir for h in got.hits)) or "nothing"
    note = "" if got.dirs else f"unscoped plan; top hits from {seen}"
    return [_check("dirs_include", d, d in got.dirs, got.dirs, note) for d in _strings(expected)]


def check_hit(expected: Any, got: Returned) -> list[Check]:
    return [_check("hit", s, any(h.holds(s) for h in got.hits), got.briefs()) for s in _strings(expected)]


def check_top1(expected: Any, got: Returned) -> list[Check]:
    want = _string(expected)
    first = got.hits[0] if got.hits else None
    return [_check("top1", want, first is not None and first.holds(want), first.brief() if first else None,
                   "" if first else "nothing returned")]


def check_absent(expected: Any, got: Returned) -> list[Check]:
    # A contested memory may be shown next to its rival: it is flagged, not "current".
    checks = []
    for s in _strings(expected):
        current = [h.brief() for h in got.hits if h.holds(s) and not h.contested]
        checks.append(_check("absent", s, not current, current or got.briefs(),
                             "returned as current" if current else ""))
    return checks


def check_contested(expected: Any, got: Returned) -> list[Check]:
    checks = []
    for s in _strings(expected):
        holding = [h for h in got.hits if h.holds(s)]
        flagged = any(h.contested for h in holding)
        note = "" if flagged else ("returned but not flagged contested" if holding else "not returned")
        checks.append(_check("contested", s, flagged, [h.brief() for h in holding] or got.briefs(), note))
    return checks


def check_empty(expected: Any, got: Returned) -> list[Check]:
    if not isinstance(expected, bool):
        raise BadExpectation("expected true or false")
    return [_check("empty", expected, (not got.hits) == expected, len(got.hits), "; ".join(got.briefs()[:1]))]


CHECKS: dict[str, Callable[[Any, Returned], list[Check]]] = {
    "intent": check_intent,
    "dirs_include": check_dirs,
    "hit": check_hit,
    "top1": check_top1,
    "absent": check_absent,
    "contested": check_contested,
    "empty": check_empty,
}


def score(expect: Mapping[str, Any], got: Returned) -> list[Check]:
    """Every expectation of one query, judged against what it returned."""
    if got.status == "failed":
        return fail_all(expect, f"search failed: {got.error}")
    checks: list[Check] = []
    for kind, expected in expect.items():
        if kind not in CHECKS:
            checks.append(unsupported(kind, expected, "unknown expectation"))
            continue
        try:
            checks.extend(CHECKS[kind](expected, got))
        except BadExpectation as exc:
            checks.append(unsupported(kind, expected, str(exc)))
    return checks


def fail_all(expect: Mapping[str, Any], note: str) -> list[Check]:
    """Every expectation of a query that could not be answered (or was never reached) fails:
    a system that errors must not score better than one that answers wrongly."""
    checks = []
    for kind, expected in expect.items():
        if kind not in CHECKS:
            checks.append(unsupported(kind, expected, "unknown expectation"))
            continue
        items = expected if isinstance(expected, list) else [expected]
        checks.extend(Check(kind=kind, expected=item, passed=False, note=note) for item in items)
    return checks


# -- aggregates ------------------------------------------------------------------------


class QueryOutcome(BaseModel):
    """One query step as replayed: what it asked, what came back, how long it took, the verdicts."""

    step: int
    subject: str
    text: str
    status: Literal["ok", "empty", "failed", "not_reached"]
    hits: list[str] = []
    intent: str | None = None
    dirs: list[str] = []
    fallback: bool = False
    client_ms: float | None = None  # wall time of the search call in the runner (RPC included)
    server_ms: float | None = None  # the query worker's own `latency_ms`
    checks: list[Check] = []

    def expects_hits(self) -> bool:
        return any(c.kind in EXPECTS_HITS and c.passed is not None for c in self.checks) or any(
            c.kind == "empty" and c.expected is False for c in self.checks)


def rate(checks: Iterable[Check]) -> float | None:
    """Share of scored checks that passed; None when nothing was scored (not 0, not 1)."""
    scored = [c.passed for c in checks if c.passed is not None]
    return sum(scored) / len(scored) if scored else None


def percentile(values: Sequence[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[max(0, math.ceil(q * len(ordered)) - 1)]


def metrics(queries: Sequence[QueryOutcome]) -> dict[str, float | None]:
    checks = [c for q in queries for c in q.checks]
    out: dict[str, float | None] = {name: rate(c for c in checks if c.kind == kind) for kind, name in METRIC_OF.items()}
    answered = [q for q in queries if q.status in ("ok", "empty")]
    wanting = [q for q in answered if q.expects_hits()]
    out["empty_recall_rate"] = sum(not q.hits for q in wanting) / len(wanting) if wanting else None
    out["fallback_rate"] = sum(q.fallback for q in answered) / len(answered) if answered else None
    ran = [q for q in queries if q.status != "not_reached"]
    out["search_failure_rate"] = sum(q.status == "failed" for q in ran) / len(ran) if ran else None
    client = [q.client_ms for q in ran if q.client_ms is not None]
    server = [q.server_ms for q in answered if q.server_ms is not None]
    out |= {"search_p50_ms": percentile(client, 0.5), "search_p95_ms": percentile(client, 0.95),
            "server_p50_ms": percentile(server, 0.5), "server_p95_ms": percentile(server, 0.95)}
    return out
