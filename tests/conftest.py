"""Fixtures on real services: one redis-server for the session, a fresh key prefix and
data dir per test, the real embedding model loaded once, the real Qdrant engine."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import threading
import time
import traceback
import uuid
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import redis

from memflow.shared.inference.embedder import E5Embedder, Embedder, Paired, SentenceTransformerEmbedder
from memflow.shared.polling import TimedOut, until
from memflow.shared.redisdb.cluster import LocalCluster, start_cluster
from memflow.shared.redisdb.connections import connect
from memflow.shared.redisdb.keys import STAGES, Keys
from memflow.shared.redisdb.server import RedisServer, find_binary, start_redis
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings

if TYPE_CHECKING:
    from memflow.workers.runtime import Context


# Every system a test starts creates an Edge index of 8 empty shards with 7 payload indexes each: 0.5 s of CPU
# and ~60 durable writes (fsync) per shard on a disk, 4-6 s of wall time per system on a disk other processes
# share (measured beside the suite: 0.2-0.7 s on tmpfs), and the same for Valkey's files. The suite's temporary
# directories (tmp_path, tmp_path_factory, tempfile) therefore live in memory when the machine has a tmpfs with
# room to spare: the same engine and the same files, whose fsyncs return at once (no test cuts the power; a
# killed process leaves its writes in the page cache either way). PYTEST_MEMFLOW_TMP_ON_DISK=1 keeps them on disk.
# Set before pytest picks its base temporary directory; xdist's processes and the tests' subprocesses inherit it.
MEMORY_TMP = Path("/dev/shm")
MEMORY_TMP_MIN_FREE = 4 << 30  # a run holds up to ~1 GB there (every passing test's directory removed at its end)


def _temporary_files_in_memory() -> None:
    if os.environ.get("PYTEST_MEMFLOW_TMP_ON_DISK") or os.environ.get("TMPDIR"):
        return  # asked for the disk, or a place chosen by whoever runs the suite
    if MEMORY_TMP.is_dir() and os.access(MEMORY_TMP, os.W_OK | os.X_OK) \
            and shutil.disk_usage(MEMORY_TMP).free >= MEMORY_TMP_MIN_FREE:
        os.environ["TMPDIR"] = str(MEMORY_TMP)
        tempfile.tempdir = None  # gettempdir() asks the environment again


_temporary_files_in_memory()


def pytest_report_header() -> str:
    """Which server the suite runs on (MEMFLOW_REDIS_SERVER picks one; default: the bundled Valkey), and where
    its temporary files are."""
    return f"redis: {find_binary(Settings().redis.server)}; temporary files in {tempfile.gettempdir()}"


# A stop that takes past SLOW_STOP_S (a worker stops within about a second: its dequeue wait): every thread's stack
# then goes to SLOW_STOPS, and the run's summary says how many there were (a long suite showed 15 s teardowns that
# no short run of the same modules did; the stacks say where the next one waits).
# Under pytest-xdist the run's processes inherit the path the first one chose: they write to one file, and the
# summary (printed by the controlling process alone) counts every process's stops from it.
SLOW_STOP_S = 2.5
SLOW_STOPS = Path(os.environ.setdefault(
    "PYTEST_MEMFLOW_SLOW_STOPS", str(Path(tempfile.gettempdir()) / f"memflow-slow-stops-{uuid.uuid4().hex[:8]}.txt")))


def join_reporting_slow_stops(threads: list[threading.Thread], timeout_s: float) -> None:
    """Join `threads` within `timeout_s` in all; a thread still running after SLOW_STOP_S is reported."""
    started = time.monotonic()
    for thread in threads:
        thread.join(timeout=max(0.0, min(SLOW_STOP_S, timeout_s) - (time.monotonic() - started)))
        if thread.is_alive():
            _report_slow_stop(thread, time.monotonic() - started)
            thread.join(timeout=max(0.0, timeout_s - (time.monotonic() - started)))


def _report_slow_stop(thread: threading.Thread, after_s: float) -> None:
    frames = sys._current_frames()
    stacks = [f"--- {t.name}\n{''.join(traceback.format_stack(frames[t.ident]))}"
              for t in threading.enumerate() if t.ident in frames]
    with SLOW_STOPS.open("a") as out:
        out.write(f"=== {thread.name} still running {after_s:.1f} s after its stop ({time.ctime()})\n")
        out.write("".join(stacks))


def pytest_terminal_summary(terminalreporter: Any) -> None:
    lines = SLOW_STOPS.read_text().splitlines() if SLOW_STOPS.exists() else []
    slow_stops = [line.removeprefix("=== ").split(" still running ")[0] for line in lines if line.startswith("=== ")]
    if slow_stops:
        terminalreporter.write_line(f"{len(slow_stops)} stops took over {SLOW_STOP_S:g} s "
                                    f"({', '.join(slow_stops[:5])}); every thread's stack: {SLOW_STOPS}")


@pytest.fixture(autouse=True)
def noise_floor_once_per_embedder() -> None:
    """A context measures its query noise floor (`Context.unrelated`: 16 passages through the embedder) when its
    query worker starts: 0.4-0.8 s of MiniLM on a busy machine, more of e5+MiniLM, for each of the ~250 systems a
    run starts (and each eval scenario). The rows depend on the embedder alone: from the first worker of the process
    on, each embedder object is measured once and its rows reused (the same real vectors; a failure is not kept)."""
    runtime = sys.modules.get("memflow.workers.runtime")  # never imported here: the stream tests stay light
    if runtime is None or getattr(runtime.Context.unrelated, "shared_per_embedder", False):
        return
    measure = runtime.Context.unrelated.func
    rows: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()

    def unrelated(ctx: Any) -> Any:
        embedder = ctx.embedder
        if embedder not in rows:
            rows[embedder] = measure(ctx)
        return rows[embedder]

    shared = cached_property(unrelated)
    shared.__set_name__(runtime.Context, "unrelated")
    shared.shared_per_embedder = True  # type: ignore[attr-defined]
    runtime.Context.unrelated = shared


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = start_redis(tmp_path_factory.mktemp("redis"), binary=Settings().redis.server)
    yield server
    server.stop()


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    """A Valkey cluster of 3 masters with a replica each, shared by the session's `cluster` tests: isolate
    with uuid hash tags, never kill its nodes (start_cluster a cluster of the test's own for that)."""
    cluster = start_cluster(tmp_path_factory.mktemp("cluster"), binary=Settings().redis.server)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="session")
def embedder() -> Embedder:
    return SentenceTransformerEmbedder()


@pytest.fixture(scope="session")
def e5() -> E5Embedder:
    """e5 alone, loaded once a process (the paired embedder's half; two modules used to load their own copy)."""
    return E5Embedder()


@pytest.fixture(scope="session")
def paired(e5: E5Embedder, embedder: Embedder) -> Embedder:
    """The default embedder (MEMFLOW_EMBEDDER=e5+st): e5 and MiniLM in one vector. Most tests run on
    MiniLM alone (faster to encode); what ranks as users' searches rank runs on this."""
    return Paired(e5, embedder)


@pytest.fixture
def paired_system(settings: Settings, paired: Embedder) -> Iterator[System]:
    running = start_system(settings, paired)
    yield running
    running.shutdown()


@pytest.fixture
def settings(redis_server: RedisServer, tmp_path: Path) -> Settings:
    # A prefix of its own isolates every test on the shared server (never FLUSHALL).
    return Settings(redis_url=redis_server.url, stream_prefix=f"t{uuid.uuid4().hex[:10]}:", data_dir=tmp_path,
                    reclaim_idle_ms=300, block_ms=50, retry_base_s=0.01, retry_max_s=0.2, lease_ms=3000)


@pytest.fixture
def client(settings: Settings) -> redis.Redis:
    """A plain connection to the test's Redis (for tests below the worker stack)."""
    return connect(settings.redis.url or "")


@pytest.fixture
def running() -> Iterator[list[tuple[threading.Event, threading.Thread]]]:
    """Threads a test starts (each with its stop event): stopped, then joined, when it ends."""
    started: list[tuple[threading.Event, threading.Thread]] = []
    yield started
    for stop, _ in started:
        stop.set()
    for _, thread in started:
        thread.join(timeout=10)


@pytest.fixture
def store_ctx(settings: Settings, embedder: Embedder) -> Iterator[Context]:
    """A context on the real store and Redis, no stage running: the write path driven by hand."""
    from memflow.workers.runtime import Context

    ctx = Context.from_settings(settings)
    ctx._embedder = embedder
    yield ctx
    ctx.close()


@pytest.fixture
def keys(settings: Settings) -> Keys:
    return settings.keys


@dataclass
class System:
    ctx: Any
    client: MemoryClient
    stop: threading.Event
    threads: list[threading.Thread]

    def shutdown(self) -> None:
        self.stop.set()
        join_reporting_slow_stops(self.threads, 15.0)
        self.ctx.close()


def start_system(settings: Settings, embedder: Embedder, stages: tuple[str, ...] = STAGES,
                 query: bool = True, store: Any = None) -> System:
    # Imported here so that the stream tests run without the whole worker stack.
    from memflow.workers.query import build_worker
    from memflow.workers.runtime import Context
    from memflow.workers.system import start_consumers

    ctx = Context.from_settings(settings)
    ctx._embedder = embedder
    ctx._store = store
    stop = threading.Event()
    threads = start_consumers(ctx, stages, stop)
    if query:
        worker = build_worker(ctx, stop)
        thread = threading.Thread(target=worker.work, kwargs={"logging_level": "WARNING"}, daemon=True)
        thread.start()
        threads.append(thread)
    return System(ctx, MemoryClient(settings), stop, threads)


@pytest.fixture
def system(settings: Settings, embedder: Embedder) -> Iterator[System]:
    running = start_system(settings, embedder)
    yield running
    running.shutdown()


def wait_for(condition: Callable[[], object], timeout_s: float = 20.0, what: str = "condition") -> object:
    """Poll a condition until it holds (tests wait on conditions, never on fixed sleeps)."""
    try:
        return until(condition, timeout_s, what)
    except TimedOut as exc:
        raise AssertionError(str(exc)) from None


def run_cli(system: System, monkeypatch: pytest.MonkeyPatch, *args: str) -> str:
    """`memflow ARGS` against this system (its Redis and prefix); the output, or an error if it failed."""
    from typer.testing import CliRunner

    from memflow.shared.settings import get_settings
    from memflow.workers.cli import app

    monkeypatch.setenv("MEMFLOW_REDIS_URL", system.ctx.settings.redis.url)
    monkeypatch.setenv("MEMFLOW_STREAM_PREFIX", system.ctx.settings.redis.stream_prefix)
    get_settings.cache_clear()
    try:
        result = CliRunner().invoke(app, list(args))
    finally:
        get_settings.cache_clear()
    assert result.exit_code == 0, result.output
    return result.output
