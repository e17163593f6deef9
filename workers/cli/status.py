"""How the running pipeline is doing: `status` (per stage, or what one subject takes in Redis), `partitions`
(the streams' partition count) and `traces tail` (how searches and LLM calls were answered)."""

from __future__ import annotations

from dataclasses import asdict
from typing import Annotated, Any

import orjson
import typer

from memflow.shared.monitoring.status import PipelineStatus, SubjectFootprint, read_status, subject_footprint
from memflow.shared.redisdb.connections import connect_queue
from memflow.shared.redisdb.keys import FIELD, recorded_partitions
from memflow.shared.streaming import dlq as dead
from memflow.shared.streaming.backlog import change_partitions
from memflow.workers.cli.common import JsonFlag, checked_subject, load_settings, print_json, redis_target

partitions_app = typer.Typer(help="The partition count of the streams, recorded in Redis.", no_args_is_help=True)
traces_app = typer.Typer(help="The search traces feed.", no_args_is_help=True)


def status(sample: Annotated[float | None, typer.Option("--sample", metavar="SECONDS", min=0.0, help=(
               "Measure read/s as what each group reads over SECONDS (waits that long) instead of "
               "the last minute's arrivals already read."))] = None,
           subject: Annotated[str | None, typer.Option("--subject", callback=checked_subject, help=(
               "Instead: every Redis key memflow keeps for SUBJECT, its bytes and time left."))] = None,
           as_json: JsonFlag = False) -> None:
    """Per stage: stream length, lag, pending, dead letters, entries read per second; the RQ queues and
    the live query workers. With --subject: what one subject takes in Redis."""
    client, keys = redis_target()
    settings = load_settings()
    if subject is not None:
        footprint = subject_footprint(client, keys, subject, connect_queue(settings, client))
        if as_json:
            print_json(asdict(footprint) | {"bytes": footprint.bytes})
            return
        _print_footprint(footprint)
        return
    report = read_status(client, keys, sample, connect_queue(settings, client), settings.redis.wait_aof)
    if as_json:
        print_json(asdict(report))
        return
    _print_status(report, llm_configured=settings.llm.base_url is not None)


def _print_footprint(footprint: SubjectFootprint) -> None:
    typer.echo(f"{'key':<28} {'memory':>10} {'expires in':>11}")
    for k in footprint.keys:
        left = "never" if k.ttl_s is None else dead.format_duration(k.ttl_s * 1000)
        typer.echo(f"{k.what[:28]:<28} {_bytes(k.bytes):>10} {left:>11}")
    typer.echo(f"{footprint.subject}: {len(footprint.keys)} keys, {_bytes(footprint.bytes)}")


def _print_status(report: PipelineStatus, *, llm_configured: bool) -> None:
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
    typer.echo(f"llm: {_llm_line(report.llm, configured=llm_configured)}")


def _llm_line(u: dict[str, Any], *, configured: bool) -> str:
    """Everyone's LLM calls over the days kept: what they were for, the mean wait, and each fallback by reason."""
    if not u.get("calls") and not u.get("fallbacks"):
        return (f"no call in the last {u.get('days', 0)} days" if configured
                else "not configured (MEMFLOW_LLM_BASE_URL unset): the rules extract, judge and plan")
    purposes = ", ".join(f"{p} {n}" for p, n in sorted(u["calls_by_purpose"].items()))
    wait = f"{u['mean_latency_ms']:.0f} ms" if u.get("mean_latency_ms") is not None else "-"
    reasons = ", ".join(f"{r} {n}" for r, n in sorted(u["fallbacks_by_reason"].items()))
    return (f"{u['calls']} calls answered in the last {u['days']} days ({purposes}), mean {wait} per call; "
            f"{u['fallbacks']} fallbacks to the rules{f' ({reasons})' if reasons else ''}")


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
    client, keys = redis_target()
    typer.echo(f"recorded: {recorded_partitions(client, keys) or 'none yet'}; MEMFLOW_PARTITIONS: {keys.partitions}")


@partitions_app.command("set")
def partitions_set(count: Annotated[int, typer.Argument(min=1, max=1024, help="The new partition count.")]) -> None:
    """Change the partition count, drained: nothing unread, pending or dead-lettered in any stage and no
    worker running (refused otherwise, saying what is left). Then start every process with
    MEMFLOW_PARTITIONS=COUNT."""
    client, keys = redis_target()
    # Refused while anything is left to drain: the system's answer (exit 1), told in one line (workers/cli/lazy.py).
    was = change_partitions(client, keys, count, load_settings().consumer.lease_ms)
    typer.echo(f"partitions: {was or 'none recorded'} -> {count}; start every process with MEMFLOW_PARTITIONS={count}")


# -- traces ---------------------------------------------------------------------------


@traces_app.command("tail")
def traces_tail(count: Annotated[int, typer.Option(min=1, help="The last this many.")] = 20,
                follow: Annotated[bool, typer.Option("--follow", "-f")] = False,
                as_json: JsonFlag = False) -> None:
    """The last searches (query redacted: intent, dirs, fallback, chosen ids, latency) and LLM calls."""
    streams, keys = redis_target()
    client: Any = connect_queue(load_settings(), streams)  # the feed lives beside the queues
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
