"""The whole system in one place, for the demo, the evaluations and the benchmarks.

`embedded(settings)` yields a running system: a redis-server of its own when none is
configured, every stage consuming, the query worker answering, and a client. By
default trigger and extract run as child processes (the shape `memflow up` runs:
they do not compete with the model for this process's interpreter lock); with
`light_in_process=True` they are threads here too (quicker to start, for short runs).
Every part, thread or child process, runs under the system runner (workers/system.py), which
restarts one that dies.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass, field

from memflow.shared.inference.embedder import Embedder
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings
from memflow.workers.process import ChildProcess, own_redis
from memflow.workers.runtime import LIGHT_STAGES, STORE_STAGES, Context
from memflow.workers.system import QUERY, Runner, stage_parts


@dataclass
class Embedded:
    ctx: Context
    client: MemoryClient
    settings: Settings
    children: list[ChildProcess] = field(default_factory=list)

    @property
    def child_pids(self) -> dict[str, int]:
        """Stage name → pid of the child process running it now (empty when all run in-process)."""
        return {"+".join(c.stages): c.pid for c in self.children if c.pid is not None}


@contextlib.contextmanager
def embedded(settings: Settings, *, light_in_process: bool = False, embedder: Embedder | None = None,
             light_processes: int = 1) -> Iterator[Embedded]:
    """The running system; PartDied at the end of the block if a part kept dying meanwhile (the
    runner then stopped every part, workers/system.py). `light_processes`: child processes per light
    stage (trigger, extract), sharing its partitions."""
    with own_redis(settings) as running:
        ctx = Context.from_settings(running, embedder=embedder)
        ctx.store  # noqa: B018 - open it (and check its model) before any stage consumes
        children = [] if light_in_process else [ChildProcess(running, (stage,)) for stage in LIGHT_STAGES
                                                for _ in range(light_processes)]
        stages = (*LIGHT_STAGES, *STORE_STAGES) if light_in_process else STORE_STAGES
        runner = Runner([*stage_parts(ctx, (*stages, QUERY)), *(child.part() for child in children)])
        runner.start()
        runner.supervise_in_background()
        try:
            yield Embedded(ctx, MemoryClient(running), running, children)
        finally:
            runner.shutdown()
            ctx.close()
        runner.raise_if_failed()
