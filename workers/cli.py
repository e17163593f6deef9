"""The `memflow` command line. Human-readable by default, `--json` for scripts."""

from __future__ import annotations

import logging
import os
import signal
import sys
import uuid
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from itertools import islice
from pathlib import Path
from typing import Annotated, Any

import orjson
import redis
import typer
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.base import BaseScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from pydantic import BaseModel

from memflow.pipeline.export import FormatError
from memflow.scheduler.app import build_scheduler, next_fire_times
from memflow.shared import dlq as dead
from memflow.shared import rpc
from memflow.shared.apikeys import KeyStore
from memflow.shared.backlog import change_partitions
from memflow.shared.client import MemoryClient
from memflow.shared.connections import connect_queue, connect_streams, require_url, running
from memflow.shared.embedder import Embedder, build_embedder
from memflow.shared.errors import InvalidInput, MemflowError
from memflow.shared.keys import FIELD, STAGES, Keys, recorded_partitions
from memflow.shared.reindex import DEFAULT_BATCH, Report, Step, reindex
from memflow.shared.rpc import Rep
from memflow.shared.settings import Settings, get_settings, to_env
from memflow.shared.status import PipelineStatus, SubjectFootprint, read_status, subject_footprint
from memflow.shared.store import Catalog, catalog_for
from memflow.workers.process import QUERY, own_redis, run_stages, say_durability, temporary_data_dir
from memflow.workers.system import Part

app = typer.Typer(help="memflow: long-term memory for LLM agents.", no_args_is_help=True,
                  pretty_exceptions_enable=False)
dlq_app = typer.Typer(help="Inspect and replay dead-letter streams.", no_args_is_help=True)
app.add_typer(dlq_app, name="dlq")
traces_app = typer.Typer(help="The search traces feed.", no_args_is_help=True)
app.add_typer(traces_app, name="traces")
jobs_app = typer.Typer(help="Maintenance jobs, run by a query worker.", no_args_is_help=True)
app.add_typer(jobs_app, name="jobs")
review_app = typer.Typer(help="Memories waiting for a decision.", no_args_is_help=True)
app.add_typer(review_app, name="review")
keys_app = typer.Typer(help="API keys for `memflow serve` and `memflow mcp`, each scoped to subjects.",
                       no_args_is_help=True)
app.add_typer(keys_app, name="keys")
partitions_app = typer.Typer(help="The partition count of the streams, recorded in Redis.", no_args_is_help=True)
app.add_typer(partitions_app, name="partitions")
bench_app = typer.Typer(help="Benchmarks: LoCoMo and MADial-Bench retrieval, performance.", no_args_is_help=True)
app.add_typer(bench_app, name="bench")

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def _settings(level: str | None = None) -> Settings:
    settings = get_settings()
    logging.basicConfig(level=level or settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return settings


def _print_json(value: Any) -> None:
    if isinstance(value, BaseModel):  # a typed reply: as it travels
        value = value.model_dump(mode="json")
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


# -- processes -------------------------------------------------------------------


@app.command()
def worker(stages: Annotated[list[str], typer.Argument(help=f"Any of {', '.join(STAGES)}, {QUERY}.")]) -> None:
    """Run stages in this process until SIGTERM/SIGINT."""
    unknown = set(stages) - set(STAGES) - {QUERY}
    if unknown:
        raise typer.BadParameter(f"unknown stage(s): {', '.join(sorted(unknown))}")
    run_stages(_settings(), stages)


@app.command("query-worker")
def query_worker() -> None:
    """Run the RQ query worker (search, pack, forget, inspect, feedback)."""
    run_stages(_settings(), [QUERY])


@app.command()
def up(serve: Annotated[bool, typer.Option("--serve", help="Also serve the HTTP API, /mcp and the inspector "
                                           "(as `memflow serve`, on MEMFLOW_HTTP_HOST:MEMFLOW_HTTP_PORT).")] = False,
       no_auth: Annotated[bool, typer.Option("--no-auth", help="With --serve: no API keys (local use only).")] = False,
       ) -> None:
    """Run the whole system on this machine: Redis (started if MEMFLOW_REDIS_URL is unset), every stage,
    the query worker, the scheduler (and with --serve the HTTP server). The stages that hold the store share
    this process (an Edge shard has one owner); the scheduler and the HTTP server run in threads of it."""
    if no_auth and serve:
        _warn_no_auth(get_settings().http.host)
    with own_redis(_settings()) as settings:
        jobs = _build_scheduler(settings, BackgroundScheduler)
        typer.echo(f"memflow up: redis {settings.redis.url}, prefix {settings.redis.stream_prefix}, "
                   f"store {settings.store.qdrant_url or settings.store.data_dir}"
                   + (f", http://{settings.http.host}:{settings.http.port}" if serve else ""))
        _print_schedule(settings, jobs)
        try:
            jobs.start()
            # trigger and extract in child processes of their own, supervised like the threads.
            run_stages(settings, ["resolve", "upsert", QUERY], children=[("trigger",), ("extract",)],
                       also=[_http_part(settings, auth=not no_auth)] if serve else [])
        finally:
            if jobs.running:
                jobs.shutdown()


@app.command()
def serve(host: Annotated[str | None, typer.Option(help="Default MEMFLOW_HTTP_HOST (127.0.0.1).")] = None,
          port: Annotated[int | None, typer.Option(help="Default MEMFLOW_HTTP_PORT (8765).")] = None,
          workers: Annotated[int, typer.Option(min=1, help="Server processes sharing the port: one uses one "
                                               "core (see `memflow bench http`).")] = 1,
          no_auth: Annotated[bool, typer.Option("--no-auth", help="Serve every subject to anyone who can "
                                                "connect. For local use only.")] = False) -> None:
    """The HTTP API, the MCP endpoint (/mcp) and the inspector page (/), over the running system."""
    import uvicorn

    from memflow.workers.api import AUTH_VARIABLE, create_app
    settings = _settings()
    host, port = host or settings.http.host, settings.http.port if port is None else port
    settings = settings.replace(http_host=host)  # the names it answers to include the address it is bound to
    if no_auth:
        _warn_no_auth(host)
    typer.echo(f"memflow serve: http://{host}:{port} (OpenAPI at /openapi.json), redis {require_url(settings)}"
               + (f", {workers} processes" if workers > 1 else ""))
    say_durability(settings)
    common: dict[str, Any] = {"host": host, "port": port, "access_log": False, "log_level": settings.log_level.lower()}
    if workers == 1:
        uvicorn.run(create_app(settings, auth=not no_auth), **common)
        return
    # Each process builds its own app from the environment: the settings resolved here, and the auth switch.
    os.environ.update({**to_env(settings.replace(redis_url=require_url(settings))),
                       AUTH_VARIABLE: "off" if no_auth else "on"})
    uvicorn.run("memflow.workers.api:app_from_environment", factory=True, workers=workers, **common)


def _http_part(settings: Settings, *, auth: bool) -> Part:
    from memflow.workers.api import http_part  # FastAPI is loaded by the commands that serve only
    return http_part(settings, auth=auth)


@app.command("mcp")
def mcp_stdio(subject: Annotated[str | None, typer.Option(envvar="MEMFLOW_MCP_SUBJECT", help=(
        "The subject the client speaks for; default: the one subject of the MEMFLOW_API_KEY key."))] = None) -> None:
    """The MCP server over stdio, for desktop clients (Claude Desktop, Cursor), over the running system."""
    from memflow.workers.mcp import run_stdio

    run_stdio(_settings(), subject)  # stdout is the protocol's: nothing else is printed there


def _warn_no_auth(host: str) -> None:
    exposed = host not in ("127.0.0.1", "localhost", "::1")
    typer.secho("\n".join([
        "!" * 78,
        "!! --no-auth: NO API KEYS. Anyone who can connect reads, writes and forgets EVERY subject.",
        f"!! Listening on {host}" + (": THIS ADDRESS IS REACHABLE FROM OTHER MACHINES." if exposed else
                                     " (this machine only). Use keys for anything else."),
        "!" * 78]), err=True, fg=typer.colors.RED, bold=True)


@app.command("scheduler")
def run_scheduler() -> None:
    """Run the maintenance schedule (decay, consolidate, review) until SIGTERM/SIGINT. It only enqueues
    jobs on the jobs queue; a query worker runs them."""
    settings = _settings()
    jobs = _build_scheduler(settings, BlockingScheduler)
    # SIGTERM stops it the way Ctrl-C does: the exception leaves the scheduler's loop (releasing its
    # locks on the way), and the shutdown below runs outside it.
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, _interrupt)
    try:
        _print_schedule(settings, jobs)
        jobs.start()
    except KeyboardInterrupt:
        pass
    finally:
        if jobs.running:
            jobs.shutdown()
    typer.echo("memflow scheduler: stopped")


def _build_scheduler(settings: Settings, kind: type[BaseScheduler]) -> BaseScheduler:
    try:
        return build_scheduler(settings, kind)
    except MemflowError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _print_schedule(settings: Settings, jobs: BaseScheduler) -> None:
    typer.echo(f"scheduler: timezone {settings.scheduler.timezone}, enqueues on "
               f"{settings.keys.jobs_queue}")
    for job_id, trigger, next_time in next_fire_times(jobs, datetime.now(UTC)):
        typer.echo(f"  {job_id:<17} {trigger:<30} next {next_time.isoformat() if next_time else 'never'}")


def _interrupt(signum: int, _frame: Any) -> None:
    raise KeyboardInterrupt(f"signal {signum}")


# -- talking to a running system ---------------------------------------------------


@app.command()
def publish(subject: str, text: str, session: str = "cli", role: str = "user", kind: str = "message",
            event_id: Annotated[str | None, typer.Option(help="Defaults to a new uuid.")] = None,
            ts: Annotated[str | None, typer.Option(help="ISO time with zone; defaults to now.")] = None) -> None:
    """Publish one event."""
    client = MemoryClient(_settings())
    event = {"event_id": event_id or str(uuid.uuid4()), "subject": subject, "session_id": session, "kind": kind,
             "role": role if kind == "message" else None, "text": text, "ts": ts or datetime.now(UTC)}
    try:
        typer.echo(client.publish(event))
    except MemflowError as exc:
        raise typer.BadParameter(str(exc)) from exc


@app.command()
def search(subject: str, query: str, k: int = 5, now: str | None = None, as_json: JsonFlag = False) -> None:
    """Search one subject's memories."""
    result = MemoryClient(_settings()).search(subject, query, k, now=datetime.fromisoformat(now) if now else None)
    if as_json:
        _print_json(result.model_dump(mode="json"))
        return
    typer.echo(f"{result.status}: {len(result.hits)} hit(s) in {result.latency_ms:.1f} ms"
               + (f" — {result.error}" if result.error else ""))
    for i, hit in enumerate(result.hits, 1):
        flag = " [contested]" if hit.contested else ""
        typer.echo(f"{i:>2}. {hit.score:.4f} {hit.dir.value}/{hit.mtype.value}{flag}  {hit.content}")


def _say_forgotten(report: rpc.ForgetReport) -> None:
    typer.echo(f"forgot {report.count} memor{'y' if report.count == 1 else 'ies'}"
               + (f" and {len(report.records)} record(s) of the turns they came from: {report.records}"
                  if report.records else "")
               + f"; words scrubbed from Redis: {report.scrubbed or 'none left'}")
    if report.still_held:
        typer.echo(f"kept, still holding their words (forget them too to remove the words): {report.still_held}")


@app.command()
def forget(subject: str, ids: Annotated[list[str] | None, typer.Argument(help="Memory ids.")] = None,
           contains: Annotated[str | None, typer.Option(help="Every memory whose content holds this.")] = None,
           verify: Annotated[bool, typer.Option(help="Then prove it: no point left, no Redis entry naming it. "
                                                     "With ids and nothing else to forget: prove an earlier forget.")]
           = False, as_json: JsonFlag = False) -> None:
    """Forget memories (by id, or by what they say) everywhere memflow kept their words."""
    client = MemoryClient(_settings())
    report = None
    if ids or contains:
        report = client.call(rpc.FORGET, subject=subject, memory_ids=ids or None, contains=contains)
    proof = None
    if verify:  # what this call forgot, else the ids given (an earlier forget)
        proven = (report and report.forgotten_ids) or ids or []
        proof = client.call(rpc.VERIFY_FORGOTTEN, subject=subject, memory_ids=proven, contains=contains)
    if as_json:
        shown = report.model_dump(mode="json") if report else {"ids": []}
        _print_json(shown | ({"verify": proof.model_dump(mode="json")} if proof else {}))
    else:
        if report:
            _say_forgotten(report)
        if proof:
            typer.echo(f"verified: {proof.verified} — points in the store: {len(proof.in_store)}, "
                       f"Redis entries naming them: {proof.residue or 0}, without a receipt: {proof.unknown}, "
                       f"points still holding their words: {proof.still_held or 'none'}")
    if proof and not proof.verified:
        raise typer.Exit(1)


@app.command("export")
def export_memories(subjects: Annotated[list[str] | None, typer.Argument(help="Subjects to export.")] = None,
                    every: Annotated[bool, typer.Option("--all", help="Every subject in the store.")] = False,
                    with_vectors: Annotated[bool, typer.Option("--with-vectors", help=(
                        "Include each memory's dense vector and the model that made it (an import into a store "
                        "of that model stores them as they are; others encode again)."))] = False) -> None:
    """Write memories as JSON Lines to stdout, with their versions, history and provenance (docs/export-format.md)."""
    if bool(subjects) == every:
        raise typer.BadParameter("name the subjects to export, or --all (not both)")
    out = sys.stdout.buffer
    for line in MemoryClient(_settings()).export(None if every else subjects, with_vectors=with_vectors):
        out.write(line)
    out.flush()


@app.command("import")
def import_memories(path: Annotated[Path, typer.Argument(help="An export (JSON Lines); - for stdin.")],
                    as_json: JsonFlag = False) -> None:
    """Import an export: checked whole first, then each subject gets what it lacks (the same file twice changes
    nothing; a memory forgotten here is not brought back)."""
    try:
        with (sys.stdin.buffer if str(path) == "-" else path.open("rb")) as lines:
            report = MemoryClient(_settings()).import_(lines)
    except FormatError as exc:
        _fail(f"{path}: {exc}: nothing was imported")
    except OSError as exc:
        _fail(f"cannot read {path}: {exc}")
    if as_json:
        _print_json(report.model_dump(mode="json"))
        return
    for s in report.subjects:
        typer.echo(f"{s.subject}: {s.memories} in the file — {s.written} written ({s.reembedded} encoded here), "
                   f"{s.already} already here, {s.kept} kept as this store has them, {s.forgotten} forgotten here")


@app.command("compact-aof")
def compact_aof() -> None:
    """Rewrite Redis's append-only file (BGREWRITEAOF): until then it keeps every command ever run, the words
    of forgotten memories and secrets included. `forget` starts one itself when it removed raw copies."""
    from memflow.workers.forgetting import compact_aof as rewrite

    if not rewrite(MemoryClient(_settings()).redis):
        typer.echo("the server refused BGREWRITEAOF (one already running?): try again shortly", err=True)
        raise typer.Exit(1)
    typer.echo("AOF rewrite started")


@app.command()
def inspect(subject: str, now: Annotated[str | None, typer.Option(help="ISO time with zone; default now.")] = None,
            as_json: JsonFlag = False) -> None:
    """A subject's memories with state, tier, strength, uses and last change; utilisation; backlog."""
    report = MemoryClient(_settings()).call(rpc.INSPECT, subject=subject, now=_when(now))
    if as_json:
        _print_json(report)
        return
    _print_memories(report.memories)
    _print_people(report.people)
    use = report.utilisation
    share = "n/a" if use.share is None else f"{use.share:.0%}"
    typer.echo(f"utilisation ({use.days} days): {use.adopted} adopted of {use.recalled} recalled = {share}")
    typer.echo("backlog (unread, pending): " + ", ".join(f"{s} {v[0]}/{v[1]}" for s, v in report.backlog.items()))
    typer.echo(f"said, not stored yet: {len(report.pending)}")
    for entry in report.pending:
        typer.echo(f"  [{entry.ts.isoformat()}] {entry.event_id}: {entry.text[:100]}")
    if report.llm:
        _print_llm("llm, this subject", report.llm.subject)
        _print_llm("llm, everyone", report.llm.everyone)


def _print_llm(title: str, u: rpc.LLMUsage) -> None:
    reasons = ", ".join(f"{r} {n}" for r, n in u.fallbacks_by_reason.items()) or "none"
    per, each = u.per_event, u.per_candidate
    typer.echo(f"{title} ({u.days} days): {u.calls} calls, {u.prompt_tokens} tokens in, "
               f"{u.completion_tokens} out; {u.events} events ({per.prompt_tokens if per else 0} in + "
               f"{per.completion_tokens if per else 0} out per event); {u.candidates} candidates from the LLM "
               f"({each.prompt_tokens if each else 0} in + {each.completion_tokens if each else 0} out per "
               f"candidate); fallbacks to the rules: {u.fallbacks} ({reasons})")


def _print_people(people: list[rpc.PersonEntry]) -> None:
    typer.echo(f"people talked about: {len(people)}")
    for person in people:
        typer.echo(f"  {person.about} ({len(person.memories)})")
        for known in person.memories:
            typer.echo(f"    {known.id[:8]} {known.mtype.value}: {known.content}")


def _print_memories(memories: list[rpc.MemoryState]) -> None:
    for m in memories:
        last = m.last_change
        about = "" if m.about == "self" else f" about={m.about}"
        typer.echo(f"{m.id[:8]} {m.status.value:<9} {m.tier.value:<10} {m.dir.value}/{m.mtype.value} "
                   f"key={m.key}{about} "
                   f"v{m.version} conf={m.confidence:.2f} strength={m.strength_now:.2f} "
                   f"uses={m.access_count}{' llm' if m.extractor == 'llm' else ''}  {m.content}"
                   f"\n         last change {last.at.isoformat()}: {last.why}")
    typer.echo(f"{len(memories)} memories")


def _when(value: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if value else None
    except ValueError as exc:
        raise typer.BadParameter(f"not an ISO time: {value!r}") from exc


@app.command()
def history(memory_id: str, subject: Annotated[str | None, typer.Option(help="Its subject (faster).")] = None,
            as_json: JsonFlag = False) -> None:
    """Every version of a memory and why each changed, oldest first."""
    report = _rpc(rpc.HISTORY, memory_id=memory_id, subject=subject)
    if as_json:
        _print_json(report)
        return
    typer.echo(f"{report.subject} key={report.key}" + ("" if report.about == "self" else f" about={report.about}"))
    for v in report.versions:
        mark = "*" if v.id == report.asked else " "
        typer.echo(f"{mark} v{v.version} {v.id[:8]} {v.status.value:<14} {v.tier.value:<10} "
                   f"{_iso(v.created_at)}  {v.content}")
        for r in v.revisions:
            before = ", ".join(f"{k}={val}" for k, val in r.before.items())
            typer.echo(f"      rev {r.rev} {_iso(r.at)}: {r.why} (was {before})")


@app.command()
def rollback(memory_id: str, to: Annotated[int, typer.Option("--to", help="The version to restore.")],
             subject: Annotated[str | None, typer.Option(help="Its subject (faster).")] = None,
             as_json: JsonFlag = False) -> None:
    """Restore an old version as a new version on top; the change is recorded like any other."""
    report = _rpc(rpc.ROLLBACK, memory_id=memory_id, to_version=to, subject=subject)
    if as_json:
        _print_json(report)
        return
    restored = report.restored
    if restored is None:
        typer.echo(f"version {to} is already current: nothing changed")
        return
    typer.echo(f"restored version {to} as v{restored.version} {restored.id[:8]}: {restored.content} "
               f"(superseded {len(report.superseded)})")


@review_app.command("list")
def review_list(subject: Annotated[str | None, typer.Argument()] = None, as_json: JsonFlag = False) -> None:
    """Memories waiting for a decision: pending_review (rules, contradictions of pinned memories) and contested."""
    found = _rpc(rpc.REVIEW_LIST, subject=subject).waiting
    if as_json:
        _print_json([m.model_dump(mode="json") for m in found])
        return
    for m in found:
        typer.echo(f"{m.id} {m.subject} {m.status.value:<14} key={m.key}  {m.content}")
    typer.echo(f"{len(found)} waiting")


@review_app.command("accept")
def review_accept(memory_id: str, subject: Annotated[str | None, typer.Option()] = None) -> None:
    """Make it active; the memories it contested on its key are superseded by it."""
    report = _rpc(rpc.REVIEW_DECIDE, memory_id=memory_id, accept=True, subject=subject)
    typer.echo(f"accepted {memory_id}: {len(report.changed)} memories changed")


@review_app.command("reject")
def review_reject(memory_id: str, subject: Annotated[str | None, typer.Option()] = None) -> None:
    """Never search it again (kept as history); a memory it contested stands alone again."""
    report = _rpc(rpc.REVIEW_DECIDE, memory_id=memory_id, accept=False, subject=subject)
    typer.echo(f"rejected {memory_id}: {len(report.changed)} memories changed")


def _rpc(call: rpc.Rpc[Any, Rep], **fields: Any) -> Rep:
    """The typed reply of one call; what memflow refuses is told as a bad parameter."""
    try:
        return MemoryClient(_settings()).call(call, **fields)
    except MemflowError as exc:
        raise typer.BadParameter(str(exc)) from exc


def _iso(value: datetime) -> str:
    return value.isoformat()


@jobs_app.command("run")
def jobs_run(job: Annotated[str, typer.Argument(help="decay, consolidate, review or retag")],
             subject: Annotated[str | None, typer.Option(help="One subject; default every subject.")] = None,
             now: Annotated[str | None, typer.Option(help="ISO time with zone; default now.")] = None,
             tier: Annotated[str | None, typer.Option(help="decay only: short_term or long_term.")] = None,
             dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would change.")] = False,
             as_json: JsonFlag = False) -> None:
    """Run one job by hand and print what it changed (or, with --dry-run, would change)."""
    report = _rpc(rpc.RUN_JOB, name=job, subject=subject, now=_when(now), dry_run=dry_run, tier=tier,
                  timeout_s=600.0)
    if as_json:
        _print_json(report)
        return
    _print_job(report)


def _print_job(report: rpc.JobReport) -> None:
    for c in report.changed:
        moved = ", ".join(f"{k} {c.before[k]} → {v}" for k, v in c.after.items())
        typer.echo(f"{c.id[:8]} {c.subject}: {moved}  {c.content}  ({c.why})")
    for w in report.written:
        typer.echo(f"{w.id[:8]} {w.subject}: new  {w.content}")
    for s in report.sent:
        typer.echo(f"-------- {s.subject}: to resolve {s.mtype.value} {s.key}  {s.content}")
    for u in report.undecided:
        typer.echo(f"{u.id[:8]} {u.subject}: still contested  {u.content}")
    typer.echo(f"{report.job}: {'would' if report.dry_run else 'did'} change {len(report.changed)}, write "
               f"{len(report.written)}, send {len(report.sent)} of {report.examined} memories in {report.subjects} "
               f"subject(s) as of {report.now.isoformat()}; {len(report.undecided)} undecided, "
               f"{len(report.skipped)} skipped (changed meanwhile)")


# -- the store's model ----------------------------------------------------------------

REINDEX_PHASES = {"copy": "copy", "catch-up": "catch up", "final": "final pass", "switch": "switch"}


@app.command("reindex")
def reindex_store(batch: Annotated[int, typer.Option("--batch", min=1, help=(
                      "Memories per page: encoded together, saved together (a resumed run starts after the "
                      "last page saved)."))] = DEFAULT_BATCH,
                  as_json: JsonFlag = False) -> None:
    """Re-embed every memory (every subject and status, history too) with the configured model. Searches
    keep using the old vectors until it switches; a killed run resumes where it stopped. With an Edge shard
    (no MEMFLOW_QDRANT_URL), stop `memflow up` first: the shard has one owner."""
    settings = _settings("WARNING")
    _refuse_beside_up(settings)
    catalog = catalog_for(settings)
    try:
        report = _reindex_showing_progress(catalog, build_embedder(settings), batch, as_json)
    except KeyboardInterrupt:
        raise MemflowError("reindex interrupted, progress saved: run `memflow reindex` again to resume") from None
    finally:
        catalog.close()
    if as_json:
        _print_json(asdict(report))
    else:
        typer.echo(_reindex_summary(report))


def _refuse_beside_up(settings: Settings) -> None:
    owner = None if settings.store.qdrant_url else running(settings.store.data_dir)
    if owner is not None:
        raise MemflowError(f"`memflow up` (pid {owner.pid}) holds the Edge shard in "
                           f"{settings.store.data_dir.resolve()}: "
                           "stop it, run `memflow reindex`, then start it again with the new model configured")


def _reindex_showing_progress(catalog: Catalog, embedder: Embedder, batch: int, quiet: bool) -> Report:
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn

    tasks: dict[str, TaskID] = {}
    # On stderr, so that --json output stays one document on stdout.
    with Progress(TextColumn("{task.description:<10}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=Console(stderr=True), disable=quiet) as bar:

        def show(step: Step) -> None:
            if step.phase not in tasks:
                tasks[step.phase] = bar.add_task(REINDEX_PHASES[step.phase], total=step.total)
            bar.update(tasks[step.phase], completed=step.done, total=step.total)

        return reindex(catalog, embedder, batch=batch, on_step=show)


def _reindex_summary(r: Report) -> str:
    if r.already:
        return f"nothing to do: {r.collection!r} already holds vectors of {r.target} ({r.points} memories)"
    rate = r.copied / r.seconds if r.seconds else 0.0
    resumed = f", resuming after {r.resumed_at}" if r.resumed_at else ""
    return (f"reindexed {r.collection!r}: {r.points} memories now hold vectors of {r.target} (were {r.source}); "
            f"{r.copied} embedded in {r.seconds:.1f} s ({rate:.0f}/s){resumed}; {r.refreshed} changed and "
            f"{r.removed} deleted meanwhile were carried over. Start memflow with this model configured.")


# -- dead letters --------------------------------------------------------------------


def _redis_target() -> tuple[Any, Keys]:
    settings = _settings()
    return connect_streams(settings), settings.keys


def _known_stage(stage: str) -> str:
    if stage not in STAGES:
        raise typer.BadParameter(f"{stage!r} is not one of {', '.join(STAGES)}")
    return stage


def _duration_ms(value: str) -> int:
    try:
        return dead.parse_duration_ms(value)
    except InvalidInput as exc:
        raise typer.BadParameter(exc.reason) from exc


Stage = Annotated[str, typer.Argument(help=f"One of {', '.join(STAGES)}.", callback=_known_stage)]
EntryIds = Annotated[list[str] | None, typer.Argument(help="Entry ids; with filters too, those of them that match.")]
ErrorFilter = Annotated[str | None, typer.Option("--error", metavar="TEXT",
                                                 help="Only entries whose reason contains TEXT (any case).")]
SubjectFilter = Annotated[str | None, typer.Option("--subject", metavar="SUBJECT",
                                                   help="Only entries whose payload is about SUBJECT.")]
OlderThan = Annotated[int | None, typer.Option("--older-than", metavar="DURATION", parser=_duration_ms,
                                               help="Only entries dead-lettered at least this long ago: 30s, 2h, 7d.")]
NewerThan = Annotated[int | None, typer.Option("--newer-than", metavar="DURATION", parser=_duration_ms,
                                               help="Only entries dead-lettered less than this long ago.")]
Count = Annotated[int, typer.Option("--count", help="Show at most this many.")]


def _letter_json(letter: dead.DeadLetter, now_ms: int) -> dict[str, Any]:
    return {**letter.__dict__, "payload": letter.payload.decode(errors="replace"),
            "age_s": (now_ms - dead.entry_ms(letter.id)) / 1000}


@dlq_app.command("list")
def dlq_list(stage: Stage, error: ErrorFilter = None, subject: SubjectFilter = None, older_than: OlderThan = None,
             newer_than: NewerThan = None, count: Count = 100, as_json: JsonFlag = False) -> None:
    """Dead letters, oldest first: stage, id, age, attempts, subject, reason."""
    client, keys = _redis_target()
    where = dead.Where(error, subject, older_than, newer_than)
    entries, now_ms = dead.list_dead(client, keys, stage, count, where), dead.server_now_ms(client)
    if as_json:
        _print_json([_letter_json(e, now_ms) for e in entries])
        return
    for e in entries:
        age = dead.format_duration(now_ms - dead.entry_ms(e.id))
        typer.echo(f"{e.stage or stage}  {e.id}  {age}  attempts={e.attempts}  subject={e.subject or '-'}  {e.error}")
    typer.echo(f"{len(entries)} shown of {dead.count(client, keys, stage)} dead letter(s) of {stage}")


@dlq_app.command("show")
def dlq_show(stage: Stage, ids: EntryIds = None, error: ErrorFilter = None, subject: SubjectFilter = None,
             older_than: OlderThan = None, newer_than: NewerThan = None, count: Count = 100) -> None:
    """Dead letters in full, payload included: one JSON object each."""
    client, keys = _redis_target()
    where = dead.Where(error, subject, older_than, newer_than)
    entries = list(islice(dead.select(client, keys, stage, ids or None, where), count))
    if ids and not entries:
        matching = "" if where.is_empty else " that matches the filters"
        raise typer.BadParameter(f"no dead letter {' '.join(ids)} of {stage}{matching}")
    now_ms = dead.server_now_ms(client)
    for entry in entries:
        _print_json(_letter_json(entry, now_ms))


@dlq_app.command("replay")
def dlq_replay(stage: Stage, ids: EntryIds = None, error: ErrorFilter = None, subject: SubjectFilter = None,
               older_than: OlderThan = None, newer_than: NewerThan = None) -> None:
    """Put dead letters back on their stream: the ids given and/or those matching the filters; else all.

    An entry goes back once however often it is replayed: it leaves the DLQ as it goes.
    """
    client, keys = _redis_target()
    where = dead.Where(error, subject, older_than, newer_than)
    typer.echo(f"replayed {dead.replay(client, keys, stage, ids or None, where, settings=_settings().pending)}")


@dlq_app.command("drop")
def dlq_drop(stage: Stage, ids: EntryIds = None, error: ErrorFilter = None, subject: SubjectFilter = None,
             older_than: OlderThan = None, newer_than: NewerThan = None) -> None:
    """Delete dead letters: the ids given and/or those matching the filters; else all."""
    client, keys = _redis_target()
    where = dead.Where(error, subject, older_than, newer_than)
    typer.echo(f"dropped {dead.drop(client, keys, stage, ids or None, where)}")


# -- status ---------------------------------------------------------------------------


@app.command()
def status(sample: Annotated[float | None, typer.Option("--sample", metavar="SECONDS", min=0.0, help=(
               "Measure read/s as what each group reads over SECONDS (waits that long) instead of "
               "the last minute's arrivals already read."))] = None,
           subject: Annotated[str | None, typer.Option("--subject", help=(
               "Instead: every Redis key memflow keeps for SUBJECT, its bytes and time left."))] = None,
           as_json: JsonFlag = False) -> None:
    """Per stage: stream length, lag, pending, dead letters, entries read per second; the RQ queues and
    the live query workers. With --subject: what one subject takes in Redis."""
    client, keys = _redis_target()
    if subject is not None:
        footprint = subject_footprint(client, keys, subject)
        if as_json:
            _print_json(asdict(footprint) | {"bytes": footprint.bytes})
            return
        _print_footprint(footprint)
        return
    settings = _settings()
    report = read_status(client, keys, sample, connect_queue(settings, client), settings.redis.wait_aof)
    if as_json:
        _print_json(asdict(report))
        return
    _print_status(report)


def _print_footprint(footprint: SubjectFootprint) -> None:
    typer.echo(f"{'key':<28} {'memory':>10} {'expires in':>11}")
    for k in footprint.keys:
        left = "never" if k.ttl_s is None else dead.format_duration(k.ttl_s * 1000)
        typer.echo(f"{k.what[:28]:<28} {_bytes(k.bytes):>10} {left:>11}")
    typer.echo(f"{footprint.subject}: {len(footprint.keys)} keys, {_bytes(footprint.bytes)}")


def _print_status(report: PipelineStatus) -> None:
    typer.echo(f"{'stage':<8} {'length':>9} {'memory':>9} {'lag':>9} {'pending':>9} {'dlq':>9} {'read/s':>9}")
    for s in report.stages:
        rate = "-" if s.read_per_s is None else f"{s.read_per_s:.2f}"
        typer.echo(f"{s.stage:<8} {s.length:>9} {_bytes(s.memory_bytes):>9} {s.lag:>9} {s.pending:>9} {s.dead:>9} "
                   f"{rate:>9}")
    typer.echo(f"query queue {report.query_queue}, jobs queue {report.jobs_queue}, "
               f"query workers {report.query_workers}")
    measured = (f"read over {report.sample_s:g} s" if report.sample_s is not None
                else "arrived in the last 60 s and read")
    typer.echo(f"read/s: entries {measured}, per second; length and memory: the input streams, "
               "acknowledged entries kept for the retention window (MEMFLOW_RETENTION_S)")
    typer.echo(f"durability: {'WARNING: ' if report.durability_weaker else ''}{report.durability}")


def _bytes(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


# -- partitions -------------------------------------------------------------------------


@partitions_app.command("show")
def partitions_show() -> None:
    """The count recorded for this deployment, and MEMFLOW_PARTITIONS here."""
    client, keys = _redis_target()
    typer.echo(f"recorded: {recorded_partitions(client, keys) or 'none yet'}; MEMFLOW_PARTITIONS: {keys.partitions}")


@partitions_app.command("set")
def partitions_set(count: Annotated[int, typer.Argument(help="The new partition count (1-1024).")]) -> None:
    """Change the partition count, drained: nothing unread, pending or dead-lettered in any stage and no
    worker running (refused otherwise, saying what is left). Then start every process with
    MEMFLOW_PARTITIONS=COUNT."""
    client, keys = _redis_target()
    try:
        was = change_partitions(client, keys, count, _settings().consumer.lease_ms)
    except MemflowError as exc:
        raise typer.BadParameter(str(exc)) from exc
    typer.echo(f"partitions: {was or 'none recorded'} -> {count}; start every process with MEMFLOW_PARTITIONS={count}")


# -- keys -------------------------------------------------------------------------------


def _keystore() -> KeyStore:
    client, keys = _redis_target()
    return KeyStore(client, keys)


@keys_app.command("create")
def keys_create(name: Annotated[str, typer.Option(help="Who or what uses it.")],
                subjects: Annotated[list[str], typer.Option(help="A subject or pattern ('team-a/*', '*'); "
                                                             "repeat or separate with commas.")],
                read_only: Annotated[bool, typer.Option("--read-only", help="Search, pack, inspect, history "
                                                        "and traces only.")] = False,
                as_json: JsonFlag = False) -> None:
    """A new key. It is shown once, alone on the last line: only its hash is kept."""
    patterns = [p for given in subjects for p in given.split(",") if p.strip()]
    key, secret = _keystore().create(name, patterns, read_only=read_only, now=datetime.now(UTC))
    if as_json:
        _print_json({**key.as_json(), "key": secret})
        return
    typer.echo(f"key {key.id} ({key.name}): subjects {', '.join(key.subjects)}"
               + (", read-only" if key.read_only else "") + ". Keep it now; it cannot be shown again:", err=True)
    typer.echo(secret)


@keys_app.command("list")
def keys_list(as_json: JsonFlag = False) -> None:
    """Every key: id, name, subject patterns, read-only, created (never the key itself)."""
    found = _keystore().list()
    if as_json:
        _print_json([k.as_json() for k in found])
        return
    for k in found:
        typer.echo(f"{k.id}  {k.name:<20} {','.join(k.subjects):<30} {'read-only' if k.read_only else 'read-write'}"
                   f"  {k.created_at}")


@keys_app.command("revoke")
def keys_revoke(key: Annotated[str, typer.Argument(help="The key's id (or its name, if only one has it).")]) -> None:
    """Revoke a key: the next request that names it is refused."""
    if not _keystore().revoke(key):
        _fail(f"no key {key!r}: `memflow keys list` shows them")
    typer.echo(f"revoked {key}")


# -- traces ---------------------------------------------------------------------------


@traces_app.command("tail")
def traces_tail(count: int = 20, follow: Annotated[bool, typer.Option("--follow", "-f")] = False,
                as_json: JsonFlag = False) -> None:
    """The last searches (query redacted: intent, dirs, fallback, chosen ids, latency) and LLM calls."""
    client, keys = _redis_target()
    entries = list(reversed(client.xrevrange(keys.traces, count=count)))
    last = "$"
    for entry_id, fields in entries:
        _print_trace(fields[FIELD.encode()], as_json)
        last = entry_id
    while follow:
        reply = client.xread({keys.traces: last}, block=5000, count=100)
        for entry_id, fields in (reply[0][1] if reply else []):
            _print_trace(fields[FIELD.encode()], as_json)
            last = entry_id


def _print_trace(raw: bytes, as_json: bool) -> None:
    trace = orjson.loads(raw)
    if as_json:
        typer.echo(raw.decode())
        return
    if trace.get("kind") == "llm":  # an LLM call: extraction batch, judgement or plan
        why = f" {trace['reason']}" if trace.get("reason") else ""
        typer.echo(f"{trace['at'][:19]} {trace['subject']:<16} llm    {trace['purpose']:<18} "
                   f"{trace['outcome'].upper()}{why} items={trace['items']} stand_ins={trace['stand_ins']} "
                   f"tokens={trace['prompt_tokens']}+{trace['completion_tokens']} {trace['latency_ms']:.1f} ms")
        return
    flag = " FALLBACK" if trace.get("fallback") else ""
    if trace.get("plan_error"):
        flag += f" (llm plan: {trace['plan_error']})"
    typer.echo(f"{trace['now'][:19]} {trace['subject']:<16} {trace['status']:<6} {trace['intent']:<18} "
               f"dirs={','.join(trace['dirs']) or '*'}{flag} chosen={len(trace['chosen'])} "
               f"{trace['latency_ms']:.1f} ms  {trace['query']!r}")


# -- measuring ------------------------------------------------------------------------
# The instruments live in bench/ (they may use everything); the CLI only hands them the flags.


@app.command("eval")
def eval_scenarios(path: Path, as_json: JsonFlag = False,
                   ablation: Annotated[bool, typer.Option(help="Run the ablation ladder.")] = False) -> None:
    """Replay behaviour scenarios (JSON Lines) against a fresh namespace and score them."""
    from memflow.bench.scenarios import run_cli

    raise typer.Exit(run_cli(path, as_json=as_json, ablation=ablation, settings=_settings("WARNING")))


@bench_app.command("locomo")
def bench_locomo(data: Annotated[Path, typer.Option(help="locomo10.json")] = Path("../shared/datasets/locomo10.json"),
                 conversations: Annotated[int | None, typer.Option(help="Only the first N.")] = None,
                 as_json: JsonFlag = False,
                 ablation: Annotated[bool, typer.Option(help="Run the ablation ladder.")] = False,
                 variants: Annotated[Path | None, typer.Option(
                     help="JSON {name: {setting: value}}: memflow once per variant (sharing ingests)."
                 )] = None,
                 jobs: Annotated[bool, typer.Option(
                     help="Run decay, consolidate and review as of each conversation's questions.")] = True,
                 llm_stub: Annotated[bool, typer.Option(
                     help="Run the LLM path against the scripted server (bench/llm_echo.py) and report its cost.")]
                 = False) -> None:
    """LoCoMo evidence recall@k for memflow and two baselines, side by side."""
    from memflow.bench.locomo import run_cli

    raise typer.Exit(run_cli(data, conversations=conversations, as_json=as_json, ablation=ablation,
                             settings=_settings("WARNING"), variants=variants, jobs=jobs, llm_stub=llm_stub))


def _madial_langs(value: str) -> str:
    if value not in ("zh", "en", "both"):
        raise typer.BadParameter(f"{value!r} is not one of zh, en, both")
    return value


@bench_app.command("madial")
def bench_madial(data: Annotated[Path, typer.Option(help="The folder of the MADial-Bench JSON Lines files.")]
                 = Path("../shared/datasets/madial"),
                 lang: Annotated[str, typer.Option(help="zh, en or both.", callback=_madial_langs)] = "both",
                 as_json: JsonFlag = False) -> None:
    """MADial-Bench memory retrieval (R@1/3/5/10, MRR@10) for memflow, BM25 and dense, side by side."""
    from memflow.bench.madial import LANGS, run_cli

    langs = LANGS if lang == "both" else (lang,)
    raise typer.Exit(run_cli(data, langs=langs, as_json=as_json, settings=_settings("WARNING")))


@bench_app.command("load")
def bench_load(events: int = 10_000, publishers: int = 8, as_json: JsonFlag = False,
               cluster: Annotated[bool, typer.Option(
                   "--cluster", help="On a local 3-master Valkey cluster (writes held by a replica), two consumers "
                   "per stage.")] = False) -> None:
    """A burst from concurrent publishers: accepted and sustained rates, peak lag, drain time, RSS, losses."""
    from memflow.bench.load import run_cli

    raise typer.Exit(run_cli(events=events, publishers=publishers, as_json=as_json, settings=_settings("WARNING"),
                             cluster=cluster))


@bench_app.command("http")
def bench_http(size: int = 10_000, queries: int = 300, clients: int = 8, requests: int = 4000, batch: int = 50,
               flood: Annotated[int, typer.Option(help="Key A's parallel clients in the two-tenant figure.")] = 8,
               probes: Annotated[int, typer.Option(help="Key B's searches per phase (idle, flood, A's export, "
                                                               "import and refused-import loops).")] = 60,
               tenants_only: Annotated[bool, typer.Option(
                   "--tenants-only", help="Only the two-tenant figures (A's flood, export and import loops).")] = False,
               as_json: JsonFlag = False) -> None:
    """The HTTP API: key B's search p50/p99 while key A floods, exports or imports in a loop, against idle; search over
    HTTP vs MemoryClient vs in-process vs the store alone; write requests/s."""
    from memflow.bench.api import run_cli

    raise typer.Exit(run_cli(size=size, queries=queries, clients=clients, requests=requests, batch=batch,
                             as_json=as_json, settings=_settings("WARNING"), flood=flood, probes=probes,
                             only_tenants=tenants_only))


@bench_app.command("poisoning")
def bench_poisoning(corpus: Annotated[Path, typer.Option(help="The folder of poisoning.jsonl and preferences.jsonl.")]
                    = Path("tests/corpus"), as_json: JsonFlag = False,
                    verbose: Annotated[bool, typer.Option(help="Each text's outcome, on stderr.")] = False) -> None:
    """Planted orders against genuine wishes: how many the gate refuses, stores, and `pack` renders as rules."""
    from memflow.bench.poisoning import run_cli

    raise typer.Exit(run_cli(corpus, as_json=as_json, verbose=verbose))


@bench_app.command("perf")
def bench_perf(events: int = 5000, queries: int = 500, probes: int = 50, publishes: int = 2000,
               sizes: Annotated[str, typer.Option(help="Store sizes for the search figures.")] = "10000,100000",
               as_json: JsonFlag = False) -> None:
    """Ingest, search, publish and publish→searchable, each next to its physical limit."""
    from memflow.bench.perf import run_cli

    raise typer.Exit(run_cli(events=events, queries=queries, probes=probes, publishes=publishes,
                             sizes=[int(s) for s in sizes.split(",") if s], as_json=as_json,
                             settings=_settings("WARNING")))


@bench_app.command("jobs")
def bench_jobs(size: Annotated[int, typer.Option(help="Memories in the store (random vectors).")] = 100_000,
               rate: Annotated[float, typer.Option(help="Searches per second, steady.")] = 5.0,
               idle_seconds: Annotated[float, typer.Option(
                   help="How long searches are measured idle (80 s: as many as the index job at 100k meets).")] = 80.0,
               jobs: Annotated[str, typer.Option(help="The jobs run, one after the other (index, consolidate, "
                                                      "decay, review, retag).")] = "index,consolidate",
               as_json: JsonFlag = False) -> None:
    """Search p99 while the index and consolidate jobs run, next to idle; failed searches, partitions lost."""
    from memflow.bench.jobs import run_cli

    raise typer.Exit(run_cli(size=size, rate=rate, idle_s=idle_seconds, as_json=as_json,
                             jobs=[j for j in jobs.split(",") if j], settings=_settings("WARNING")))


@bench_app.command("publish")
def bench_publish(n: Annotated[int, typer.Option(help="Publishes one at a time, per variant (at most).")] = 1000,
                  threads: Annotated[int, typer.Option(help="Publishers at once, for the rates.")] = 8,
                  batch: Annotated[int, typer.Option(help="Events per publish_many.")] = 100,
                  seconds: Annotated[float, typer.Option(help="Time spent on each figure, at most.")] = 5.0,
                  variants: Annotated[str, typer.Option(help="Any of everysec, always, always+waitaof, "
                                                        "everysec+waitaof, everysec+waitaof+hz100, "
                                                        "everysec+waitaof+hz500.")] = (
                      "everysec,always,always+waitaof,everysec+waitaof,everysec+waitaof+hz100,everysec+waitaof+hz500"),
                  as_json: JsonFlag = False) -> None:
    """Publish latency and throughput with an fsynced acknowledgement (appendfsync, WAITAOF), next to bare XADD."""
    from memflow.bench.publish import run_cli

    raise typer.Exit(run_cli(n=n, threads=threads, batch=batch, budget_s=seconds,
                             variants=[v for v in variants.split(",") if v], as_json=as_json,
                             settings=_settings("WARNING")))


@bench_app.command("pending")
def bench_pending(sizes: Annotated[str, typer.Option(help="Memories in each searched subject.")] = "10000,100000",
                  queries: int = 200, burst: int = 2000, as_json: JsonFlag = False) -> None:
    """Search with and without pending entries (read-your-writes), idle and under a burst, next to the limit."""
    from memflow.bench.pending import run_cli

    raise typer.Exit(run_cli(sizes=[int(s) for s in sizes.split(",") if s], queries=queries, burst=burst,
                             as_json=as_json, settings=_settings("WARNING")))


@bench_app.command("profile")
def bench_profile(size: Annotated[int, typer.Option(help="Memories in the subject (a realistic mix).")] = 10_000,
                  reads: Annotated[int, typer.Option(help="Reads of each kind.")] = 300,
                  writes: Annotated[int, typer.Option(help="Writes, each followed by the rebuilding read.")] = 20,
                  as_json: JsonFlag = False) -> None:
    """Reading a subject's profile: kept, in process and over HTTP, next to one Redis GET; the rebuild after a
    write."""
    from memflow.bench.profile import run_cli

    raise typer.Exit(run_cli(size=size, reads=reads, writes=writes, as_json=as_json, settings=_settings("WARNING")))


# -- the demo ------------------------------------------------------------------------

# Two sessions a day apart: a compound introduction with the assistant's small talk, then a move said in passing.
# The searches find the current city first, and the job the move left alone.
DEMO_SESSIONS = [
    ("s1", [
        ("user", "Hi! I'm planning the Atlas project rollout this quarter."),
        ("assistant", "Great, how can I help with Atlas?"),
        ("user", "I live in Lyon and I work as a site reliability engineer."),
        ("user", "I prefer short answers with bullet points, please."),
        ("user", "Remember: never deploy on Fridays."),
        ("user", "We decided to use PostgreSQL 16 for the Atlas database."),
        ("user", "我不喜欢冗长的解释，回答请尽量简短。"),
    ]),
    ("s2", [
        ("user", "Quick news: we moved to Geneva last week."),
        ("assistant", "Congratulations on the move! Anything I can help with today?"),
    ]),
]
DEMO_QUERIES = ["where do I live?", "what is my job?", "how should answers be formatted?",
                "which database does Atlas use?", "when must we not deploy?"]


@app.command()
def demo() -> None:
    """Start everything in a temporary directory, hold a short conversation, show what was remembered."""
    from memflow.workers.embedded import embedded

    with temporary_data_dir(_settings("WARNING")) as tmp_settings, embedded(tmp_settings) as system:
        _demo_conversation(system.client)


def _demo_conversation(client: MemoryClient) -> None:
    subject, now = "demo-user", datetime.now(UTC)
    for day, (session, turns) in enumerate(DEMO_SESSIONS):
        start = now - timedelta(days=len(DEMO_SESSIONS) - day, minutes=10)
        typer.echo(f"== an agent publishes a conversation (session {session}, {start:%Y-%m-%d})")
        for i, (role, text) in enumerate(turns):
            client.publish({"event_id": f"demo-{session}-{i}", "subject": subject, "session_id": session,
                            "kind": "message", "role": role, "text": text, "ts": start + timedelta(seconds=10 * i)})
            typer.echo(f"   {role:>9}: {text}")
        client.publish({"event_id": f"demo-{session}-end", "subject": subject, "session_id": session,
                        "kind": "session_end", "ts": start + timedelta(minutes=5)})
    typer.echo("== waiting for trigger → extract → resolve → upsert ...")
    if not client.wait_idle(timeout_s=120):
        raise SystemExit("the pipeline did not go idle within 120 s")
    typer.echo("== memories written")
    _print_memories(client.call(rpc.INSPECT, subject=subject).memories)
    for query in DEMO_QUERIES:
        result = client.search(subject, query, k=3)
        typer.echo(f"== search {query!r}: {result.status}, {result.latency_ms:.1f} ms")
        for hit in result.hits:
            typer.echo(f"   {hit.score:.4f} {hit.dir.value}/{hit.mtype.value}  {hit.content}")


# -- the entry point ------------------------------------------------------------------


def main() -> None:
    """`memflow`: the commands, with every error memflow expects told in one line and what to do."""
    try:
        app()
    except MemflowError as exc:  # with its notes: an import's says what became of the subject it refused
        _fail("; ".join([str(exc), *getattr(exc, "__notes__", [])]))
    except redis.ConnectionError as exc:
        _fail(f"cannot reach Redis ({exc}): is `memflow up` still running, or is MEMFLOW_REDIS_URL right?")


def _fail(message: str) -> None:
    sys.stderr.write(f"memflow: {message}\n")
    raise SystemExit(1)


if __name__ == "__main__":
    main()
