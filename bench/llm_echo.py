"""A script for the scripted LLM server that answers like a model that reads what the rules read.

For cost figures (`memflow bench locomo --llm-stub`) the prompts are memflow's own and real;
what a model answers is not known here, so the replies are sized like the rules' reading of
the same turns: the statements the rule extractor finds (as items quoting their turn), the
heuristic plan of a query, "complementary" for every judgement. Token counts are the stub's
estimate (`bench.llm_stub.estimate_tokens`), not a real tokenizer's.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from typing import Any

from memflow.bench.llm_stub import Reply
from memflow.pipeline.extract import read
from memflow.pipeline.llm_extract import KIND_TYPES
from memflow.pipeline.models import ExtractTask, Role, TriggerReason, Turn
from memflow.pipeline.plan import plan

EXTRACTION = "memflow extraction: "
_T0 = datetime(2026, 1, 1, tzinfo=UTC)
# The date the rules add to an event ("…（2023-05-08）"): memflow dates the model's item itself.
_DATE_LABEL = re.compile(r"\s?[（(][^（()）]*[)）]$")


def purpose(body: dict[str, Any]) -> str:
    """The first line of the system message: which prompt this is."""
    return str(body["messages"][0]["content"]).split("\n", 1)[0]


def data_of(body: dict[str, Any]) -> Any:
    """The JSON data block of the last user message (the transcript, the statements, the query)."""
    inner = str(body["messages"][-1]["content"]).split("\n", 1)[1].rsplit("\n", 1)[0]
    return json.loads(inner)


def echo(body: dict[str, Any]) -> Reply:
    head = purpose(body)
    if head.startswith(EXTRACTION):
        return _extraction(head.removeprefix(EXTRACTION), data_of(body))
    if head == "memflow conflict judgement":
        known = data_of(body)["known"]
        return _json({"relations": [{"id": k["id"], "relation": "complementary"} for k in known]})
    if head == "memflow query planning":
        heuristic = plan(data_of(body)["query"])
        route = heuristic.routes[0]
        return _json({"intent": heuristic.intent, "routes": [{"text": route.text, "strategy": route.strategy,
                                                              "dirs": [d.value for d in route.dirs], "weight": 1}]})
    return Reply(status=400, content=f"unknown prompt {head!r}")


def _extraction(kind: str, transcript: list[dict[str, Any]]) -> Reply:
    # No speaker: memflow prefixes the speaker's name itself when it stamps the item.
    turns = [Turn(event_id=t["t"], role=Role(t["role"]), text=t["text"], ts=_T0 + timedelta(seconds=i))
             for i, t in enumerate(transcript)]
    task = ExtractTask(subject="echo", session_id="echo", reason=TriggerReason.session_end, turns=turns,
                       ts=_T0 + timedelta(days=1), outcome="success")
    types = KIND_TYPES[kind]  # type: ignore[index]
    said = {t.event_id: t.text for t in turns}
    items = [{"type": c.mtype.value, "content": _DATE_LABEL.sub("", c.content), "turn": c.source_event_ids[0],
              "evidence": said[c.source_event_ids[0]], "source": "explicit", "confidence": c.confidence}
             for c in read(task)[1] if c.mtype in types]
    return _json({"items": items})


def _json(value: Any) -> Reply:
    return Reply(content=json.dumps(value, ensure_ascii=False))
