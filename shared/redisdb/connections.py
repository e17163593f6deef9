"""Redis connections, configured once for how memflow uses them, to a server new enough for it — one server,
or a Redis/Valkey cluster (MEMFLOW_REDIS_CLUSTER) — and writes acknowledged only once replicas hold them."""

from __future__ import annotations

import logging
import os
import re
import socket
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TypeAlias, cast, overload

import orjson
import redis
import redis.asyncio
from redis.client import Pipeline
from redis.cluster import RedisCluster

from memflow.shared.errors import MemflowError
from memflow.shared.settings import Settings

log = logging.getLogger(__name__)

# The oldest servers whose streams do what memflow relies on: XINFO GROUPS reports `entries-read`
# and `lag` (the status read rates, the tests' progress probes) and XAUTOCLAIM replies with the ids
# deleted meanwhile — all Redis 7.0. Every Valkey release (7.2 on) reports itself as Redis 7.2.4.
MIN_VERSION = {"redis": (7, 0), "valkey": (7, 2)}
SUPPORTED = "Redis ≥ 7.0 or Valkey ≥ 7.2"

# Where `memflow up` records the Redis it started, so that a command run beside it (another
# terminal, same directory) finds it without MEMFLOW_REDIS_URL.
RUNNING_FILE = "running.json"


# What `connect` returns: one server's client, or a cluster's (same commands, keys routed by slot).
Client: TypeAlias = redis.Redis | RedisCluster


class ServerTooOld(MemflowError):
    pass


class NotReplicated(MemflowError):
    """Fewer replicas than asked hold a write when its WAIT timed out: were its master to die now, the write
    could be lost. It is applied on the master all the same (nothing is undone): repeat only what is safe to."""


class NotDurable(MemflowError):
    """The server's AOF did not hold a write on disk when its WAITAOF timed out: were the server killed now,
    the write could be lost. It is applied all the same (nothing is undone): repeat only what is safe to."""


# A server answers a BLOCK that ran out within milliseconds: past the longest blocking read by this
# much, a socket that has heard nothing is talking to a server that stopped answering (a half-open
# connection, a paused or wedged server), and the read raises instead of holding the stage forever.
READ_MARGIN_S = 10.0
# The query worker's dequeue: RQ blocks at most 1 s (workers/rq_adapter.DEQUEUE_WAIT_S: 0.25 s), and
# raises the socket timeout of the pool it is given to that + 10 s when it is lower. The stage
# connection starts at least there, so that RQ never changes a pool the stream stages share.
RQ_DEQUEUE_S = 1.0
# A peer that is gone (its host down, a NAT that forgot us) is noticed after 30 + 3 x 10 s of silence,
# instead of the kernel's default two hours. A server that is up but silent is the socket timeout's.
KEEPALIVE_S = {"TCP_KEEPIDLE": 30, "TCP_KEEPINTVL": 10, "TCP_KEEPCNT": 3}
# Before a command on a connection idle this long, a PING checks it is still there.
HEALTH_CHECK_S = 30
# The longest a client connection's own command asks the server to block: the RPC reply's wait is read in
# slices this long (shared/sdk/client.py), `memflow traces --follow` blocks 5 s. Its socket timeout is past it.
CLIENT_BLOCK_S = 5.0
# How long connecting may take, unless a caller says (MEMFLOW_CONNECT_TIMEOUT_S for the clients).
CONNECT_TIMEOUT_S = 5.0


@overload
def connect(url: str, *, socket_timeout_s: float | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S,
            cluster: Literal[False] = False) -> redis.Redis: ...
@overload
def connect(url: str, *, socket_timeout_s: float | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S,
            cluster: Literal[True]) -> RedisCluster: ...
@overload
def connect(url: str, *, socket_timeout_s: float | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S,
            cluster: bool) -> Client: ...


def connect(url: str, *, socket_timeout_s: float | None = None, connect_timeout_s: float = CONNECT_TIMEOUT_S,
            cluster: bool = False) -> Client:
    """A client to a server checked to be new enough, with TCP keepalive and a health check.

    `socket_timeout_s` must be longer than any blocking command the client sends (a stage's
    XREADGROUP BLOCK, RQ's BLMOVE): `stage_socket_timeout_s` for a stage's connection,
    `client_socket_timeout_s` for a client's (connect_streams and connect_queue give it by default).
    With it, a read that hears nothing raises redis.TimeoutError (not retried). None: no socket
    timeout (tests' own connections); keepalive still notices a peer that is gone.

    `cluster`: `url` names any node of a cluster, and the client (a RedisCluster) finds the others and
    sends each command to the node that owns its keys' slot; every node's version is checked. Unlike
    the single server's, it connects at once: it raises here when no node answers.
    """
    options: dict[str, Any] = dict(socket_timeout=socket_timeout_s, socket_connect_timeout=connect_timeout_s,
                                   socket_keepalive=True, socket_keepalive_options=_keepalive_options(),
                                   health_check_interval=HEALTH_CHECK_S)
    client: Client = RedisCluster.from_url(url, **options) if cluster else redis.Redis.from_url(url, **options)
    if url not in _checked:
        _check_version(client, url)
    return client


def connect_async(url: str, *, socket_timeout_s: float, max_connections: int,
                  connect_timeout_s: float = CONNECT_TIMEOUT_S, cluster: bool = False) -> redis.asyncio.Redis:
    """An asyncio client with `connect`'s options, for a front door's per-request reads on its event loop
    (the server's version is checked by the sync client every process also makes); a cluster's client
    when `cluster` (typed as one server's: its reads name one key each). `socket_timeout_s`: past its
    longest blocking read (`client_socket_timeout_s` for reads in CLIENT_BLOCK_S slices).

    At most `max_connections` (per node): a blocking read holds one for its whole wait, and the pool's
    default (100) would refuse the 101st waiting request. One more waits for a connection to free, as
    long as connecting may take."""
    options: dict[str, Any] = {"socket_timeout": socket_timeout_s, "socket_connect_timeout": connect_timeout_s,
                               "socket_keepalive": True, "socket_keepalive_options": _keepalive_options()}
    if cluster:
        return cast(redis.asyncio.Redis, redis.asyncio.RedisCluster.from_url(url, max_connections=max_connections,
                                                                             **options))
    pool = redis.asyncio.BlockingConnectionPool.from_url(url, max_connections=max_connections,
                                                         timeout=connect_timeout_s,
                                                         health_check_interval=HEALTH_CHECK_S, **options)
    return redis.asyncio.Redis.from_pool(pool)


def client_socket_timeout_s(settings: Settings) -> float:
    """The socket timeout of a client's connection (MemoryClient, the HTTP API, the CLI, the scheduler):
    MEMFLOW_SOCKET_TIMEOUT_S past the longest its commands ask the server to wait (a blocking read's
    slice, a WAIT for replicas, a WAITAOF for the disk)."""
    longest = max(CLIENT_BLOCK_S, settings.redis.wait_timeout_ms / 1000, settings.redis.wait_aof_timeout_ms / 1000)
    return settings.client.socket_timeout_s + longest


def stage_socket_timeout_s(block_ms: int) -> float:
    """The socket timeout of a connection the stages and the query worker share (see READ_MARGIN_S)."""
    return max(block_ms / 1000, RQ_DEQUEUE_S) + READ_MARGIN_S


def _keepalive_options() -> dict[int, int]:
    # The options exist on Linux; elsewhere (macOS names TCP_KEEPIDLE differently) the kernel's defaults.
    return {getattr(socket, name): value for name, value in KEEPALIVE_S.items() if hasattr(socket, name)}


# URLs whose server passed the version check in this process (one INFO per URL, not per client).
_checked: set[str] = set()


def _check_version(client: Client, url: str) -> None:
    try:
        info = _oldest(client)
    except (redis.ConnectionError, redis.TimeoutError):
        return  # not up (yet): connections are lazy and the stage loops retry; checked next time
    except redis.ResponseError as exc:  # a managed service that hides INFO
        log.warning("cannot read the server version at %s (%s); assuming %s", _safe(url), exc, SUPPORTED)
        _checked.add(url)
        return
    name, version = server_version(info)
    if version < MIN_VERSION[name]:
        raise ServerTooOld(f"the server at {_safe(url)} is {name.capitalize()} {_dotted(version)}; memflow needs "
                           f"{SUPPORTED} (stream consumer-group counters). Upgrade it, or unset "
                           "MEMFLOW_REDIS_URL and memflow starts the Valkey it bundles")
    _checked.add(url)


def _oldest(client: Client) -> dict[str, object]:
    """INFO server of the server, or of the cluster's node that runs the oldest version."""
    if isinstance(client, redis.Redis):
        return dict(client.info("server"))
    infos: dict[str, dict[str, object]] = client.info("server", target_nodes=RedisCluster.ALL_NODES)
    return min(infos.values(), key=lambda info: server_version(info)[1])


def server_version(info: dict[str, object]) -> tuple[str, tuple[int, ...]]:
    """("redis" | "valkey", version) from INFO server. Valkey 8+ names itself; 7.2 only says redis 7.2.4."""
    if "valkey_version" in info:
        return "valkey", parse_version(str(info["valkey_version"]))
    return "redis", parse_version(str(info.get("redis_version", "0")))


def parse_version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3]) or (0,)


def _dotted(version: tuple[int, ...]) -> str:
    return ".".join(map(str, version))


def _safe(url: str) -> str:
    """The URL without its password (it goes into error messages and logs)."""
    return re.sub(r"//([^:@/]*):[^@/]*@", r"//\1:***@", url)


def safe_url(settings: Settings) -> str:
    """The deployment's stream server's URL without its password, for a log line."""
    return _safe(require_url(settings))


# -- durable acknowledgement ---------------------------------------------------------------------


def replicated(client: Client, key: str, write: Callable[[Pipeline], object], *, replicas: int,
               timeout_ms: int, fsync_timeout_ms: int | None = None, raise_on_error: bool = True) -> list[Any]:
    """Send the commands `write` queues (all on `key`'s slot) and then WAIT until `replicas` replicas hold
    them, in one round trip on one connection to the node that owns the slot; the commands' replies.

    Replication is asynchronous: a write the master acknowledged is lost if the master dies before a
    replica got it, and a replica takes its place. WAIT closes that window — but it counts the replicas
    that hold the last write *of the connection it is sent on*: sent on another connection (a pool hands
    out any; RedisCluster sends a bare WAIT to a default node, not the key's), it proves nothing. So the
    writes and their WAIT share one pipeline to the owning node, not a MULTI (WAIT inside one does not wait).

    `replicas` 0: no WAIT (the setting's default). Raises NotReplicated when fewer acknowledged within
    `timeout_ms`; a node that is gone or no longer owns the slot raises redis' own error, after the
    cluster client has been told to reread the slot map (it is bypassed here, so it would not know).

    `fsync_timeout_ms`: first WAITAOF 1 0 on the same connection, which returns once the node's own AOF
    holds the writes on disk (shared/redisdb/durability.py); NotDurable when it did not within that long.

    `raise_on_error` False: a command that failed has its error in its place among the replies (a caller
    that sends again what a NOSCRIPT refused, and only that); the waits' own errors are raised all the same.
    """
    pipe = _owner(client, key).pipeline(transaction=False)
    write(pipe)
    waits = 0
    if fsync_timeout_ms is not None:
        pipe.waitaof(1, 0, fsync_timeout_ms)
        waits += 1
    if replicas:
        pipe.wait(replicas, timeout_ms)
        waits += 1
    try:
        replies = pipe.execute(raise_on_error=raise_on_error)
    except (redis.ConnectionError, redis.TimeoutError, redis.exceptions.MovedError,
            redis.exceptions.ClusterDownError):
        _reread_slots(client)
        raise
    for reply in replies[len(replies) - waits:]:
        if isinstance(reply, Exception):
            raise reply
    if replicas and replies[-1] < replicas:
        raise NotReplicated(f"{replies[-1]} of {replicas} replicas acknowledged the write to {key} within "
                            f"{timeout_ms} ms (MEMFLOW_REDIS_WAIT_REPLICAS)")
    if fsync_timeout_ms is not None and replies[len(replies) - waits][0] < 1:
        raise NotDurable(f"the server did not fsync the write to {key} to its AOF within {fsync_timeout_ms} ms "
                         "(MEMFLOW_REDIS_WAIT_AOF_TIMEOUT_MS): a busy disk")
    return replies[:len(replies) - waits]


def load_script(client: Client, key: str, script: str) -> str:
    """Load `script` on the node that owns `key`'s slot (where `replicated` sends the EVALSHA of it); its SHA1."""
    return str(_owner(client, key).script_load(script))


def _owner(client: Client, key: str) -> redis.Redis:
    """A client to the one server that holds `key`: the server itself, or the cluster's node for its slot."""
    if isinstance(client, redis.Redis):
        return client
    node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]  # untyped in redis-py 8.1
    return client.get_redis_connection(node)


def _reread_slots(client: Client) -> None:
    if isinstance(client, redis.Redis):
        return
    try:
        client.nodes_manager.initialize()
    except (redis.RedisError, redis.exceptions.RedisClusterException) as exc:
        # No node answered (mid-failover): the next command through the client tries again.
        log.warning("cannot reread the cluster's slot map: %s", exc)


# -- finding the Redis a running `memflow up` started ---------------------------------------


@dataclass(frozen=True)
class Running:
    redis_url: str
    pid: int
    # The transient server of the RPC queues (shared/redisdb/server.py TRANSIENT); None: a record of before it.
    queue_url: str | None = None


def announce(data_dir: Path, redis_url: str, queue_url: str | None = None) -> Path:
    """Record that this process runs memflow on `redis_url` (and its queues on `queue_url`) from `data_dir`;
    returns the record."""
    path = data_dir / RUNNING_FILE
    data_dir.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps({"redis_url": redis_url, "queue_url": queue_url, "pid": os.getpid()}))
    return path


def running(data_dir: Path) -> Running | None:
    """The `memflow up` recorded in `data_dir`, if its process is still alive."""
    try:
        record = orjson.loads((data_dir / RUNNING_FILE).read_bytes())
        queue = record.get("queue_url")
        found = Running(str(record["redis_url"]), int(record["pid"]), None if queue is None else str(queue))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return found if _alive(found.pid) else None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # someone else's process: alive
    return True


def connect_streams(settings: Settings, *, socket_timeout_s: float | None = None) -> redis.Redis:
    """The deployment's stream server: one server, or (MEMFLOW_REDIS_CLUSTER) a cluster client; its socket
    timeout `socket_timeout_s`, else a client's (`client_socket_timeout_s`).

    Typed as one server's client: everything memflow sends through it names keys of one slot (a
    partition's hash tag, or one key), which a cluster client routes by itself."""
    url, timeout_s = require_url(settings), socket_timeout_s or client_socket_timeout_s(settings)
    if settings.redis.cluster:
        return cast(redis.Redis, connect(url, socket_timeout_s=timeout_s, cluster=True,
                                         connect_timeout_s=settings.client.connect_timeout_s))
    return connect(url, socket_timeout_s=timeout_s, connect_timeout_s=settings.client.connect_timeout_s)


def connect_queue(settings: Settings, streams: redis.Redis | None = None, *,
                  socket_timeout_s: float | None = None) -> redis.Redis:
    """The server of the RPC queues and of everything transient (`queue_url`): its own, else the streams' (`streams`,
    reused); its socket timeout as connect_streams'."""
    url = queue_url(settings)
    if streams is not None and url is None:
        return streams
    return connect(url or require_url(settings), socket_timeout_s=socket_timeout_s or client_socket_timeout_s(settings),
                   connect_timeout_s=settings.client.connect_timeout_s)


def require_queue_url(settings: Settings) -> str:
    """The URL of the queues' server: queue_url's, else the streams' (require_url)."""
    return queue_url(settings) or require_url(settings)


def queue_url(settings: Settings) -> str | None:
    """Where the RPC queues and what a search writes live when not beside the streams: MEMFLOW_REDIS_QUEUE_URL, else
    the transient server a `memflow up` running from the data dir started (only when it also runs the streams');
    None: the streams' server holds them too.

    A server apart, because what lives there never waits for the disk (docs/architecture.md "Which writes are
    durable"): the streams' server fsyncs every write it acknowledges, the queues' never."""
    if settings.redis.queue_url:
        return settings.redis.queue_url
    if settings.redis.url:
        return None
    found = running(settings.store.data_dir)
    return None if found is None else found.queue_url


def require_url(settings: Settings) -> str:
    """The Redis to use: the configured URL, else the one a `memflow up` running from the data dir started."""
    if settings.redis.url:
        return settings.redis.url
    found = running(settings.store.data_dir)
    if found is not None:
        return found.redis_url
    raise MemflowError(f"no memflow is running from {settings.store.data_dir.resolve()} and MEMFLOW_REDIS_URL is not "
                       "set: start `memflow up` in this directory (another terminal), or set MEMFLOW_REDIS_URL")
