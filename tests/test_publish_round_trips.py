"""A publish is one round trip (issue 42: publish p99 within 2× a bare durable XADD): the fates, pending entries,
their bounds and the XADDs in one script (shared/unstored/published.py), then the wait for the disk, in one pipeline.

Counted as the server sees them (MONITOR): the client's own commands, not the script's. No stages run here, so the
subject stays at its bounds and every publish is one that has to trim."""

from __future__ import annotations

import random
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from typing import Any

import pytest
import redis

from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings
from memflow.shared.unstored import fates

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def said(subject: str, n: int, at: datetime = T0) -> dict[str, Any]:
    return {"event_id": f"{subject}-{n}", "subject": subject, "session_id": "s1", "kind": "message", "role": "user",
            "text": f"Remember: shelf {n} holds the blue box.", "ts": at}


@pytest.fixture
def sdk(settings: Settings, monkeypatch: pytest.MonkeyPatch) -> Iterator[MemoryClient]:
    monkeypatch.setattr(fates, "PER_SUBJECT", 5)  # both hashes at their bounds after a few publishes
    yield MemoryClient(settings.replace(pending_per_subject=3))


def client_commands(sdk: MemoryClient, act: Any) -> list[str]:
    """The commands the server got from clients (not from scripts) while `act` ran, in order, lower case."""
    url = sdk.settings.redis.url or ""
    marker = f"done-{id(act)}"
    watcher, ender = redis.Redis.from_url(url), redis.Redis.from_url(url)
    ender.ping()  # connected before: its handshake is not counted
    seen: list[str] = []
    with watcher.monitor() as monitor:  # type: ignore[no-untyped-call]  # untyped in redis-py 8
        act()
        ender.echo(marker)
        for command in monitor.listen():
            if marker in command["command"]:
                break
            if command.get("client_type") != "lua":
                seen.append(command["command"].split(" ", 1)[0].lower())
    return seen


def test_a_publish_at_its_bounds_is_one_script_and_the_wait_for_the_disk(sdk: MemoryClient) -> None:
    for n in range(8):  # past both bounds; the first also loads the script
        sdk.publish(said("ann", n, T0 + timedelta(seconds=n)))
    sent = client_commands(sdk, lambda: sdk.publish(said("ann", 8, T0 + timedelta(seconds=8))))
    assert sent == ["evalsha", "waitaof"], sent  # one pipeline: no trim after it, no SCRIPT EXISTS before it
    assert sorted(sdk.redis.hkeys(sdk.keys.pending("ann"))) == [b"ann-6", b"ann-7", b"ann-8"]
    assert int(fates.PER_SUBJECT * fates.TRIM_TO) <= sdk.redis.hlen(sdk.keys.fates("ann")) <= fates.PER_SUBJECT
    assert sdk.event_fate("ann", "ann-8").state.value == "accepted"


def test_a_batch_over_partitions_is_one_round_trip_too(sdk: MemoryClient) -> None:
    subjects = [f"s{i}" for i in range(12)]
    sdk.publish(said("warm", 0))
    sent = client_commands(sdk, lambda: sdk.publish_many([said(s, 0) for s in subjects]))
    parts = len({sdk.keys.partition(s) for s in subjects})
    assert sent == ["evalsha"] * parts + ["waitaof"], sent
    assert all(sdk.redis.hexists(sdk.keys.pending(s), f"{s}-0") for s in subjects)


def test_the_oldest_entries_go_first_by_their_instant_whatever_the_offset(sdk: MemoryClient) -> None:
    """The script reads a turn's time as an instant: an offset, or a fraction of a second, changes nothing."""
    later = timezone(timedelta(hours=5, minutes=30))
    times = [T0 + timedelta(seconds=3),                                    # b0: 3rd
             (T0 + timedelta(seconds=1)).astimezone(later),                # b1: 1st (another offset, same instant)
             T0 + timedelta(seconds=4, microseconds=500),                  # b2: 5th
             T0 + timedelta(seconds=2, microseconds=250_000),              # b3: 2nd
             (T0 + timedelta(seconds=4)).astimezone(timezone(-timedelta(hours=8)))]  # b4: 4th
    for n, at in enumerate(times):
        sdk.publish({**said("bo", n, at), "event_id": f"b{n}"})
    assert sorted(sdk.redis.hkeys(sdk.keys.pending("bo"))) == [b"b0", b"b2", b"b4"]  # the three latest


def test_a_partition_keeps_its_share_of_the_subjects_with_entries(settings: Settings) -> None:
    sdk = MemoryClient(settings.replace(pending_subjects=2 * settings.keys.partitions))
    partition = sdk.keys.partition("q0")
    same = [s for s in (f"q{i}" for i in range(400)) if sdk.keys.partition(s) == partition][:4]
    for n, subject in enumerate(same):
        sdk.publish(said(subject, n))
        time.sleep(0.002)  # each its own millisecond: the order they published in is the order they go in
    held = [s for s in same if sdk.redis.exists(sdk.keys.pending(s))]
    assert held == same[2:]  # the two that published longest ago went
    assert sdk.redis.zcard(sdk.keys.pending_subjects(partition)) == 2


def test_a_server_that_lost_the_script_is_sent_it_and_the_publish_is_written_once(sdk: MemoryClient) -> None:
    sdk.publish(said("cy", 0))
    sdk.redis.script_flush()  # what a restart or a promoted replica looks like to the client
    stream = sdk.keys.work("events", "cy")
    before = sdk.redis.xlen(stream)
    sdk.publish_many([said("cy", 1), said("cy", 2)])
    assert sdk.redis.xlen(stream) == before + 2
    assert sdk.event_fate("cy", "cy-2").state.value == "accepted"


def test_the_script_keeps_the_entries_python_would_keep(settings: Settings) -> None:
    """Times in any offset, with and without fractions, published in no order, some at the same instant: the
    newest `per_subject` by (instant, event id), as sorting the decoded entries in Python keeps them."""
    rng = random.Random(42)
    sdk = MemoryClient(settings.replace(pending_per_subject=15))
    offsets = [timezone.utc, timezone(timedelta(hours=5, minutes=30)), timezone(-timedelta(hours=8)),
               timezone(timedelta(hours=14)), timezone(-timedelta(hours=3, minutes=45))]
    published: list[tuple[datetime, str]] = []
    for n in range(40):
        at = T0 + timedelta(days=rng.randint(-400, 400), seconds=rng.randint(0, 86_399),
                            microseconds=rng.choice([0, 0, 1, 500_000, rng.randint(0, 999_999)]))
        at = published[rng.randrange(len(published))][0] if published and rng.random() < 0.15 else at
        event_id = f"r{rng.randint(0, 10**6):07d}-{n}"
        published.append((at, event_id))
        sdk.publish({**said("dee", n, at.astimezone(rng.choice(offsets))), "event_id": event_id})
    newest = sorted(published)[-15:]
    assert sorted(sdk.redis.hkeys(sdk.keys.pending("dee"))) == sorted(e.encode() for _, e in newest)
