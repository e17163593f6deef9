"""The commands that talk to a running system about memories: `publish`, `search`, `forget` (and
`compact-aof`, which rewrites Redis's log of what was forgotten), `inspect`, `history`, `rollback`."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime
from typing import Annotated

import typer

from memflow.pipeline.models import SearchResult
from memflow.shared.errors import NotFound
from memflow.shared.sdk import rpc
from memflow.shared.sdk.client import MemoryClient
from memflow.workers.cli.common import JsonFlag, MemoryIdArg, NowOption, ask, fail, load_settings, print_json, when


def publish(subject: str, text: str, session: str = "cli", role: str = "user", kind: str = "message",
            event_id: Annotated[str | None, typer.Option(help="Defaults to a new uuid.")] = None,
            ts: Annotated[str | None, typer.Option(help="ISO time with zone; defaults to now.")] = None) -> None:
    """Publish one event."""
    client = MemoryClient(load_settings())
    event_id = event_id or str(uuid.uuid4())
    event = {"event_id": event_id, "subject": subject, "session_id": session, "kind": kind,
             "role": role if kind == "message" else None, "text": text, "ts": ts or datetime.now(UTC)}
    entry = client.publish(event)  # a bad field: InvalidInput, usage (workers/cli/lazy.py)
    # The event id is what `fate` asks by: a new one made here is otherwise nowhere to be seen.
    typer.echo(f"published event {event_id} (stream entry {entry}): `memflow fate {subject} {event_id}` tells "
               "what became of it")


def search(subject: str, query: str,
           k: Annotated[int, typer.Option(min=1, max=200, help="How many hits, 1 to 200.")] = 5,
           now: NowOption = None,
           as_json: JsonFlag = False) -> None:
    """Search one subject's memories."""
    result = MemoryClient(load_settings()).search(subject, query, k, now=when(now))
    if as_json:
        print_json(result.model_dump(mode="json"))
    else:
        _print_hits(result)
    if result.status == "failed":  # not answered: an error, whatever was printed
        raise typer.Exit(1)


def _print_hits(result: SearchResult) -> None:
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


def forget(subject: str, ids: Annotated[list[str] | None, typer.Argument(help=(
               "Memory ids, or the starts of them that `memflow inspect` shows."))] = None,
           contains: Annotated[str | None, typer.Option(help="Every memory whose content holds this.")] = None,
           verify: Annotated[bool, typer.Option(help="Then prove it: no point left, no Redis entry naming it. "
                                                     "With ids and nothing else to forget: prove an earlier forget.")]
           = False, as_json: JsonFlag = False) -> None:
    """Forget memories (by id, or by what they say) everywhere memflow kept their words."""
    if not ids and not contains:  # else nothing would be done, and nothing said
        raise typer.BadParameter("name the memories to forget: their ids, or --contains TEXT", param_hint="IDS")
    client = MemoryClient(load_settings())
    report = client.call(rpc.FORGET, subject=subject, memory_ids=ids or None, contains=contains)
    proof = None
    if verify:  # what this call forgot, else the ids given (an earlier forget)
        proven = report.forgotten_ids or ids or []
        proof = client.call(rpc.VERIFY_FORGOTTEN, subject=subject, memory_ids=proven, contains=contains)
    if as_json:
        print_json(report.model_dump(mode="json") | ({"verify": proof.model_dump(mode="json")} if proof else {}))
    else:
        _say_forgotten(report)
        if proof:
            typer.echo(f"verified: {proof.verified} — points in the store: {len(proof.in_store)}, "
                       f"Redis entries naming them: {proof.residue or 0}, without a receipt: {proof.unknown}, "
                       f"points still holding their words: {proof.still_held or 'none'}")
    if proof and not proof.verified:
        raise typer.Exit(1)


def compact_aof() -> None:
    """Rewrite Redis's append-only file (BGREWRITEAOF): until then it keeps every command ever run, the words
    of forgotten memories and secrets included. `forget` starts one itself when it removed raw copies."""
    from memflow.workers.forgetting import compact_aof as rewrite

    if not rewrite(MemoryClient(load_settings()).redis):
        typer.echo("the server refused BGREWRITEAOF (one already running?): try again shortly", err=True)
        raise typer.Exit(1)
    typer.echo("AOF rewrite started")


def inspect(subject: str, now: NowOption = None,
            as_json: JsonFlag = False) -> None:
    """A subject's memories with state, tier, strength, uses and last change; utilisation; backlog."""
    report = MemoryClient(load_settings()).call(rpc.INSPECT, subject=subject, now=when(now))
    if not report.memories and not report.pending:
        fail(f"no subject {subject!r}: nothing stored or waiting to be stored for it")
    if as_json:
        print_json(report)
        return
    print_memories(report.memories)
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


def print_memories(memories: list[rpc.MemoryState]) -> None:
    for m in memories:
        last = m.last_change
        about = "" if m.about == "self" else f" about={m.about}"
        typer.echo(f"{m.id[:8]} {m.status.value:<9} {m.tier.value:<10} {m.dir.value}/{m.mtype.value} "
                   f"key={m.key}{about} "
                   f"v{m.version} conf={m.confidence:.2f} strength={m.strength_now:.2f} "
                   f"uses={m.access_count}{' llm' if m.extractor == 'llm' else ''}  {m.content}"
                   f"\n         last change {last.at.isoformat()}: {last.why}")
    typer.echo(f"{len(memories)} memories")


def fate(subject: str, event_id: Annotated[str, typer.Argument(help="The event_id it was published with.")],
         as_json: JsonFlag = False) -> None:
    """What became of a published event: accepted, stored (as which memories), nothing to remember, dropped or
    dead-lettered, and why."""
    try:
        found = MemoryClient(load_settings()).event_fate(subject, event_id)
    except NotFound:
        fail(f"no event {event_id!r} recorded for {subject!r}: never published there, or its fate has expired")
    if as_json:
        print_json(found.model_dump(mode="json"))
        return
    typer.echo(f"{found.state.value}" + (f": {found.reason}" if found.reason else "")
               + (f"; memories {', '.join(found.memory_ids)}" if found.memory_ids else ""))


def history(memory_id: MemoryIdArg, subject: Annotated[str | None, typer.Option(help="Its subject (faster).")] = None,
            as_json: JsonFlag = False) -> None:
    """Every version of a memory and why each changed, oldest first."""
    report = ask(rpc.HISTORY, memory_id=memory_id, subject=subject)
    if as_json:
        print_json(report)
        return
    typer.echo(f"{report.subject} key={report.key}" + ("" if report.about == "self" else f" about={report.about}"))
    for v in report.versions:
        mark = "*" if v.id == report.asked else " "
        typer.echo(f"{mark} v{v.version} {v.id[:8]} {v.status.value:<14} {v.tier.value:<10} "
                   f"{_iso(v.created_at)}  {v.content}")
        for r in v.revisions:
            before = ", ".join(f"{k}={val}" for k, val in r.before.items())
            typer.echo(f"      rev {r.rev} {_iso(r.at)}: {r.why} (was {before})")


def rollback(memory_id: MemoryIdArg, to: Annotated[int, typer.Option("--to", min=1, help="The version to restore.")],
             subject: Annotated[str | None, typer.Option(help="Its subject (faster).")] = None,
             as_json: JsonFlag = False) -> None:
    """Restore an old version as a new version on top; the change is recorded like any other."""
    report = ask(rpc.ROLLBACK, memory_id=memory_id, to_version=to, subject=subject)
    if as_json:
        print_json(report)
        return
    restored = report.restored
    if restored is None:
        typer.echo(f"version {to} is already current: nothing changed")
        return
    typer.echo(f"restored version {to} as v{restored.version} {restored.id[:8]}: {restored.content} "
               f"(superseded {len(report.superseded)})")


def _iso(value: datetime) -> str:
    return value.isoformat()
