"""The few /v1 calls the framework adapters make, over httpx (docs/integrations.md#over-http).

Synchronous on purpose: the adapters' async methods run these in a thread, so one code path serves both. Each
failure is a `MemflowHttpError` carrying the server's own message and field (docs/front-doors.md#http-api).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar
from urllib.parse import quote

import httpx

T = TypeVar("T")


class MemflowHttpError(RuntimeError):
    """A refusal or failure of memflow's HTTP API, in the server's words."""

    def __init__(self, status: int, message: str, field: str | None = None) -> None:
        super().__init__(f"memflow answered {status}: {message}" + (f" (field `{field}`)" if field else ""))
        self.status, self.message, self.field = status, message, field


class MemflowHttp:
    """One key's view of a memflow server: `url` as `memflow serve` prints it, `key` an `mf_…` API key."""

    def __init__(self, url: str, key: str | None, *, timeout_s: float = 30.0,
                 client: httpx.Client | None = None) -> None:
        headers = {"Authorization": f"Bearer {key}"} if key else {}
        self.http = client or httpx.Client(base_url=url.rstrip("/"), headers=headers, timeout=timeout_s)

    def close(self) -> None:
        self.http.close()

    def subjects(self) -> list[str]:
        return list(self._answer(self.http.get("/v1/subjects"))["subjects"])

    def memories(self, subject: str) -> dict[str, Any]:
        """The subject's inspect report: every memory with its payload, and what is pending. A subject that holds
        nothing yet may be answered 404: it is a namespace with no item, not an error."""
        reply = self.http.get(f"/v1/subjects/{_path(subject)}/memories")
        if reply.status_code == 404:
            return {"subject": subject, "memories": [], "pending": [], "backlog": {}}
        return dict(self._answer(reply))

    def search(self, subject: str, query: str, k: int) -> list[dict[str, Any]]:
        found = self._answer(self.http.post("/v1/search", json={"subject": subject, "query": query, "k": k}))
        return list(found["hits"])

    def write(self, subject: str, content: str, *, external_ref: str | None, event_id: str) -> None:
        self._answer(self.http.post("/v1/memories", json={"subject": subject, "content": content,
                                                          "external_ref": external_ref, "event_id": event_id}))

    def event_fate(self, subject: str, event_id: str) -> dict[str, Any]:
        """What became of a published event (`GET /v1/events/{id}`): its `state`, `memory_ids` and `reason`."""
        return dict(self._answer(self.http.get(f"/v1/events/{quote(event_id, safe='')}",
                                               params={"subject": subject})))

    def publish(self, events: Sequence[dict[str, Any]]) -> None:
        if events:
            self._answer(self.http.post("/v1/events", json=list(events)))

    def forget(self, subject: str, memory_ids: Sequence[str]) -> None:
        if memory_ids:
            self._answer(self.http.request("DELETE", f"/v1/subjects/{_path(subject)}/memories",
                                           json={"memory_ids": list(memory_ids)}))

    @staticmethod
    def _answer(reply: httpx.Response) -> Any:
        if reply.is_success:
            return reply.json()
        try:
            error = reply.json()["error"]
            raise MemflowHttpError(reply.status_code, str(error["message"]), error.get("field"))
        except (ValueError, KeyError, TypeError):
            raise MemflowHttpError(reply.status_code, reply.text[:300]) from None


def _path(subject: str) -> str:
    return quote(subject, safe="/:")


# A subject is `[A-Za-z0-9._:/-]{1,128}` (pipeline/models.py SUBJECT_PATTERN). A framework's scope (a namespace
# label, an app name, a user id such as an email) may hold any character: each outside the plain set, and `:`
# itself, is written `:XX` per UTF-8 byte, so that the mapping is reversible and `/` stays the separator.
_PLAIN = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._-")


def label(text: str) -> str:
    """`text` as one segment of a subject ("a@b.com" -> "a:40b.com"); ValueError when empty."""
    if not text:
        raise ValueError("an empty name cannot be part of a memflow subject")
    return "".join(c if c in _PLAIN else "".join(f":{b:02X}" for b in c.encode()) for c in text)


def unlabel(segment: str) -> str:
    """The text a segment was made from (`label`'s inverse)."""
    out, i = bytearray(), 0
    while i < len(segment):
        if segment[i] == ":" and _hex(segment[i + 1:i + 3]):
            out.append(int(segment[i + 1:i + 3], 16))
            i += 3
        else:
            out.extend(segment[i].encode())
            i += 1
    return out.decode(errors="replace")


def _hex(pair: str) -> bool:
    return len(pair) == 2 and all(c in "0123456789ABCDEFabcdef" for c in pair)


def subject_of(scope: Sequence[str]) -> str:
    """The subject a framework's scope names: its parts labelled and joined by `/` (("users", "a@b") ->
    "users/a:40b"). Both adapters map the same way: LangGraph's ("my-app", "alice") is ADK's app my-app, user alice."""
    if not scope:
        raise ValueError("a memflow subject needs at least one name")
    return "/".join(label(part) for part in scope)


def scope_of(subject: str) -> tuple[str, ...]:
    return tuple(unlabel(part) for part in subject.split("/"))


def until(check: Callable[[], T | None], timeout_s: float, poll_s: float = 0.05) -> T | None:
    """`check()`'s first answer other than None within `timeout_s`, else None (a deadline, not a sleep)."""
    deadline = time.monotonic() + timeout_s
    while True:
        found = check()
        if found is not None or time.monotonic() >= deadline:
            return found
        time.sleep(poll_s)
