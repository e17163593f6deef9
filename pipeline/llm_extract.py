"""LLM extraction: prompts per memory type, and strict reading of the replies (docs/write-path.md#llm-extraction).

Pure: the extract worker sends the prompts and hands the replies back. A task becomes a few
`Batch`es, one per (prompt kind × slice of the transcript); each batch's reply either
becomes candidates in full or is refused as a whole, and then the rules' statements of the
same kind and the same turns stand in for it (`fill_in`). Nothing is ever lost silently:
the caller counts every refusal.

What a reply may do is narrower than what it may say:
- types outside its kind's list, unknown topics (keys) and dirs, and unknown fields are refused;
- `evidence` must quote the turn it names, and `turn` must be one of the transcript's;
- confidence is clamped into its source's band (said outright 0.9–0.95; inferred 0.4–0.6);
- the subject, the status, the directory and the key are never the model's to set: they
  come from the task, the resolver and the tagger;
- a rule or a `system` item is written at once only when the rules read the same words as a
  rule too; otherwise it is the model's inference and waits for review (pipeline.resolve).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from memflow.pipeline.cues import TOPICS
from memflow.pipeline.drafts import EMPHATIC_CONFIDENCE, EXPLICIT_CONFIDENCE, Draft, stamp
from memflow.pipeline.extract import gated, statement_key, statement_slot, timed
from memflow.pipeline.gate import gate
from memflow.pipeline.holders import holder_named
from memflow.pipeline.models import Candidate, Dir, ExtractTask, MType, Role, Source, TriggerReason, Turn
from memflow.pipeline.prompting import DATA_RULES, Message, Refused, clamp, data_block, json_object, messages
from memflow.pipeline.statements import CJK, normal
from memflow.pipeline.topics import TEMPORARY, normalize_key
from memflow.pipeline.triggers import read_cues

PromptKind = Literal["preferences", "decisions", "procedures", "context"]

# What each prompt may return. The rules' statements of these types are what a refused reply falls back on.
KIND_TYPES: dict[PromptKind, frozenset[MType]] = {
    "preferences": frozenset({MType.preference, MType.temp_preference, MType.rule}),
    "decisions": frozenset({MType.decision}),
    "procedures": frozenset({MType.skill}),
    "context": frozenset({MType.fact, MType.event}),
}
# Which prompts a trigger asks (docs/write-path.md#llm-extraction): what a realtime signal names; business context,
# preferences and decisions in one batch at session end; decisions and, on success, procedures
# when a task completes. An explicit write is typed by the rules: it says what it is.
SIGNAL_KINDS: dict[str, tuple[PromptKind, ...]] = {
    "preference": ("preferences",),
    "rule": ("preferences",),
    "decision": ("decisions",),
    "correction": ("preferences", "context"),
    "remember": ("preferences", "context"),
}
SESSION_KINDS: tuple[PromptKind, ...] = ("preferences", "decisions", "context")

# A slice of transcript per prompt: long sessions are read in pieces, never truncated.
MAX_BATCH_CHARS = 6000
MAX_ITEMS = 40
MAX_CONTENT_CHARS = 500
INFERRED_BAND = (0.4, 0.6)
EXPLICIT_BAND = (EXPLICIT_CONFIDENCE, EMPHATIC_CONFIDENCE)
KNOWN_TOPICS = frozenset(t.key for t in TOPICS)
# Kinds whose statements may be filed under a known topic (the others are keyed by their own words).
_TOPICAL = frozenset({"preferences", "context"})
_PLACEHOLDER = re.compile(r"\[REDACTED:[a-z_]+\]")

_ASK: dict[PromptKind, str] = {
    "preferences": (
        "Extract the user's lasting preferences (type \"preference\"), wishes for now only (\"temp_preference\") "
        "and standing instructions (\"rule\"). For each: source \"explicit\" if the user said it, \"inferred\" if "
        "you read it from behaviour; confidence 0..1; domain (e.g. communication_style, output_format, tools, "
        "food); evidence quoting the turn word for word. Skip vague signals (\"ok\", \"thanks\")."
    ),
    "decisions": (
        "Extract decisions the user confirmed (type \"decision\"): what was chosen, the reasoning, and the "
        "alternatives rejected (with why). Skip options still being discussed."
    ),
    "procedures": (
        "The task succeeded. Extract the procedure that worked (type \"skill\") as a title and its steps, "
        "only if it would help the next time the same task comes up."
    ),
    "context": (
        "Extract lasting facts about the user, their people, projects and business (type \"fact\") and dated "
        "events or plans (type \"event\", keep the time words of the turn in the content). One fact per item, "
        "self-contained, in the language of the turn: \"I live in Hamburg and work as a nurse\" is two items, "
        "each with the span of the turn it rests on as evidence. A new value said in passing (\"we moved to…\", "
        "\"I don't … anymore\", \"现在改成…\") is a fact of its own, in the turn's words, with its topic."
    ),
}
_WORDING = (
    "Write each content as a self-contained statement in the user's own words and the turn's language "
    "(\"I prefer short answers\", \"我住在上海\"): the same statement must come out the same way every time."
)
_SHAPE = (
    'Reply with one JSON object and nothing else: {"items": [{"type": ..., "content": ..., "turn": <the t-id of '
    'the turn>, "evidence": <a span quoted from that turn>, "source": "explicit"|"inferred", "confidence": 0..1, '
    '"domain"?: ..., "topic"?: <one of the known topics, or omit>, "reasoning"?: ..., '
    '"alternatives_rejected"?: [...], "steps"?: [...], "about"?: "self" or whom it is about ("mother", '
    '"wife\'s sister", a name)}]}. {"items": []} when there is nothing to keep.'
)


@dataclass(frozen=True)
class Batch:
    """One prompt: a kind, over some turns (t1, t2… in the prompt, mapped back to event ids here)."""

    kind: PromptKind
    turns: tuple[Turn, ...]

    @property
    def event_ids(self) -> frozenset[str]:
        return frozenset(t.event_id for t in self.turns)


class Item(BaseModel):
    """One statement as a reply gives it. Unknown fields are refused (a reply may not set subject or status)."""

    model_config = ConfigDict(extra="forbid")

    type: MType
    content: str = Field(min_length=1, max_length=MAX_CONTENT_CHARS)
    turn: str
    evidence: str = Field(min_length=1)
    source: Literal["explicit", "inferred"] = "explicit"
    confidence: float = EXPLICIT_CONFIDENCE
    domain: str | None = Field(default=None, max_length=60)
    topic: str | None = None
    dir: Dir | None = None
    reasoning: str | None = Field(default=None, max_length=MAX_CONTENT_CHARS)
    alternatives_rejected: list[str] = Field(default_factory=list, max_length=10)
    steps: list[str] = Field(default_factory=list, max_length=30)
    # Whom the statement is about: "self", or the person ("mother", "wife's sister", a name); None: the rules read it.
    about: str | None = Field(default=None, min_length=1, max_length=60)

    @field_validator("topic")
    @classmethod
    def _known_topic(cls, topic: str | None) -> str | None:
        if topic is not None and topic not in KNOWN_TOPICS:
            raise ValueError(f"unknown topic {topic!r}")
        return topic


class Reply(BaseModel):
    model_config = ConfigDict(extra="forbid")

    items: list[Item] = Field(max_length=MAX_ITEMS)


def kinds_for(task: ExtractTask) -> tuple[PromptKind, ...]:
    """The prompts a task is worth (none for an explicit write: it is typed by the rules)."""
    if task.reason is TriggerReason.realtime:
        wanted = {k for s in task.signals for k in SIGNAL_KINDS.get(s, ())}
        return tuple(k for k in KIND_TYPES if k in wanted)
    if task.reason is TriggerReason.session_end:
        return SESSION_KINDS
    if task.reason is TriggerReason.task_complete:
        return ("decisions", "procedures") if task.outcome == "success" else ("decisions",)
    return ()


def batches(task: ExtractTask, max_chars: int = MAX_BATCH_CHARS) -> list[Batch]:
    """Every prompt of the task: each kind over slices of the gated transcript of at most `max_chars`."""
    kinds = kinds_for(task)
    turns = [t for t in gated(task.turns) if t.role is not Role.tool or "procedures" in kinds]
    if not kinds or not any(t.role is Role.user for t in turns):
        return []
    return [Batch(kind, piece) for kind in kinds for piece in _slices(turns, max_chars)]


def _slices(turns: Sequence[Turn], max_chars: int) -> list[tuple[Turn, ...]]:
    pieces: list[tuple[Turn, ...]] = []
    piece: list[Turn] = []
    size = 0
    for turn in turns:
        if piece and size + len(turn.text) > max_chars:
            pieces.append(tuple(piece))
            piece, size = [], 0
        piece.append(turn)
        size += len(turn.text)
    return [*pieces, tuple(piece)] if piece else pieces


def prompt(batch: Batch) -> list[Message]:
    """The chat messages of one batch: instructions in the system message, the transcript as data."""
    system = "\n\n".join([
        f"memflow extraction: {batch.kind}",
        "You extract long-term memories for an assistant from a conversation.",
        DATA_RULES.format(name="transcript"),
        _ASK[batch.kind],
        _WORDING,
        f"Allowed types: {', '.join(sorted(t.value for t in KIND_TYPES[batch.kind]))}.",
        *([f"Known topics: {', '.join(sorted(KNOWN_TOPICS))}."] if batch.kind in _TOPICAL else []),
        _SHAPE,
    ])
    transcript = [{"t": f"t{i}", "role": t.role.value, **({"speaker": t.speaker} if t.speaker else {}), "text": t.text}
                  for i, t in enumerate(batch.turns, 1)]
    return messages(system, data_block("transcript", transcript))


def read_reply(task: ExtractTask, batch: Batch, reply: str) -> tuple[list[Candidate], int]:
    """The candidates a reply gives, and how many of its items were dropped as out of scope (a statement
    the assistant made, or one holding a redacted secret: the rules drop those too). Any item out of
    bounds refuses the whole reply (`Refused`)."""
    try:
        items = Reply.model_validate(json_object(reply)).items
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"])
        raise Refused("invalid", f"{where}: {first['msg']}") from None
    found = [_candidate(task, batch, i, item) for i, item in enumerate(items)]
    kept = [c for c in found if c is not None]
    return kept, len(found) - len(kept)


def _candidate(task: ExtractTask, batch: Batch, index: int, item: Item) -> Candidate | None:
    if item.type not in KIND_TYPES[batch.kind]:
        raise Refused("invalid", f"items.{index}.type: {item.type.value} is not asked by a {batch.kind} prompt")
    turn = _turn(batch, index, item)
    quoted = normal(item.evidence)
    if not quoted or quoted not in normal(turn.text):
        raise Refused("evidence", f"items.{index}.evidence does not quote turn {item.turn}")
    if not gate(item.content, Role.user).keep:
        raise Refused("gated", f"items.{index}.content is what the gate refuses (an injection or filler)")
    if _PLACEHOLDER.search(item.content) or (turn.role is not Role.user and item.type is not MType.skill):
        return None
    draft = timed(_draft(item, turn), turn.ts)
    return stamp(task, turn, draft).model_copy(update={"extractor": "llm"})


def _turn(batch: Batch, index: int, item: Item) -> Turn:
    position = int(item.turn[1:]) if re.fullmatch(r"t\d+", item.turn) else 0
    if not 1 <= position <= len(batch.turns):
        raise Refused("invalid", f"items.{index}.turn: {item.turn!r} is no turn of the transcript")
    return batch.turns[position - 1]


def _draft(item: Item, turn: Turn) -> Draft:
    content = _content(item)
    cue = read_cues(item.evidence)
    inferred = item.source == "inferred" or (_binding(item) and not cue.rule)
    if inferred:
        source, confidence = Source.inferred, clamp(item.confidence, *INFERRED_BAND)
    else:
        # A change said in passing ("we moved to…") replaces its topic's value, as the rules read it too.
        source = Source.explicit_correction if cue.correction or cue.change else Source.explicit
        confidence = clamp(item.confidence, *EXPLICIT_BAND)
    key = _key(item, content)
    # A topic the model named is one thing; the rules' key is what the rules say it is.
    slot = key != statement_key(item.type, item.content) or statement_slot(item.type, item.content)
    return Draft(mtype=item.type, key=key, content=content, evidence=item.evidence.strip(),
                 source=source, confidence=round(confidence, 4), slot=slot,
                 about=None if item.about is None else holder_named(item.about))


def _binding(item: Item) -> bool:
    """A rule, or anything the model files under `system`: it binds the assistant, so only the user's
    own words (read as a rule by the rules too) make it one without review."""
    return item.type is MType.rule or item.dir is Dir.system


def _content(item: Item) -> str:
    zh = bool(CJK.search(item.content))
    parts = [item.content.strip()]
    if item.reasoning:
        parts.append(("理由：" if zh else "because ") + item.reasoning.strip())
    if item.alternatives_rejected:
        parts.append(("未选：" if zh else "rejected: ") + "; ".join(a.strip() for a in item.alternatives_rejected))
    if item.steps:
        parts.append(("步骤：" if zh else "steps: ") + " → ".join(s.strip() for s in item.steps))
    return ("；" if zh else "; ").join(parts)[: 4 * MAX_CONTENT_CHARS]


def _key(item: Item, content: str) -> str:
    """The rules' key for the same statement, so LLM and rule memories resolve against each other; a known
    topic the model names is used when the rules find none."""
    key = statement_key(item.type, item.content)
    if item.topic is None or item.type not in (MType.preference, MType.temp_preference, MType.fact):
        return key
    if key.removesuffix(TEMPORARY) in KNOWN_TOPICS:
        return key
    return normalize_key(item.topic) + (TEMPORARY if item.type is MType.temp_preference else "")


def fill_in(batch: Batch, rule_statements: Sequence[Candidate]) -> list[Candidate]:
    """The rules' statements that stand in for a refused batch: its kind's types, from its turns."""
    types, events = KIND_TYPES[batch.kind], batch.event_ids
    return [c for c in rule_statements if c.mtype in types and events.intersection(c.source_event_ids)]


def missed(task: ExtractTask, batch: Batch, found: Sequence[Candidate],
           rule_statements: Sequence[Candidate]) -> list[Candidate]:
    """The rules' statements that stand in when the model keeps nothing of a realtime turn. Such a turn
    carries an explicit signal ("remember", a correction, a stated preference): an explicit request
    is never dropped quietly. At session end an empty reply is the model's judgement and stands."""
    if found or task.reason is not TriggerReason.realtime:
        return []
    return fill_in(batch, rule_statements)


def uncovered(task: ExtractTask, rule_statements: Sequence[Candidate]) -> list[Candidate]:
    """The rules' statements of types no prompt of this task asks for (kept as they are)."""
    asked = {t for kind in kinds_for(task) for t in KIND_TYPES[kind]}
    return [c for c in rule_statements if c.mtype not in asked]
