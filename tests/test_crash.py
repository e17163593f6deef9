"""kill -9 a real stage process with messages in flight: nothing lost, nothing doubled."""

from __future__ import annotations

import os
import signal
import subprocess
from datetime import UTC, datetime, timedelta

from memflow.shared.sdk.rpc import MemoryState
from memflow.shared.settings import Settings
from memflow.shared.streaming.backlog import backlog
from memflow.workers.process import spawn_stage
from tests.conftest import start_system, wait_for

N = 200


def test_kill_dash_nine_mid_batch_loses_and_duplicates_nothing(settings: Settings, embedder) -> None:
    system = start_system(settings, embedder, stages=("resolve", "upsert"))
    procs = [spawn_stage(settings, "trigger"), spawn_stage(settings, "extract")]
    try:
        t0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
        for i in range(N):
            system.client.publish({"event_id": f"k{i}", "subject": "crash", "session_id": "s1", "kind": "message",
                                   "role": "user", "text": f"Remember: code word zq{i}x belongs to project {i}.",
                                   "ts": t0 + timedelta(seconds=i)})
        extract_stream = system.ctx.keys.work("extract", "crash")
        wait_for(lambda: system.ctx.client.xlen(extract_stream) >= 3, what="the trigger to be mid-way")
        # Freeze both, and kill them only in a moment when they hold messages read but not
        # acknowledged (a plain kill races the batch's own acknowledgement on a busy machine).
        wait_for(lambda: frozen_in_flight(system, procs[:2]), what="a moment with messages in flight")
        for proc in procs[:2]:
            os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
        procs += [spawn_stage(settings, "trigger"), spawn_stage(settings, "extract")]
        assert system.client.wait_idle(timeout_s=90)

        assert_each_stored_once(system.client.inspect("crash").memories)
    finally:
        terminate(procs)
        system.shutdown()


def frozen_in_flight(system, procs) -> bool:
    """Stop the processes; True (left stopped) if they hold unacknowledged messages, else resume them."""
    for proc in procs:
        os.kill(proc.pid, signal.SIGSTOP)
    in_flight = sum(p for _, p in backlog(system.ctx.client, system.ctx.keys, ("trigger", "extract")).values())
    if in_flight == 0:
        for proc in procs:
            os.kill(proc.pid, signal.SIGCONT)
    return in_flight > 0


def test_kill_dash_nine_of_the_store_process_loses_no_acknowledged_write(settings: Settings) -> None:
    """The process holding the Edge shard (resolve, upsert, query) dies mid-stream and
    comes back on the same shard: every statement ends up stored exactly once."""
    from memflow.shared.sdk.client import MemoryClient

    client = MemoryClient(settings.replace(rpc_timeout_s=60.0))
    procs = [spawn_stage(settings, "trigger"), spawn_stage(settings, "extract"), spawn_stage(settings, "resolve", "upsert", "query")]
    try:
        t0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
        for i in range(N):
            client.publish({"event_id": f"s{i}", "subject": "crash2", "session_id": "s1", "kind": "message",
                            "role": "user", "text": f"Remember: shelf zq{i}x holds box {i}.",
                            "ts": t0 + timedelta(seconds=i)})
        upsert = client.keys.work("upsert", "crash2")
        wait_for(lambda: _read_by_group(client, upsert) >= 5, timeout_s=60, what="upsert to be mid-way")
        os.kill(procs[2].pid, signal.SIGKILL)
        procs[2].wait()
        left = backlog(client.redis, client.keys, ("resolve", "upsert"))
        assert sum(lag + pending for lag, pending in left.values()) > 0, "the kill came after all the work"
        procs.append(spawn_stage(settings, "resolve", "upsert", "query"))
        assert client.wait_idle(timeout_s=120)

        assert_each_stored_once(client.inspect("crash2").memories)
    finally:
        terminate(procs)


def _read_by_group(client, stream: str) -> int:
    if not client.redis.exists(stream):
        return 0
    groups = client.redis.xinfo_groups(stream)
    return sum(int(g.get("entries-read") or 0) for g in groups)


def assert_each_stored_once(memories: list[MemoryState]) -> None:
    """Statement i carries the token zq{i}x: exactly one memory per statement, none lost, none doubled."""
    contents = [m.content for m in memories]
    for i in range(N):
        assert sum(f"zq{i}x" in c for c in contents) == 1, f"statement {i}: {contents}"


def terminate(procs: list[subprocess.Popen[bytes]]) -> None:
    """SIGTERM, then wait past the process's own budget for its parts to stop (Runner.shutdown: 30 s, then the
    store's close): a stop that slow on a loaded machine is not what these tests are about; a hang is killed."""
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    for proc in procs:
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
            raise
