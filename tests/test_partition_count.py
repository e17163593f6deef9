"""The partition count is the deployment's, recorded in Redis (issue 29, item 6): a consumer or a publisher
started with another count is refused with a clear error, and the count changes only drained, through
`memflow partitions set`."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import redis

from memflow.pipeline.models import Wire
from memflow.shared.codec import encode
from memflow.shared.redisdb.keys import FIELD, Keys, PartitionCountMismatch, recorded_partitions
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings
from memflow.shared.streaming.backlog import PartitionChangeRefused, change_partitions
from memflow.shared.streaming.consumer import ConsumerConfig, StreamConsumer
from memflow.shared.streaming.handlers import Emit

LEASE_MS = 3000


class Say(Wire):
    subject: str
    n: int


def consumer(client: redis.Redis, settings: Settings, partitions: int, name: str) -> StreamConsumer[Say]:
    def handle(items: Sequence[Say]) -> list[list[Emit]]:
        return [[] for _ in items]

    keys = Keys(settings.redis.stream_prefix, partitions)
    return StreamConsumer(client, keys, "extract", Say, handle, ConsumerConfig(block_ms=10, lease_ms=LEASE_MS),
                          name=name)


def event(subject: str) -> dict[str, object]:
    return {"event_id": f"e-{subject}", "subject": subject, "session_id": "s", "kind": "message", "role": "user",
            "text": "I moved to Lisbon last spring.", "ts": "2025-01-01T10:00:00Z"}


def test_a_consumer_with_another_partition_count_is_refused(client: redis.Redis, settings: Settings) -> None:
    consumer(client, settings, 4, "first").ensure_group()
    assert recorded_partitions(client, settings.keys) == 4, "the first start records its count"
    with pytest.raises(PartitionCountMismatch) as refused:
        consumer(client, settings, 8, "second").ensure_group()
    message = str(refused.value)
    assert "MEMFLOW_PARTITIONS is 8" in message and "split into 4 partitions" in message
    assert "memflow partitions set 8" in message and "drain" in message
    consumer(client, settings, 4, "third").ensure_group()  # the recorded count starts as before


def test_a_publisher_with_another_partition_count_is_refused(client: redis.Redis, settings: Settings) -> None:
    consumer(client, settings, 4, "first").ensure_group()
    with pytest.raises(PartitionCountMismatch, match="MEMFLOW_PARTITIONS is 8"):
        MemoryClient(settings.replace(partitions=8)).publish(event("alice"))
    assert all(client.xlen(k) == 0 for k in Keys(settings.redis.stream_prefix, 8).inputs_of("trigger")), \
        "published on the wrong count"
    MemoryClient(settings.replace(partitions=4)).publish(event("alice"))


def test_the_count_changes_only_drained(client: redis.Redis, settings: Settings) -> None:
    four, eight = Keys(settings.redis.stream_prefix, 4), Keys(settings.redis.stream_prefix, 8)
    first = consumer(client, settings, 4, "first")
    first.ensure_group()
    client.xadd(four.work("extract", "alice"), {FIELD: encode(Say(subject="alice", n=1))})
    with pytest.raises(PartitionChangeRefused, match="extract: 1 unread"):
        change_partitions(client, eight, 8, LEASE_MS)
    first.step()  # drained: read and settled
    first.leases.refresh(force=True)
    with pytest.raises(PartitionChangeRefused, match="extract: 1 consumers running"):
        change_partitions(client, eight, 8, LEASE_MS)
    first.leases.release_all()  # the worker stopped
    assert change_partitions(client, eight, 8, LEASE_MS) == 4
    consumer(client, settings, 8, "after").ensure_group()
    with pytest.raises(PartitionCountMismatch, match="MEMFLOW_PARTITIONS is 4 but .* split into 8"):
        consumer(client, settings, 4, "stale").ensure_group()


def test_memflow_partitions_set(client: redis.Redis, settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    from typer.testing import CliRunner

    from memflow.shared.settings import get_settings
    from memflow.workers.cli import app

    monkeypatch.setenv("MEMFLOW_REDIS_URL", settings.redis.url or "")
    monkeypatch.setenv("MEMFLOW_STREAM_PREFIX", settings.redis.stream_prefix)

    def memflow(*args: str) -> tuple[int, str]:
        get_settings.cache_clear()
        try:
            result = CliRunner().invoke(app, list(args))
        finally:
            get_settings.cache_clear()
        return result.exit_code, result.output

    four = Keys(settings.redis.stream_prefix, 4)
    consumer(client, settings, 4, "first").ensure_group()
    client.xadd(four.work("extract", "alice"), {FIELD: encode(Say(subject="alice", n=1))})
    code, said = memflow("partitions", "set", "8")
    assert code != 0 and "not drained" in said and "extract: 1 unread" in said, said
    client.delete(four.work("extract", "alice"))
    assert memflow("partitions", "set", "8") == (0, "partitions: 4 -> 8; start every process with "
                                                    "MEMFLOW_PARTITIONS=8\n")
    assert memflow("partitions", "show")[1] == "recorded: 8; MEMFLOW_PARTITIONS: 4\n"
