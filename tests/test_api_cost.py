"""What a request may cost is bounded before the work starts (issue 30, items 1 and 2): item counts and the
key's permission are checked before a single item is validated, and a query is capped by what the encoders
read (in tokens), each refusal naming its limit.

One served system for the module (tests/test_api.py's), each test under subjects of its own.
"""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from memflow.shared.errors import InvalidInput
from tests.conftest import wait_for
from tests.test_api import Served, error_of, event, served, subject

__all__ = ["served"]  # the module's fixture, shared with tests/test_api.py

# 330,000 empty objects in 990 KB (under the 1 MB body limit): validated one by one, they took 15 s.
HUGE_BATCH = b"[" + b",".join([b"{}"] * 330_000) + b"]"
# A wait, not a bound: a /healthz that gets no answer in this long was held behind the batch, not slow.
HEALTHZ_DEADLINE_S = 30.0


def posted_while_healthz_answers(served: Served, key: str) -> tuple[httpx.Response, list[int | str]]:
    """POST the huge batch with `key`; meanwhile /healthz is asked again and again. The reply, and what each
    /healthz got: its status, or the error that ended it (none answered within HEALTHZ_DEADLINE_S)."""
    health: list[int | str] = []
    done = threading.Event()

    def probe() -> None:
        with httpx.Client(base_url=served.url, timeout=HEALTHZ_DEADLINE_S) as http:
            while not done.is_set():
                try:
                    health.append(http.get("/healthz").status_code)
                except httpx.HTTPError as exc:
                    health.append(repr(exc))
    prober = threading.Thread(target=probe, daemon=True)
    prober.start()
    with served.http(key) as http:
        reply = http.post("/v1/events", content=HUGE_BATCH, headers={"content-type": "application/json"})
    wait_for(lambda: health, HEALTHZ_DEADLINE_S, "a /healthz asked during the batch to be answered")
    done.set()
    prober.join(HEALTHZ_DEADLINE_S)
    assert not prober.is_alive(), "a /healthz never answered"
    return reply, health


def test_a_huge_batch_is_refused_before_its_items_are_validated_and_healthz_stays_answered(served: Served) -> None:
    published = served.system.client.keys.inputs_of("trigger")
    before = sum(served.system.client.redis.xlen(stream) for stream in published)
    # A read-only key is told no for what it is, not for what it sent.
    reader = served.key(f"{subject()}/*", read_only=True)
    # How fast (ms, where validating the items took 15 s) is `memflow bench http`'s figure (refusals_p50_ms);
    # here, the order: had the items been validated first, the first `{}` would be the answer (422).
    reply, health = posted_while_healthz_answers(served, reader)
    assert reply.status_code == 403 and error_of(reply)["code"] == "forbidden", reply.text[:300]
    # A key that may write: the count is refused, naming the limit, before any item is looked at.
    writer = served.key(f"{subject()}/*")
    reply, health2 = posted_while_healthz_answers(served, writer)
    assert reply.status_code == 413, reply.text[:300]
    error = error_of(reply)
    assert error["field"] == "body" and "at most 500 events" in error["message"], error
    assert set(health + health2) <= {200, 503}, health + health2
    assert sum(served.system.client.redis.xlen(stream) for stream in published) == before


def test_a_batch_within_the_limit_is_still_validated_item_by_item(served: Served) -> None:
    subj = subject()
    with served.http(served.admin) as http:
        bad: list[Any] = [event(subj, "one"), {}, event(subj, "three")]
        reply = http.post("/v1/events", json=bad)
        assert reply.status_code == 422 and error_of(reply)["field"].startswith("1."), reply.text
        not_json = http.post("/v1/events", content=b"[{", headers={"content-type": "application/json"})
        assert not_json.status_code == 400 and error_of(not_json)["field"] == "body"
        good = http.post("/v1/events", json=[event(subj, "I like green tea.", 0), event(subj, "And jasmine.", 1)])
        assert good.status_code == 202 and len(good.json()["ids"]) == 2


def test_a_query_past_what_the_encoders_read_is_refused_naming_the_limit(served: Served) -> None:
    subj = subject()
    # 2,000 words: 14 KB, well under the 32 KB text limit, but eight times what the embedder reads.
    long_query = " ".join(["coffee"] * 2_000)
    with served.http(served.admin) as http:
        for path in ("/v1/search", "/v1/pack"):
            reply = http.post(path, json={"subject": subj, "query": long_query})
            assert reply.status_code == 422, reply.text[:300]
            error = error_of(reply)
            assert error["field"] == "query" and "at most 512" in error["message"], error
        # What the encoders do read is searched as before.
        fits = http.post("/v1/search", json={"subject": subj, "query": " ".join(["coffee"] * 200)})
        assert fits.status_code == 200 and fits.json()["status"] == "empty", fits.text[:300]
    # The SDK refuses it the same way, before anything is enqueued.
    with pytest.raises(InvalidInput, match="at most 512"):
        served.system.client.search(subj, long_query)
