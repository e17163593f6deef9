"""Waiting for a condition nothing announces: ask again until it holds, or give up with what was awaited; and how
long to wait before trying again what failed (`backoff_s`)."""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from typing import TypeVar

from memflow.shared.errors import MemflowError

T = TypeVar("T")


class TimedOut(MemflowError):
    """The condition did not hold within the time given."""


def until(condition: Callable[[], T | None], timeout_s: float, what: str, poll_s: float = 0.02) -> T:
    """`condition()`'s first truthy value, asked every `poll_s`; TimedOut naming `what` after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = condition()
        if value:
            return value
        time.sleep(poll_s)
    raise TimedOut(f"timed out after {timeout_s} s waiting for {what}")


def backoff_s(failures: int, base_s: float, max_s: float, rand: Callable[[], float] = random.random) -> float:
    """Full-jitter exponential backoff: uniform in [0, min(max, base * 2^failures)]."""
    return float(rand() * min(max_s, base_s * (2 ** min(failures, 30))))
