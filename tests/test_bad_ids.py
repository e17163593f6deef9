"""An id that is no memory id is an input error at every door (issue 38 item 8): 422 naming the field, in words,
never a 503 with the storage engine's text nor a regular expression. A memory id is a UUID in any case, taken
as its lowercase form (the store's).
"""

from __future__ import annotations

import uuid
from typing import Any
from urllib.parse import quote

import pytest
from mcp import Client

from memflow.shared.errors import InvalidInput
from memflow.shared.sdk import rpc
from memflow.workers.mcp import SUBJECT_HEADER
from tests import test_api
from tests.test_api import Served, error_of, subject
from tests.test_mcp import over_http, run, text_of

served = test_api.served  # the module's system and `memflow serve`

BAD_IDS = ["../../etc/passwd", "abc", "8fc354c3-f9df-571d-aa52-d8dd7b4db4a", "8fc354c3f9df571daa52d8dd7b4db4a7",
           "8fc354c3-f9df-571d-aa52-d8dd7b4db4a7\n", "' OR 1=1 --", "8fc354c3-f9df-571d-aa52-d8dd7b4db4g7"]
SAID = "is not a memory id: a memory id is a UUID, such as 8fc354c3-f9df-571d-aa52-d8dd7b4db4a7"


def refused(reply: Any, field: str) -> None:
    assert reply.status_code == 422, (field, reply.status_code, reply.text)
    # The sentence names the field as the request named it (issue 41).
    assert error_of(reply) == {"code": "invalid_input", "message": f"`{field}` {SAID}", "field": field}, reply.text


def test_a_bad_id_is_a_422_naming_its_field_at_every_route(served: Served) -> None:
    subj, good = subject(), str(uuid.uuid4())
    with served.http(served.admin) as http:
        for bad in BAD_IDS:
            refused(http.delete(f"/v1/subjects/{subj}/memories", params={"ids": [good, bad]}), "ids.1")
            refused(http.request("DELETE", f"/v1/subjects/{subj}/memories", json={"memory_ids": [bad]}), "memory_ids.0")
            refused(http.post("/v1/feedback", json={"subject": subj, "memory_ids": [good, good, bad]}), "memory_ids.2")
            if "\n" not in bad:  # a path with a line break in it is no route's (404), as any such path
                refused(http.get(f"/v1/memories/{quote(bad, safe='')}/history", params={"subject": subj}), "memory_id")


def test_mcp_forget_refuses_a_bad_id_in_words(served: Served) -> None:
    connect = over_http(served, {"Authorization": f"Bearer {served.admin}", SUBJECT_HEADER: subject()})

    async def body(c: Client) -> list[Any]:
        return [await c.call_tool("forget", {"memory_ids": [bad]}) for bad in BAD_IDS]
    for bad, result in zip(BAD_IDS, run(connect, body), strict=True):
        said = text_of(result)
        assert result.is_error and "memory_ids" in said and SAID in said, (bad, said)
        assert "pattern" not in said and "^[" not in said, said


@pytest.mark.parametrize("call, fields, field", [
    (rpc.ROLLBACK, {"to_version": 1}, "memory_id"), (rpc.HISTORY, {}, "memory_id"),
    (rpc.REVIEW_DECIDE, {"accept": True}, "memory_id")])
def test_the_sdk_refuses_a_bad_id_before_sending_it(served: Served, call: Any, fields: dict[str, Any],
                                                     field: str) -> None:
    for bad in BAD_IDS:
        with pytest.raises(InvalidInput) as refusal:
            served.system.client.call(call, memory_id=bad, **fields)
        assert (refusal.value.field, refusal.value.reason) == (field, SAID), bad
