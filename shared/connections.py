"""Redis connections, configured once for how memflow uses them, to a server new enough for it."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

import orjson
import redis

from shared.errors import MemflowError
from shared.settings import Settings

log = logging.getLogger(__name__)

# The oldest servers whose streams do what memflow relies on: XINFO GROUPS reports `entries-read`
# and `lag` (the status read rates, the tests' progress probes) and XAUTOCLAIM replies with the ids
# deleted meanwhile — all Redis 7.0. Every Valkey release (7.2 on) reports itself as Redis 7.2.4.
MIN_VERSION = {"redis": (7, 0), "valkey": (7, 2)}
SUPPORTED = "Redis ≥ 7.0 or Valkey ≥ 7.2"

# Where `memflow up` records the Redis it started, so that a command run beside it (another
# terminal, same directory) finds it without MEMFLOW_REDIS_URL.
RUNNING_FILE = "running.json"


class ServerTooOld(MemflowError):
    pass


def connect(url: str) -> redis.Redis:
    """A client for blocking stream reads and RQ result waits, to a server checked to be new enough.

    redis-py's default socket timeout (5 s, with retries) turns a legitimately long
    XREADGROUP BLOCK or `latest_result(timeout=...)` into a TimeoutError about a minute
    later; blocking calls carry their own timeouts, so the socket gets none.
    """
    client = redis.Redis.from_url(url, socket_timeout=None, socket_connect_timeout=5, health_check_interval=30)
    if url not in _checked:
        _check_version(client, url)
    return client


# URLs whose server passed the version check in this process (one INFO per URL, not per client).
_checked: set[str] = set()


def _check_version(client: redis.Redis, url: str) -> None:
    try:
        info = client.info("server")
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


# -- finding the Redis a running `memflow up` started ---------------------------------------


@dataclass(frozen=True)
class Running:
    redis_url: str
    pid: int


def announce(data_dir: Path, redis_url: str) -> Path:
    """Record that this process runs memflow on `redis_url` from `data_dir`; returns the record."""
    path = data_dir / RUNNING_FILE
    data_dir.mkdir(parents=True, exist_ok=True)
    path.write_bytes(orjson.dumps({"redis_url": redis_url, "pid": os.getpid()}))
    return path


def running(data_dir: Path) -> Running | None:
    """The `memflow up` recorded in `data_dir`, if its process is still alive."""
    try:
        record = orjson.loads((data_dir / RUNNING_FILE).read_bytes())
        found = Running(str(record["redis_url"]), int(record["pid"]))
    except (OSError, ValueError, KeyError, TypeError):
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


def require_url(settings: Settings) -> str:
    """The Redis to use: the configured URL, else the one a `memflow up` running from the data dir started."""
    if settings.redis_url:
        return settings.redis_url
    found = running(settings.data_dir)
    if found is not None:
        return found.redis_url
    raise MemflowError(f"no memflow is running from {settings.data_dir.resolve()} and MEMFLOW_REDIS_URL is not "
                       "set: start `memflow up` in this directory (another terminal), or set MEMFLOW_REDIS_URL")
