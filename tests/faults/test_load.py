"""A burst from 8 concurrent publishers: nothing lost, and the pipeline drains on its own.

CI: 800 events; FAULTS_FULL=1: the issue's 10,000 (`memflow bench load` prints the figures).
"""

from __future__ import annotations

import pytest

from memflow.bench.load import measure
from memflow.shared.inference.embedder import Embedder
from memflow.shared.settings import Settings
from memflow.workers.embedded import embedded
from tests.faults.common import FULL

pytestmark = pytest.mark.faults
EVENTS = 10_000 if FULL else 800


@pytest.mark.timeout(7200 if FULL else 300)
def test_a_burst_from_eight_publishers_loses_nothing(settings: Settings, embedder: Embedder) -> None:
    with embedded(settings, embedder=embedder) as system:
        report = measure(system, EVENTS, publishers=8)
    print(f"load: {report}")
    acc = report["accounting"]
    assert acc["lost"] == 0 and acc["dead_letters"] == 0 and acc["stored"] == acc["messages"] > 0.9 * EVENTS
    assert all(peak > 0 for peak in report["peak_backlog"].values()), "the burst never built a backlog"
