"""memflow as the memory of a LangGraph agent (`pip install langchain-mcp-adapters langgraph`): the agent gets
memflow's MCP tools as LangChain tools over streamable HTTP.

    MEMFLOW_URL=http://127.0.0.1:8765 MEMFLOW_KEY=mf_... OPENAI_API_KEY=sk-... python examples/langgraph_agent.py

langchain-mcp-adapters requires mcp<2, memflow mcp>=2.3: install this example's packages in an environment of
their own (it needs nothing of memflow's: it speaks HTTP). `memory_tools` and `agent` are what an application
copies; `main` runs the agent (it needs a model). tests/test_examples.py runs `python langgraph_agent.py --tools`
in such an environment (no model): the tools listed and called as the agent's tool node would.
"""

from __future__ import annotations

import asyncio
import json
import os
import sys
from typing import Any

from langchain_mcp_adapters.client import MultiServerMCPClient


def memory_client(url: str, key: str, subject: str | None = None) -> MultiServerMCPClient:
    headers = {"Authorization": f"Bearer {key}", **({"X-Memflow-Subject": subject} if subject else {})}
    return MultiServerMCPClient({"memflow": {"transport": "streamable_http", "url": f"{url.rstrip('/')}/mcp",
                                             "headers": headers}})


async def memory_tools(url: str, key: str, subject: str | None = None) -> list[Any]:
    """memflow's tools as LangChain tools: `remember`, `recall`, `context`, `profile`, `forget`, `publish_turns`,
    `event_fate`."""
    return list(await memory_client(url, key, subject).get_tools())


def agent(tools: list[Any], model: str = "openai:gpt-4.1") -> Any:
    from langgraph.prebuilt import create_react_agent
    return create_react_agent(model, tools)


async def drive_tools(url: str, key: str, subject: str | None) -> dict[str, Any]:
    """No model: each tool invoked as the agent's tool node would; what they answered."""
    tools = {tool.name: tool for tool in await memory_tools(url, key, subject)}
    out: dict[str, Any] = {"tools": sorted(tools)}
    out["remember"] = await tools["remember"].ainvoke({"content": "I prefer oolong tea after lunch."})
    out["recall"] = await tools["recall"].ainvoke({"query": "what do I drink after lunch?", "k": 5})
    return out


async def main() -> None:
    url, key, subject = os.environ["MEMFLOW_URL"], os.environ["MEMFLOW_KEY"], os.environ.get("MEMFLOW_SUBJECT")
    if sys.argv[1:] == ["--tools"]:
        print(json.dumps(await drive_tools(url, key, subject), default=str))
        return
    graph = agent(await memory_tools(url, key, subject))
    print(await graph.ainvoke({"messages": [("user", "Remember that I prefer tea.")]}))


if __name__ == "__main__":
    asyncio.run(main())
