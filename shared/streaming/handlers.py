"""What a stage's handler is to the consumer loop (shared/streaming/consumer.py): it takes a batch of decoded messages
and returns, per message, what to emit downstream (`Emit`) or the exception it failed with; `per_item` makes one of a
one-message function. While it runs it may mark progress (`progress`), so that a long batch keeps its partitions."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import TypeVar

import redis
from pydantic import BaseModel

from memflow.shared.errors import Retryable
from memflow.shared.streaming.leases import LeaseLost, Leases

M = TypeVar("M", bound=BaseModel)


@dataclass(frozen=True)
class Emit:
    """A message a handler wants added to a stream when its input is acknowledged."""

    stream: str  # a partition stream of the message's subject: Keys.work(name, subject)
    message: BaseModel


# Per input entry, in order: what to emit, or the exception that entry failed with.
Outcome = list[Emit] | BaseException
BatchHandler = Callable[[Sequence[M]], Sequence[Outcome]]


def per_item(handle: Callable[[M], list[Emit]]) -> BatchHandler[M]:
    """Turn a one-message handler into a batch handler that isolates each message's failure, hands a message
    over only while its partition's lease is still ours (confirmed just before: `Leases.confirm`), and marks
    progress after each message it is done with (one failing with a `Retryable` error is not done: it is
    retried in place, and a retry in place that never ends loses the partitions after MEMFLOW_MAX_BATCH_S)."""

    def run(items: Sequence[M]) -> list[Outcome]:
        outcomes: list[Outcome] = []
        for i, item in enumerate(items):
            try:
                confirmed = _confirmed(i)
            except redis.RedisError as exc:  # cannot tell: left pending, retried once Redis answers
                outcomes.append(exc)
                continue
            if not confirmed:
                outcomes.append(LeaseLost("the partition's lease was lost before this entry was handled"))
                continue
            try:
                outcome: Outcome = handle(item)
            # A consumer loop must outlive any one bad message: the error is kept and the
            # message retried, then dead-lettered, never swallowed.
            except Exception as exc:  # noqa: BLE001
                outcome = exc
            outcomes.append(outcome)
            if not isinstance(outcome, Retryable):
                progress()
        return outcomes

    return run


@dataclass(frozen=True)
class _Turn:
    """The batch a consumer loop has handed its handler: the partition of each message, by index."""

    leases: Leases
    partitions: Sequence[int]


# The batch in hand on this thread, while its handler runs (`handing`, in StreamConsumer._outcomes).
_TURN: ContextVar[_Turn | None] = ContextVar("memflow_stream_turn", default=None)


@contextmanager
def handing(leases: Leases, partitions: Sequence[int]) -> Iterator[None]:
    """The consumer loop hands its handler a batch whose message `i` is of partition `partitions[i]`: meanwhile
    `progress` and `per_item`'s confirmations on this thread act on `leases`."""
    turn = _TURN.set(_Turn(leases, partitions))
    try:
        yield
    finally:
        _TURN.reset(turn)


def progress() -> None:
    """From inside a batch handler: the batch moves on (a message done), so its consumer keeps its partitions
    for another MEMFLOW_MAX_BATCH_S (Temporal's activity heartbeat). A handler whose one batch makes many
    slow calls says so after each; outside a consumer loop, nothing."""
    turn = _TURN.get()
    if turn is not None:
        turn.leases.progress()


def _confirmed(index: int) -> bool:
    """Is the lease of the partition of message `index` of the batch in hand still ours (True outside a loop)?"""
    turn = _TURN.get()
    return turn is None or turn.leases.confirm(turn.partitions[index])
