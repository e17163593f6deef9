"""Running stages as processes: one process, several stages, one stop.

`run_stages` is what `memflow worker ...` and `memflow up` run: the stages named, each a part
of the system runner (workers/system.py: a stream stage is a consumer thread, "query" the RQ
query worker in a thread), and for `up` the light stages as child processes, supervised the same
way. SIGTERM/SIGINT finish the batches in hand and return; a part that keeps dying exits non-zero.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import redis

from memflow.shared.errors import MemflowError
from memflow.shared.redisdb.connections import announce, connect_streams, running, safe_url
from memflow.shared.redisdb.durability import warn_if_weaker
from memflow.shared.redisdb.server import start_redis
from memflow.shared.settings import Settings, to_env
from memflow.workers.runtime import STORE_STAGES, Context
from memflow.workers.system import QUERY, Part, run

__all__ = ["QUERY", "ChildProcess", "own_redis", "run_stages", "say_durability", "spawn_stage", "stop_children",
           "temporary_data_dir"]

log = logging.getLogger(__name__)


def run_stages(settings: Settings, stages: Sequence[str], *, children: Sequence[Sequence[str]] = (),
               also: Sequence[Part] = ()) -> None:
    """Run `stages` here, each of `children` (a list of stages) as a child process, and the parts `also`
    (the HTTP server of `up --serve`), supervised alike, until stopped."""
    say_durability(settings)
    ctx = Context.from_settings(settings)
    if set(stages) & {*STORE_STAGES, QUERY}:
        # Opened (and its model checked) before any stage consumes: a ModelMismatch stops the process
        # with its one line, instead of failing every message it would have read.
        ctx.store  # noqa: B018
    try:
        run(ctx, stages, also=[*(ChildProcess(settings, tuple(c)).part() for c in children), *also],
            query_log_level=settings.log_level)
    finally:
        ctx.close()


def say_durability(settings: Settings) -> None:
    """At start: a warning when an acknowledged publish survives less on this Redis than docs/guarantees.md promises
    (no AOF, no WAITAOF: shared/redisdb/durability.py). A server not up yet is the stage loops' to wait out."""
    try:
        warn_if_weaker(connect_streams(settings), settings.redis.wait_aof, safe_url(settings))
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        log.info("cannot read the server's persistence yet (%s): the first publish says it", exc)


@dataclass
class ChildProcess:
    """A `memflow worker <stages...>` child as a part of the runner: its exit while we run is a death
    (the runner starts another); our stop terminates it."""

    settings: Settings
    stages: tuple[str, ...]
    pid: int | None = None

    def part(self) -> Part:
        return Part("+".join(self.stages), self.run)

    def run(self, stop: threading.Event) -> None:
        child = spawn_stage(self.settings, *self.stages)
        self.pid = child.pid
        try:
            while not stop.wait(0.2):
                if child.poll() is not None:
                    log.error("child %s (pid %d) exited with %s", self.part().name, child.pid, child.returncode)
                    return
        finally:
            stop_children([child])


@contextlib.contextmanager
def own_redis(settings: Settings) -> Iterator[Settings]:
    """The settings, with a server of our own when none is configured, recorded in the data dir for
    the commands run beside us (shared.redisdb.connections.require_url)."""
    if settings.redis.url:
        yield settings
        return
    already = running(settings.store.data_dir)
    if already is not None:
        raise MemflowError(f"memflow is already running from {settings.store.data_dir.resolve()} (pid {already.pid}, "
                           f"Redis {already.redis_url}): stop it first, or use another MEMFLOW_DATA_DIR")
    data = settings.store.data_dir
    server = start_redis(data / "redis", binary=settings.redis.server)
    # The queues and what a search writes on a server that never waits for the disk (TRANSIENT's comment); unless
    # the deployer named one.
    queues = None if settings.redis.queue_url else start_redis(data / "queue", binary=settings.redis.server,
                                                               durable=False)
    log.info("started %s at %s%s", server.binary, server.url, f", its transient twin at {queues.url}" if queues else "")
    queue_url = queues.url if queues else settings.redis.queue_url
    record = announce(data, server.url, queue_url)
    try:
        yield settings.replace(redis_url=server.url, redis_queue_url=queue_url)
    finally:
        record.unlink(missing_ok=True)
        server.stop()
        if queues is not None:
            queues.stop()


def spawn_stage(settings: Settings, *stages: str) -> subprocess.Popen[bytes]:
    """A child `memflow worker <stages...>` running with exactly our settings (and our Redis)."""
    env = dict(os.environ) | to_env(settings)
    # A child logs as quietly as its parent does (the demo keeps the terminal clean).
    env["MEMFLOW_LOG_LEVEL"] = logging.getLevelName(logging.getLogger().getEffectiveLevel())
    return subprocess.Popen([sys.executable, "-m", "memflow.workers.cli", "worker", *stages], env=env)


def stop_children(children: Sequence[subprocess.Popen[bytes]]) -> None:
    for child in children:
        child.terminate()
    for child in children:
        try:
            child.wait(timeout=30)
        except subprocess.TimeoutExpired:
            child.kill()


@contextlib.contextmanager
def temporary_data_dir(settings: Settings) -> Iterator[Settings]:
    with tempfile.TemporaryDirectory(prefix="memflow-demo-") as tmp:
        yield settings.replace(data_dir=Path(tmp), redis_url=None, redis_queue_url=None)
