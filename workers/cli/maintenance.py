"""The commands that keep memories right by hand: `review` (memories waiting for a decision), `jobs run` (one
maintenance job now) and `reindex` (every memory re-embedded with the configured model)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated

import typer

from memflow.shared.errors import MemflowError
from memflow.shared.inference.embedder import Embedder, build_embedder
from memflow.shared.redisdb.connections import running
from memflow.shared.sdk import rpc
from memflow.shared.settings import Settings
from memflow.shared.storage.store import Catalog, catalog_for
from memflow.shared.writer.reindex import DEFAULT_BATCH, Report, Step, reindex
from memflow.workers.cli.common import JsonFlag, MemoryIdArg, NowOption, ask, fail, load_settings, print_json, when

review_app = typer.Typer(help="Memories waiting for a decision.", no_args_is_help=True)
jobs_app = typer.Typer(help="Maintenance jobs, run by a query worker.", no_args_is_help=True)


@review_app.command("list")
def review_list(subject: Annotated[str | None, typer.Argument()] = None, as_json: JsonFlag = False) -> None:
    """Memories waiting for a decision: pending_review (rules, contradictions of pinned memories) and contested."""
    found = ask(rpc.REVIEW_LIST, subject=subject).waiting
    if as_json:
        print_json([m.model_dump(mode="json") for m in found])
        return
    for m in found:
        typer.echo(f"{m.id} {m.subject} {m.status.value:<14} key={m.key}  {m.content}")
    typer.echo(f"{len(found)} waiting")


@review_app.command("accept")
def review_accept(memory_id: MemoryIdArg, subject: Annotated[str | None, typer.Option()] = None) -> None:
    """Make it active; the memories it contested on its key are superseded by it."""
    report = ask(rpc.REVIEW_DECIDE, memory_id=memory_id, accept=True, subject=subject)
    typer.echo(f"accepted {report.id}: {len(report.changed)} memories changed")


@review_app.command("reject")
def review_reject(memory_id: MemoryIdArg, subject: Annotated[str | None, typer.Option()] = None) -> None:
    """Never search it again (kept as history); a memory it contested stands alone again."""
    report = ask(rpc.REVIEW_DECIDE, memory_id=memory_id, accept=False, subject=subject)
    typer.echo(f"rejected {report.id}: {len(report.changed)} memories changed")


def _known_job(job: str) -> str:
    from memflow.workers.jobs import NAMES

    if job not in NAMES:  # the command line's mistake (exit 2), before a worker is asked
        raise typer.BadParameter(f"{job!r} is no job: one of {', '.join(NAMES)}")
    return job


@jobs_app.command("run")
def jobs_run(job: Annotated[str, typer.Argument(help="decay, consolidate, review or retag", callback=_known_job)],
             subject: Annotated[str | None, typer.Option(help="One subject; default every subject.")] = None,
             now: NowOption = None,
             tier: Annotated[str | None, typer.Option(help="decay only: short_term or long_term.")] = None,
             dry_run: Annotated[bool, typer.Option("--dry-run", help="Show what would change.")] = False,
             as_json: JsonFlag = False) -> None:
    """Run one job by hand and print what it changed (or, with --dry-run, would change)."""
    report = ask(rpc.RUN_JOB, name=job, subject=subject, now=when(now), dry_run=dry_run, tier=tier,
                  timeout_s=600.0)
    if subject is not None and not report.examined:  # a typo'd subject is not "nothing to change"
        fail(f"no subject {subject!r}: nothing stored for it")
    if as_json:
        print_json(report)
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


def reindex_store(batch: Annotated[int, typer.Option("--batch", min=1, help=(
                      "Memories per page: encoded together, saved together (a resumed run starts after the "
                      "last page saved)."))] = DEFAULT_BATCH,
                  as_json: JsonFlag = False) -> None:
    """Re-embed every memory (every subject and status, history too) with the configured model. Searches
    keep using the old vectors until it switches; a killed run resumes where it stopped. With an Edge shard
    (no MEMFLOW_QDRANT_URL), stop `memflow up` first: the shard has one owner."""
    settings = load_settings("WARNING")
    _refuse_beside_up(settings)
    catalog = catalog_for(settings)
    try:
        report = _reindex_showing_progress(catalog, build_embedder(settings), batch, as_json)
    except KeyboardInterrupt:
        raise MemflowError("reindex interrupted, progress saved: run `memflow reindex` again to resume") from None
    finally:
        catalog.close()
    if as_json:
        print_json(asdict(report))
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
