"""`memflow dlq`: list, show, replay and drop the entries each stage gave up on."""

from __future__ import annotations

from itertools import islice
from typing import Annotated, Any

import typer

from memflow.shared.errors import InvalidInput
from memflow.shared.redisdb.keys import STAGES
from memflow.shared.streaming import dlq as dead
from memflow.workers.cli.common import JsonFlag, checked_subject, fail, load_settings, print_json, redis_target

dlq_app = typer.Typer(help="Inspect and replay dead-letter streams.", no_args_is_help=True)


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
SubjectFilter = Annotated[str | None, typer.Option("--subject", metavar="SUBJECT", callback=checked_subject,
                                                   help="Only entries whose payload is about SUBJECT.")]
OlderThan = Annotated[int | None, typer.Option("--older-than", metavar="DURATION", parser=_duration_ms,
                                               help="Only entries dead-lettered at least this long ago: 30s, 2h, 7d.")]
Every = Annotated[bool, typer.Option("--all", help="Every dead letter of the stage (when no id or filter is named).")]
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
    client, keys = redis_target()
    where = dead.Where(error, subject, older_than, newer_than)
    entries, now_ms = dead.list_dead(client, keys, stage, count, where), dead.server_now_ms(client)
    if as_json:
        print_json([_letter_json(e, now_ms) for e in entries])
        return
    for e in entries:
        age = dead.format_duration(now_ms - dead.entry_ms(e.id))
        typer.echo(f"{e.stage or stage}  {e.id}  {age}  attempts={e.attempts}  subject={e.subject or '-'}  {e.error}")
    typer.echo(f"{len(entries)} shown of {dead.count(client, keys, stage)} dead letter(s) of {stage}")


@dlq_app.command("show")
def dlq_show(stage: Stage, ids: EntryIds = None, error: ErrorFilter = None, subject: SubjectFilter = None,
             older_than: OlderThan = None, newer_than: NewerThan = None, count: Count = 100) -> None:
    """Dead letters in full, payload included: one JSON object each."""
    client, keys = redis_target()
    where = dead.Where(error, subject, older_than, newer_than)
    entries = list(islice(dead.select(client, keys, stage, ids or None, where), count))
    if ids and not entries:
        _none_of(ids, stage, where)
    if not entries:  # said on stderr: stdout holds one JSON object per letter, here none
        typer.echo(f"no dead letters of {stage}{'' if where.is_empty else ' that match the filters'}", err=True)
    now_ms = dead.server_now_ms(client)
    for entry in entries:
        print_json(_letter_json(entry, now_ms))


@dlq_app.command("replay")
def dlq_replay(stage: Stage, ids: EntryIds = None, error: ErrorFilter = None, subject: SubjectFilter = None,
               older_than: OlderThan = None, newer_than: NewerThan = None, every: Every = False) -> None:
    """Put dead letters back on their stream: the ids given and/or those matching the filters, or --all.

    An entry goes back once however often it is replayed: it leaves the DLQ as it goes.
    """
    where = dead.Where(error, subject, older_than, newer_than)
    _named_or_all(ids, where, every, "replay")
    client, keys = redis_target()
    typer.echo(f"replayed {dead.replay(client, keys, stage, ids or None, where, settings=load_settings().pending)}")


@dlq_app.command("drop")
def dlq_drop(stage: Stage, ids: EntryIds = None, error: ErrorFilter = None, subject: SubjectFilter = None,
             older_than: OlderThan = None, newer_than: NewerThan = None, every: Every = False) -> None:
    """Delete dead letters: the ids given and/or those matching the filters, or --all."""
    where = dead.Where(error, subject, older_than, newer_than)
    _named_or_all(ids, where, every, "drop")
    client, keys = redis_target()
    typer.echo(f"dropped {dead.drop(client, keys, stage, ids or None, where)}")


def _named_or_all(ids: list[str] | None, where: dead.Where, every: bool, verb: str) -> None:
    """A command that acts on every dead letter of a stage says so (--all): naming nothing is a usage error, never
    "all" by default (a mistyped filter would have replayed or dropped the lot)."""
    if not ids and where.is_empty and not every:
        fail(f"name the dead letters to {verb}: entry ids, a filter (--error, --subject, --older-than, "
             "--newer-than), or --all", 2)


def _none_of(ids: list[str], stage: str, where: dead.Where) -> None:
    """`show` of ids none of which is there: an error (exit 1). (`replay` and `drop` say "0" instead: an entry
    leaves the DLQ as it is replayed, so a second replay of it is done, not wrong.)"""
    matching = "" if where.is_empty else " that matches the filters"
    fail(f"no dead letter {' '.join(ids)} of {stage}{matching}: `memflow dlq list {stage}` shows them")
