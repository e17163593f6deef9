"""How the HTTP API words a refusal (issue 41 item 2): in plain words, naming the field as the body named it (a
write's `content`, a batch's `0.subject`), without pydantic's vocabulary; and a key sent without `Bearer`, or a body
of another media type, told what to send — at /v1 and at /mcp alike. A live `memflow serve` over the real pipeline."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from memflow.shared.errors import InvalidInput
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.server import RedisServer
from tests.test_api import Served, error_of, event, serving, subject

# pydantic's own words: none reaches a caller.
JARGON = ("Input should", "Value error", "Field required", "String should", "Extra inputs", "valid dictionary",
          "Assertion failed", "model_attributes_type")


@pytest.fixture(scope="module")
def served(redis_server: RedisServer, embedder: Embedder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from serving(redis_server, embedder, tmp_path_factory.mktemp("words"))


def plain(error: dict[str, Any]) -> str:
    message = str(error["message"])
    assert not [w for w in JARGON if w in message], message
    return message


# (what, route, body, status, the field named, words the message holds)
BAD: list[tuple[str, str, Any, int, str, str]] = [
    ("a write too long", "/v1/memories", {"subject": "a", "content": "x" * 40_000}, 422, "content",
     "`content` is 40000 bytes, over the limit of 32768"),
    ("an empty write", "/v1/memories", {"subject": "a", "content": ""}, 422, "content", "`content` must not be empty"),
    ("a write without content", "/v1/memories", {"subject": "a"}, 422, "content", "`content` is required"),
    ("content of another type", "/v1/memories", {"subject": "a", "content": 5}, 422, "content",
     "`content` must be a string"),
    ("an extra field", "/v1/memories", {"subject": "a", "content": "x", "colour": 1}, 422, "colour",
     "`colour` is not a field of this body"),
    ("a list for an object", "/v1/memories", [1], 422, "body", "the body must be a JSON object"),
    ("no body at all", "/v1/search", None, 422, "body", "the body is empty: send a JSON object"),
    ("a subject that is no id", "/v1/memories", {"subject": "a b", "content": "x"}, 422, "subject",
     "`subject` must be 1 to 128 letters, digits or . _ : / -"),
    ("a naive time", "/v1/search", {"subject": "a", "query": "q", "now": "2026-03-02T09:00:00"}, 422, "now",
     "`now`: a timestamp must be timezone-aware"),
    ("a word for a number", "/v1/search", {"subject": "a", "query": "q", "k": "many"}, 422, "k",
     "`k` must be a whole number"),
    ("a number past its bound", "/v1/search", {"subject": "a", "query": "q", "k": 100_000}, 422, "k",
     "`k` must be at most 200"),
    ("a pack without a query", "/v1/pack", {"subject": "a"}, 422, "query", "`query` is required"),
    ("feedback of no list", "/v1/feedback", {"subject": "a", "memory_ids": "x"}, 422, "memory_ids",
     "`memory_ids` must be a list"),
    ("an event's text too long", "/v1/events", event("a", "x" * 40_000), 422, "text",
     "`text` is 40000 bytes, over the limit of 32768"),
    ("an extra field of an event", "/v1/events", {**event("a", "hi"), "zz": 1}, 422, "zz",
     "`zz` is not a field of this body"),
    ("a bad subject in a batch", "/v1/events", [event("a", "one"), {**event("a", "two"), "subject": "a b"}], 422,
     "1.subject", "`1.subject` must be 1 to 128 letters"),
    ("a role of none in a batch", "/v1/events", [{**event("a", "two"), "role": "robot"}], 422, "0.role",
     "`0.role` must be one of 'user', 'assistant', 'tool' or 'system'"),
    ("a string for events", "/v1/events", "hello", 422, "body",
     "the body must be an event (a JSON object) or a JSON array of events"),
    ("a number in a batch", "/v1/events", [5], 422, "0", "`0` must be a JSON object"),
    ("no events at all", "/v1/events", None, 422, "body", "the body is empty: send an event"),
    ("a message without a role", "/v1/events", {**event("a", "hi"), "role": None}, 422, "body",
     "a message event needs a role and a non-empty text"),
]


@pytest.mark.parametrize(("what", "path", "body", "status", "field", "words"), BAD, ids=[b[0] for b in BAD])
def test_a_refusal_names_the_bodys_own_field_in_plain_words(served: Served, what: str, path: str, body: Any,
                                                            status: int, field: str, words: str) -> None:
    with served.http(served.admin) as http:
        sent = {"content": b"", "headers": {"Content-Type": "application/json"}} if body is None else {"json": body}
        reply = http.post(path, **sent)  # type: ignore[arg-type]
        assert reply.status_code == status, reply.text
        error = error_of(reply)
        assert error["code"] == "invalid_input" and error["field"] == field, error
        assert words in plain(error), error


QUERIES = [("/v1/changes?after=zz", "after", "`after` must be an entry's `id` (such as 1767225600000-0)"),
           ("/v1/subjects/a/profile?since=bad", "since", "`since` must be a profile's `revision`"),
           ("/v1/subjects/a/export?with_vectors=maybe", "with_vectors", "`with_vectors` must be true or false"),
           ("/v1/subjects/a/traces?count=many", "count", "`count` must be a whole number")]


@pytest.mark.parametrize(("path", "field", "words"), QUERIES, ids=[q[1] for q in QUERIES])
def test_a_query_parameter_is_named_in_words_not_as_its_pattern(served: Served, path: str, field: str,
                                                                 words: str) -> None:
    with served.http(served.admin) as http:
        reply = http.get(path)
    assert reply.status_code == 422, reply.text
    error = error_of(reply)
    assert error["field"] == field and words in plain(error) and "^" not in error["message"], error


def test_the_sdks_write_names_content_too(served: Served) -> None:
    with pytest.raises(InvalidInput) as refused:
        served.system.client.write(subject(), "x" * 40_000)
    assert refused.value.field == "content" and "Value error" not in str(refused.value), refused.value
    assert str(refused.value).startswith("content: is 40000 bytes, over the limit of 32768"), refused.value


MCP_HEADERS = {"Accept": "application/json, text/event-stream"}
LIST_TOOLS = {"jsonrpc": "2.0", "id": 1, "method": "tools/list"}


@pytest.mark.parametrize(("door", "path", "body"), [("api", "/v1/search", {"subject": "a", "query": "q"}),
                                                    ("mcp", "/mcp", LIST_TOOLS)])
def test_a_key_without_bearer_is_told_to_send_bearer(served: Served, door: str, path: str, body: Any) -> None:
    for header, why in ((served.admin, "without the `Bearer ` scheme"), (f"Basic {served.admin}", "another scheme"),
                        ("Bearer", "no key after it")):
        reply = httpx.post(f"{served.url}{path}", json=body, headers={**MCP_HEADERS, "Authorization": header},
                           timeout=30)
        assert reply.status_code == 401, (header, reply.text)
        error = error_of(reply)
        assert error["code"] == "unauthorized" and error["field"] == "Authorization", error
        assert why in error["message"] and "send `Authorization: Bearer <key>`" in error["message"], error
        assert served.admin not in reply.text  # the key is never echoed
    # No header at all is still no key.
    bare = httpx.post(f"{served.url}{path}", json=body, headers=MCP_HEADERS, timeout=30)
    assert bare.status_code == 401 and error_of(bare)["message"].startswith("no API key"), bare.text


def test_a_message_to_mcp_of_another_type_is_told_to_send_json(served: Served) -> None:
    for sent in ("text/plain", "application/x-www-form-urlencoded", None):
        headers = {**MCP_HEADERS, "Authorization": f"Bearer {served.admin}", **({"Content-Type": sent} if sent
                                                                                 else {})}
        reply = httpx.post(f"{served.url}/mcp", content=b'{"jsonrpc": "2.0", "id": 1, "method": "tools/list"}',
                           headers=headers, timeout=30)
        assert reply.status_code == 415, (sent, reply.text)
        error = error_of(reply)
        assert error["field"] == "Content-Type" and "`Content-Type: application/json`" in error["message"], error
