"""The agent-facing SDK.

`publish` validates and appends to the `events` stream (one XADD: well under a
millisecond on a local Redis); the rest are calls to the query worker over RQ.
A search that could not be answered comes back with `status="failed"` and the error,
never as an empty list an agent would read as "nothing remembered".
"""

from __future__ import annotations

import math
import re
import time
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from pydantic import ValidationError
from rq import Queue
from rq.results import Result
from rq.serializers import JSONSerializer

from pipeline.models import (
    SUBJECT_PATTERN,
    ChatEvent,
    Dir,
    Kind,
    MType,
    PackedPrompt,
    Role,
    SearchRequest,
    SearchResult,
)
from shared.codec import encode
from shared.connections import connect, require_url
from shared.errors import InvalidInput, RpcError
from shared.keys import FIELD, STAGES, Keys
from shared.settings import Settings, get_settings
from shared.streams import backlog

WORKERS_MODULE = "workers.query"


class MemoryClient:
    def __init__(self, settings: Settings | None = None) -> None:
        self.settings = settings or get_settings()
        self.keys = Keys(self.settings.stream_prefix)
        self.redis = connect(require_url(self.settings))
        self._queue = Queue(self.keys.query_queue, connection=self.redis, serializer=JSONSerializer)
        self._jobs = Queue(self.keys.jobs_queue, connection=self.redis, serializer=JSONSerializer)

    # -- writing -----------------------------------------------------------------

    def validate(self, event: ChatEvent | dict[str, Any]) -> ChatEvent:
        """The event as the pipeline will see it, or InvalidInput naming the first bad field."""
        data = event.model_dump() if isinstance(event, ChatEvent) else event
        try:
            return ChatEvent.model_validate(data, context={"max_text_bytes": self.settings.max_text_bytes})
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "event"
            raise InvalidInput(field, first["msg"]) from exc

    def publish(self, event: ChatEvent | dict[str, Any]) -> str:
        """Append one event to the `events` stream; returns its stream id. Does not wait for processing."""
        checked = self.validate(event)
        entry_id = self.redis.xadd(self.keys.stream("events"), {FIELD: encode(checked)})
        return entry_id.decode() if isinstance(entry_id, bytes) else str(entry_id)

    def write(self, subject: str, content: str, *, session_id: str = "api", external_ref: str | None = None,
              ts: datetime | None = None, event_id: str | None = None) -> str:
        """Remember `content` explicitly. It still passes the gate, resolve and upsert."""
        event = {"event_id": event_id or f"write-{uuid.uuid4()}", "subject": subject, "session_id": session_id,
                 "kind": Kind.message, "role": Role.user, "text": content, "ts": ts or datetime.now(UTC),
                 "meta": {"explicit": True, "external_ref": external_ref}}
        return self.publish(event)

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

    # -- reading -----------------------------------------------------------------

    def search(self, subject: str, query: str, k: int | None = None, *, now: datetime | None = None,
               dirs: Sequence[Dir | str] | None = None, mtypes: Sequence[MType | str] | None = None) -> SearchResult:
        try:
            req = SearchRequest.model_validate({"subject": subject, "query": query, "k": k or self.settings.search_k,
                                                "now": now, "dirs": dirs, "mtypes": mtypes})
        except ValidationError as exc:
            first = exc.errors()[0]
            raise InvalidInput(".".join(str(p) for p in first["loc"]), first["msg"]) from exc
        try:
            raw = self._call("search", req.model_dump(mode="json"), timeout_s=self.settings.search_timeout_s)
        except RpcError as exc:
            return SearchResult(subject=subject, query=query, status="failed", error=str(exc))
        return SearchResult.model_validate(raw)

    def pack(self, subject: str, query: str, budget_tokens: int = 800, system_prompt: str = "", *,
             now: datetime | None = None) -> PackedPrompt:
        check_subject(subject)
        raw = self._call("pack", subject, query, budget_tokens, system_prompt, _iso(now))
        return PackedPrompt.model_validate(raw)

    def forget(self, subject: str, memory_ids: Sequence[str] | None = None, *, contains: str | None = None) -> int:
        check_subject(subject)
        return int(self._call("forget", subject, list(memory_ids) if memory_ids is not None else None, contains))

    def forget_report(self, subject: str, memory_ids: Sequence[str] | None = None, *,
                      contains: str | None = None) -> dict[str, Any]:
        """Forget, and say which memories and how many Redis entries holding their words were removed."""
        check_subject(subject)
        ids = list(memory_ids) if memory_ids is not None else None
        result: dict[str, Any] = self._call("forget_report", subject, ids, contains)
        return result

    def verify_forgotten(self, subject: str, memory_ids: Sequence[str]) -> dict[str, Any]:
        """The proof that forgotten memories are gone: no point in the store, no Redis entry naming them."""
        check_subject(subject)
        result: dict[str, Any] = self._call("verify_forgotten", subject, list(memory_ids))
        return result

    def feedback(self, subject: str, memory_ids: Sequence[str], *, at: datetime | None = None) -> int:
        check_subject(subject)
        return int(self._call("feedback", subject, list(memory_ids), _iso(at)))

    def inspect(self, subject: str, *, now: datetime | None = None) -> dict[str, Any]:
        check_subject(subject)
        result: dict[str, Any] = self._call("inspect", subject, _iso(now))
        return result

    # -- maintenance ---------------------------------------------------------------

    def run_job(self, name: str, *, subject: str | None = None, now: datetime | None = None,
                dry_run: bool = False, tier: str | None = None, timeout_s: float = 600.0) -> dict[str, Any]:
        """Run a maintenance job (decay, consolidate, review, retag) in a query worker; its report."""
        report: dict[str, Any] = self._call("run_job", name, subject, _iso(now), dry_run, tier, timeout_s=timeout_s,
                                            queue=self._jobs)
        return report

    def history(self, memory_id: str, *, subject: str | None = None) -> dict[str, Any]:
        """Every version of a memory (of its key) and each change of each, oldest first."""
        result: dict[str, Any] = self._call("history", memory_id, subject)
        return result

    def rollback(self, memory_id: str, to_version: int, *, subject: str | None = None,
                 at: datetime | None = None) -> dict[str, Any]:
        """Restore an old version of a keyed memory as a new version (itself recorded as a change)."""
        result: dict[str, Any] = self._call("rollback", memory_id, to_version, subject, _iso(at))
        return result

    def review_list(self, subject: str | None = None) -> list[dict[str, Any]]:
        """Memories waiting for a decision: pending_review and contested."""
        result: list[dict[str, Any]] = self._call("review_list", subject)
        return result

    def review(self, memory_id: str, *, accept: bool, subject: str | None = None,
               at: datetime | None = None) -> dict[str, Any]:
        """Accept (active; the rivals it contested are superseded) or reject (never searched again)."""
        result: dict[str, Any] = self._call("review_decide", memory_id, accept, subject, _iso(at))
        return result

    def _call(self, name: str, *args: Any, timeout_s: float | None = None, queue: Queue | None = None) -> Any:
        timeout = timeout_s or self.settings.rpc_timeout_s
        job = (queue or self._queue).enqueue(f"{WORKERS_MODULE}.{name}", *args, ttl=math.ceil(timeout),
                                  result_ttl=60, failure_ttl=3600, job_timeout=math.ceil(timeout))
        result = job.latest_result(timeout=math.ceil(timeout))
        if result is None:
            raise RpcError(f"{name}: no answer from a query worker within {timeout} s (is one running?)")
        if result.type != Result.Type.SUCCESSFUL:
            raise RpcError(f"{name} failed in the query worker: {(result.exc_string or '').strip()[-500:]}")
        return result.return_value


def check_subject(subject: str) -> None:
    """Every call names one subject, and only a well-formed one: a wildcard or a separator never
    reaches a key or a filter."""
    if not isinstance(subject, str) or not re.fullmatch(SUBJECT_PATTERN, subject):
        raise InvalidInput("subject", f"{subject!r} is not a subject id (1–128 of A-Z a-z 0-9 . _ : / -)")


def _iso(value: datetime | None) -> str | None:
    return value.isoformat() if value else None
