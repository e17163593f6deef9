"""`memflow eval FILE.jsonl`: replay behaviour scenarios (docs/ranking.md#scenarios) in the real system, scored.

Every scenario gets a fresh namespace (its own stream prefix and Edge shard) on one
redis-server started for the run, with the embedding model loaded once. Steps run in
order on the scenario's clock: `at` is the event time and the search `now`. Before every
query, pack, forget and job the runner waits until the pipeline is idle.

Liberal in what it reads, strict in what it reports: a line that is not a JSON object stops the run
(the file is broken); a scenario it cannot replay faithfully (invalid, an unknown step, a
job that does not exist yet) is reported "not runnable" with the reason and left out of
the scores; an error of the system under test fails the expectations it kept from running.
Scoring itself is pure and lives in `bench/expectations.py`.
"""

from __future__ import annotations

import contextlib
import logging
import shutil
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import orjson
from pydantic import AliasChoices, BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from memflow.bench.ablation import ladder
from memflow.bench.expectations import Check, QueryOutcome, fail_all, metrics, rate, returned, score
from memflow.pipeline.models import Dir, MType, Role, SearchResult, Subject
from memflow.shared.codec import json_object
from memflow.shared.errors import DecodeError, MemflowError
from memflow.shared.inference.embedder import Embedder, build_embedder
from memflow.shared.redisdb.server import start_redis
from memflow.shared.settings import Settings
from memflow.shared.storage.store import INDEX_SEPARATOR, is_index_of
from memflow.workers.embedded import Embedded, embedded

log = logging.getLogger(__name__)

IDLE_TIMEOUT_S = 60.0
# Stages poll at this pace instead of the 1 s default, so that a stopped system's threads
# are gone soon after the scenario (they overlap the next one; see `stop_in_background`).
EVAL_BLOCK_MS = 50

# The maintenance jobs a `run` step may name, called with the running system and the step's
# `at`: each runs in the system's query worker over the scenario's subjects, as the scheduler
# would have it (decay over both tiers). A job not listed makes its scenario not runnable.
JobRunner = Callable[[Embedded, datetime], None]


def _job(name: str) -> JobRunner:
    def run(system: Embedded, now: datetime) -> None:
        system.client.run_job(name, now=now)

    return run


JOBS: dict[str, JobRunner] = {name: _job(name) for name in ("decay", "consolidate", "review")}


# -- the format -----------------------------------------------------------------------


class Lenient(BaseModel):
    """The scenario format may grow: unknown keys are kept, not refused. At the step's top level
    they are taken for annotations and ignored; inside an action (`query`, `say`, ...) they would
    change what the step means, so the scenario is reported not runnable (see `preflight`)."""

    model_config = ConfigDict(extra="allow", frozen=True)


def _text_or_object(value: Any) -> Any:
    return {"text": value} if isinstance(value, str) else value


class Say(Lenient):
    session: str = "s1"
    role: Role = Role.user
    text: str = Field(min_length=1)
    agent_id: str | None = None
    meta: dict[str, Any] = Field(default_factory=dict)


class TaskComplete(Lenient):
    session: str = "s1"
    outcome: str | None = None
    text: str = ""


class Forget(Lenient):
    contains: str | None = None
    ids: list[str] | None = None

    @model_validator(mode="after")
    def _something(self) -> Forget:
        if not self.contains and self.ids is None:
            raise ValueError("forget needs `contains` or `ids`")
        return self


class Pack(Lenient):
    text: str
    budget: int = Field(default=800, validation_alias=AliasChoices("budget", "budget_tokens"))
    system_prompt: str = ""


class Query(Lenient):
    text: str = Field(min_length=1)
    k: int | None = Field(default=None, ge=1, le=200)  # the search request's own bounds
    dirs: list[Dir] | None = None
    mtypes: list[MType] | None = None


ACTIONS = ("say", "end_session", "task_complete", "run", "forget", "pack", "query")


class Step(Lenient):
    at: datetime
    subject: Subject | None = None
    say: Say | None = None
    end_session: str | None = None
    task_complete: TaskComplete | None = None
    run: str | None = None
    forget: Forget | None = None
    pack: Pack | None = None
    query: Query | None = None
    expect: dict[str, Any] | None = None

    @field_validator("at")
    @classmethod
    def _utc_if_naive(cls, at: datetime) -> datetime:
        return at if at.tzinfo else at.replace(tzinfo=UTC)

    @field_validator("end_session", mode="before")
    @classmethod
    def _session_of(cls, value: Any) -> Any:
        return value.get("session") if isinstance(value, dict) else value

    @field_validator("run", mode="before")
    @classmethod
    def _job_name(cls, value: Any) -> Any:
        return (value.get("job") or value.get("name")) if isinstance(value, dict) else value

    @field_validator("query", "pack", mode="before")
    @classmethod
    def _plain_text(cls, value: Any) -> Any:
        return _text_or_object(value)

    def actions(self) -> list[str]:
        """The step's action keys; with no known one, its unknown keys (a step kind we do not know)."""
        known = [a for a in ACTIONS if getattr(self, a) is not None]
        return known or sorted(self.model_extra or {})


class Scenario(Lenient):
    id: str
    subject: Subject
    description: str = ""
    steps: list[Step]


@dataclass(frozen=True)
class Entry:
    """One line of the file: a scenario, or why it is not one."""

    line: int
    id: str
    scenario: Scenario | None
    problem: str | None = None


class ScenarioFileError(Exception):
    """The file cannot be run at all (missing, unreadable, a line that is not a JSON object)."""


def load(path: Path) -> list[Entry]:
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ScenarioFileError(f"cannot read {path}: {exc}") from exc
    entries = parse_lines(text.splitlines())
    if not entries:
        raise ScenarioFileError(f"{path}: no scenarios")
    return entries


def parse_lines(lines: Iterable[str]) -> list[Entry]:
    entries = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            raw = json_object(line)
        except DecodeError as exc:
            raise ScenarioFileError(f"line {number}: {exc}") from exc
        entries.append(parse_entry(number, raw))
    return entries


def parse_entry(line: int, raw: dict[str, Any]) -> Entry:
    name = str(raw.get("id") or f"line-{line}")
    try:
        return Entry(line, name, Scenario.model_validate(raw))
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "scenario"
        return Entry(line, name, None, f"invalid scenario: {where}: {first['msg']} ({exc.error_count()} error(s))")


def preflight(entry: Entry) -> list[str]:
    """Why this scenario cannot be replayed faithfully; empty when it can."""
    if entry.scenario is None:
        return [entry.problem or "invalid scenario"]
    return [f"step {i}: {problem}" for i, step in enumerate(entry.scenario.steps) for problem in step_problems(step)]


def step_problems(step: Step) -> list[str]:
    actions = step.actions()
    if len(actions) != 1:
        return ["no action" if not actions else f"several actions ({', '.join(actions)})"]
    action = actions[0]
    if action not in ACTIONS:
        return [f"unknown step kind {action!r}"]
    problems = []
    options = getattr(step, action)
    if isinstance(options, Lenient) and options.model_extra:
        problems.append(f"unknown {action} option(s) {', '.join(sorted(options.model_extra))}")
    if step.run is not None and step.run not in JOBS:
        problems.append(f"job {step.run!r} does not exist yet")
    if step.expect is not None and step.query is None:
        problems.append("`expect` on a step that is not a query")
    return problems


# -- replaying one scenario -------------------------------------------------------------


class Stalled(MemflowError):
    """The pipeline did not go idle: what follows would be measured on a half-written store."""


class Replay:
    """One scenario's steps, in order, against one running system, on the scenario's clock."""

    def __init__(self, scenario: Scenario, system: Embedded, idle_timeout_s: float = IDLE_TIMEOUT_S) -> None:
        self.scenario = scenario
        self.system = system
        self.client = system.client
        self.idle_timeout_s = idle_timeout_s
        self.handlers: dict[str, Callable[[int, Step], QueryOutcome | None]] = {
            "say": self._say, "end_session": self._end_session, "task_complete": self._task_complete,
            "run": self._run, "forget": self._forget, "pack": self._pack, "query": self._query}

    def run(self) -> tuple[list[QueryOutcome], str | None]:
        """The outcome of every query step, and the error that stopped the replay, if one did."""
        outcomes: list[QueryOutcome] = []
        steps = self.scenario.steps
        for i, step in enumerate(steps):
            try:
                outcome = self.handlers[step.actions()[0]](i, step)
            except MemflowError as exc:
                error = f"step {i} ({step.actions()[0]}): {type(exc).__name__}: {exc}"
                return outcomes + unreached(steps, i, self.scenario.subject, error), error
            if outcome is not None:
                outcomes.append(outcome)
        return outcomes, None

    def prepare(self) -> list[int]:
        """Every step but the queries, then wait until the pipeline is idle: the store the queries are asked of.
        The query steps' indices (bench/ranking_check.py asks them later, of a copy of that store); ValueError
        when a query comes before a step of another kind (it would be asked of a later store than it was)."""
        steps = self.scenario.steps
        queries = [i for i, step in enumerate(steps) if step.query is not None]
        if queries != list(range(len(steps) - len(queries), len(steps))):
            raise ValueError(f"{self.scenario.id}: a query comes before another step; only trailing queries can be "
                             "asked of the finished store")
        for i, step in enumerate(steps):
            if step.query is None:
                self.handlers[step.actions()[0]](i, step)
        self._idle(len(steps))
        return queries

    def search(self, step: Step) -> SearchResult:
        """A query step's search as the runner asks it: the step's subject, options and time."""
        assert step.query is not None
        return self.client.search(self._subject(step), step.query.text, step.query.k, now=step.at,
                                  dirs=step.query.dirs, mtypes=step.query.mtypes)

    def _subject(self, step: Step) -> str:
        return step.subject or self.scenario.subject

    def _publish(self, i: int, step: Step, session: str, **fields: Any) -> None:
        self.client.publish({"event_id": f"e{i}", "subject": self._subject(step), "session_id": session,
                             "ts": step.at, **fields})

    def _idle(self, i: int) -> None:
        if not self.client.wait_idle(timeout_s=self.idle_timeout_s):
            raise Stalled(f"the pipeline was not idle {self.idle_timeout_s:.0f} s after step {i - 1}")

    def _say(self, i: int, step: Step) -> None:
        assert step.say is not None
        said = step.say
        self._publish(i, step, said.session, kind="message", role=said.role, text=said.text, meta=said.meta,
                      agent_id=said.agent_id)

    def _end_session(self, i: int, step: Step) -> None:
        assert step.end_session is not None
        self._publish(i, step, step.end_session, kind="session_end")

    def _task_complete(self, i: int, step: Step) -> None:
        assert step.task_complete is not None
        task = step.task_complete
        self._publish(i, step, task.session, kind="task_complete", text=task.text, meta={"outcome": task.outcome})

    def _run(self, i: int, step: Step) -> None:
        assert step.run is not None
        self._idle(i)
        JOBS[step.run](self.system, step.at)

    def _forget(self, i: int, step: Step) -> None:
        assert step.forget is not None
        self._idle(i)
        self.client.forget(self._subject(step), step.forget.ids, contains=step.forget.contains)

    def _pack(self, i: int, step: Step) -> None:
        assert step.pack is not None
        self._idle(i)
        self.client.pack(self._subject(step), step.pack.text, step.pack.budget, step.pack.system_prompt, now=step.at)

    def _query(self, i: int, step: Step) -> QueryOutcome:
        assert step.query is not None
        self._idle(i)
        subject, text = self._subject(step), step.query.text
        started = time.perf_counter()
        result = self.search(step)
        client_ms = (time.perf_counter() - started) * 1000
        got = returned(result)
        checks = [c.model_copy(update={"step": i, "query": text}) for c in score(step.expect or {}, got)]
        return QueryOutcome(step=i, subject=subject, text=text, status=result.status, hits=got.briefs(),
                            intent=got.intent, dirs=got.dirs, fallback=got.fallback, client_ms=client_ms,
                            server_ms=result.latency_ms, checks=checks)


def unreached(steps: Sequence[Step], failed_at: int, subject: str, error: str) -> list[QueryOutcome]:
    """The queries from `failed_at` on, which the replay never asked: their expectations fail."""
    note = f"not reached: {error}"
    return [QueryOutcome(step=i, subject=step.subject or subject, text=step.query.text, status="not_reached",
                         checks=[c.model_copy(update={"step": i, "query": step.query.text})
                                 for c in fail_all(step.expect or {}, note)])
            for i, step in enumerate(steps) if i >= failed_at and step.query is not None]


# -- running a file ----------------------------------------------------------------------


class ScenarioReport(BaseModel):
    id: str
    line: int
    description: str = ""
    runnable: bool
    reason: str | None = None  # why it is not runnable
    error: str | None = None  # what stopped the replay of a runnable one
    passed: bool | None = None  # None: not run, or nothing scored
    expectations: list[Check] = []
    queries: list[QueryOutcome] = []
    elapsed_s: float = 0.0


class Report(BaseModel):
    file: str
    pass_rate: float | None
    metrics: dict[str, float | None]
    counts: dict[str, int]
    not_runnable: int
    latency_note: str = ("search_p50/p95_ms: wall time of the client's search call (RPC included); "
                         "server_p50/p95_ms: the query worker's latency_ms")
    scenarios: list[ScenarioReport]


def namespace(base: Settings) -> Settings:
    """Settings for one scenario: a stream prefix and an Edge shard nobody else uses."""
    tag = uuid.uuid4().hex[:8]
    return base.replace(stream_prefix=f"eval-{tag}:", collection=f"eval-{tag}")


def run_entry(entry: Entry, base: Settings, embedder: Embedder, stopping: list[threading.Thread],
              idle_timeout_s: float = IDLE_TIMEOUT_S) -> ScenarioReport:
    problems = preflight(entry)
    description = entry.scenario.description if entry.scenario else ""
    if problems or entry.scenario is None:
        return ScenarioReport(id=entry.id, line=entry.line, description=description, runnable=False,
                              reason="; ".join(problems))
    started = time.perf_counter()
    with contextlib.ExitStack() as stack:
        settings = namespace(base)
        stack.callback(drop_index, settings)  # after the system stopped: an ExitStack unwinds last in, first out
        system = stack.enter_context(embedded(settings, light_in_process=True, embedder=embedder))
        queries, error = Replay(entry.scenario, system, idle_timeout_s).run()
        if error is None:
            stopping.append(stop_in_background(stack.pop_all()))
    checks = [c for q in queries for c in q.checks]
    scored = [c.passed for c in checks if c.passed is not None]
    return ScenarioReport(id=entry.id, line=entry.line, description=description, runnable=True, error=error,
                          passed=all(scored) if scored else None, expectations=checks, queries=queries,
                          elapsed_s=time.perf_counter() - started)


def drop_index(settings: Settings) -> None:
    """A finished scenario's Edge index (its shards, its record, any progress file): nobody reads it again, and
    ~115 MB of mapped pages each (a file of 28 scenarios held 3 GB till the run's end, in memory where the data
    dir is a tmpfs). A Qdrant server's collections are left as they were."""
    if settings.store.qdrant_url:
        return
    root, collection = settings.store.data_dir / "qdrant", settings.store.collection
    for path in root.glob(f"{collection}*"):
        if is_index_of(path.name, collection) and path.is_dir():
            shutil.rmtree(path, ignore_errors=True)
        elif path.is_file() and path.name.startswith((f"{collection}.", f"{collection}{INDEX_SEPARATOR}")):
            path.unlink(missing_ok=True)


def stop_in_background(stack: contextlib.ExitStack) -> threading.Thread:
    """Stop a finished scenario's system while the next one runs.

    Stopping takes a second, nearly all of it the query worker's idle dequeue wait (no work,
    no GIL held), which would otherwise be most of an eval's run time. Only a replay that
    ended cleanly is stopped this way: after an error a timed-out call may still sit in its
    queue, and the old worker must not run it while the next scenario's context is current.
    """
    thread = threading.Thread(target=stack.close, name="eval-stop", daemon=True)
    thread.start()
    return thread


def evaluate(entries: Sequence[Entry], base: Settings, embedder: Embedder, *, file: str = "",
             idle_timeout_s: float = IDLE_TIMEOUT_S) -> Report:
    """Replay every scenario; `base` must name a running Redis (each scenario gets its own namespace on it).
    `idle_timeout_s`: how long a step may leave the pipeline busy (a real model on the LLM path takes longer)."""
    reports: list[ScenarioReport] = []
    stopping: list[threading.Thread] = []
    try:
        for n, entry in enumerate(entries, 1):
            log.info("scenario %s/%s: %s", n, len(entries), entry.id)
            reports.append(run_entry(entry, base, embedder, stopping, idle_timeout_s))
    finally:
        for thread in stopping:
            thread.join()
    return summarise(file, reports)


def summarise(file: str, reports: list[ScenarioReport]) -> Report:
    ran = [r for r in reports if r.runnable]
    checks = [c for r in ran for c in r.expectations]
    counts = {"scenarios": len(reports), "ran": len(ran), "passed": sum(r.passed is True for r in ran),
              "failed": sum(r.passed is False for r in ran), "not_runnable": len(reports) - len(ran),
              "errors": sum(r.error is not None for r in ran), "queries": sum(len(r.queries) for r in ran),
              "expectations": sum(c.passed is not None for c in checks),
              "expectations_passed": sum(c.passed is True for c in checks),
              "unsupported": sum(c.passed is None for c in checks)}
    return Report(file=file, pass_rate=rate(checks), metrics=metrics([q for r in ran for q in r.queries]),
                  counts=counts, not_runnable=counts["not_runnable"], scenarios=reports)


# -- ablation ------------------------------------------------------------------------------


class AblationRow(BaseModel):
    step: str
    built: bool
    overrides: dict[str, Any] | None = None
    report: Report | None = None


def ablate(entries: Sequence[Entry], base: Settings, embedder: Embedder, *, file: str = "") -> list[AblationRow]:
    """The whole file once per step of the ladder; a step whose feature is not built is only listed."""
    rows = []
    for label, overrides in ladder():
        if overrides is None:
            rows.append(AblationRow(step=label, built=False))
            continue
        report = evaluate(entries, base.replace(**overrides), embedder, file=file)
        rows.append(AblationRow(step=label, built=True, overrides=overrides, report=report))
    return rows


# -- output -----------------------------------------------------------------------------------

METRIC_LABELS = {
    "intent_accuracy": "intent accuracy", "dir_hit_rate": "directory hit rate", "recall_at_k": "recall@k (hit)",
    "top1_accuracy": "top-1 accuracy", "temporal_correctness": "temporal correctness (absent)",
    "contested_detection": "contested detection", "empty_accuracy": "empty (expected nothing)",
    "empty_recall_rate": "empty-recall rate", "fallback_rate": "fallback rate",
    "search_failure_rate": "search failure rate",
}
ABLATION_COLUMNS = {"intent_accuracy": "intent", "dir_hit_rate": "dirs", "recall_at_k": "recall@k",
                    "top1_accuracy": "top1", "temporal_correctness": "temporal", "empty_recall_rate": "empty-rec",
                    "fallback_rate": "fallback", "search_p95_ms": "p95 ms"}


def _num(value: float | None, spec: str = ".3f") -> str:
    return "n/a" if value is None else format(value, spec)


def _got(check: Check) -> str:
    got = check.got
    if isinstance(got, list):
        got = " | ".join(str(g) for g in got) if got else "nothing"
    text = f"got {got}" if got is not None else ""
    return f"{text} — {check.note}" if check.note else text


def render_scenario(report: ScenarioReport) -> list[str]:
    if not report.runnable:
        return [f"{report.id:<32} NOT RUNNABLE  {report.reason}"]
    verdict = {True: "pass", False: "FAIL", None: "-"}[report.passed]
    scored = [c for c in report.expectations if c.passed is not None]
    lines = [f"{report.id:<32} {verdict:<4} {sum(c.passed is True for c in scored)}/{len(scored)}"
             f"  ({report.elapsed_s:.1f} s)"]
    if report.error:
        lines.append(f"    ERROR {report.error}")
    for c in report.expectations:
        mark = {True: "pass", False: "FAIL", None: "UNSUPPORTED"}[c.passed]
        lines.append(f"    {mark:<4} {c.kind:<12} {str(c.expected):<24} {_got(c)}")
    return lines


def render_metrics(report: Report) -> list[str]:
    c = report.counts
    m = report.metrics
    lines = [f"{'pass rate':<32} {_num(report.pass_rate)}  ({c['expectations_passed']}/{c['expectations']} "
             f"expectations; {c['unsupported']} unsupported)"]
    lines += [f"{label:<32} {_num(m[key])}" for key, label in METRIC_LABELS.items()]
    label = f"search p50 / p95 (n={c['queries']})"
    lines.append(f"{label:<32} {_num(m['search_p50_ms'], '.1f')} / {_num(m['search_p95_ms'], '.1f')} ms client-side"
                 f"   (query worker's own: {_num(m['server_p50_ms'], '.1f')} / {_num(m['server_p95_ms'], '.1f')} ms)")
    return lines


def render(report: Report) -> str:
    c = report.counts
    lines = [f"memflow eval {report.file}: {c['scenarios']} scenarios, {c['ran']} run ({c['passed']} passed, "
             f"{c['failed']} failed, {c['errors']} with errors), {c['not_runnable']} not runnable", ""]
    for scenario in report.scenarios:
        lines += render_scenario(scenario)
    return "\n".join([*lines, "", *render_metrics(report)])


def render_ablation(rows: list[AblationRow]) -> str:
    header = f"{'step':<22} {'pass rate':>9} " + " ".join(f"{v:>9}" for v in ABLATION_COLUMNS.values())
    lines = [header, "-" * len(header)]
    for row in rows:
        if row.report is None:
            lines.append(f"{row.step:<22} {'not built':>9}")
            continue
        m = row.report.metrics
        cells = " ".join(f"{_num(m[k], '.1f' if k.endswith('_ms') else '.3f'):>9}" for k in ABLATION_COLUMNS)
        switches = row.overrides or "none (no feature switch exists yet: the system as built)"
        lines.append(f"{row.step:<22} {_num(row.report.pass_rate):>9} {cells}   overrides: {switches}")
    first = next((r.report for r in rows if r.report), None)
    if first:
        lines.append(f"({first.counts['ran']} scenarios run, {first.not_runnable} not runnable, same data and k)")
    return "\n".join(lines)


def report_json(report: Report) -> dict[str, Any]:
    # The expectations already carry their verdicts; per query only what came back is repeated.
    dumped: dict[str, Any] = report.model_dump(mode="json",
                                               exclude={"scenarios": {"__all__": {"queries": {"__all__": {"checks"}}}}})
    return dumped


def ablation_json(rows: list[AblationRow]) -> dict[str, Any]:
    steps = [{"step": r.step, "built": r.built, "overrides": r.overrides,
              **({"pass_rate": r.report.pass_rate, "metrics": r.report.metrics, "counts": r.report.counts,
                  "not_runnable": r.report.not_runnable} if r.report else {})} for r in rows]
    return {"steps": steps}


# -- the command ---------------------------------------------------------------------------------


@contextlib.contextmanager
def bench_settings(settings: Settings) -> Iterator[Settings]:
    """A redis-server and a data dir of the run's own: a measurement never writes into a live deployment."""
    with tempfile.TemporaryDirectory(prefix="memflow-eval-") as tmp:
        server = start_redis(Path(tmp) / "redis", binary=settings.redis.server)
        try:
            yield settings.replace(redis_url=server.url, data_dir=Path(tmp), qdrant_url=None,
                                   block_ms=EVAL_BLOCK_MS)
        finally:
            server.stop()


def run_cli(path: Path, *, as_json: bool, ablation: bool, settings: Settings) -> int:
    """Exit code 0 whenever the scenarios could be run, however they scored; 2 when they could not."""
    try:
        entries = load(path)
    except ScenarioFileError as exc:
        sys.stderr.write(f"memflow eval: {exc}\n")
        return 2
    embedder = build_embedder(settings)
    embedder.encode_queries(["warm-up: the first calls into the model pay one-time costs no search should be charged"])
    with bench_settings(settings) as base:
        if ablation:
            rows = ablate(entries, base, embedder, file=str(path))
            output = ablation_json(rows) if as_json else render_ablation(rows)
        else:
            report = evaluate(entries, base, embedder, file=str(path))
            output = report_json(report) if as_json else render(report)
    text = orjson.dumps(output, option=orjson.OPT_INDENT_2).decode() if isinstance(output, dict) else output
    sys.stdout.write(text + "\n")
    return 0
