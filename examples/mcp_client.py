"""memflow's MCP tools from the official MCP Python SDK's client, over streamable HTTP (`/mcp` of `memflow
serve`): what Claude Code, Cursor and other MCP clients do, in a dozen lines. No model: the tools are called
directly, as an agent's runtime would call them.

    MEMFLOW_URL=http://127.0.0.1:8765 MEMFLOW_KEY=mf_... python examples/mcp_client.py

The subject is the key's (a key for one subject), or `MEMFLOW_SUBJECT` (sent as `X-Memflow-Subject`), never a
tool argument. Driven by tests/test_examples.py against a live server.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client


def headers(key: str, subject: str | None = None) -> dict[str, str]:
    """The key, and the subject when the key covers more than one."""
    return {"Authorization": f"Bearer {key}", **({"X-Memflow-Subject": subject} if subject else {})}


@asynccontextmanager
async def memory(url: str, key: str, subject: str | None = None) -> AsyncIterator[Client]:
    """A session with memflow's `/mcp`: `remember`, `recall`, `context`, `profile`, `forget`, `publish_turns`,
    `event_fate`."""
    async with (httpx2.AsyncClient(headers=headers(key, subject), timeout=60,
                                   event_hooks={"response": [refused_at_the_door]}) as http,
                Client(streamable_http_client(f"{url.rstrip('/')}/mcp", http_client=http)) as client):
        yield client


async def refused_at_the_door(response: httpx2.Response) -> None:
    """A request memflow refuses before MCP reads it (a wrong key: 401 with the API's JSON error), raised in the
    server's words: the SDK would hand its caller "Server returned an error response" alone. A JSON-RPC error
    (its `code` a number) is the SDK's to read, as it does."""
    if response.status_code < 400 or not response.headers.get("content-type", "").startswith("application/json"):
        return
    await response.aread()
    try:
        body = response.json()
    except ValueError:
        return
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and isinstance(error.get("code"), str):
        raise RuntimeError(f"{response.status_code} {error['code']}: {error.get('message')}")


async def call(client: Client, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's structured reply; a tool error raised with its text."""
    result = await client.call_tool(tool, arguments)
    if result.is_error or result.structured_content is None:
        raise RuntimeError(" ".join(getattr(block, "text", "") for block in result.content))
    return dict(result.structured_content)


async def main() -> None:
    url, key = os.environ.get("MEMFLOW_URL"), os.environ.get("MEMFLOW_KEY")
    if not url or not key:
        raise SystemExit("mcp_client: set MEMFLOW_URL (such as http://127.0.0.1:8765) and MEMFLOW_KEY "
                         "(`memflow keys create`)")
    async with memory(url, key, os.environ.get("MEMFLOW_SUBJECT")) as c:
        print("tools:", sorted(tool.name for tool in (await c.list_tools()).tools))
        print(await call(c, "remember", content="I prefer tea over coffee in the morning."))
        print(await call(c, "recall", query="what do I drink in the morning?", k=5))
        print(await call(c, "context", task="offer the user a drink"))


def one_line(exc: BaseException) -> str:
    """What went wrong, in a line: the innermost cause of a failure the SDK wrapped in exception groups."""
    while isinstance(exc, BaseExceptionGroup) and len(exc.exceptions) == 1:
        exc = exc.exceptions[0]
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__


if __name__ == "__main__":
    try:
        asyncio.run(main())
    except Exception as exc:  # the example's user reads one line (a tool error is the server's own words)
        raise SystemExit(f"mcp_client: {one_line(exc)}") from None
