"""The agent-facing SDK.

`publish` validates and appends to the `events` stream (one XADD: well under a
millisecond on a local Redis); the rest are calls to the query worker over RQ, each an RPC of the table in
`shared.sdk.rpc` (a request model validated here and again in the worker, a reply model validated here).
A search that could not be answered comes back with `status="failed"` and the error,
never as an empty list an agent would read as "nothing remembered".

Every connection has a socket timeout (shared/redisdb/connections.client_socket_timeout_s): a reply is waited
for in reads of at most CLIENT_BLOCK_S each, until the call's own timeout, so that a server that stops
answering raises within the socket timeout instead of holding the caller forever. A caller on an event
loop (the HTTP API) sends in a thread (`send`: RQ is sync) and waits for the reply on its loop
(`wait_async`), holding no thread while the query worker works.
"""

from __future__ import annotations

import math
import time
import uuid
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic

import redis
import redis.asyncio
from pydantic import BaseModel, ValidationError
from redis.client import Pipeline
from redis.exceptions import NoScriptError
from rq import Queue, Worker
from rq.job import Job
from rq.results import Result
from rq.serializers import JSONSerializer

from memflow.pipeline import feed, wording
from memflow.pipeline.fates import EventFate, FateAsked, gate_refusal
from memflow.pipeline.feed import ChangesPage
from memflow.pipeline.gate import gate, redact_secrets
from memflow.pipeline.models import ChatEvent, Dir, Kind, MType, PackedPrompt, Role, SearchResult
from memflow.pipeline.profile import ProfileReply
from memflow.shared.changes import feed as feed_pages
from memflow.shared.errors import InvalidInput, NotFound, RpcError, raised_said
from memflow.shared.redisdb.connections import (
    CLIENT_BLOCK_S,
    connect_queue,
    connect_streams,
    load_script,
    replicated,
    safe_url,
)
from memflow.shared.redisdb.durability import fsync_timeout_ms
from memflow.shared.redisdb.keys import STAGES, check_partitions, id_space
from memflow.shared.sdk import transfer
from memflow.shared.sdk.rpc import (
    FEEDBACK,
    FORGET,
    HISTORY,
    INSPECT,
    PACK,
    PROFILE,
    REVIEW_DECIDE,
    REVIEW_LIST,
    ROLLBACK,
    RUN_JOB,
    SEARCH,
    SUBJECTS,
    VERIFY_FORGOTTEN,
    WORKERS_MODULE,
    ForgetProof,
    ForgetReport,
    History,
    ImportReport,
    InspectReport,
    JobReport,
    Rep,
    Req,
    ReviewDecision,
    RollbackReport,
    Rpc,
    Waiting,
)
from memflow.shared.settings import Settings, get_settings
from memflow.shared.streaming.backlog import backlog
from memflow.shared.unstored import fates, published

# The fields of `write` that become other fields of the event it publishes: a refusal names the caller's.
_WRITE_FIELDS = {"text": "content", "meta": "external_ref"}


class MemoryClient:
    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self.keys = self.settings.keys
        self.redis = connect_streams(self.settings)
        # The RPC queues' server: the streams' own, unless they are on a cluster (RQ runs on none).
        self.queue_redis = connect_queue(self.settings, self.redis)
        self._queue = Queue(self.keys.query_queue, connection=self.queue_redis, serializer=JSONSerializer)
        self._jobs = Queue(self.keys.jobs_queue, connection=self.queue_redis, serializer=JSONSerializer)
        self._partitions_checked = False
        self._feed_seal: feed.Sealed | None = None
        self._fsync_timeout_ms: int | None = None  # WAITAOF's, when a publish waits for the disk (_append)

    # -- writing -----------------------------------------------------------------

    def validate(self, event: ChatEvent | dict[str, Any]) -> ChatEvent:
        """The event as the pipeline will see it, or InvalidInput naming the first bad field."""
        data = event.model_dump() if isinstance(event, ChatEvent) else event
        try:
            return ChatEvent.model_validate(data, context={"max_text_bytes": self.settings.limits.max_text_bytes})
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "event"
            raise InvalidInput(field, wording.reason(first)) from exc

    def publish(self, event: ChatEvent | dict[str, Any]) -> str:
        """Append one event to the `events` stream; returns its stream id. Does not wait for processing."""
        checked = self.validate(event)
        return self._append([(self.keys.work("events", checked.subject), [checked])])[0][0]

    def publish_many(self, events: Sequence[ChatEvent | dict[str, Any]]) -> list[str]:
        """Append a batch in one round trip, all or nothing at validation: InvalidInput names the first bad
        event's index and field (`3.ts`) and nothing is published."""
        checked = []
        for i, event in enumerate(events):
            try:
                checked.append(self.validate(event))
            except InvalidInput as exc:
                raise InvalidInput(f"{i}.{exc.field}", exc.reason) from exc
        if not checked:
            return []
        by_stream: dict[str, list[int]] = {}
        for i, event in enumerate(checked):
            by_stream.setdefault(self.keys.work("events", event.subject), []).append(i)
        parts = [(stream, [checked[i] for i in at]) for stream, at in by_stream.items()]
        # One server: every partition's writes in one round trip, and one wait for the disk (and replicas) for
        # the batch. A cluster: one per partition the batch touches (each on its own node).
        groups = [[part] for part in parts] if self.settings.redis.cluster else [parts]
        ids = [""] * len(checked)
        for group in groups:
            for stream_ids, (stream, _) in zip(self._append(group), group, strict=True):
                for i, entry_id in zip(by_stream[stream], stream_ids, strict=True):
                    ids[i] = entry_id
        return ids

    def _append(self, parts: Sequence[tuple[str, Sequence[ChatEvent]]]) -> list[list[str]]:
        """XADD the events to their partitions' streams (all on one connection: one server, or one cluster
        node's slot), wait until the server's AOF holds them on disk (MEMFLOW_REDIS_WAIT_AOF,
        shared/redisdb/durability.py) and (MEMFLOW_REDIS_WAIT_REPLICAS) for its replicas: an event is acknowledged
        once it would survive a kill -9 of the server, a crash of its machine and its master's death. With
        each partition's XADDs, in one script before them: each event's fate `accepted` and the pending entries
        a search serves until what they say is stored, within their bounds (shared/unstored/published.py). One
        round trip in all, the one whose reply waits for the disk. The entry ids, per part."""
        # routed by the deployment's partition count, or refused (shared/redisdb/keys.py)
        if not self._partitions_checked:
            check_partitions(self.redis, self.keys)
            self._fsync_timeout_ms = self._waits_for_fsync()
            self.redis.script_load(published.SCRIPT)  # on every master of a cluster: no NOSCRIPT to resend after
            self._partitions_checked = True
        todo = [published.Part(stream, [_without_secrets(event) for event in events]) for stream, events in parts]
        replies = self._written(todo)
        refused = [part for part, reply in zip(todo, replies, strict=True) if isinstance(reply, NoScriptError)]
        if refused:  # a server that does not know the script yet (new, restarted, a replica promoted): it ran none
            load_script(self.redis, todo[0].stream, published.SCRIPT)
            again = iter(self._written(refused))
            replies = [next(again) if isinstance(reply, NoScriptError) else reply for reply in replies]
        for reply in replies:
            if isinstance(reply, Exception):
                raise reply
        return [published.ids(reply) for reply in replies]

    def _written(self, parts: Sequence[published.Part]) -> list[Any]:
        """One round trip: the parts' scripts (fates, pending entries, their bounds, the XADDs: published.py),
        then the waits for the disk and the replicas; each part's reply, or its error."""
        def write(pipe: Pipeline) -> None:
            for part in parts:
                published.queue(pipe, self.keys, self.settings.pending, part)

        r = self.settings.redis
        return replicated(self.redis, parts[0].stream, write, replicas=r.wait_replicas, timeout_ms=r.wait_timeout_ms,
                          fsync_timeout_ms=self._fsync_timeout_ms, raise_on_error=False)

    def _waits_for_fsync(self) -> int | None:
        """WAITAOF's timeout when the server can answer it and the settings want it, else None (a server
        without AOF or WAITAOF: warned about once, as what an acknowledgement then survives)."""
        r = self.settings.redis
        return fsync_timeout_ms(self.redis, safe_url(self.settings), r.wait_aof, r.wait_aof_timeout_ms)

    def write(self, subject: str, content: str, *, session_id: str = "api", external_ref: str | None = None,
              ts: datetime | None = None, event_id: str | None = None) -> str:
        """Remember `content` explicitly. It still passes the gate, resolve and upsert. InvalidInput when it holds
        a secret: the statement would be stored as nothing (a secret is never remembered), so it is refused
        rather than acknowledged and dropped; and so is whatever the gate would drop (an instruction to the
        assistant, filler), with the gate's reason. Nothing refused is published."""
        kinds = redact_secrets(content)[1]
        if kinds:
            raise InvalidInput("content", f"holds a secret ({', '.join(kinds)}): memflow never stores one, so nothing "
                               "would be remembered; write the statement without it")
        verdict = gate(content, Role.user)  # the trigger's own gate: what it would drop is refused here instead
        if not verdict.keep:
            raise InvalidInput("content", f"not remembered: {gate_refusal(verdict)}")
        event = {"event_id": event_id or f"write-{uuid.uuid4()}", "subject": subject, "session_id": session_id,
                 "kind": Kind.message, "role": Role.user, "text": content, "ts": ts or datetime.now(UTC),
                 "meta": {"explicit": True, "external_ref": external_ref}}
        try:
            return self.publish(event)
        except InvalidInput as exc:  # named as the caller named it: the event's `text` is the write's `content`
            raise InvalidInput(_WRITE_FIELDS.get(exc.field, exc.field), exc.reason) from exc

    def event_fate(self, subject: str, event_id: str) -> EventFate:
        """What became of an event published for `subject` (pipeline/fates.py): accepted, stored (as which
        memories), nothing to remember, dropped or dead-lettered, and why. NotFound when nothing is recorded for
        it under `subject`: never published there, or published more than a week before the subject's last
        publish (shared/unstored/fates.py)."""
        try:  # a subject that is no subject id never leaves the client
            FateAsked(subject=subject, event_id=event_id)
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InvalidInput(".".join(str(p) for p in first["loc"]), wording.reason(first)) from exc
        found = fates.read(self.redis, self.keys, subject, event_id)
        if found is None:
            raise NotFound(f"no event {event_id!r} published for {subject!r} (or its fate has expired)")
        return found

    def wait_idle(self, timeout_s: float = 30.0, poll_s: float = 0.02) -> bool:
        """Block until every stage has read and acknowledged everything; False on timeout."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.is_idle():
                return True
            time.sleep(poll_s)
        return False

    def is_idle(self) -> bool:
        return all(lag == 0 and pending == 0 for lag, pending in backlog(self.redis, self.keys, STAGES).values())

    def query_workers(self) -> int:
        """How many query workers listen on this system's query queue (alive: RQ expires a dead one's record)."""
        return len(Worker.all(queue=self._queue))

    # -- reading -----------------------------------------------------------------

    def search(self, subject: str, query: str, k: int | None = None, *, now: datetime | None = None,
               dirs: Sequence[Dir | str] | None = None, mtypes: Sequence[MType | str] | None = None,
               about: str | None = None) -> SearchResult:
        """`about` restricts the search to memories about one person ("self", "mother", "friend:小李")."""
        request = _request(SEARCH, subject=subject, query=query, k=k or self.settings.client.search_k, now=now,
                           dirs=dirs, mtypes=mtypes, about=about)
        try:
            return self._ask(SEARCH, request, timeout_s=self.settings.client.search_timeout_s)
        except RpcError as exc:
            return SearchResult(subject=subject, query=query, status="failed", error=str(exc))

    def pack(self, subject: str, query: str, budget_tokens: int = 800, system_prompt: str = "", *,
             now: datetime | None = None, request_id: str | None = None) -> PackedPrompt:
        """`request_id`: the uses this pack adopts count once per id (a retry passes the same; default: new)."""
        return self.call(PACK, subject=subject, query=query, budget_tokens=budget_tokens,
                         system_prompt=system_prompt, now=now, **_named(request_id=request_id))

    def forget(self, subject: str, memory_ids: Sequence[str] | None = None, *, contains: str | None = None) -> int:
        return self.call(FORGET, subject=subject, memory_ids=memory_ids, contains=contains).count

    def forget_report(self, subject: str, memory_ids: Sequence[str] | None = None, *,
                      contains: str | None = None) -> ForgetReport:
        """Forget, and say which memories and how many Redis entries holding their words were removed."""
        return self.call(FORGET, subject=subject, memory_ids=memory_ids, contains=contains)

    def verify_forgotten(self, subject: str, memory_ids: Sequence[str], *, contains: str | None = None) -> ForgetProof:
        """The proof that forgotten memories are gone: no point in the store, no Redis entry naming them (and,
        with `contains`, none of the subject's holding those words raw)."""
        return self.call(VERIFY_FORGOTTEN, subject=subject, memory_ids=memory_ids, contains=contains)

    def feedback(self, subject: str, memory_ids: Sequence[str], *, at: datetime | None = None,
                 request_id: str | None = None) -> int:
        """`request_id`: counted once per id (a retry passes the same; default: a new one per call)."""
        return self.call(FEEDBACK, subject=subject, memory_ids=memory_ids, at=at,
                         **_named(request_id=request_id)).count

    def inspect(self, subject: str, *, now: datetime | None = None) -> InspectReport:
        return self.call(INSPECT, subject=subject, now=now)

    # -- export and import (docs/export-format.md) ------------------------------------

    def export(self, subjects: Sequence[str] | None = None, *, with_vectors: bool = False,
               now: datetime | None = None) -> Iterator[bytes]:
        """The export of `subjects` (None: every subject) as JSON Lines, line by line: a header, then every
        stored point of each subject with its versions, history and provenance (and its vector, if asked)."""
        chosen = list(subjects) if subjects is not None else self.call(SUBJECTS).subjects
        return transfer.export_lines(self, chosen, with_vectors, now or datetime.now(UTC))

    def import_(self, lines: Iterable[bytes | str], *, as_subject: str | None = None) -> ImportReport:
        """Import an export: the whole file is read and checked first (`FormatError` naming the line and the
        field), then each subject gets what it lacks, through the one write path. The same file twice changes
        nothing; a memory forgotten here is not written back. `as_subject`: the file's one subject imported as this
        one, with new ids and its provenance kept (docs/export-format.md#as-another-subject)."""
        return transfer.import_parsed(self, transfer.read(lines, as_subject))

    # -- maintenance ---------------------------------------------------------------

    def run_job(self, name: str, *, subject: str | None = None, now: datetime | None = None,
                dry_run: bool = False, tier: str | None = None, timeout_s: float = 600.0) -> JobReport:
        """Run a maintenance job (decay, consolidate, review, retag) in a query worker; its report."""
        return self.call(RUN_JOB, subject=subject, name=name, now=now, dry_run=dry_run, tier=tier,
                         timeout_s=timeout_s)

    def history(self, memory_id: str, *, subject: str | None = None) -> History:
        """Every version of a memory (of its key) and each change of each, oldest first."""
        return self.call(HISTORY, memory_id=memory_id, subject=subject)

    def changes(self, subject: str | None = None, *, after: str = feed.START, limit: int = feed.DEFAULT_PAGE
                ) -> ChangesPage:
        """What changed after the entry `after` (`next` of the page before; "0": the oldest kept), ids and kinds
        only: of `subject`, or of every subject. Ask again with `next` while `more` (docs/changes.md)."""
        if not 1 <= limit <= feed.MAX_PAGE:
            raise InvalidInput("limit", f"between 1 and {feed.MAX_PAGE}, not {limit}")
        try:
            start = feed.cursor(after)
            start = self._sealed().open(start) if feed.is_sealed(start) else start
        except ValueError as exc:
            raise InvalidInput("after", str(exc)) from None
        return feed_pages.page(self.redis, self.keys, start,
                               (lambda s: s == subject) if subject is not None else (lambda s: True), limit,
                               self._sealed)

    def _sealed(self) -> feed.Sealed:
        """The deployment's sealer of feed places (pipeline/feed.py `Sealed`), read once."""
        if self._feed_seal is None:
            secret = id_space(self.redis, self.keys).secret
            assert secret is not None  # id_space always names with a secret
            self._feed_seal = feed.Sealed(secret)
        return self._feed_seal

    def profile(self, subject: str, *, since: str | None = None, max_tokens: int | None = None,
                now: datetime | None = None) -> ProfileReply:
        """What holds now for `subject` (docs/profile.md): identity, preferences, rules, people, open contests;
        its prompt text within `max_tokens` if given; what changed after revision `since` if given."""
        return self.call(PROFILE, subject=subject, since=since, max_tokens=max_tokens, now=now)

    def rollback(self, memory_id: str, to_version: int, *, subject: str | None = None,
                 at: datetime | None = None) -> RollbackReport:
        """Restore an old version of a keyed memory as a new version (itself recorded as a change)."""
        return self.call(ROLLBACK, memory_id=memory_id, to_version=to_version, subject=subject, at=at)

    def review_list(self, subject: str | None = None) -> list[Waiting]:
        """Memories waiting for a decision: pending_review and contested."""
        return self.call(REVIEW_LIST, subject=subject).waiting

    def review(self, memory_id: str, *, accept: bool, subject: str | None = None,
               at: datetime | None = None) -> ReviewDecision:
        """Accept (active; the rivals it contested are superseded) or reject (never searched again)."""
        return self.call(REVIEW_DECIDE, memory_id=memory_id, accept=accept, subject=subject, at=at)

    # -- the calls -------------------------------------------------------------------

    def call(self, rpc: Rpc[Any, Rep], *, timeout_s: float | None = None, **fields: Any) -> Rep:
        """One call of the table (`shared.sdk.rpc`), typed: InvalidInput (naming the field) when `fields` are
        not its request; RpcError when no worker answered, the call failed there or its reply is not one."""
        return self._ask(rpc, _request(rpc, **fields), timeout_s=timeout_s)

    def _ask(self, rpc: Rpc[Req, Rep], request: Req, *, timeout_s: float | None = None) -> Rep:
        sent = self._send(rpc, request, timeout_s)
        return self.reply(sent, self.wait(sent))

    def _call(self, name: str, *args: Any, timeout_s: float | None = None, queue: Queue | None = None,
              fields: dict[str, Any] | None = None) -> Any:
        """Enqueue `workers.query.<name>` and wait for its JSON reply. A request travels as the job's keyword
        arguments (`fields`, by name); the worker validates them whoever enqueued them."""
        sent = self._enqueue(name, args, fields or {}, queue or self._queue, timeout_s)
        return _returned(sent, self.wait(sent))

    # -- a call in two halves: sent from a thread, its reply waited for on an event loop --------------------

    def send(self, rpc: Rpc[Any, Rep], *, timeout_s: float | None = None, **fields: Any) -> Sent[Rep]:
        """Validate and enqueue one call (InvalidInput naming the field); its reply is `reply(sent, wait)`,
        or on an event loop `reply(sent, await wait_async(sent, connection))`."""
        return self._send(rpc, _request(rpc, **fields), timeout_s)

    def _send(self, rpc: Rpc[Req, Rep], request: Req, timeout_s: float | None) -> Sent[Rep]:
        queue = self._jobs if rpc.queue == "jobs" else self._queue
        sent = self._enqueue(rpc.name, (), request.model_dump(mode="json"), queue, timeout_s)
        return Sent(sent.name, sent.job, sent.timeout_s, sent.deadline, rpc.reply)

    def _enqueue(self, name: str, args: Sequence[Any], fields: dict[str, Any], queue: Queue,
                 timeout_s: float | None) -> Sent[Any]:
        timeout = timeout_s or self.settings.client.rpc_timeout_s
        job = queue.enqueue(f"{WORKERS_MODULE}.{name}", args=tuple(args), kwargs=fields, ttl=math.ceil(timeout),
                            result_ttl=60, failure_ttl=3600, job_timeout=math.ceil(timeout))
        return Sent(name, job, timeout, time.monotonic() + timeout, BaseModel)

    def wait(self, sent: Sent[Any]) -> Result | None:
        """The call's result, or None when none came by its deadline: read in slices of CLIENT_BLOCK_S, each
        well within the connection's socket timeout."""
        while (left := sent.deadline - time.monotonic()) > 0:
            found = self.queue_redis.xread({_result_key(sent.job): "0-0"}, block=_block_ms(left))
            if found:
                return _restored(sent.job, found, self.queue_redis)
        return None

    async def wait_async(self, sent: Sent[Any], connection: redis.asyncio.Redis) -> Result | None:
        """`wait` on an event loop: `connection` is an asyncio client of the queues' server."""
        while (left := sent.deadline - time.monotonic()) > 0:
            found = await connection.xread({_result_key(sent.job): "0-0"}, block=_block_ms(left))
            if found:
                return _restored(sent.job, found, self.queue_redis)
        return None

    def reply(self, sent: Sent[Rep], result: Result | None) -> Rep:
        """The reply the call's result carries, validated: RpcError when none came, the call failed in the
        worker or its reply is not one."""
        raw = _returned(sent, result)
        try:
            return sent.reply.model_validate(raw)
        except ValidationError as exc:
            raise RpcError(f"{sent.name}: the query worker's reply is not a {sent.reply.__name__}: {exc}") from exc


@dataclass(frozen=True)
class Sent(Generic[Rep]):
    """A call enqueued: its job, and when the caller stops waiting for its reply."""

    name: str
    job: Job
    timeout_s: float
    deadline: float  # time.monotonic()
    reply: type[Rep]


def _without_secrets(event: ChatEvent) -> ChatEvent:
    """The event with the gate's secrets redacted from its text, before any copy of it is written: the raw
    entry rewritten after the trigger read it would still have reached the AOF and the replicas (issue 30).
    The trigger judges injections on what it gets; they are worded around a secret, not in it."""
    if not event.text:
        return event
    text, kinds = redact_secrets(event.text)
    return event.model_copy(update={"text": text}) if kinds else event


def _block_ms(left_s: float) -> int:
    return max(1, math.ceil(min(left_s, CLIENT_BLOCK_S) * 1000))


def _result_key(job: Job) -> str:
    return str(Result.get_key(job.id))  # type: ignore[no-untyped-call]  # untyped in rq


def _restored(job: Job, found: Any, connection: redis.Redis) -> Result:
    """The last result of an XREAD of a job's result stream (RQ's own `Result.fetch_latest`, sliced)."""
    result_id, payload = found[0][1][-1]
    return Result.restore(job.id, result_id.decode(), payload, connection=connection, serializer=job.serializer)


def _returned(sent: Sent[Any], result: Result | None) -> Any:
    if result is None:
        raise RpcError(f"{sent.name}: no answer from a query worker within {sent.timeout_s} s (is one running?)",
                       "timeout")
    if result.type != Result.Type.SUCCESSFUL:
        raised = (result.exc_string or "").strip()
        raise RpcError(f"{sent.name}: {raised_said(raised)}", _raised_kind(raised), worker_traceback=raised)
    return result.return_value


def _request(rpc: Rpc[Req, Any], **fields: Any) -> Req:
    """The request, or InvalidInput naming its first bad field (a subject that is no subject id never
    leaves the client)."""
    try:
        return rpc.request.model_validate(fields)
    except ValidationError as exc:
        first = exc.errors()[0]
        raise InvalidInput(".".join(str(p) for p in first["loc"]) or rpc.name, wording.reason(first)) from exc


def _raised_kind(exc_string: str) -> str:
    """The class name of the error a worker's traceback ends with ("memflow.shared.errors.NotFound: …")."""
    last = exc_string.splitlines()[-1] if exc_string else ""
    head = last.split(":", 1)[0]
    if ":" not in last or not head.replace(".", "").replace("_", "").isalnum():
        return "failed"
    return head.rsplit(".", 1)[-1]


def _named(**fields: Any) -> dict[str, Any]:
    """The fields given (not None): the others keep their request model's default (a fresh request id)."""
    return {k: v for k, v in fields.items() if v is not None}
