"""LLM conflict judgement: what a new statement is to one the rules cannot place (docs/write-path.md#the-llm-judge).

The resolver asks only where the rules cannot tell (`pipeline.resolve.decide` names those
memories through its `judge` argument): a new value of a fact or a decision on a known key
that is no correction, or a close statement under another key. The answer is one of three
relations, and anything else — prose, an unknown word, a missing id — counts as a
contradiction: the safe reading, since it flags both and overrides nothing.
"""

from __future__ import annotations

from typing import Literal, get_args

from memflow.pipeline.models import Candidate, Memory
from memflow.pipeline.prompting import DATA_RULES, Message, Refused, data_block, json_object, messages

Verdict = Literal["version_update", "complementary", "contradiction"]
VERDICTS = frozenset(get_args(Verdict))
SAFE: Verdict = "contradiction"


def prompt(candidate: Candidate, known: list[Memory]) -> list[Message]:
    system = "\n\n".join([
        "memflow conflict judgement",
        "You compare a new statement about a user with statements already remembered about them.",
        DATA_RULES.format(name="statements"),
        "For each known statement give its relation to the new one: \"version_update\" (the new one replaces it: "
        "it is out of date), \"complementary\" (both hold: different aspects), or \"contradiction\" (they cannot "
        "both be true and the new one does not say it replaces the old).",
        'Reply with one JSON object and nothing else: {"relations": [{"id": "k1", "relation": ...}]}.',
    ])
    data = {"new": {"said_at": candidate.ts.date().isoformat(), "text": candidate.content},
            "known": [{"id": f"k{i}", "said_at": m.created_at.date().isoformat(), "text": m.content}
                      for i, m in enumerate(known, 1)]}
    return messages(system, data_block("statements", data))


def read_reply(reply: str, known: list[Memory]) -> tuple[dict[str, Verdict], int]:
    """The verdict per known memory id, and how many answers were unreadable (each read as a contradiction)."""
    try:
        relations = json_object(reply).get("relations")
    except Refused:
        relations = None
    given: dict[str, object] = {}
    if isinstance(relations, list):
        given = {str(r.get("id")): r.get("relation") for r in relations if isinstance(r, dict)}
    verdicts: dict[str, Verdict] = {}
    unknown = 0
    for i, memory in enumerate(known, 1):
        answer = given.get(f"k{i}")
        if answer in VERDICTS:
            verdicts[memory.id] = answer  # type: ignore[assignment]
        else:
            verdicts[memory.id], unknown = SAFE, unknown + 1
    return verdicts, unknown
