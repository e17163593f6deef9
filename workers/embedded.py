"""The whole system in one place, for the demo, the evaluations and the benchmarks.

`embedded(settings)` yields a running system: a redis-server of its own when none is
configured, every stage consuming, the query worker answering, and a client. By
default trigger and extract run as child processes (the shape `memflow up` runs:
they do not compete with the model for this process's interpreter lock); with
`light_in_process=True` they are threads here too (quicker to start, for short runs).
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field

from shared.client import MemoryClient
from shared.embedder import Embedder
from shared.settings import Settings
from workers.process import own_redis, spawn_stage, stop_children
from workers.query import build_worker
from workers.runtime import LIGHT_STAGES, STORE_STAGES, Context, start_consumers


@dataclass
class Embedded:
    ctx: Context
    client: MemoryClient
    settings: Settings
    # Stage name → pid of the child process running it (empty when all run in-process).
    child_pids: dict[str, int] = field(default_factory=dict)


@contextlib.contextmanager
def embedded(settings: Settings, *, light_in_process: bool = False,
             embedder: Embedder | None = None) -> Iterator[Embedded]:
    with own_redis(settings) as running:
        ctx = Context.from_settings(running)
        if embedder is not None:
            ctx._embedder = embedder
        ctx.store  # noqa: B018 - open it (and check its model) before any stage consumes
        stop = threading.Event()
        children = [] if light_in_process else [spawn_stage(running, stage) for stage in LIGHT_STAGES]
        stages = (*LIGHT_STAGES, *STORE_STAGES) if light_in_process else STORE_STAGES
        threads = start_consumers(ctx, stages, stop)
        worker = threading.Thread(target=build_worker(ctx, stop).work, kwargs={"logging_level": "WARNING"},
                                  name="memflow-query", daemon=True)
        worker.start()
        try:
            pids = {stage: child.pid for stage, child in zip(LIGHT_STAGES, children, strict=False)}
            yield Embedded(ctx, MemoryClient(running), running, pids)
        finally:
            stop.set()
            stop_children(children)
            for thread in [*threads, worker]:
                thread.join(timeout=30)
            ctx.close()
