"""A slow consumer: the store process is throttled (stopped 3/4 of the time) during an ingest.

Its lag grows and `memflow status` shows it; throttling lifted, the backlog drains to zero on
its own and nothing is lost.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading

import pytest

from memflow.shared.monitoring.status import read_status
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings, to_env
from tests.conftest import wait_for
from tests.faults.common import FULL, ROLES, account, events, start, terminate

# Half a minute or more: CI runs it in its second pass (-m long), not in the README's default run.
pytestmark = [pytest.mark.faults, pytest.mark.long]
EVENTS = 2000 if FULL else 150


def throttle(pid: int, stop: threading.Event) -> None:
    """Run the process a quarter of the time until `stop`."""
    while not stop.is_set():
        os.kill(pid, signal.SIGSTOP)
        stop.wait(0.3)
        os.kill(pid, signal.SIGCONT)
        stop.wait(0.1)
    os.kill(pid, signal.SIGCONT)


def status_json(settings: Settings) -> dict:
    out = subprocess.run([sys.executable, "-m", "memflow.workers.cli", "status", "--json"], env=dict(os.environ)
                         | to_env(settings), capture_output=True, text=True, timeout=60, check=True)
    return json.loads(out.stdout)


@pytest.mark.timeout(600 if FULL else 240)
def test_a_slow_consumer_shows_its_lag_and_drains(settings: Settings) -> None:
    client = MemoryClient(settings.replace(rpc_timeout_s=60.0))
    procs = {role: start(settings, role) for role in ROLES}
    slow = threading.Event()
    try:
        assert client.wait_idle(timeout_s=60)  # the store process is up (model loaded) before throttling
        throttler = threading.Thread(target=throttle, args=(procs["store"].pid, slow), daemon=True)
        throttler.start()
        for event in events(EVENTS, "slow"):
            client.publish(event)
        wait_for(lambda: read_status(client.redis, client.keys).stages[2].lag > 20, timeout_s=60,
                 what="resolve's lag to grow")
        shown = {s["stage"]: s for s in status_json(settings)["stages"]}
        assert shown["resolve"]["lag"] + shown["resolve"]["pending"] > 0, shown
        slow.set()
        throttler.join(timeout=10)
        assert client.wait_idle(timeout_s=180)
        drained = read_status(client.redis, client.keys).stages
        assert all(s.lag == 0 and s.pending == 0 and s.dead == 0 for s in drained), drained
        report = account(client, "slow", EVENTS)
        print(f"slow consumer: peak seen resolve lag {shown['resolve']['lag']}, {report}")
        assert report["missing"] == [] and report["doubled"] == [] and report["lost_updates"] == []
    finally:
        slow.set()
        terminate(list(procs.values()))
