"""extract: `extract` → `resolve`. Turns triggered text into candidate memories (rules, zh + en)."""

from __future__ import annotations

from functools import partial

from pipeline.extract import extract
from pipeline.models import ExtractTask
from shared.streams import Emit, StreamConsumer, per_item
from workers.runtime import Context


def build(ctx: Context) -> StreamConsumer[ExtractTask]:
    return StreamConsumer(ctx.client, ctx.keys, "extract", ExtractTask, per_item(partial(handle, ctx)),
                          ctx.consumer_config())


def handle(ctx: Context, task: ExtractTask) -> list[Emit]:
    found = extract(task, episode_context=ctx.settings.episode_context)
    return [Emit(ctx.keys.stream("resolve"), candidate) for candidate in found]
