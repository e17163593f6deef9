"""LangGraph's long-term store (`langgraph.store.base.BaseStore`) backed by memflow
(docs/integrations.md#langgraphs-store).

A namespace is a subject (`http.subject_of`: ("users", "alice") -> "users/alice"); an item is a memory written
explicitly (`POST /v1/memories`) with the item's key as its `external_ref`. The value's text is the memory's
content: `value["content"]` when that is all it holds, else the value as JSON; `get` reads it back from the
words memflow kept (`evidence`), so a value comes back as it was put. A `put` waits until memflow has stored
it (at most `wait_s`, asking the event's fate: `GET /v1/events/{id}`): memflow resolves and stores asynchronously,
and a value its gate refuses, or that states nothing memflow keeps, is an error (`NotStored`), not a silent loss.
Memories memflow learnt otherwise (from a conversation) are items too: their key is their memory id, their value
`{"content": …}`.

    store = MemflowStore("http://127.0.0.1:8765", "mf_...")
    store.put(("users", "alice"), "drink", {"content": "Alice drinks oolong after lunch"})
    store.search(("users", "alice"), query="what does she drink?")
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import uuid
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from langgraph.store.base import (
    BaseStore,
    GetOp,
    Item,
    ListNamespacesOp,
    MatchCondition,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
)

from memflow.shared.integrations.http import MemflowHttp, MemflowHttpError, scope_of, subject_of, until

# What a search may return (pipeline/models.py SEARCHABLE_STATUSES); the rest is history or awaits review.
CURRENT = ("active", "contested")
# memflow keeps `external_ref` up to this length (pipeline/checks.py MAX_META_TEXT).
MAX_KEY = 2048
# A search reads at most this many hits per subject (SearchRequest.k's bound).
MAX_HITS = 200
EVENT_PREFIX = "langgraph:"


class NotStored(ValueError):
    """memflow kept nothing of a value put: its gate refused it (an order to the assistant planted in data,
    filler such as "ok") or it states nothing memflow keeps."""


class MemflowStore(BaseStore):  # type: ignore[misc, unused-ignore]  # Any where langgraph is not installed
    """`url` and `key` name a `memflow serve` and an API key whose subjects cover the namespaces used."""

    def __init__(self, url: str, key: str | None, *, wait_s: float = 30.0, http: MemflowHttp | None = None) -> None:
        self.api = http or MemflowHttp(url, key)
        self.wait_s = wait_s

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        return [self._one(op) for op in ops]

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        return await asyncio.to_thread(self.batch, list(ops))

    def _one(self, op: Op) -> Result:
        if isinstance(op, GetOp):
            return self._get(op.namespace, op.key)
        if isinstance(op, PutOp):
            self._put(op.namespace, op.key, op.value)
            return None
        if isinstance(op, SearchOp):
            return self._search(op)
        if isinstance(op, ListNamespacesOp):
            return namespaces(self.api.subjects(), op)
        raise TypeError(f"memflow's store does not know the operation {type(op).__name__}")

    # -- get, put, delete ------------------------------------------------------------------------

    def _get(self, namespace: tuple[str, ...], key: str) -> Item | None:
        found = [m for m in self._held(namespace, key) if m["status"] in CURRENT]
        return item(namespace, max(found, key=lambda m: str(m["updated_at"]))) if found else None

    def _held(self, namespace: tuple[str, ...], key: str) -> list[dict[str, Any]]:
        """Every memory of the namespace that is this key's: written under it, or (a key never written) its id."""
        memories = memories_of(self.api, subject_of(namespace))
        mine = event_prefix(key)
        return [m for m in memories
                if m.get("external_ref") == key or (m.get("external_ref") is None and m["id"] == key)
                or any(str(e).startswith(mine) for e in m.get("source_event_ids", ()))]

    def _put(self, namespace: tuple[str, ...], key: str, value: Mapping[str, Any] | None) -> None:
        """Replace the key's memories with `value` (None: delete them). The old go first, so that memflow cannot
        take the new value for a repeat of the old one and keep the old words."""
        if len(key) > MAX_KEY:
            raise ValueError(f"memflow keeps keys of at most {MAX_KEY} characters ({len(key)} given)")
        subject = subject_of(namespace)
        self.api.forget(subject, [m["id"] for m in self._held(namespace, key) if m["status"] != "deleted"])
        if value is None:
            return
        event_id = event_prefix(key) + uuid.uuid4().hex
        try:
            self.api.write(subject, rendered(value), external_ref=key, event_id=event_id)
        except MemflowHttpError as exc:  # the gate's refusal is told at once, with its reason (a 422 on content)
            if exc.status == 422 and exc.field == "content":
                raise NotStored(f"memflow's gate refused the value put at {namespace}/{key}: {exc}") from None
            raise
        if self.wait_s > 0:
            fate = until(lambda: self._decided(subject, event_id), self.wait_s)
            if fate is not None and fate["state"] != "stored":
                raise NotStored(f"memflow kept nothing of the value put at {namespace}/{key}: "
                                f"{fate.get('reason') or fate['state']}")

    def _decided(self, subject: str, event_id: str) -> dict[str, Any] | None:
        """The event's fate once the pipeline has decided it (`GET /v1/events/{id}`); None while it is accepted."""
        fate = self.api.event_fate(subject, event_id)
        return None if fate["state"] == "accepted" else fate

    # -- search ------------------------------------------------------------------------------------

    def _search(self, op: SearchOp) -> list[SearchItem]:
        prefix = tuple(op.namespace_prefix)
        found: list[SearchItem] = []
        for subject in self.api.subjects():
            namespace = scope_of(subject)
            if namespace[:len(prefix)] == prefix:
                found += self._search_one(subject, namespace, op)
        found = [i for i in found if matches(i.value, op.filter)]
        if op.query:
            found.sort(key=lambda i: -(i.score or 0.0))
        else:
            found.sort(key=lambda i: i.updated_at, reverse=True)
        return found[op.offset:op.offset + op.limit]

    def _search_one(self, subject: str, namespace: tuple[str, ...], op: SearchOp) -> list[SearchItem]:
        """One subject's items: ranked by memflow's search when there is a query, else all current ones."""
        by_id = {m["id"]: m for m in memories_of(self.api, subject) if m["status"] in CURRENT}
        if not op.query:
            return [item(namespace, m) for m in by_id.values()]
        k = MAX_HITS if op.filter else min(MAX_HITS, op.offset + op.limit)
        # A hit still pending (said, not stored yet) has no memory to read its key from: it is an item once stored.
        return [item(namespace, by_id[h["id"]], score=float(h["score"]))
                for h in self.api.search(subject, op.query, k) if h["id"] in by_id]


# -- values and items -------------------------------------------------------------------------------


def rendered(value: Mapping[str, Any]) -> str:
    """The text memflow stores for a value: its `content` alone when that is all it holds and reads back as
    itself, else the value as JSON."""
    content = value.get("content")
    if set(value) == {"content"} and isinstance(content, str) and content == content.strip() \
            and not isinstance(_json(content), dict):
        return content
    return json.dumps(dict(value), ensure_ascii=False)


def parsed(text: str) -> dict[str, Any]:
    """`rendered`'s inverse."""
    found = _json(text)
    return found if isinstance(found, dict) else {"content": text}


def _json(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


def item(namespace: tuple[str, ...], memory: dict[str, Any], score: float | None = None) -> SearchItem:
    """A memory as an item: a value put through this store from the words memflow kept, any other memory as
    its content under its id."""
    ours = any(str(e).startswith(EVENT_PREFIX) for e in memory.get("source_event_ids", ()))
    value = parsed(str(memory.get("evidence") or memory["content"])) if ours else {"content": memory["content"]}
    return SearchItem(namespace=namespace, key=memory.get("external_ref") or memory["id"], value=value,
                      created_at=_time(memory["created_at"]), updated_at=_time(memory["updated_at"]), score=score)


def _time(text: str) -> datetime:
    return datetime.fromisoformat(text.replace("Z", "+00:00"))


def event_prefix(key: str) -> str:
    """The start of the event id of every put of `key`: memflow may merge a value into an equal one stored
    under another key, and the key still finds it by its event."""
    return f"{EVENT_PREFIX}{hashlib.sha256(key.encode()).hexdigest()[:24]}:"


def memories_of(api: MemflowHttp, subject: str) -> list[dict[str, Any]]:
    return list(api.memories(subject)["memories"])


# -- filters and namespaces --------------------------------------------------------------------------

_COMPARE = {"$eq": lambda a, b: a == b, "$ne": lambda a, b: a != b, "$gt": lambda a, b: a > b,
            "$gte": lambda a, b: a >= b, "$lt": lambda a, b: a < b, "$lte": lambda a, b: a <= b}


def matches(value: dict[str, Any], flt: dict[str, Any] | None) -> bool:
    """LangGraph's filter on a value's top-level fields: an exact value or `{"$op": operand}`."""
    for field, wanted in (flt or {}).items():
        have = value.get(field)
        conditions = wanted.items() if isinstance(wanted, dict) and all(k in _COMPARE for k in wanted) \
            else [("$eq", wanted)]
        try:
            if not all(_COMPARE[op](have, operand) for op, operand in conditions):
                return False
        except TypeError:  # None or another type compared by order: no match
            return False
    return True


def namespaces(subjects: Sequence[str], op: ListNamespacesOp) -> list[tuple[str, ...]]:
    found = {scope_of(s) for s in subjects}
    kept = {ns[:op.max_depth] if op.max_depth is not None else ns
            for ns in found if all(_matched(ns, c) for c in op.match_conditions or ())}
    return sorted(kept)[op.offset:op.offset + op.limit]


def _matched(namespace: tuple[str, ...], condition: MatchCondition) -> bool:
    path = tuple(condition.path)
    if len(path) > len(namespace):
        return False
    part = namespace[:len(path)] if condition.match_type == "prefix" else namespace[len(namespace) - len(path):]
    return all(p == "*" or p == n for p, n in zip(path, part, strict=True))
