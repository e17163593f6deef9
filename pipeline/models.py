"""The domain: what flows between the stages and what the store keeps.

Pure pydantic, no I/O. Every model that crosses a process boundary (stream entry,
RQ argument, store payload) forbids unknown fields, so a typo or a message from a
newer schema fails loudly instead of being half-read. The checks their validators run, and the limits
they hold values to, are pipeline/checks.py.
"""

from __future__ import annotations

import math
from datetime import datetime
from enum import Enum
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from memflow.pipeline.checks import DEFAULT_MAX_TEXT_BYTES, encodable, finite_vector, plain_meta

# shared/sdk/rpc.py takes the timestamp checks from here, with the models they check.
from memflow.pipeline.checks import aware as aware
from memflow.pipeline.checks import event_time as event_time
from memflow.pipeline.tokens import within_query_limit

SCHEMA_VERSION = 1
SUBJECT_PATTERN = r"^[A-Za-z0-9._:/-]{1,128}$"
Subject = Annotated[str, Field(pattern=SUBJECT_PATTERN)]
# A memory's id is a UUID (pipeline/ids.py; the store takes no other point id): anything else is
# refused where it comes in, naming the field, instead of failing in the store (shared/sdk/rpc.py `MemoryId`).
MEMORY_ID_PATTERN = r"^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$"
Extractor = Literal["rules", "llm"]
# Whom a memory is about (pipeline/holders.py): "self", a relation chain ("wife.sister"), a name (":tom") or both
# ("friend:小李"). Bounded and free of separators a key or a log line would misread.
HOLDER_PATTERN = r"^[^\s\x00-\x1f]{1,80}$"
Holder = Annotated[str, Field(pattern=HOLDER_PATTERN, examples=["self", "mother", "wife.sister", "friend:小李"])]


class Wire(BaseModel):
    """Base of every model that travels: strict about unknown fields."""

    model_config = ConfigDict(extra="forbid")


class Kind(str, Enum):
    message = "message"
    session_end = "session_end"
    task_complete = "task_complete"
    feedback = "feedback"


class Role(str, Enum):
    user = "user"
    assistant = "assistant"
    tool = "tool"
    system = "system"


class Dir(str, Enum):
    preferences = "preferences"
    entities = "entities"
    events = "events"
    patterns = "patterns"
    tools = "tools"
    skills = "skills"
    system = "system"
    general = "general"


class MType(str, Enum):
    session_context = "session_context"
    task_state = "task_state"
    temp_preference = "temp_preference"
    preference = "preference"
    fact = "fact"
    event = "event"
    decision = "decision"
    rule = "rule"
    skill = "skill"
    pattern = "pattern"
    insight = "insight"
    # Not in the original type list: what happened in a session, kept verbatim with
    # provenance. It must not decay like session_context (48 h) or it would be gone
    # before anyone asks "what did we talk about last month".
    episode = "episode"


class Source(str, Enum):
    explicit = "explicit"
    explicit_correction = "explicit_correction"
    inferred = "inferred"
    repeated = "repeated"
    derived = "derived"
    tool = "tool"


class Status(str, Enum):
    active = "active"
    contested = "contested"
    superseded = "superseded"
    archived = "archived"
    pending_review = "pending_review"
    deleted = "deleted"


class Tier(str, Enum):
    short_term = "short_term"
    long_term = "long_term"
    archive = "archive"


# What a search may return: everything else is history or held for review.
SEARCHABLE_STATUSES = (Status.active, Status.contested)


# ---------------------------------------------------------------------------
# Events: what agents publish.


class ChatEvent(Wire):
    """One thing an agent saw or said. Validated in the client and again in the trigger worker.

    The text limit comes from validation context (`max_text_bytes`) so that it stays a
    setting without this module reading settings.
    """

    event_id: str = Field(min_length=1, max_length=256)
    subject: Subject
    agent_id: str | None = None
    session_id: str = Field(min_length=1, max_length=256)
    kind: Kind
    role: Role | None = None
    text: str = ""
    ts: datetime
    meta: dict[str, Any] = Field(default_factory=dict)

    _event_time = field_validator("ts")(event_time)
    _encodable = field_validator("agent_id", "text")(encodable)

    @field_validator("text")
    @classmethod
    def _not_oversize(cls, text: str, info: ValidationInfo) -> str:
        limit = (info.context or {}).get("max_text_bytes", DEFAULT_MAX_TEXT_BYTES)
        size = len(text.encode("utf-8"))
        if size > limit:
            raise ValueError(f"is {size} bytes, over the limit of {limit}: split it (it is never truncated)")
        return text

    # Checked here, not when the event is written: what passes validation must reach the
    # pipeline as it is (orjson cannot write NaN, bytes or 2**70, and writes a set as a list).
    _json_meta = field_validator("meta")(plain_meta)

    @model_validator(mode="after")
    def _message_shape(self) -> ChatEvent:
        if self.kind is Kind.message and (self.role is None or not self.text.strip()):
            raise ValueError("a message event needs a role and a non-empty text")
        return self


class Turn(Wire):
    """A message as the trigger keeps it: gated, redacted, with its provenance."""

    event_id: str
    role: Role
    text: str
    ts: datetime
    speaker: str | None = None

    _event_time = field_validator("ts")(event_time)


class TriggerReason(str, Enum):
    realtime = "realtime"
    session_end = "session_end"
    task_complete = "task_complete"
    explicit_write = "explicit_write"


class ExtractTask(Wire):
    """trigger → extract: some turns, and why they are worth reading now."""

    subject: Subject
    session_id: str
    reason: TriggerReason
    signals: list[str] = Field(default_factory=list)
    turns: list[Turn]
    ts: datetime
    outcome: str | None = None
    external_ref: str | None = None

    _event_time = field_validator("ts")(event_time)


# ---------------------------------------------------------------------------
# Candidates and writes.


class Candidate(Wire):
    """extract → resolve: one self-contained statement that may become a memory."""

    subject: Subject
    session_id: str | None = None
    mtype: MType
    dir: Dir
    key: str = Field(min_length=1, max_length=200)
    content: str = Field(min_length=1)
    confidence: float = Field(ge=0.0, le=1.0)
    importance: float = Field(default=0.5, ge=0.0, le=1.0)
    source: Source
    evidence: str = ""
    source_event_ids: list[str] = Field(min_length=1)
    ts: datetime
    expires_at: datetime | None = None
    pinned: bool = False
    tag_version: int = 1
    external_ref: str | None = None
    # The turns around a verbatim record: indexed for keyword search, never shown (see Memory.context).
    context: str = ""
    context_event_ids: list[str] = Field(default_factory=list)
    # How many times upsert sent this candidate back because it was built on a stale version.
    retries: int = 0
    # Its key names one single-valued thing (a topic, an attribute), so that a newer value on the key
    # replaces it; False for a key made of a statement's first words, shared by chance.
    slot: bool = True
    # Who read it from the text: the rules, or an LLM (pipeline/llm_extract.py).
    extractor: Extractor = "rules"
    # Whom it is about (pipeline/holders.py): "self", or a person by relation and/or name.
    about: Holder = "self"

    _event_time = field_validator("ts")(event_time)
    _aware = field_validator("expires_at")(aware)


class Revision(Wire):
    """One change to a stored point: when, why, and the values it replaced (its history)."""

    rev: int
    at: datetime
    why: str
    before: dict[str, Any] = Field(default_factory=dict)

    _aware = field_validator("at")(aware)


class Memory(Wire):
    """A point in the store: the payload of one version of one memory."""

    id: str
    subject: Subject
    uri: str
    dir: Dir
    mtype: MType
    key: str
    content: str
    confidence: float = Field(ge=0.0, le=1.0)
    importance: float = Field(default=0.5, ge=0.0, le=1.0)
    source: Source
    status: Status = Status.active
    tier: Tier = Tier.short_term
    created_at: datetime
    updated_at: datetime
    last_accessed_at: datetime | None = None
    access_count: int = 0
    strength: float = 1.0
    # When the decay job last computed `strength` (it never rises again without a use or a restatement).
    strength_at: datetime | None = None
    pinned: bool = False
    expires_at: datetime | None = None
    valid_from: datetime | None = None
    valid_to: datetime | None = None
    version: int = 1
    # Revision of this point's payload: every patch must name the revision it was built on.
    rev: int = 1
    supersedes: str | None = None
    superseded_by: str | None = None
    conflicts_with: list[str] = Field(default_factory=list)
    # Its support (sessions that stated it + uses that adopted it) when it was drawn into its
    # contest: review weighs what was gathered since, not the uses that made it worth contesting.
    contested_support: int = Field(default=0, ge=0)
    source_event_ids: list[str] = Field(default_factory=list)
    session_ids: list[str] = Field(default_factory=list)
    evidence: str = ""
    tag_version: int = 1
    external_ref: str | None = None
    # The turns around an episode in its session (two before, one after: pipeline/extract.py).
    # A reply ("Yes, twice — in May and June") means nothing without the question it answers:
    # keyword search matches content + context (LoCoMo R@5 +8 points), while search results and
    # prompts show content.
    context: str = ""
    # The turns just before and after it: a search adds part of their keyword score to this one's.
    context_event_ids: list[str] = Field(default_factory=list)
    # Every change made to this point since it was written, oldest first: a new value of the
    # memory is a new version (another point), and a change of state is logged here, so
    # `memflow history` can say what each version was and why it changed.
    revisions: list[Revision] = Field(default_factory=list)
    extractor: Extractor = "rules"
    # Its key names one single-valued thing (Candidate.slot). Points written before it was recorded: True.
    slot: bool = True
    # The operation that last changed this point ("<mutation id>:<op index>"): a retry of a mutation
    # cut short recognises what it already wrote (docs/write-path.md#the-applier).
    last_op: str | None = None
    # The count that last added uses to this point ("<mutation id>:<op index>"): a fold of uses redone after
    # a crash (shared/writer/uses.py) counts them once. Apart from `last_op`: a count moves no revision.
    last_count: str | None = None
    # Whom it is about (Candidate.about). Points written before it was recorded: the user's own.
    about: Holder = "self"

    _aware = field_validator("created_at", "updated_at", "last_accessed_at", "strength_at", "expires_at",
                             "valid_from", "valid_to")(aware)

    @field_validator("strength")
    @classmethod
    def _finite(cls, strength: float) -> float:
        # "NaN" reads as a float; a NaN strength would rank every search it takes part in at random.
        if not math.isfinite(strength):
            raise ValueError("strength must be a finite number")
        return strength


class PutOp(Wire):
    """Write a new point. Its id is deterministic, so writing it twice is one point."""

    op: Literal["put"] = "put"
    memory: Memory


class PatchOp(Wire):
    """Change fields of an existing point, only if it is still at `expected_rev`.

    `add_*` lists are unions, so a redelivered patch adds nothing twice.
    """

    op: Literal["patch"] = "patch"
    id: str
    expected_rev: int
    set: dict[str, Any] = Field(default_factory=dict)
    add_source_event_ids: list[str] = Field(default_factory=list)
    add_session_ids: list[str] = Field(default_factory=list)
    why: str
    # Bookkeeping (strength refreshes): checked against the revision like any patch, but it neither
    # moves the revision nor enters the history or the `changes` feed.
    quiet: bool = False


class CountOp(Wire):
    """Count uses of a point: added to the count it holds when applied, so none is lost to a race."""

    op: Literal["count"] = "count"
    id: str
    uses: int = Field(default=1, ge=1)
    at: datetime

    _aware = field_validator("at")(aware)


class DeleteOp(Wire):
    """Purge a point from the index (after its soft delete has been announced)."""

    op: Literal["delete"] = "delete"
    id: str


WriteOp = Annotated[PutOp | PatchOp, Field(discriminator="op")]
MutationOp = Annotated[PutOp | PatchOp | CountOp | DeleteOp, Field(discriminator="op")]


class Action(str, Enum):
    add = "add"
    duplicate = "duplicate"
    supersede = "supersede"
    contest = "contest"
    review = "review"
    complement = "complement"
    reactivate = "reactivate"


class WriteBatch(Wire):
    """resolve → upsert: what one candidate changes, applied together or sent back."""

    subject: Subject
    action: Action
    why: str
    candidate: Candidate
    ops: list[WriteOp]
    # The embedding of the candidate's content, for the PutOp (computed once in resolve).
    vector: list[float] | None = None
    # The model that made `vector`. A batch still in the stream when `memflow reindex` moves the store
    # to another model is decided again (re-embedded) rather than mix two models' vectors in one index.
    vector_model: str | None = None

    @field_validator("vector")
    @classmethod
    def _finite(cls, vector: list[float] | None) -> list[float] | None:
        return finite_vector(vector)


class Mutation(Wire):
    """Every change to stored memories, as one applier applies it (docs/write-path.md#the-applier).

    `id` is derived from what the mutation does, so a retry or a replay of the same change carries
    the same id and its ops are recognised as done. `on_stale` says what a revision that moved on
    means: "send_back" (a write batch: nothing is written, the candidate is decided again), "skip"
    (jobs and ops: that op is left for the next run) or "rebase" (forget: the wish wins over any
    concurrent change).
    """

    id: str
    subject: Subject
    action: str
    why: str
    at: datetime
    ops: list[MutationOp]
    on_stale: Literal["send_back", "skip", "rebase"] = "skip"
    source_event_ids: list[str] = Field(default_factory=list)
    # A put that finds its point written by another op (the same words from the same events) is a redelivery of
    # it and announced; for an import it is a point the store held before, and says nothing (False).
    announce_found: bool = True

    _aware = field_validator("at")(aware)


class Change(Wire):
    """An entry of the `changes` feed: who, what, before → after, why."""

    memory_id: str
    subject: Subject
    action: str
    why: str
    before: dict[str, Any] | None = None
    after: dict[str, Any] | None = None
    at: datetime
    source_event_ids: list[str] = Field(default_factory=list)
    # The point's revision after the change (None: a deletion): the feed is in this order per memory.
    rev: int | None = None

    _aware = field_validator("at")(aware)


# ---------------------------------------------------------------------------
# Reading.

Strategy = Literal["exact_match", "semantic", "bm25"]


class Route(Wire):
    text: str
    dirs: list[Dir] = Field(default_factory=list)
    strategy: Strategy = "semantic"
    weight: float = Field(default=1.0, ge=0.0, le=10.0)
    # Only memories stored under one of these topic keys (the topic the query asks about).
    keys: list[str] = Field(default_factory=list, max_length=5)


class Period(Wire):
    """A period a question asks about (`pipeline.timeref.asked_period`): [start, end)."""

    start: datetime
    end: datetime
    label: str


class QueryPlan(Wire):
    intent: str
    routes: list[Route] = Field(min_length=1)
    source: Literal["heuristic", "llm"] = "heuristic"
    fallback: bool = False
    # What was said in this period ranks higher (pipeline.score.in_period).
    period: Period | None = None
    # Whom the query asks about (pipeline.holders.asked_holder): memories about someone else rank lower.
    about: str | None = None


# A query: at most 32 KB (checked first: a length), then at most what the encoders read (pipeline/tokens.py).
QueryText = Annotated[str, Field(min_length=1, max_length=DEFAULT_MAX_TEXT_BYTES), AfterValidator(within_query_limit)]


class SearchRequest(Wire):
    subject: Subject
    query: QueryText
    k: int = Field(default=5, ge=1, le=200)
    now: datetime | None = None
    dirs: list[Dir] | None = None
    mtypes: list[MType] | None = None
    # Only memories about this person ("self", "mother", "friend:小李"; pipeline/holders.py).
    about: Holder | None = None

    _aware = field_validator("now")(aware)


class Hit(Wire):
    id: str
    content: str
    dir: Dir
    mtype: MType
    key: str
    status: Status
    tier: Tier
    confidence: float
    score: float
    scores: dict[str, float] = Field(default_factory=dict)
    source_event_ids: list[str] = Field(default_factory=list)
    created_at: datetime
    contested: bool = False
    # Whom it is about: "self" (the user) or a person in the user's life (pipeline/holders.py).
    about: str = "self"
    # Said and not stored yet (the read-your-writes layer, pipeline/pending.py): `event_id` is the event it
    # comes from, `superseding` the stored memory it is about to replace. Its `id` is its own until it lands.
    pending: bool = False
    event_id: str | None = None
    superseding: str | None = None


class SearchResult(Wire):
    """What a search says. `status` tells "found nothing" (empty) from "could not look" (failed)."""

    subject: str
    query: str
    status: Literal["ok", "empty", "failed"]
    hits: list[Hit] = Field(default_factory=list)
    plan: QueryPlan | None = None
    fallback: bool = False
    error: str | None = None
    latency_ms: float = 0.0


class PackedPrompt(Wire):
    system: str
    preferences: list[str] = Field(default_factory=list)
    rules: list[str] = Field(default_factory=list)
    memories: list[str] = Field(default_factory=list)
    used_ids: list[str] = Field(default_factory=list)
    # The events whose words were packed while still pending (said, not stored yet).
    pending_event_ids: list[str] = Field(default_factory=list)
    tokens: int = 0


class Trace(Wire):
    """An entry of the `traces` feed: how one search was answered."""

    subject: str
    query: str  # redacted, at most 200 characters
    intent: str
    source: str
    dirs: list[str] = Field(default_factory=list)
    candidates: list[dict[str, Any]] = Field(default_factory=list)
    chosen: list[str] = Field(default_factory=list)
    fallback: bool = False
    status: str
    error: str | None = None
    latency_ms: float
    now: datetime
    kind: Literal["search"] = "search"
    # Why an LLM plan was asked for and not used (timeout, invalid…): the heuristic plan answered.
    plan_error: str | None = None
    # The period the query named, whose memories ranked higher (QueryPlan.period's label).
    period: str | None = None


class LLMTrace(Wire):
    """An entry of the `traces` feed for one LLM call: an extraction batch, a judgement or a plan.

    A fallback says why and what stood in, so a failing model is never an empty list that
    looks like "nothing to remember"."""

    kind: Literal["llm"] = "llm"
    purpose: str
    subject: str
    session_id: str | None = None
    outcome: Literal["ok", "fallback"]
    reason: str | None = None
    detail: str | None = None  # redacted, at most 200 characters
    items: int = 0  # what the LLM gave: candidates, verdicts, routes
    stand_ins: int = 0  # what the rules gave instead, on a fallback
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_ms: float = 0.0
    at: datetime
