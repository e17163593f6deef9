"""The query worker: search, pack, forget, inspect, feedback and the maintenance calls, as RQ jobs.

It runs as an RQ `SimpleWorker` (no fork per job: forking a process that holds torch
deadlocks, and the model and the store are loaded once; workers/rq_adapter.py). Every call is an RPC
of the table in `shared.sdk.rpc`: one entry point (`serve`) validates the job's request and hands it, with
this worker's context, to the call's handler (`HANDLERS`); the reply goes back as JSON (RQ's
JSONSerializer), validated by its model. A search's ranking order is pipeline/search.py's.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from functools import partial
from typing import Any, Generic

from rq import Queue
from rq.serializers import JSONSerializer

from memflow.pipeline import search as recipe
from memflow.pipeline.gate import gate, redact
from memflow.pipeline.models import Memory, PackedPrompt, SearchRequest, SearchResult, Trace
from memflow.pipeline.pack import pack as build_prompt
from memflow.pipeline.profile import ProfileReply
from memflow.shared.changes import profiles
from memflow.shared.errors import MemflowError, StoreUnavailable
from memflow.shared.inference.llm import usage as llm_usage
from memflow.shared.monitoring import metrics
from memflow.shared.monitoring.status import Traces
from memflow.shared.redisdb.keys import STAGES
from memflow.shared.sdk.rpc import (
    EXPORT,
    FEEDBACK,
    FORGET,
    HEALTH,
    HISTORY,
    IMPORT,
    INSPECT,
    PACK,
    PROFILE,
    REVIEW_DECIDE,
    REVIEW_LIST,
    ROLLBACK,
    RUN_JOB,
    SEARCH,
    SUBJECTS,
    VERIFY_FORGOTTEN,
    WORKERS_MODULE,
    Adopted,
    ExportedSubject,
    ExportRequest,
    FeedbackRequest,
    ForgetProof,
    ForgetReport,
    ForgetRequest,
    Health,
    HealthRequest,
    History,
    HistoryRequest,
    Imported,
    ImportRequest,
    InspectReport,
    InspectRequest,
    JobReport,
    PackRequest,
    ProfileRequest,
    Rep,
    Req,
    ReviewDecideRequest,
    ReviewDecision,
    ReviewList,
    ReviewListRequest,
    RollbackReport,
    RollbackRequest,
    Rpc,
    RunJobRequest,
    SubjectList,
    SubjectsRequest,
    VerifyRequest,
    request_of,
)
from memflow.shared.search.reader import profile_for
from memflow.shared.storage.store import MemoryFilter
from memflow.shared.streaming.backlog import backlog
from memflow.shared.unstored import pending
from memflow.shared.writer.uses import Uses
from memflow.workers import forgetting, jobs, ops, transfer
from memflow.workers.rq_adapter import QueryWorker, RpcJob
from memflow.workers.runtime import Context

log = logging.getLogger(__name__)


# -- search ------------------------------------------------------------------


def search(ctx: Context, req: SearchRequest) -> SearchResult:
    """The search `req` asks for (pipeline/search.py), traced."""
    now = req.now or datetime.now(UTC)
    started = time.perf_counter()
    searched = recipe.search(ctx.search_reader, profile_for(ctx.settings, ctx.ranking, req.query), req, now)
    result = searched.result(req)
    result.latency_ms = (time.perf_counter() - started) * 1000
    record_trace(ctx.traces, ops.UtilisationCounters(ctx.transient, ctx.keys), req, result, searched.scored, now,
                 searched.plan_error)
    return result


def record_trace(traces: Traces, utilisation: ops.UtilisationCounters, req: SearchRequest, result: SearchResult,
                 scored: list[tuple[Memory, float]], now: datetime, plan_error: str | None = None) -> None:
    plan = result.plan
    dirs = sorted({d.value for route in plan.routes for d in route.dirs}) if plan else []
    trace = Trace(subject=req.subject, query=redact(req.query)[:200], intent=plan.intent if plan else "",
                  source=plan.source if plan else "heuristic", dirs=dirs,
                  candidates=_candidates(scored, result),
                  chosen=[h.id for h in result.hits], fallback=result.fallback or bool(plan and plan.fallback),
                  status=result.status, error=result.error, latency_ms=result.latency_ms, now=now,
                  plan_error=plan_error, period=plan.period.label if plan and plan.period else None)
    # The trace, the latency histogram (GET /metrics) and the subject's use go to Redis in one round trip.
    pipe = traces.client.pipeline(transaction=False)
    traces.add(trace, via=pipe)
    metrics.record_search(pipe, traces.keys, result.status, result.latency_ms / 1000)
    utilisation.count(req.subject, now, recalled=len(result.hits), via=pipe)
    traced = pipe.execute()[0]  # the trace's id in the feed: indexed under its subject (bounded)
    traces.remember(req.subject, traced)


def _candidates(scored: list[tuple[Memory, float]], result: SearchResult) -> list[dict[str, Any]]:
    """The top fused candidates with their relevance, and every chosen one (a reserved place may go to a
    memory below the top 20) with every factor of its score."""
    factors = {h.id: {name: round(v, 6) for name, v in h.scores.items()} for h in result.hits}
    shown = [(m, score) for i, (m, score) in enumerate(scored) if i < 20 or m.id in factors]
    return [{"id": m.id, "score": round(score, 6), **factors.get(m.id, {})} for m, score in shown]


def pack(ctx: Context, req: PackRequest) -> PackedPrompt:
    """A prompt for `query`; packing counts as adoption of every memory it used."""
    when = req.now or datetime.now(UTC)
    search_req = SearchRequest(subject=req.subject, query=req.query, k=20, now=when)
    searched = recipe.search(ctx.search_reader, profile_for(ctx.settings, ctx.ranking, req.query), search_req, when)
    if searched.failed is not None:
        raise searched.failed
    packed = build_prompt(searched.hits, req.system_prompt, req.budget_tokens, ctx.embedder.count_tokens)
    # Its uses are recorded once per request and counted on the points without waiting for the write lock.
    ops.feedback(ctx.applier, Uses(ctx.client, ctx.keys), ops.UtilisationCounters(ctx.transient, ctx.keys), req.subject,
                 packed.used_ids, when, req.request_id, recalled=len(searched.hits))
    return packed


# -- adoption, forgetting, inspection -------------------------------------------


def feedback(ctx: Context, req: FeedbackRequest) -> Adopted:
    """Count memories as adopted (used in an answer): access_count + 1, per subject."""
    ids = ops.resolve_ids(ctx.store, req.subject, req.memory_ids)
    count = ops.feedback(ctx.applier, Uses(ctx.client, ctx.keys), ops.UtilisationCounters(ctx.transient, ctx.keys),
                         req.subject, ids, req.at or datetime.now(UTC), req.request_id)
    return Adopted(count=count)


def forget(ctx: Context, req: ForgetRequest) -> ForgetReport:
    """Forget memories everywhere memflow kept their words (workers/forgetting.py)."""
    ids = None if req.memory_ids is None else ops.resolve_ids(ctx.store, req.subject, req.memory_ids)
    report = forgetting.forget(ctx.applier, forgetting.Places.of(ctx), req.subject, ids, req.contains,
                               datetime.now(UTC))
    return ForgetReport.model_validate(report)


def verify_forgotten(ctx: Context, req: VerifyRequest) -> ForgetProof:
    proof = forgetting.verify(ctx.store, forgetting.Places.of(ctx), req.subject, req.memory_ids, req.contains)
    return ForgetProof.model_validate(proof)


def inspect(ctx: Context, req: InspectRequest) -> InspectReport:
    """Each memory with its state, tier, strength now, uses and last change; utilisation; backlog."""
    when = req.now or datetime.now(UTC)
    memories = ctx.store.get(MemoryFilter(req.subject))
    memories.sort(key=lambda m: (m.created_at, m.id))
    taus = ctx.settings.lifecycle.decay_tau_hours
    llm = None if ctx.llm is None else {"subject": llm_usage(ctx.transient, ctx.keys, req.subject, when),
                                        "everyone": llm_usage(ctx.transient, ctx.keys, None, when)}
    return InspectReport.model_validate({
        "subject": req.subject, "now": when, "memories": [ops.memory_state(m, when, taus) for m in memories],
        "utilisation": ops.UtilisationCounters(ctx.transient, ctx.keys).report(req.subject, when), "llm": llm,
        "backlog": backlog(ctx.client, ctx.keys, STAGES), "people": ops.people_of(memories),
        "pending": [{"event_id": s.turn.event_id, "session_id": s.session_id, "text": v.text, "ts": s.turn.ts}
                    for s in pending.read(ctx.client, ctx.keys, req.subject)
                    if (v := gate(s.turn.text, s.turn.role)).keep]})  # as a search would read it: gated


# -- maintenance: jobs, history, rollback, review (workers/jobs.py, workers/ops.py) -----


def run_job(ctx: Context, req: RunJobRequest) -> JobReport:
    """A maintenance job, run here because this process holds the store."""
    report = jobs.run(ctx, req.name, req.subject, req.now or datetime.now(UTC), req.dry_run,
                      req.tier.value if req.tier else None)
    return jobs.report_of(report, ctx.foreground.step_aside)


def history(ctx: Context, req: HistoryRequest) -> History:
    return History.model_validate(ops.history(ctx.store, req.memory_id, req.subject, req.within))


def rollback(ctx: Context, req: RollbackRequest) -> RollbackReport:
    report = ops.rollback(ctx.applier, ctx.embedder, req.memory_id, req.to_version, req.subject,
                          req.at or datetime.now(UTC), ctx.id_space)
    return RollbackReport.model_validate(report)


def review_list(ctx: Context, req: ReviewListRequest) -> ReviewList:
    return ReviewList.model_validate({"waiting": ops.review_list(ctx.store, req.subject)})


def review_decide(ctx: Context, req: ReviewDecideRequest) -> ReviewDecision:
    report = ops.review_decide(ctx.applier, req.memory_id, req.accept, req.subject,
                               req.at or datetime.now(UTC))
    return ReviewDecision.model_validate(report)


def health(ctx: Context, req: HealthRequest) -> Health:
    """The store answers a count: what `/healthz` asks of a query worker."""
    try:
        return Health(store="ok", memories=ctx.store.count())
    except StoreUnavailable as exc:
        return Health(store="unavailable", error=str(exc))


def subjects(ctx: Context, req: SubjectsRequest) -> SubjectList:
    """Every subject the store holds memories of (a front door shows a caller the ones its key covers)."""
    return SubjectList(subjects=sorted(ctx.store.subjects()))


def profile(ctx: Context, req: ProfileRequest) -> ProfileReply:
    """The subject's profile (shared/changes/profiles.py): the materialized one, or built from the store and kept."""
    found = profiles.current(ctx.store, ctx.client, ctx.keys, req.subject, req.now or datetime.now(UTC))
    return profiles.reply(ctx.client, ctx.keys, found, req.since, req.max_tokens)


def export(ctx: Context, req: ExportRequest) -> ExportedSubject:
    """Every stored point of a subject, for `memflow export` (workers/transfer.py, docs/export-format.md)."""
    page = transfer.export_subject(ctx.store, ctx.embedder, req.subject, req.with_vectors, req.after, req.limit)
    return ExportedSubject.model_validate(page)


def import_subject(ctx: Context, req: ImportRequest) -> Imported:
    """Write what a subject lacks of an export, through the applier (workers/transfer.py)."""
    return Imported.model_validate(transfer.import_subject(ctx.applier, ctx.embedder, ctx.id_space, req))


# -- the worker ----------------------------------------------------------------


@dataclass(frozen=True)
class Handler(Generic[Req, Rep]):
    """What the worker runs for one RPC of the table (typed: the handler takes that RPC's request and
    answers its reply)."""

    rpc: Rpc[Req, Rep]
    run: Callable[[Context, Req], Rep]


HANDLERS: dict[str, Handler[Any, Any]] = {h.rpc.name: h for h in (
    Handler(SEARCH, search), Handler(PACK, pack), Handler(FORGET, forget),
    Handler(VERIFY_FORGOTTEN, verify_forgotten), Handler(FEEDBACK, feedback), Handler(INSPECT, inspect),
    Handler(RUN_JOB, run_job), Handler(HISTORY, history), Handler(ROLLBACK, rollback),
    Handler(REVIEW_LIST, review_list), Handler(REVIEW_DECIDE, review_decide), Handler(HEALTH, health),
    Handler(SUBJECTS, subjects), Handler(EXPORT, export), Handler(IMPORT, import_subject),
    Handler(PROFILE, profile))}


def serve(ctx: Context, job_name: str, args: Sequence[Any], kwargs: dict[str, Any]) -> Any:
    """Run one RPC job: its request validated (whoever enqueued it), its handler, its reply as JSON.
    An error (a refused request, a handler's MemflowError) fails the job: the client raises RpcError."""
    name = job_name.removeprefix(f"{WORKERS_MODULE}.")
    handler = HANDLERS.get(name) if job_name != name else None
    if handler is None:
        raise MemflowError(f"{job_name!r} is no RPC of the query worker: one of {', '.join(HANDLERS)}")
    return handler.run(ctx, request_of(handler.rpc, args, kwargs)).model_dump(mode="json")


SEARCHES, JOBS = "query", "jobs"


def build_worker(ctx: Context, stop: threading.Event | None = None,
                 serves: Sequence[str] = (SEARCHES, JOBS)) -> QueryWorker:
    """A worker of the queues named in `serves` (SEARCHES: every call but the maintenance jobs; JOBS: those).
    A process runs one of each (workers/system.py), so a job of an hour never holds a search: one worker
    serving both runs one job at a time, whatever its queues' order."""
    ctx.store  # noqa: B018 - load the model and open the store before the first job, not during it
    try:  # and measure what a query's noise floor is measured against, if the embedder answers now
        ctx.unrelated  # noqa: B018
    except MemflowError as exc:  # an endpoint that is down: the first search that can will measure it
        log.warning("noise floor not measured at start: %s", exc)
    # Searches first: RQ takes from the first non-empty queue, so a worker of both never starts a job
    # while a search waits in the queue.
    names = {SEARCHES: ctx.keys.query_queue, JOBS: ctx.keys.jobs_queue}
    queues = [Queue(names[kind], connection=ctx.transient, serializer=JSONSerializer)
              for kind in (SEARCHES, JOBS) if kind in serves]
    # worker_ttl 16 s: the key of a worker that died goes within a minute; its dequeue blocks DEQUEUE_WAIT_S.
    # No job descriptions in the log: a search's description is its query, and a query may hold a secret.
    return QueryWorker(queues, connection=ctx.transient, serializer=JSONSerializer, worker_ttl=16,
                       stop=stop, log_job_description=False, job_class=RpcJob.bound_to(partial(serve, ctx)),
                       foreground=ctx.foreground, maintenance=ctx.keys.jobs_queue)
