"""No secret reaches the disk or a replica, and forget --contains takes a raw copy off both (issue 43 item 4).

tests/test_forgetting.py reads the keys; here the proof reads what a key scan cannot see: the AOF files on the
master's disk and on a replica's, and the replica's own keys. Own servers (a master and its replica, each with
its AOF), on a directory of the test's."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest
import redis

from memflow.pipeline.models import ChatEvent, Kind, Role
from memflow.shared.codec import encode
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.connections import connect
from memflow.shared.redisdb.keys import FIELD
from memflow.shared.redisdb.server import RedisServer, start_redis
from memflow.shared.settings import Settings
from tests.conftest import System, start_system, wait_for
from tests.test_forgetting import SECRETS, T0, TURN

# A rewritten AOF starts with an RDB image whose values are LZF-compressed: a secret still in it would be missed by a
# search of the bytes (the flagged bytes of an XDEL'ed entry were, with 100 entries a node). Uncompressed, the file
# says what it holds; the compression hides nothing from whoever reads the file with the server's own loader.
READABLE = ("--rdbcompression", "no")


@pytest.fixture
def replicated(settings: Settings, embedder: Embedder, tmp_path: Path) -> Iterator[tuple[System, redis.Redis]]:
    """A system on a master of its own with a replica, and its queues on a transient server, as the embedded mode
    runs them (an RPC job carries the words `forget --contains` looks for); and a connection to the replica."""
    servers: list[RedisServer] = [start_redis(tmp_path / "master", binary=settings.redis.server, extra_args=READABLE)]
    port = servers[0].url.rsplit(":", 1)[1].split("/")[0]
    servers.append(start_redis(tmp_path / "replica", binary=settings.redis.server,
                               extra_args=(*READABLE, "--replicaof", "127.0.0.1", port)))
    servers.append(start_redis(tmp_path / "queue", binary=settings.redis.server, durable=False))
    replica = connect(servers[1].url)
    wait_for(lambda: replica.info("replication").get("master_link_status") == "up", 30, "the replica's link")
    system = start_system(settings.replace(redis_url=servers[0].url, redis_queue_url=servers[2].url), embedder)
    try:
        yield system, replica
    finally:
        system.shutdown()
        for server in reversed(servers):
            server.stop()


def aof_bytes(client: redis.Redis) -> bytes:
    """Every file of the server's AOF (its base and increments), as on disk now."""
    folder = Path(client.config_get("dir")["dir"]) / client.config_get("appenddirname")["appenddirname"]
    return b"".join(path.read_bytes() for path in sorted(folder.iterdir()) if path.is_file())


def values(client: redis.Redis, prefix: str) -> bytes:
    """Every value of every key under `prefix`, as one blob (streams, hashes, strings)."""
    blob = []
    for key in client.scan_iter(match=prefix + "*"):
        kind = client.type(key).decode()
        if kind == "stream":
            blob += [v for _, fields in client.xrange(key) for v in fields.values()]
        elif kind == "hash":
            blob += list(client.hgetall(key).values())
        elif kind == "string":
            blob.append(client.get(key) or b"")
    return b" ".join(blob)


def caught_up(master: redis.Redis) -> None:
    assert master.wait(1, 10_000) == 1, "the replica did not catch up"


def rewritten(client: redis.Redis) -> bool:
    info: dict[str, Any] = client.info("persistence")
    return not (int(info["aof_rewrite_in_progress"]) or int(info["aof_rewrite_scheduled"]))


def test_a_published_secret_is_on_no_disk_and_in_no_replica(replicated: tuple[System, redis.Redis]) -> None:
    system, replica = replicated
    master, prefix = system.ctx.client, system.ctx.keys.prefix
    system.client.publish({"event_id": "kim-e1", "subject": "kim", "session_id": "s1", "kind": "message",
                           "role": "user", "text": TURN, "ts": T0})
    system.client.publish({"event_id": "kim-end", "subject": "kim", "session_id": "s1", "kind": "session_end",
                           "ts": T0 + timedelta(minutes=5)})
    assert system.client.wait_idle(timeout_s=60)
    caught_up(master)
    assert b"invoices by e-mail" in aof_bytes(master) and b"invoices by e-mail" in aof_bytes(replica)  # it looked
    for secret in SECRETS:
        where = {"master's AOF": aof_bytes(master), "replica's AOF": aof_bytes(replica),
                 "replica's keys": values(replica, prefix)}
        assert [place for place, blob in where.items() if secret.encode() in blob] == [], secret


def test_forget_contains_takes_a_raw_copy_off_the_master_and_the_replica_disk(
        replicated: tuple[System, redis.Redis]) -> None:
    """A raw copy written around publish (an older client, a direct XADD) reached both AOFs; before, the rewrite ran
    on the master alone and the replica's AOF kept the XADD."""
    system, replica = replicated
    master, keys = system.ctx.client, system.ctx.keys
    secret = "sk-live-9fQ2xW7mZ4kP1vB8nR3tY6cJ"
    event = ChatEvent(event_id="max-e1", subject="max", session_id="s1", kind=Kind.message, role=Role.user,
                      text=f"my deploy key is {secret}, keep the staging box up", ts=T0)
    master.xadd(keys.work("events", "max"), {FIELD: encode(event)})
    # Another subject's event right after it in the same stream, kept by forget: a stream node holding more than one
    # entry would keep the scrubbed entry's bytes beside it (only flagged), in memory and in every rewrite.
    neighbour = next(f"ann-{i}" for i in range(1000) if keys.work("events", f"ann-{i}") == keys.work("events", "max"))
    for subject in (neighbour, "max"):
        system.client.publish({"event_id": f"{subject}-end", "subject": subject, "session_id": "s1",
                               "kind": "session_end", "ts": T0 + timedelta(minutes=5)})
    assert system.client.wait_idle(timeout_s=60)
    caught_up(master)
    assert secret.encode() in aof_bytes(master) and secret.encode() in aof_bytes(replica)  # the copies to take off

    report = system.client.forget_report("max", contains=secret)
    assert report.scrubbed
    caught_up(master)
    wait_for(lambda: rewritten(master) and rewritten(replica), 60, "the AOF rewrites")
    assert secret.encode() not in values(replica, keys.prefix)
    assert master.xlen(keys.work("events", "max")) >= 1, "the neighbour's entry was kept"
    assert secret.encode() not in aof_bytes(master), "the master's AOF"
    assert secret.encode() not in aof_bytes(replica), "the replica's AOF"
