"""What an acknowledged publish survives on the deployment's Redis, read from the server itself.

Redis and Valkey write their AOF before they reply, but with `appendfsync everysec` they do not
always write it: while the background fsync of the previous second is still running (a busy disk),
they postpone the write for up to 2 s (aof.c, flushAppendOnlyFile) and reply all the same. A
`kill -9` of the server in that window loses writes it has acknowledged, and a crash of the machine
loses the last second even when they were written. So `publish` asks for the fsync itself:
`WAITAOF 1 0 <timeout>` on the connection that wrote the events (Redis >= 7.2, Valkey >= 7.2)
returns once the server's AOF holds them on disk. The server memflow starts runs with
`appendfsync always` (shared/redisdb/server.py): it fsyncs once per event-loop turn, before replying,
and the WAITAOF after it returns at once.

A server of the deployment's own may run without AOF, or be a Redis 7.0 (no WAITAOF): then an
acknowledgement promises less, and `durability` says what, for the warning at start and
`memflow status`.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

import redis
from redis.cluster import RedisCluster

from memflow.shared.redisdb.connections import server_version

log = logging.getLogger(__name__)
# Redis 7.2 added WAITAOF; Valkey forked from 7.2.4 and has it in every version memflow supports.
WAITAOF_SINCE = {"redis": (7, 2), "valkey": (7, 2)}


@dataclass(frozen=True)
class Durability:
    """The server's persistence, as far as it says. None: it would not say (a managed service hiding
    INFO or CONFIG)."""

    aof: bool | None
    appendfsync: str | None  # "always" | "everysec" | "no"
    waitaof: bool  # the server has the WAITAOF command

    def waits_for_fsync(self, wanted: bool) -> bool:
        """Whether a publish sends WAITAOF: `wanted` (MEMFLOW_REDIS_WAIT_AOF), and the server can answer it
        (AOF on: WAITAOF refuses numlocal 1 without one)."""
        return wanted and self.waitaof and self.aof is not False

    def promise(self, wanted: bool) -> str:
        """What an acknowledged publish survives, in one sentence."""
        if self.aof is False:
            return ("AOF is off on the server (appendonly no): an acknowledged publish lives in its memory only, "
                    "and a restart of the server loses it; run it with appendonly yes")
        if self.waits_for_fsync(wanted):
            return "an acknowledged publish is fsynced to the server's AOF (WAITAOF): it survives kill -9 and a crash"
        if self.appendfsync == "always":
            return "an acknowledged publish is fsynced to the server's AOF (appendfsync always)"
        why = ("MEMFLOW_REDIS_WAIT_AOF is off" if not wanted
               else "the server has no WAITAOF (Redis < 7.2)")
        return (f"an acknowledged publish is not waited on to reach the disk ({why}; appendfsync "
                f"{self.appendfsync or 'unknown'}): a kill -9 of the server under a busy disk, or a crash of the "
                "machine, can lose the last 2 s of them; run the server with appendfsync always")

    def is_weaker(self, wanted: bool) -> bool:
        """Whether the promise is less than 'fsynced before acknowledged' (docs/guarantees.md)."""
        return self.aof is False or not (self.waits_for_fsync(wanted) or self.appendfsync == "always")


def durability(client: redis.Redis | RedisCluster) -> Durability:
    """Read from the server (every primary of a cluster: the weakest answer)."""
    infos = _per_node(client, lambda node: node.info("persistence"))
    aof = None if infos is None else all(int(i.get("aof_enabled", 0)) for i in infos)
    configs = _per_node(client, lambda node: node.config_get("appendfsync"))
    policies = {str(c.get("appendfsync")) for c in configs} if configs else set()
    appendfsync = None if not policies else min(policies, key=["no", "everysec", "always"].index)
    servers = _per_node(client, lambda node: node.info("server"))
    # By version: redis-py cannot parse COMMAND INFO's answer for a command the server lacks ([nil]).
    waitaof = servers is not None and all(_has_waitaof(*server_version(i)) for i in servers)
    return Durability(aof, appendfsync, waitaof)


def _has_waitaof(name: str, version: tuple[int, ...]) -> bool:
    return version >= WAITAOF_SINCE[name]


def _per_node(client: redis.Redis | RedisCluster, ask: Any) -> list[dict[str, Any]] | None:
    """ask(node) on the server, or on each primary of a cluster; None when the server refuses it."""
    try:
        if isinstance(client, RedisCluster):
            return [ask(client.get_redis_connection(node)) for node in client.get_primaries()]  # type: ignore[no-untyped-call]
        return [ask(client)]
    except redis.ResponseError:  # a command renamed away or refused (a managed service)
        return None


_warned: set[str] = set()
# Per server (its URL), whether writes there can be waited on to reach the disk: asked once per process.
_waits: dict[str, bool] = {}


def fsync_timeout_ms(client: redis.Redis | RedisCluster, url: str, wanted: bool, timeout_ms: int) -> int | None:
    """WAITAOF's timeout for writes to the server at `url` (its password left out), or None when they cannot
    be waited on (MEMFLOW_REDIS_WAIT_AOF off, no AOF, no WAITAOF: warned about once)."""
    if url not in _waits:
        _waits[url] = warn_if_weaker(client, wanted, url).waits_for_fsync(wanted)
    return timeout_ms if _waits[url] else None


def warn_if_weaker(client: redis.Redis | RedisCluster, wanted: bool, where: str) -> Durability:
    """The server's durability; logged as a warning, once per server and process, when an acknowledged
    publish survives less than docs/guarantees.md promises."""
    found = durability(client)
    if found.is_weaker(wanted) and where not in _warned:
        _warned.add(where)
        log.warning("Redis at %s: %s", where, found.promise(wanted))
    return found
