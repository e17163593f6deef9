"""What the work streams hold as a whole: each stage's backlog (`memflow status`, `wait_idle`), the trimming of
their acknowledged past (the consumer loop calls it, shared/streaming/consumer.py), and the partition count, which
changes only while they hold nothing (`memflow partitions set`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import redis

from memflow.shared.errors import MemflowError
from memflow.shared.redisdb.keys import STAGES, Keys, recorded_partitions, swap_partitions
from memflow.shared.streaming.leases import live_consumers
from memflow.shared.unstored import fates


def backlog(client: redis.Redis, keys: Keys, stages: Sequence[str]) -> dict[str, tuple[int, int]]:
    """(entries not yet read, entries read but not acknowledged) for each stage's group, summed over
    the partitions.

    Each partition is one snapshot of all its stages, read in one MULTI (its keys share a slot).
    An entry moves from one stage to the next in one script (XADD downstream + XACK, `_settle`),
    and not only forwards: upsert sends a batch built on a stale state back to resolve. Read one
    stage after another, a hand-over landing between two reads is counted by neither: resolve read
    idle, upsert sends a candidate back, upsert reads idle, and `wait_idle` returned while a
    correction was still to be written (the "lost" same-key correction). In one transaction every
    entry is counted where it is. Partitions need no common snapshot: an entry never leaves its
    subject's partition.
    """
    totals = {stage: (0, 0) for stage in stages}
    for partition in range(keys.partitions):
        pipe = client.pipeline(transaction=True)
        for stage in stages:
            pipe.xinfo_stream(keys.input_of(stage, partition))
            pipe.xinfo_groups(keys.input_of(stage, partition))
        # A stream nobody has written to yet answers "no such key": that stage has nothing to do.
        replies = pipe.execute(raise_on_error=False)
        for stage, info, groups in zip(stages, replies[0::2], replies[1::2], strict=True):
            lag, pending = _stage_backlog(keys.group(stage), info, groups)
            totals[stage] = (totals[stage][0] + lag, totals[stage][1] + pending)
    return totals


def _stage_backlog(group_name: str, info: Any, groups: Any) -> tuple[int, int]:
    if isinstance(info, redis.ResponseError):
        return 0, 0
    # A cluster client's MULTI hands back raw replies: bytes keys, a group as a flat [name, value, ...] list.
    info = _fields(info)
    groups = [_fields(g) for g in groups]
    if not info["length"]:
        return 0, 0
    group = next((g for g in groups if _text(g["name"]) == group_name), None)
    if group is None:
        return int(info["length"]), 0
    lag = group.get("lag")
    if lag is None:  # Redis cannot count it (entries were deleted): compare ids instead
        lag = 0 if _text(group["last-delivered-id"]) == _text(info["last-generated-id"]) else 1
    return int(lag), int(group["pending"])


def _fields(reply: Any) -> dict[str, Any]:
    pairs = reply.items() if isinstance(reply, dict) else zip(reply[0::2], reply[1::2], strict=True)
    return {_text(k): v for k, v in pairs}


def trim_acknowledged(client: redis.Redis, stream: str, retention_ms: int) -> int:
    """Trim the entries of `stream` that every group has read and acknowledged and that are older than
    `retention_ms` (by the server's clock); never one that is unread or pending. Returns how many went.

    The bound is the slowest group's position: the smaller of its last delivered id and its oldest
    pending one. Both only move forwards (a new entry is delivered after the last one, a reclaimed one
    was pending already), so a bound read here is still safe when XTRIM runs.
    """
    try:
        groups: Any = client.xinfo_groups(stream)
    except redis.ResponseError:  # no such stream yet
        return 0
    if not groups:
        return 0  # nobody reads it yet: everything is unread
    bound = _server_now_id(client, retention_ms)
    for group in groups:
        bound = min(bound, _id(group["last-delivered-id"]))
        if int(group["pending"]):
            oldest: Any = client.xpending(stream, _text(group["name"]))
            bound = min(bound, _id(oldest["min"]))
    # LIMIT 0: no cap. An approximate trim removes at most 100 nodes' worth of entries a call by default, and the
    # servers memflow starts keep one entry a node (shared/redisdb/server.py DURABLE): 100 entries a call, fewer
    # than a busy partition gains between two trims.
    return int(client.xtrim(stream, minid=f"{bound[0]}-{bound[1]}", approximate=True, limit=0))


def _server_now_id(client: redis.Redis, retention_ms: int) -> tuple[int, int]:
    seconds, micros = client.time()
    return int(seconds) * 1000 + int(micros) // 1000 - retention_ms, 0


def _id(value: bytes | str) -> tuple[int, int]:
    ms, _, seq = _text(value).partition("-")
    return int(ms), int(seq or 0)


def _text(value: bytes | str) -> str:
    return value.decode() if isinstance(value, bytes) else value


class PartitionChangeRefused(MemflowError):
    """`memflow partitions set` while the pipeline holds work, dead letters or live consumers."""


def change_partitions(client: redis.Redis, keys: Keys, count: int, lease_ms: int) -> int | None:
    """Record `count` as the deployment's partition count (`memflow partitions set`); the count it replaces.

    Only drained: a subject's partition depends on the count, so an entry in flight (unread or pending in any
    stage), a dead letter (replayed to the partition it came from) or a consumer still running on the old count
    would carry a subject's work through two partitions, or leave it in one no one owns. The checks read the
    partitions of the recorded count; the record changes only if it is still that count.
    """
    if not 1 <= count <= 1024:
        raise PartitionChangeRefused(f"a partition count is between 1 and 1024, not {count}")
    recorded = recorded_partitions(client, keys)
    old = Keys(keys.prefix, recorded or keys.partitions)
    busy = {stage: f"{lag} unread, {unacked} pending"
            for stage, (lag, unacked) in backlog(client, old, STAGES).items() if lag or unacked}
    dead = {stage: n for stage in STAGES if (n := sum(int(client.xlen(s)) for s in old.dlqs(stage)))}
    live = {stage: n for stage in STAGES if (n := live_consumers(client, old, stage, lease_ms))}
    why = [*(f"{stage}: {what}" for stage, what in busy.items()),
           *(f"{stage}: {n} dead letters (replay or drop them first)" for stage, n in dead.items()),
           *(f"{stage}: {n} consumers running (stop every worker first)" for stage, n in live.items())]
    if why:
        raise PartitionChangeRefused(f"cannot change the partition count from {old.partitions} to {count} while "
                                     f"the pipeline is not drained: {'; '.join(why)}")
    if not swap_partitions(client, keys, recorded, count):
        raise PartitionChangeRefused(f"the partition count changed meanwhile (from {recorded}): check again")
    fates.move(client, old, Keys(keys.prefix, count))  # each event's fate, still found under the new count
    return recorded
