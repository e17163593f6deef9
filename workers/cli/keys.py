"""`memflow keys`: the API keys of `memflow serve` and `memflow mcp`: create, list, revoke."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Annotated

import typer

from memflow.shared.admission.apikeys import KeyStore
from memflow.workers.cli.common import JsonFlag, fail, print_json, redis_target

keys_app = typer.Typer(help="API keys for `memflow serve` and `memflow mcp`, each scoped to subjects.",
                       no_args_is_help=True)


def _keystore() -> KeyStore:
    client, keys = redis_target()
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
        print_json({**key.as_json(), "key": secret})
        return
    # The warning first, on stderr; the key last, alone on stdout: `KEY=$(memflow keys create …)` takes it whole.
    typer.echo(f"key {key.id} ({key.name}): subjects {', '.join(key.subjects)}"
               + (", read-only" if key.read_only else "") + ". Keep it now (the last line, on stdout): it cannot be "
               "shown again.", err=True)
    sys.stderr.flush()
    typer.echo(secret)


@keys_app.command("list")
def keys_list(as_json: JsonFlag = False) -> None:
    """Every key: id, name, subject patterns, read-only, created (never the key itself)."""
    found = _keystore().list()
    if as_json:
        print_json([k.as_json() for k in found])
        return
    for k in found:
        typer.echo(f"{k.id}  {k.name:<20} {','.join(k.subjects):<30} {'read-only' if k.read_only else 'read-write'}"
                   f"  {k.created_at}")


@keys_app.command("revoke")
def keys_revoke(key: Annotated[str, typer.Argument(help="The key's id (or its name, if only one has it).")]) -> None:
    """Revoke a key: the next request that names it is refused."""
    if not _keystore().revoke(key):
        fail(f"no key {key!r}: `memflow keys list` shows them")
    typer.echo(f"revoked {key}")
