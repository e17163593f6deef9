"""LLM query planning: the deep path for ambiguous queries only (docs/ranking.md#llm-planning).

The heuristic planner answers every query; `pipeline.plan.is_ambiguous` says when a model
could do better ("那个项目后来怎么样了" names nothing; two intents nearly tied). The reply is
refused unless it names a known intent and at most three routes with known dirs and
strategies; weights are clamped. The routes keep the whole-subject net and the topic route
of the heuristic plan, so a model's plan can narrow where to look first but never make a
query miss what the heuristic plan would find.
"""

from __future__ import annotations

from typing import get_args

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from memflow.pipeline.models import Dir, QueryPlan, Route, Strategy
from memflow.pipeline.plan import INTENT_DIRS, Intent
from memflow.pipeline.prompting import DATA_RULES, Message, Refused, clamp, data_block, json_object, messages
from memflow.pipeline.statements import normal

MAX_ROUTES = 3
WEIGHT_RANGE = (0.1, 1.0)
MAX_ROUTE_CHARS = 200
INTENTS = frozenset(get_args(Intent))


class _Route(BaseModel):
    model_config = ConfigDict(extra="forbid")

    text: str = Field(min_length=1, max_length=MAX_ROUTE_CHARS)
    dirs: list[Dir] = Field(default_factory=list, max_length=len(Dir))
    strategy: Strategy = "semantic"
    weight: float = 1.0


class _Plan(BaseModel):
    model_config = ConfigDict(extra="forbid")

    intent: str
    routes: list[_Route] = Field(min_length=1, max_length=MAX_ROUTES)

    @field_validator("intent")
    @classmethod
    def _known(cls, intent: str) -> str:
        if intent not in INTENTS:
            raise ValueError(f"unknown intent {intent!r}")
        return intent


def cache_key(query: str) -> str:
    """The normalised query a cached plan is filed under (case, spaces and punctuation do not matter)."""
    return normal(query)


def prompt(query: str, context: list[str] | None = None) -> list[Message]:
    """The planning prompt: the intents and where each looks, the query (and recent turns) as data."""
    table = "\n".join(f"- {intent}: {', '.join(d.value for d in dirs) or 'everything'}"
                      for intent, dirs in INTENT_DIRS.items())
    system = "\n\n".join([
        "memflow query planning",
        "You plan a search over a user's long-term memories. The query may refer to something without naming "
        "it (\"that project\", \"上次那个\"); rewrite it into self-contained search texts.",
        DATA_RULES.format(name="query"),
        f"Intents and the directories they search:\n{table}",
        f"Directories: {', '.join(d.value for d in Dir)}. Strategies: semantic, bm25, exact_match.",
        'Reply with one JSON object and nothing else: {"intent": ..., "routes": [{"text": ..., "dirs": [...], '
        f'"strategy": ..., "weight": 0..1}}]}} with 1 to {MAX_ROUTES} routes.',
    ])
    return messages(system, data_block("query", {"query": query, "recent": context or []}))


def read_reply(reply: str, heuristic: QueryPlan) -> QueryPlan:
    """The model's plan, validated, with the heuristic plan's safety routes kept (`Refused` otherwise)."""
    try:
        parsed = _Plan.model_validate(json_object(reply))
    except ValidationError as exc:
        first = exc.errors()[0]
        raise Refused("invalid", f"{'.'.join(str(p) for p in first['loc'])}: {first['msg']}") from None
    routes = [Route(text=r.text, dirs=r.dirs, strategy=r.strategy, weight=clamp(r.weight, *WEIGHT_RANGE))
              for r in parsed.routes]
    kept = [r for r in heuristic.routes if r.keys or not r.dirs]  # topic key and whole-subject net
    return QueryPlan(intent=parsed.intent, routes=routes + [r for r in kept if r not in routes], source="llm")
