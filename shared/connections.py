"""Redis connections, configured once for how memflow uses them."""

from __future__ import annotations

import redis

from shared.errors import MemflowError


def connect(url: str) -> redis.Redis:
    """A client for blocking stream reads and RQ result waits.

    redis-py's default socket timeout (5 s, with retries) turns a legitimately long
    XREADGROUP BLOCK or `latest_result(timeout=...)` into a TimeoutError about a minute
    later; blocking calls carry their own timeouts, so the socket gets none.
    """
    return redis.Redis.from_url(url, socket_timeout=None, socket_connect_timeout=5, health_check_interval=30)


def require_url(url: str | None) -> str:
    if not url:
        raise MemflowError("MEMFLOW_REDIS_URL is not set (only `memflow up` and `memflow demo` start a Redis)")
    return url
