"""What the commands share: the settings (with logging set up), `--json` output, a typed call of the running
system, a time given on the command line, Redis's streams, and the one-line failure."""

from __future__ import annotations

import logging
import re
import sys
from datetime import datetime
from typing import Annotated, Any, NoReturn

import orjson
import typer
from pydantic import BaseModel

from memflow.pipeline.models import SUBJECT_PATTERN
from memflow.shared.redisdb.connections import connect_streams
from memflow.shared.redisdb.keys import Keys
from memflow.shared.sdk import rpc
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.sdk.rpc import Rep
from memflow.shared.settings import Settings, get_settings

JsonFlag = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]


def load_settings(level: str | None = None) -> Settings:
    settings = get_settings()
    logging.basicConfig(level=level or settings.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    return settings


def print_json(value: Any) -> None:
    if isinstance(value, BaseModel):  # a typed reply: as it travels
        value = value.model_dump(mode="json")
    sys.stdout.write(orjson.dumps(value, option=orjson.OPT_INDENT_2).decode() + "\n")


def when(value: str | None) -> datetime | None:
    try:
        return datetime.fromisoformat(value) if value else None
    except ValueError as exc:
        raise typer.BadParameter(f"not an ISO time: {value!r}") from exc


def checked_time(value: str | None) -> str | None:
    """An option's callback: a time that cannot be read refused as the command line is parsed, naming the option
    ("Invalid value for '--now': not an ISO time"), before anything is asked of Redis."""
    when(value)
    return value


# `--now` where a command takes one: checked as the command line is parsed.
NowOption = Annotated[str | None, typer.Option("--now", help="ISO time with zone; default now.", callback=checked_time)]


def checked_subject(value: str | None) -> str | None:
    """An option's callback: a name no subject can have (a filter it would make match nothing) refused as usage."""
    if value is not None and re.fullmatch(SUBJECT_PATTERN, value) is None:
        raise typer.BadParameter(f"{value!r} is no subject id (1 to 128 letters, digits or . _ : / -)")
    return value


def ask(call: rpc.Rpc[Any, Rep], **fields: Any) -> Rep:
    """The typed reply of one call. What memflow refuses ends the command in one line (workers/cli/lazy.py): a
    request refused before it is sent as usage (exit 2), what the worker answered as an error (exit 1)."""
    return MemoryClient(load_settings()).call(call, **fields)


def redis_target() -> tuple[Any, Keys]:
    settings = load_settings()
    return connect_streams(settings), settings.keys


def fail(message: str, code: int = 1) -> NoReturn:
    """An error (exit 1), or with USAGE what was given is wrong on its face (exit 2), in one line."""
    sys.stderr.write(f"memflow: {message}\n")
    raise SystemExit(code)


# The exit code of a command line wrong on its face (workers/cli/lazy.py tells them all).
USAGE = 2


# Where a command takes a memory id: the whole id, or its start as `memflow inspect` shows it.
MemoryIdArg = Annotated[str, typer.Argument(help="Its id, or the start of it that `memflow inspect` shows "
                                                 "(8 characters).")]
