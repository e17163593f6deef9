"""The query worker's calls: one table, a request model and a reply model each.

The client (`shared.sdk.client.MemoryClient`) and the worker (`workers.query`) are both built from
`RPCS`: the client validates a request, enqueues it as the job's keyword arguments and
validates the reply; the worker validates the request again (whoever enqueued it) and hands it
to its handler with the worker's context. A job's function name is `workers.query.<name>`,
which is also the name the scheduler enqueues its firings under (scheduler/firings.py).

Replies keep the field names the callers have always read; times a handler writes as ISO text
(`IsoTime`) are written back exactly so.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, PlainSerializer, WithJsonSchema, field_validator
from pydantic_core import PydanticCustomError

from memflow.pipeline.export import Record
from memflow.pipeline.feed import REVISION_PATTERN
from memflow.pipeline.models import (
    MEMORY_ID_PATTERN,
    Memory,
    MType,
    PackedPrompt,
    QueryText,
    Revision,
    SearchRequest,
    SearchResult,
    Source,
    Status,
    Subject,
    Tier,
    Wire,
    aware,
    event_time,
)
from memflow.pipeline.prefixes import is_prefix
from memflow.pipeline.profile import ProfileReply
from memflow.pipeline.scopes import PATTERN_CHARS
from memflow.shared.errors import InvalidInput
from memflow.shared.inference import tokenizer

# A memory id, or its start (pipeline/prefixes.py): 4 to 8 hex digits, or 8, a dash and 1 to 4 more.
MEMORY_REF_PATTERN = (r"^([0-9a-fA-F]{4,8}|[0-9a-fA-F]{8}-[0-9a-fA-F]{1,4}|[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}"
                      r"-[0-9a-fA-F]{4}-[0-9a-fA-F]{12})$")

# A query is counted in e5's positions by its tokenizer, in every process that takes one (pipeline/tokens.py).
tokenizer.install()

# The module RQ jobs of the query worker are named in: `workers.query.search`, `workers.query.run_job`...
WORKERS_MODULE = "memflow.workers.query"

# A time on the wire, written back as the handler wrote it (`isoformat()`: "+00:00", not "Z").
IsoTime = Annotated[datetime, PlainSerializer(lambda t: t.isoformat(), return_type=str, when_used="json")]

# Names one call of a client, so that its retries are recognised (printable, bounded: it is kept in Redis).
RequestId = Annotated[str, Field(min_length=1, max_length=128, pattern=r"^[\x21-\x7e]+$")]


def new_request_id() -> str:
    return uuid.uuid4().hex


EXAMPLE_MEMORY_ID = "8fc354c3-f9df-571d-aa52-d8dd7b4db4a7"


def canonical_memory_id(value: str) -> str:
    """A memory id as the store names its points: a UUID, lowercase. Any other text is an input error naming
    the field, in words (`../../etc/passwd` reached the store, and its engine's error text came back as a 503;
    the pattern's own message was a regular expression)."""
    if re.fullmatch(MEMORY_ID_PATTERN, value) is None:
        raise PydanticCustomError("memory_id", "not a memory id: a memory id is a UUID, such as {example}",
                                  {"example": EXAMPLE_MEMORY_ID})
    return value.lower()


# Every id a request names, at every door (the HTTP API, /mcp, the inspector, the SDK, the CLI): the client and
# the worker validate a call's request, and the doors take their ids as this type too. Its document is a UUID's.
MemoryId = Annotated[str, AfterValidator(canonical_memory_id), WithJsonSchema(
    {"type": "string", "pattern": MEMORY_ID_PATTERN, "examples": [EXAMPLE_MEMORY_ID]})]


def memory_ref(value: str) -> str:
    """A memory named by its id or by the start of one (pipeline/prefixes.py: as `memflow inspect` shows 8),
    lowercase: the worker finds the one id of the subject it starts (workers/ops.py `resolve_ids`). Anything else
    is refused as `MemoryId` refuses it, in the same words at every door."""
    return value.lower() if is_prefix(value) else canonical_memory_id(value)


# Where an operator names a memory to act on (history, rollback, review, forget, feedback): its id or a prefix.
MemoryRef = Annotated[str, AfterValidator(memory_ref), WithJsonSchema(
    {"type": "string", "pattern": MEMORY_REF_PATTERN, "examples": [EXAMPLE_MEMORY_ID, EXAMPLE_MEMORY_ID[:8]]})]


Req = TypeVar("Req", bound=BaseModel)
Rep = TypeVar("Rep", bound=BaseModel)


@dataclass(frozen=True)
class Rpc(Generic[Req, Rep]):
    """One call: its name, what it is asked with and what it answers; `jobs` calls (long maintenance
    runs) wait in their own queue, served by a worker of their own: never in a search's way."""

    name: str
    request: type[Req]
    reply: type[Rep]
    queue: Literal["query", "jobs"] = "query"

    @property
    def job_name(self) -> str:
        return f"{WORKERS_MODULE}.{self.name}"


# -- requests ----------------------------------------------------------------------------


class PackRequest(Wire):
    subject: Subject
    query: QueryText
    budget_tokens: int = Field(default=800, ge=0)
    system_prompt: str = ""
    now: datetime | None = None
    # The uses a pack adopts count once per request id: a retry sends the same one (shared/writer/uses.py).
    request_id: RequestId = Field(default_factory=new_request_id)

    _aware = field_validator("now")(aware)


class ForgetRequest(Wire):
    subject: Subject
    memory_ids: list[MemoryRef] | None = None
    contains: str | None = None


class VerifyRequest(Wire):
    subject: Subject
    memory_ids: list[MemoryId]
    # The words a `forget --contains` named: their raw copies (a secret no memory holds) must be gone too.
    contains: str | None = None


class FeedbackRequest(Wire):
    subject: Subject
    memory_ids: list[MemoryRef]
    at: datetime | None = None
    request_id: RequestId = Field(default_factory=new_request_id)  # counted once per request id

    _aware = field_validator("at")(aware)


class InspectRequest(Wire):
    subject: Subject
    now: datetime | None = None

    # Inspect counts days back from `now` (utilisation): year 1 overflowed into a 503 with a traceback.
    _now = field_validator("now")(lambda now: None if now is None else event_time(now))


class RunJobRequest(Wire):
    # In this order: a scheduled firing names them positionally (scheduler/firings.py).
    name: str
    subject: Subject | None = None
    now: datetime | None = None
    dry_run: bool = False
    tier: Tier | None = None

    _aware = field_validator("now")(aware)


class HistoryRequest(Wire):
    memory_id: MemoryRef
    subject: Subject | None = None
    # Without `subject`: the subject patterns of the key asking (its scope). The worker looks for the memory only
    # among the subjects they cover, so no point of another subject is read for a key that may not see it.
    within: list[Annotated[str, Field(pattern=PATTERN_CHARS.pattern)]] | None = Field(default=None, max_length=64)


class RollbackRequest(Wire):
    memory_id: MemoryRef
    to_version: int
    subject: Subject | None = None
    at: datetime | None = None

    _aware = field_validator("at")(aware)


class ReviewListRequest(Wire):
    subject: Subject | None = None


class HealthRequest(Wire):
    pass


class SubjectsRequest(Wire):
    pass


# The most a profile's prompt text may be asked to hold (tokens).
MAX_PROFILE_TOKENS = 8000


class ProfileRequest(Wire):
    subject: Subject
    since: str | None = Field(default=None, pattern=REVISION_PATTERN)
    max_tokens: int | None = Field(default=None, ge=1, le=MAX_PROFILE_TOKENS)
    now: datetime | None = None

    _aware = field_validator("now")(aware)


class ReviewDecideRequest(Wire):
    memory_id: MemoryRef
    accept: bool
    subject: Subject | None = None
    at: datetime | None = None

    _aware = field_validator("at")(aware)


# The most memories one import call carries: a job's arguments sit in Redis until a worker takes them, and
# the worker embeds those it lacks vectors for (~2 KB a memory, 4 more with a vector: a few MB a call). A
# bigger subject is sent in several calls, the whole file validated first (docs/export-format.md#import).
MAX_IMPORT_RECORDS = 500


# The most points one export call answers: its reply waits in Redis until the caller reads it (~1.2 KB a point,
# ~17 KB with a 768-dim vector), so a subject is exported page by page; a page with vectors is a tenth as long.
MAX_EXPORT_PAGE = 2000


class ExportRequest(Wire):
    """A page of a subject's points, oldest first: those after `after` (the `next` of the page before)."""

    subject: Subject
    with_vectors: bool = False
    after: str | None = Field(default=None, max_length=128)
    limit: int = Field(default=MAX_EXPORT_PAGE, ge=1, le=MAX_EXPORT_PAGE)


class ImportRequest(Wire):
    """Some of one subject's lines of an export, already read and checked against the header they came under.
    `step`: `check` refuses what the store can tell before anything is written and writes nothing; `write`
    imports them; `undo` takes back what an import of these very records wrote (its subject's import was refused
    at a later slice), its deletion announced `at` (docs/export-format.md#a-subject-whole-or-not-at-all)."""

    subject: Subject
    exported_at: datetime
    model: str | None = None
    dim: int | None = Field(default=None, ge=1)
    records: list[Record] = Field(max_length=MAX_IMPORT_RECORDS)
    step: Literal["check", "write", "undo"] = "write"
    at: datetime | None = None
    # The import run these slices belong to: its undo fences it, so a write of the run that comes after its undo
    # (a call the caller gave up on, taken by a worker late) is refused instead of writing what was taken back.
    attempt: str | None = Field(default=None, pattern=r"^[0-9a-f]{32}$")

    _aware = field_validator("exported_at", "at")(aware)


# -- replies -----------------------------------------------------------------------------


class ForgetReport(Wire):
    """What a forget removed: the memories named, the records forgotten with them, and per Redis place how
    many entries holding their words; and what still holds their words (docs/write-path.md#forgetting)."""

    # Always in a reply (the document says so); defaults only for a reply of a worker from before they were.
    model_config = ConfigDict(json_schema_serialization_defaults_required=True)

    count: int
    ids: list[str]
    scrubbed: dict[str, int]
    # The verbatim records of the turns they were distilled from, forgotten with them: they held their words.
    records: list[str] = Field(default_factory=list)
    # Points not forgotten that still hold the forgotten words (a memory not named saying the same): forget them
    # too, or keep them knowingly.
    still_held: list[str] = Field(default_factory=list)

    @property
    def forgotten_ids(self) -> list[str]:
        """Every id it forgot, the memories named and the records with them: what its proof covers."""
        return [*self.ids, *self.records]


class ForgetProof(Wire):
    """`verified` when the store holds no point for any of `ids`, no Redis place still names one and no point
    still holds their words (`still_held`: the ids of those that do); `unknown`: ids with no receipt (never
    forgotten here)."""

    model_config = ConfigDict(json_schema_serialization_defaults_required=True)  # as ForgetReport's

    subject: str
    ids: list[str]
    unknown: list[str]
    in_store: list[str]
    residue: dict[str, int]
    still_held: list[str] = Field(default_factory=list)
    verified: bool


class Adopted(Wire):
    """How many of the named memories were found (and counted as used)."""

    count: int


class LastChange(Wire):
    at: IsoTime
    why: str


class MemoryState(Memory):
    """A memory as inspect shows it: its payload, its strength now and its last change."""

    strength_now: float
    last_change: LastChange


# A subject's memories recalled and adopted over `days`, and the share adopted (counted by workers/ops.py
# `UtilisationCounters`). No docstring: it would change the API's published schema (clients/typescript).
class Utilisation(Wire):
    days: int
    recalled: int
    adopted: int
    share: float | None


class PerUnit(Wire):
    calls: float
    prompt_tokens: float
    completion_tokens: float


class LLMUsage(Wire):
    """The LLM counters of a subject or of everyone (`shared.inference.llm.summarise`)."""

    days: int
    calls: int
    calls_by_purpose: dict[str, int]
    prompt_tokens: int
    completion_tokens: int
    fallbacks: int
    fallbacks_by_reason: dict[str, int]
    mean_latency_ms: float | None = None  # over the calls answered (a timeout or refused connection has none)
    events: int
    candidates: int
    per_event: PerUnit | None
    per_candidate: PerUnit | None


class LLMUse(Wire):
    subject: LLMUsage
    everyone: LLMUsage


class PendingEntry(Wire):
    """What the subject said that is not stored yet (docs/read-your-writes.md), as it is kept: gated."""

    event_id: str
    session_id: str
    text: str
    ts: IsoTime


class Known(Wire):
    """One thing known of a person in the user's life."""

    id: str
    content: str
    mtype: MType
    status: Status
    created_at: IsoTime


class PersonEntry(Wire):
    """A person the subject has talked about (pipeline/holders.py) and what is known of them now."""

    about: str = Field(description='The holder: a relation chain ("wife.sister"), a name (":tom") or both')
    relation: str | None = None
    name: str | None = None
    memories: list[Known]


class People(Wire):
    subject: str
    people: list[PersonEntry]


class InspectReport(Wire):
    subject: str
    now: IsoTime
    memories: list[MemoryState]
    utilisation: Utilisation
    llm: LLMUse | None  # None: no LLM configured
    backlog: dict[str, tuple[int, int]]  # stage → (unread, pending)
    pending: list[PendingEntry] = Field(default_factory=list)
    people: list[PersonEntry] = Field(default_factory=list)


class JobChange(Wire):
    id: str
    subject: str
    content: str
    why: str
    before: dict[str, Any]
    after: dict[str, Any]


class JobWrite(Wire):
    id: str
    subject: str
    content: str


class JobSend(Wire):
    subject: str
    mtype: MType
    key: str
    content: str


class JobUndecided(Wire):
    id: str
    subject: str
    key: str
    content: str


class JobReport(Wire):
    """What a maintenance job changed (or, dry, would change): patched, written new, sent to resolve,
    left undecided, and skipped because the pipeline changed them meanwhile."""

    job: str
    tier: Tier | None
    subjects: int
    examined: int
    dry_run: bool
    now: IsoTime
    changed: list[JobChange]
    written: list[JobWrite]
    sent: list[JobSend]
    undecided: list[JobUndecided]
    skipped: list[str]


class Version(Wire):
    id: str
    version: int
    status: Status
    tier: Tier
    content: str
    source: Source
    confidence: float
    created_at: datetime
    updated_at: datetime
    supersedes: str | None
    superseded_by: str | None
    conflicts_with: list[str]
    source_event_ids: list[str]
    revisions: list[Revision]


class History(Wire):
    """Every version of a memory's key, oldest first; `asked` is the one named."""

    subject: str
    key: str
    asked: str
    versions: list[Version]
    # Whom the memory is about (pipeline/holders.py).
    about: str = "self"


class Restored(Wire):
    id: str
    version: int
    content: str


class RollbackReport(Wire):
    """`restored` is None when the version asked for is already current (nothing changed)."""

    subject: str
    key: str
    to_version: int
    restored: Restored | None
    superseded: list[str]


class Waiting(Wire):
    id: str
    subject: str
    status: Status
    key: str
    mtype: MType
    content: str
    confidence: float
    conflicts_with: list[str]
    created_at: IsoTime


class ReviewList(Wire):
    waiting: list[Waiting]


class Changed(Wire):
    id: str
    after: dict[str, str]


class ReviewDecision(Wire):
    id: str
    accepted: bool
    changed: list[Changed]


class Health(Wire):
    """A query worker's word that it answers and its store does: `memories` counted in the store."""

    store: Literal["ok", "unavailable"]
    memories: int | None = None
    error: str | None = None


class SubjectList(Wire):
    subjects: list[str]


class ExportedSubject(Wire):
    """A page of a subject's stored points, oldest first; `model` and `dim` name the vectors' model when asked
    for; `next`: ask again with `after=next` for the rest (None: that was the last page)."""

    subject: str
    model: str | None = None
    dim: int | None = None
    records: list[Record]
    next: str | None = None


class Imported(Wire):
    """What an import did to one subject: memories `written`; `already` held as the file has them; `kept`
    held here in another state (this store's stands); `forgotten` here, so not written back; `reembedded`: those
    written whose vectors were encoded here (none in the file, or another model's)."""

    subject: str
    memories: int
    written: int
    already: int
    kept: int
    forgotten: int
    reembedded: int


class ImportReport(Wire):
    subjects: list[Imported]


# -- the table -----------------------------------------------------------------------------

SEARCH = Rpc("search", SearchRequest, SearchResult)
PACK = Rpc("pack", PackRequest, PackedPrompt)
FORGET = Rpc("forget", ForgetRequest, ForgetReport)
VERIFY_FORGOTTEN = Rpc("verify_forgotten", VerifyRequest, ForgetProof)
FEEDBACK = Rpc("feedback", FeedbackRequest, Adopted)
INSPECT = Rpc("inspect", InspectRequest, InspectReport)
RUN_JOB = Rpc("run_job", RunJobRequest, JobReport, queue="jobs")
HISTORY = Rpc("history", HistoryRequest, History)
ROLLBACK = Rpc("rollback", RollbackRequest, RollbackReport)
REVIEW_LIST = Rpc("review_list", ReviewListRequest, ReviewList)
REVIEW_DECIDE = Rpc("review_decide", ReviewDecideRequest, ReviewDecision)
HEALTH = Rpc("health", HealthRequest, Health)
SUBJECTS = Rpc("subjects", SubjectsRequest, SubjectList)
PROFILE = Rpc("profile", ProfileRequest, ProfileReply)
# Maintenance-sized (a whole subject, an embedding per memory lacking a vector): the jobs' queue, never a search's.
EXPORT = Rpc("export", ExportRequest, ExportedSubject, queue="jobs")
IMPORT = Rpc("import_subject", ImportRequest, Imported, queue="jobs")

RPCS: dict[str, Rpc[Any, Any]] = {rpc.name: rpc for rpc in (
    SEARCH, PACK, FORGET, VERIFY_FORGOTTEN, FEEDBACK, INSPECT, RUN_JOB, HISTORY, ROLLBACK, REVIEW_LIST,
    REVIEW_DECIDE, HEALTH, SUBJECTS, EXPORT, IMPORT, PROFILE)}


def request_of(rpc: Rpc[Req, Any], args: Sequence[Any], kwargs: dict[str, Any]) -> Req:
    """The request of a job: its keyword arguments are the request's fields; positional ones (a scheduled
    firing's) are its fields in order. ValidationError when they are not a request."""
    fields = list(rpc.request.model_fields)
    if len(args) > len(fields):
        raise InvalidInput("args", f"{rpc.name} takes at most {len(fields)} fields ({', '.join(fields)})")
    return rpc.request.model_validate(dict(zip(fields, args, strict=False)) | kwargs)
