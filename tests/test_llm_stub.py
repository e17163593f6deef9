"""The scripted LLM server, driven through the real `openai` client (and raw HTTP for the edges)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from typing import Any

import openai
import pytest
from openai import OpenAI

from memflow.bench.llm_stub import Reply, ScriptedLLM, estimate_tokens

MESSAGES = [
    {"role": "system", "content": "extract memories\nReturn JSON."},
    {"role": "user", "content": "I moved to Lisbon in May."},
]


def client(server: ScriptedLLM, max_retries: int = 0, timeout: float = 10.0) -> OpenAI:
    return OpenAI(base_url=server.url, api_key="test", max_retries=max_retries, timeout=timeout)


def post(server: ScriptedLLM, path: str, data: bytes) -> tuple[int, dict[str, Any]]:
    """Raw POST, for what the openai client never sends (bad JSON, unknown paths)."""
    request = urllib.request.Request(server.url.removesuffix("/v1") + path, data=data, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=10) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@pytest.fixture
def default_server() -> Iterator[ScriptedLLM]:
    with ScriptedLLM() as server:
        yield server


def test_scripted_reply_and_usage_and_recorded_request() -> None:
    with ScriptedLLM([Reply(content='{"facts": ["lives in Lisbon"]}')]) as server:
        response = client(server).chat.completions.create(model="gpt-test", messages=MESSAGES)  # type: ignore[arg-type]

        assert response.choices[0].message.content == '{"facts": ["lives in Lisbon"]}'
        assert response.model == "gpt-test"
        assert response.usage is not None
        prompt = estimate_tokens("\n".join(m["content"] for m in MESSAGES))
        completion = estimate_tokens('{"facts": ["lives in Lisbon"]}')
        assert (response.usage.prompt_tokens, response.usage.completion_tokens) == (prompt, completion)
        assert response.usage.total_tokens == prompt + completion
        assert (server.prompt_tokens, server.completion_tokens) == (prompt, completion)
        assert server.calls == 1
        assert server.requests[0]["model"] == "gpt-test"
        assert server.requests[0]["messages"] == MESSAGES
        assert server.purposes() == ["extract memories"]


def test_explicit_usage_overrides_the_estimate() -> None:
    with ScriptedLLM([Reply(content="x", prompt_tokens=100, completion_tokens=7)]) as server:
        usage = client(server).chat.completions.create(model="m", messages=MESSAGES).usage  # type: ignore[arg-type]

        assert usage is not None and (usage.prompt_tokens, usage.completion_tokens) == (100, 7)
        assert (server.prompt_tokens, server.completion_tokens) == (100, 7)


def test_rate_limit_then_success_is_retried_by_the_client() -> None:
    with ScriptedLLM([Reply(status=429, headers={"retry-after": "0"}), Reply(content="ok")]) as server:
        response = client(server, max_retries=2).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]

        assert response.choices[0].message.content == "ok"
        assert server.calls == 2
        # Only the answered request counts towards usage.
        assert server.completion_tokens == estimate_tokens("ok")


def test_error_status_carries_an_openai_error_body() -> None:
    with ScriptedLLM([Reply(status=429, content="slow down")]) as server:
        with pytest.raises(openai.RateLimitError) as raised:
            client(server).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]

        assert raised.value.status_code == 429
        assert raised.value.body == {"message": "slow down", "type": "requests", "param": None,
                                     "code": "rate_limit_exceeded"}
        assert (server.prompt_tokens, server.completion_tokens) == (0, 0)


def test_exhausted_sequence_answers_500() -> None:
    with ScriptedLLM([Reply(content="only one")]) as server:
        llm = client(server)
        assert llm.chat.completions.create(model="m", messages=MESSAGES).choices[0].message.content == "only one"  # type: ignore[arg-type]
        with pytest.raises(openai.InternalServerError):
            llm.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        assert server.calls == 2


@pytest.mark.timeout(20)
def test_slow_reply_times_the_client_out_and_close_wakes_the_handler() -> None:
    # A delay past this test's own timeout: a handler that waited it out would still be in flight after close
    # (which gives handlers 2 s), so no stopwatch is needed to tell woken from waited out.
    server = ScriptedLLM([Reply(content="late", delay_s=600)]).start()
    try:
        with pytest.raises(openai.APITimeoutError):
            client(server, max_retries=0, timeout=0.5).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        assert server.in_flight == 1  # still sitting in its delay
    finally:
        server.close()
    # The handler woke from its delay rather than being abandoned mid-wait.
    assert server.in_flight == 0


def test_callable_script_sees_the_request_body() -> None:
    def echo(body: dict[str, Any]) -> Reply:
        last_user = [m["content"] for m in body["messages"] if m["role"] == "user"][-1]
        return Reply(content=f"you said: {last_user}")

    with ScriptedLLM(echo) as server:
        response = client(server).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]

        assert response.choices[0].message.content == "you said: I moved to Lisbon in May."


def test_raising_script_answers_500() -> None:
    def broken(body: dict[str, Any]) -> Reply:
        raise KeyError("nope")

    with ScriptedLLM(broken) as server:
        with pytest.raises(openai.InternalServerError):
            client(server).chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]


def test_default_script_and_models_endpoint(default_server: ScriptedLLM) -> None:
    llm = client(default_server)
    response = llm.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])

    assert response.choices[0].message.content == "{}"
    assert [m.id for m in llm.models.list()] == ["scripted"]
    assert default_server.purposes() == [""]


def test_bad_json_unknown_path_and_unprefixed_path(default_server: ScriptedLLM) -> None:
    status, body = post(default_server, "/v1/chat/completions", b"{not json")
    assert status == 400 and body["error"]["type"] == "invalid_request_error"

    status, body = post(default_server, "/v1/embeddings", b"{}")
    assert status == 404 and "error" in body

    status, body = post(default_server, "/chat/completions", json.dumps({"messages": MESSAGES}).encode())
    assert status == 200 and body["model"] == "scripted" and body["id"] == "chatcmpl-1"
    assert default_server.calls == 1


def test_purposes_use_the_first_system_message() -> None:
    with ScriptedLLM() as server:
        llm = client(server)
        llm.chat.completions.create(model="m", messages=MESSAGES)  # type: ignore[arg-type]
        llm.chat.completions.create(
            model="m",
            messages=[{"role": "user", "content": "q"}, {"role": "system", "content": "plan the query\nmore"}],
            metadata={"purpose": "not this"},
        )

        assert server.purposes() == ["extract memories", "plan the query"]


def test_estimate_tokens() -> None:
    assert estimate_tokens("你好") == 2
    assert estimate_tokens("abcdefgh") == 2
    assert estimate_tokens("abcde") == 2
    assert estimate_tokens("") == 0
    assert estimate_tokens("你好abcde") == 4
