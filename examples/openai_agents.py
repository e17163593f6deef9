"""memflow as the memory of an OpenAI Agents SDK agent (`pip install 'memflow[examples]'`, or `openai-agents`):
the agent gets memflow's MCP tools over streamable HTTP.

    MEMFLOW_URL=http://127.0.0.1:8765 MEMFLOW_KEY=mf_... OPENAI_API_KEY=sk-... python examples/openai_agents.py

`memory_server` and `assistant` are what an application copies; `main` runs the agent (it needs a model).
tests/test_examples.py drives the same server object without a model: it lists the tools the agent would see
and calls them as the SDK's runner would.
"""

from __future__ import annotations

import asyncio
import os

from agents import Agent, Runner
from agents.mcp import MCPServerStreamableHttp


def memory_server(url: str, key: str, subject: str | None = None) -> MCPServerStreamableHttp:
    """memflow's `/mcp` for the Agents SDK; the subject is the key's, or `subject` (X-Memflow-Subject)."""
    headers = {"Authorization": f"Bearer {key}", **({"X-Memflow-Subject": subject} if subject else {})}
    return MCPServerStreamableHttp(name="memflow", params={"url": f"{url.rstrip('/')}/mcp", "headers": headers},
                                   cache_tools_list=True)


def assistant(memory: MCPServerStreamableHttp, model: str = "gpt-4.1") -> Agent:
    return Agent(name="assistant", model=model, mcp_servers=[memory],
                 instructions="Use your memory tools: recall before you answer about the user, remember what "
                              "they ask you to, and forget what they ask you to forget.")


async def main() -> None:
    async with memory_server(os.environ["MEMFLOW_URL"], os.environ["MEMFLOW_KEY"],
                             os.environ.get("MEMFLOW_SUBJECT")) as memory:
        result = await Runner.run(assistant(memory), "What do I drink in the morning?")
        print(result.final_output)


if __name__ == "__main__":
    asyncio.run(main())
