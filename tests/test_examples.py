"""The integrations people copy (examples/), each driven against a live `memflow serve` without a model: the
tools an agent would be given are listed and called as its runtime would call them.

- examples/mcp_client.py: the official MCP SDK's client (a dependency of memflow: never skips).
- examples/openai_agents.py: the OpenAI Agents SDK (`pip install -e '.[examples]'`; skips, saying so, without).
- examples/langgraph_agent.py: langchain-mcp-adapters requires mcp<2, memflow mcp>=2.3, so it runs in an
  environment of its own, named by PYTEST_LANGGRAPH_PYTHON (.ci/run makes one); skips, saying so, without.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path
from types import ModuleType
from typing import Any

import anyio
import pytest

from tests import test_api
from tests.test_api import Served

served = test_api.served  # the fixture: a system and `memflow serve` for this module

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
TOOLS = {"remember", "recall", "context", "profile", "forget", "publish_turns", "event_fate"}


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"memflow_example_{name}", EXAMPLES / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def keyed(served: Served) -> tuple[str, str]:
    """A subject and a key for it alone (the subject is the key's: no header needed)."""
    subject = f"ex-{uuid.uuid4().hex[:8]}"
    return subject, served.key(subject)


def test_the_mcp_client_example_prints_the_servers_refusal_in_one_line(served: Served) -> None:
    # Issue 41: a key over two subjects and no MEMFLOW_SUBJECT printed a 76-line ExceptionGroup.
    key = served.key(f"ex-two-{uuid.uuid4().hex[:6]}/*")
    done = subprocess.run([sys.executable, str(EXAMPLES / "mcp_client.py")],
                          env={**os.environ, "MEMFLOW_URL": served.url, "MEMFLOW_KEY": key},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1, (done.stdout, done.stderr)
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert "with X-Memflow-Subject" in done.stderr and "Traceback" not in done.stderr, done.stderr


def test_the_mcp_client_example_remembers_recalls_packs_and_forgets(served: Served) -> None:
    mcp_client = example("mcp_client")
    subject, key = keyed(served)

    async def session() -> dict[str, Any]:
        async with mcp_client.memory(served.url, key) as client:
            assert {tool.name for tool in (await client.list_tools()).tools} == TOOLS
            written = await mcp_client.call(client, "remember", content="I prefer tea over coffee in the morning.")
            assert written["event_id"]
            assert await anyio.to_thread.run_sync(served.system.client.wait_idle, 30.0)
            found = await mcp_client.call(client, "recall", query="what do I drink in the morning?", k=5)
            packed = await mcp_client.call(client, "context", task="offer the user a drink")
            gone = await mcp_client.call(client, "forget", contains="tea")
            after = await mcp_client.call(client, "recall", query="what do I drink in the morning?")
            return {"found": found, "packed": packed, "gone": gone, "after": after}
    out = anyio.run(session)
    assert out["found"]["status"] == "ok" and "tea" in out["found"]["memories"][0]["content"]
    assert "tea" in out["packed"]["text"]
    assert out["gone"]["proof"]["verified"] and out["gone"]["ids"]
    assert out["after"]["status"] == "empty"
    assert served.system.client.search(subject, "tea").status == "empty"  # the key's subject, the one written


def test_a_tool_error_of_the_mcp_client_example_is_raised_with_its_text(served: Served) -> None:
    mcp_client = example("mcp_client")
    _, key = keyed(served)

    async def session() -> str:
        async with mcp_client.memory(served.url, key) as client:
            try:
                await mcp_client.call(client, "recall", query="tea", subject="someone-else")
            except RuntimeError as refused:
                return str(refused)
        return "not refused"
    # A tool takes no subject: a model naming one is told which argument was refused.
    assert "subject" in anyio.run(session)


def test_the_openai_agents_example_gives_the_agent_memflows_tools_and_they_answer(served: Served) -> None:
    pytest.importorskip("agents", reason="openai-agents is not installed: pip install -e '.[examples]'")
    openai_agents = example("openai_agents")
    subject, key = keyed(served)

    async def session() -> dict[str, Any]:
        async with openai_agents.memory_server(served.url, key) as memory:
            agent = openai_agents.assistant(memory)
            # The tools the runner would hand the model, and calls as it would make them.
            tools = {tool.name for tool in await agent.get_mcp_tools(run_context=None)}
            written = await memory.call_tool("remember", {"content": "My sister Anna lives in Lyon."})
            assert not written.is_error, written
            assert await anyio.to_thread.run_sync(served.system.client.wait_idle, 30.0)
            found = await memory.call_tool("recall", {"query": "where does my sister live?"})
            return {"tools": tools, "found": found.structured_content}
    out = anyio.run(session)
    assert out["tools"] == TOOLS
    assert out["found"]["status"] == "ok" and "Lyon" in out["found"]["memories"][0]["content"]
    assert served.system.client.search(subject, "sister").status == "ok"


LANGGRAPH_PYTHON = os.environ.get("PYTEST_LANGGRAPH_PYTHON")


@pytest.mark.skipif(not LANGGRAPH_PYTHON, reason="PYTEST_LANGGRAPH_PYTHON names no Python with langgraph and "
                    "langchain-mcp-adapters (they require mcp<2, memflow mcp>=2.3: an environment of their own, "
                    "as .ci/run makes)")
def test_the_langgraph_example_gives_the_agent_memflows_tools_and_they_answer(served: Served) -> None:
    assert LANGGRAPH_PYTHON is not None
    subject, key = keyed(served)
    env = {"PATH": os.environ.get("PATH", ""), "MEMFLOW_URL": served.url, "MEMFLOW_KEY": key}
    done = subprocess.run([LANGGRAPH_PYTHON, str(EXAMPLES / "langgraph_agent.py"), "--tools"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(out["tools"]) == TOOLS
    assert "event_id" in str(out["remember"])
    assert served.system.client.wait_idle(30)
    assert any("oolong" in m.content for m in served.system.client.inspect(subject).memories)
