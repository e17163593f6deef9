"""`memflow export` and `memflow import`: memories as JSON Lines, out of one store and into another
(docs/export-format.md)."""

from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Annotated

import typer

from memflow.pipeline.export import FormatError
from memflow.pipeline.models import SUBJECT_PATTERN
from memflow.shared.errors import InvalidInput
from memflow.shared.sdk import rpc
from memflow.shared.sdk.client import MemoryClient
from memflow.workers.cli.common import USAGE, JsonFlag, fail, load_settings, print_json


def export_memories(subjects: Annotated[list[str] | None, typer.Argument(help="Subjects to export.")] = None,
                    every: Annotated[bool, typer.Option("--all", help="Every subject in the store.")] = False,
                    with_vectors: Annotated[bool, typer.Option("--with-vectors", help=(
                        "Include each memory's dense vector and the model that made it (an import into a store "
                        "of that model stores them as they are; others encode again)."))] = False) -> None:
    """Write memories as JSON Lines to stdout, with their versions, history and provenance (docs/export-format.md)."""
    if bool(subjects) == every:
        raise typer.BadParameter("name the subjects to export, or --all (not both)")
    _refuse_malformed(subjects or [])
    client = MemoryClient(load_settings())
    _refuse_unknown(client, subjects or [])
    out = sys.stdout.buffer
    for line in client.export(None if every else subjects, with_vectors=with_vectors):
        out.write(line)
    out.flush()


def _refuse_malformed(subjects: list[str]) -> None:
    """A name no subject can have is wrong on its face (exit 2, as `search` and `inspect` say it), not a subject
    the store happens not to hold (exit 1)."""
    for subject in subjects:
        if re.fullmatch(SUBJECT_PATTERN, subject) is None:
            fail(f"subject: {subject!r} is no subject id (1 to 128 letters, digits or . _ : / -)", USAGE)


def _refuse_unknown(client: MemoryClient, subjects: list[str]) -> None:
    """A subject named that the store holds nothing of: said (exit 1), before a header with no memories is written."""
    held = set(client.call(rpc.SUBJECTS).subjects)
    unknown = [s for s in subjects if s not in held]
    if unknown:
        fail(f"no memories of {', '.join(map(repr, unknown))} in this store: nothing exported")


def import_memories(path: Annotated[Path, typer.Argument(help="An export (JSON Lines); - for stdin.")],
                    as_subject: Annotated[str | None, typer.Option("--as", metavar="SUBJECT", help=(
                        "Import the file's one subject as SUBJECT: new ids, provenance kept, the file's subject "
                        "untouched (docs/export-format.md#as-another-subject)."))] = None,
                    as_json: JsonFlag = False) -> None:
    """Import an export: checked whole first, then each subject gets what it lacks (the same file twice changes
    nothing; a memory forgotten here is not brought back)."""
    try:
        with (sys.stdin.buffer if str(path) == "-" else path.open("rb")) as lines:
            report = MemoryClient(load_settings()).import_(lines, as_subject=as_subject)
    except FormatError as exc:  # the file named is wrong on its face: usage, as a malformed argument is
        fail(f"{path}: {exc}: nothing was imported", USAGE)
    except InvalidInput as exc:
        if exc.field != "as_subject":
            raise
        fail(f"--as: {exc.reason}: nothing was imported", USAGE)
    except OSError as exc:
        fail(f"cannot read {path}: {exc}", USAGE)
    if as_json:
        print_json(report.model_dump(mode="json"))
        return
    for s in report.subjects:
        typer.echo(f"{s.subject}: {s.memories} in the file — {s.written} written ({s.reembedded} encoded here), "
                   f"{s.already} already here, {s.kept} kept as this store has them, {s.forgotten} forgotten here")
