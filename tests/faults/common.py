"""What the fault tests share: real stage processes, the events they ingest, and the accounting.

The counts are small by default (CI) and the issue's full counts with FAULTS_FULL=1.
"""

from __future__ import annotations

import os
import signal
import subprocess
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

from memflow.shared.redisdb.keys import STAGES
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings
from memflow.workers.process import spawn_stage, stop_children

FULL = os.environ.get("FAULTS_FULL") == "1"
T0 = datetime(2026, 5, 1, 9, 0, tzinfo=UTC)
# The processes of the embedded deployment: the store (an Edge shard) has one owner, which also
# answers queries.
ROLES: dict[str, tuple[str, ...]] = {"trigger": ("trigger",), "extract": ("extract",),
                                     "store": ("resolve", "upsert", "query")}
KEYED = 8  # keys updated again and again through an ingest ("locker{j} is {v}")


def events(n: int, subject: str) -> list[dict[str, Any]]:
    """n statements: most carry a token of their own (zq{i}x); every fifth updates one of KEYED keys."""
    found = []
    for i in range(n):
        if i % 5 == 4:
            text = f"Remember: locker{(i // 5) % KEYED} is {i}."
        else:
            text = f"Remember: code word zq{i}x belongs to project {i}."
        found.append({"event_id": f"f{i}", "subject": subject, "session_id": f"s{i // 50}", "kind": "message",
                      "role": "user", "text": text, "ts": T0 + timedelta(seconds=i)})
    return found


def last_values(n: int) -> dict[str, str]:
    """The value each keyed locker must hold at the end: the last one said."""
    return {f"locker{(i // 5) % KEYED}": str(i) for i in range(n) if i % 5 == 4}


def account(client: MemoryClient, subject: str, n: int) -> dict[str, Any]:
    """Every event stored once or dead-lettered with a reason; every key at its last value, once."""
    memories = client.inspect(subject).memories
    dead = dead_letters(client)
    facts = [m for m in memories if m.mtype == "fact"]
    missing, doubled = [], []
    for i in range(n):
        if i % 5 == 4:
            continue
        found = sum(f"zq{i}x" in m.content for m in facts)
        if found == 0 and not any(f'"f{i}"' in d for d in dead):
            missing.append(i)
        if found > 1:
            doubled.append(i)
    lost_updates = []
    for key, value in last_values(n).items():
        live = [m for m in facts if m.key == f"fact.{key}" and m.status == "active"]
        if [m.content for m in live] != [f"{key} is {value}"]:
            lost_updates.append((key, value, [(m.content, m.status) for m in live]))
    return {"events": n, "missing": missing, "doubled": doubled, "lost_updates": lost_updates,
            "dead_letters": len(dead)}


def dead_letters(client: MemoryClient) -> list[str]:
    """The payloads in every dead-letter stream, with their reasons."""
    found = []
    for stream in (s for stage in STAGES for s in client.keys.dlqs(stage)):
        for _, fields in client.redis.xrange(stream):
            found.append(f"{fields.get(b'error', b'').decode()} {fields.get(b'payload', b'').decode(errors='replace')}")
    return found


def start(settings: Settings, role: str) -> subprocess.Popen[bytes]:
    return spawn_stage(settings, *ROLES[role])


def kill9(proc: subprocess.Popen[bytes]) -> None:
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()


def terminate(procs: Sequence[subprocess.Popen[bytes]]) -> None:
    stop_children([p for p in procs if p.poll() is None])


def read_by_groups(client: MemoryClient) -> int:
    """How far an ingest got: the entries every stage has written on (nothing is trimmed within the hour).

    Not the groups' `entries-read`: Redis may forget that counter when it restarts from its AOF.
    """
    streams = [s for stage in STAGES[1:] for s in client.keys.inputs_of(stage)] + [client.keys.changes]
    return sum(int(client.redis.xlen(stream)) for stream in streams)
