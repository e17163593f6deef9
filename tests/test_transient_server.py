"""The embedded mode runs two servers: the durable one (every acknowledged write fsynced) and a transient one for
the RPC queues and what a search writes, so that a search never waits for the disk (issue 42;
docs/architecture.md "Which writes are durable")."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import redis

from memflow.shared.inference.embedder import Embedder
from memflow.shared.monitoring.status import recent_traces
from memflow.shared.redisdb.connections import connect_queue, running
from memflow.shared.settings import Settings
from memflow.workers.embedded import embedded
from memflow.workers.process import own_redis

T0 = datetime(2026, 3, 1, 9, tzinfo=UTC)
# What a search writes, by key: RQ's job, registries and result; the traces feed and a subject's index of it; the
# latency histogram; the subject's utilisation counters.
SEARCH_WRITES = ("rq:*", "*traces*", "*search-latency*", "*util:*")


def own(settings: Settings, data_dir: Path) -> Settings:
    """The settings of a deployment with no Redis named: the embedded default starts its own."""
    return settings.replace(redis_url=None, redis_queue_url=None, data_dir=data_dir)


def written(client: redis.Redis) -> set[str]:
    return {k.decode() for pattern in SEARCH_WRITES for k in client.scan_iter(match=pattern, count=1000)}


def said(subject: str, event_id: str, text: str) -> dict[str, Any]:
    return {"event_id": event_id, "subject": subject, "session_id": "s1", "kind": "message", "role": "user",
            "text": text, "ts": T0}


def test_a_search_writes_to_the_transient_server_and_nothing_to_the_durable_one(settings: Settings, embedder: Embedder,
                                                                               tmp_path: Path) -> None:
    with embedded(own(settings, tmp_path), light_in_process=True, embedder=embedder) as system:
        durable, transient = system.ctx.client, system.ctx.transient
        assert durable.config_get("appendfsync")["appendfsync"] == "always"  # acknowledged means fsynced, still
        assert transient.config_get("appendonly")["appendonly"] == "no"  # and this one never touches the disk
        system.client.publish(said("ann", "e1", "I keep my spare key under the blue flowerpot."))
        assert system.client.wait_idle(timeout_s=120)
        found = system.client.search("ann", "where is the spare key?", k=3, now=T0)
        assert found.status == "ok" and found.hits

        assert written(durable) == set()  # protection off (one server for both), this lists every key below
        assert {k for k in written(transient) if k.startswith("rq:")}
        assert system.ctx.keys.traces in written(transient) and system.ctx.keys.search_latency in written(transient)
        assert [t.subject for t in recent_traces(system.client.queue_redis, system.ctx.keys, "ann", 5)] == ["ann"]


def test_a_command_beside_a_running_memflow_finds_both_servers_and_nothing_transient_reaches_the_disk(
        settings: Settings, tmp_path: Path) -> None:
    mine = own(settings, tmp_path)
    with own_redis(mine) as started:
        record = running(tmp_path)
        assert record is not None and record.queue_url == started.redis.queue_url != started.redis.url
        beside = connect_queue(mine)  # what `memflow status` or `traces tail` run from the same data dir reach
        assert beside.connection_pool.connection_kwargs["port"] == urlsplit(started.redis.queue_url or "").port
        beside.xadd(mine.keys.traces, {"m": b"{}"})
    assert running(tmp_path) is None  # the record goes with the process
    assert [p.name for p in (tmp_path / "queue").iterdir() if p.name != "redis.log"] == []  # no AOF, no snapshot

    with own_redis(mine) as again:  # the same data dir: the transient server starts empty
        assert connect_queue(again).xlen(mine.keys.traces) == 0
