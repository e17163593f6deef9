"""An upgrade from the unpartitioned layout: the work not yet done, the dead letters, the feed and the keys
move into the partitioned one; what was done stays behind; nothing moves twice."""

from __future__ import annotations

from datetime import UTC, datetime

import orjson
import redis

from memflow.pipeline.models import ChatEvent
from memflow.shared.codec import encode
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.keys import FIELD, Keys
from memflow.shared.redisdb.migrate import migrate_unpartitioned
from memflow.shared.settings import Settings
from tests.conftest import start_system

T0 = datetime(2026, 3, 2, 9, tzinfo=UTC)


def said(subject: str, event_id: str, text: str) -> bytes:
    return encode(ChatEvent(event_id=event_id, subject=subject, session_id="s1", kind="message", role="user",
                            text=text, ts=T0))


def old_layout(client: redis.Redis, keys: Keys) -> None:
    """What a deployment before partitions leaves: events read and acknowledged, read and pending, unread."""
    events = f"{keys.prefix}events"
    client.xgroup_create(events, "trigger", id="0", mkstream=True)
    done = client.xadd(events, {FIELD: said("ann", "e1", "Remember: my locker is 12.")})
    client.xadd(events, {FIELD: said("bob", "e2", "Remember: the staging database is called kestrel-7.")})
    client.xreadgroup("trigger", "old-consumer", {events: ">"})
    client.xack(events, "trigger", done)
    client.xadd(events, {FIELD: said("cy", "e3", "Remember: my favourite tea is genmaicha.")})
    client.xadd(f"{keys.prefix}dlq:trigger", {"payload": said("dee", "e4", "x"), "error": "boom", "attempts": 5,
                                             "source": events, "source_id": "1-0", "stage": "trigger"})
    client.xadd(f"{keys.prefix}changes", {FIELD: b'{"action": "add"}'})
    client.hset(f"{keys.prefix}apikeys", "k1", orjson.dumps({"id": "k1"}))
    client.set(f"{keys.prefix}apikey:abc123", orjson.dumps({"id": "k1"}))


def test_the_work_not_done_moves_to_its_partitions_and_the_rest_is_renamed_once(
        client: redis.Redis, keys: Keys) -> None:
    old_layout(client, keys)
    moved = migrate_unpartitioned(client, keys)
    assert moved == {"work:trigger": 2, "dlq:trigger": 1, "keys": 3}
    payloads = {s: [orjson.loads(f[FIELD.encode()])["event_id"] for _, f in client.xrange(keys.work("events", s))]
                for s in ("ann", "bob", "cy")}
    assert payloads["bob"].count("e2") == 1 and payloads["cy"].count("e3") == 1
    assert "e1" not in payloads["ann"], "an acknowledged event was moved: it would be done twice"
    [(_, letter)] = client.xrange(keys.dlq("trigger", keys.partition("dee")))
    assert letter[b"error"] == b"boom" and letter[b"source"] == keys.input_of("trigger", keys.partition("dee")).encode()
    assert client.xlen(keys.changes) == 1 and client.hexists(keys.api_keys, "k1")
    assert client.exists(keys.api_key_hash("abc123"))
    assert not client.exists(f"{keys.prefix}events", f"{keys.prefix}dlq:trigger", f"{keys.prefix}changes",
                             f"{keys.prefix}apikeys", f"{keys.prefix}apikey:abc123")
    assert migrate_unpartitioned(client, keys) == {}


def test_a_system_started_on_the_old_layout_does_the_work_it_left(settings: Settings, embedder: Embedder,
                                                                   client: redis.Redis, keys: Keys) -> None:
    old_layout(client, keys)
    system = start_system(settings, embedder)
    try:
        assert system.client.wait_idle(timeout_s=60)
        for subject, word in (("bob", "kestrel-7"), ("cy", "genmaicha")):
            found = system.client.search(subject, word, now=T0)
            assert any(word in hit.content for hit in found.hits), (subject, found)
    finally:
        system.shutdown()
