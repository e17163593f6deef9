"""Google ADK's memory service (`google.adk.memory.BaseMemoryService`) backed by memflow
(docs/integrations.md#google-adks-memory-service).

An app's user is a subject (`http.subject_of`: app "support", user "a@b.com" -> "support/a:40b.com"). Adding a
session publishes its text turns as chat events (the user's as `user`, every agent's as `assistant`), each with
an id made from the session's and the event's, then a `session_end`: adding the same session again, as ADK
does after each turn, stores nothing twice. memflow then extracts, gates and resolves as for any agent; a
search ranks what it stored and what it is still writing (docs/read-your-writes.md).

    runner = Runner(agent=agent, app_name="support", session_service=sessions,
                    memory_service=MemflowMemoryService("http://127.0.0.1:8765", "mf_..."))
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from google.adk.events.event import Event
from google.adk.memory.base_memory_service import BaseMemoryService, SearchMemoryResponse
from google.adk.memory.memory_entry import MemoryEntry
from google.adk.sessions.session import Session
from google.genai import types

from memflow.shared.integrations.http import MemflowHttp, subject_of

# ADK's own in-memory service answers at most ten memories a search.
SEARCH_K = 10
# Events per request: within the API's batch bound (MEMFLOW_HTTP_MAX_BATCH's default).
CHUNK = 100


class MemflowMemoryService(BaseMemoryService):  # type: ignore[misc, unused-ignore]  # Any without google-adk
    """`url` and `key` name a `memflow serve` and an API key whose subjects cover `<app>/<user>`."""

    def __init__(self, url: str, key: str | None, *, http: MemflowHttp | None = None) -> None:
        self.api = http or MemflowHttp(url, key)

    async def add_session_to_memory(self, session: Session) -> None:
        await self.add_events_to_memory(app_name=session.app_name, user_id=session.user_id,
                                        events=session.events, session_id=session.id)

    async def add_events_to_memory(self, *, app_name: str, user_id: str, events: Sequence[Event],
                                   session_id: str | None = None,
                                   custom_metadata: Mapping[str, object] | None = None) -> None:
        """Publish the events' text turns and end the session there, so that memflow reads them now."""
        batch = chat_events(subject_of((app_name, user_id)), session_id or "adk", events)
        for start in range(0, len(batch), CHUNK):
            await asyncio.to_thread(self.api.publish, batch[start:start + CHUNK])

    async def add_memory(self, *, app_name: str, user_id: str, memories: Sequence[MemoryEntry],
                         custom_metadata: Mapping[str, object] | None = None) -> None:
        """Each entry's text written as an explicit memory (it still passes the gate)."""
        subject = subject_of((app_name, user_id))
        for entry in memories:
            text = text_of(entry.content)
            if text:
                await asyncio.to_thread(self.api.write, subject, text, external_ref=entry.id,
                                        event_id=f"adk:{entry.id or uuid.uuid4().hex}")

    async def search_memory(self, *, app_name: str, user_id: str, query: str) -> SearchMemoryResponse:
        if not query.strip():  # memflow refuses an empty query; ADK's own services answer it with nothing
            return SearchMemoryResponse()
        hits = await asyncio.to_thread(self.api.search, subject_of((app_name, user_id)), query, SEARCH_K)
        return SearchMemoryResponse(memories=[entry(hit) for hit in hits])

    async def delete_memory(self, *, app_name: str, user_id: str, memory_id: str | None = None) -> None:
        """Forget one memory (an id `search_memory` gave), with memflow's proof; None forgets nothing."""
        if memory_id:
            await asyncio.to_thread(self.api.forget, subject_of((app_name, user_id)), [memory_id])


def chat_events(subject: str, session_id: str, events: Sequence[Event]) -> list[dict[str, Any]]:
    """The events' text turns as memflow chat events, then the session's end (named by its last turn)."""
    turns = [turn(subject, session_id, e) for e in events if text_of(e.content)]
    if not turns:
        return []
    last = turns[-1]
    end = {"event_id": f"{last['event_id']}:end", "subject": subject, "session_id": session_id,
           "kind": "session_end", "ts": last["ts"]}
    return [*turns, end]


def turn(subject: str, session_id: str, event: Event) -> dict[str, Any]:
    user = event.author == "user"
    return {"event_id": f"adk:{session_id}:{event.id or uuid.uuid4().hex}", "subject": subject,
            "session_id": session_id, "kind": "message", "role": "user" if user else "assistant",
            "agent_id": None if user else event.author or None, "text": text_of(event.content),
            "ts": datetime.fromtimestamp(event.timestamp, UTC).isoformat()}


def text_of(content: types.Content | None) -> str:
    """A message's text parts, joined; a model's thoughts and tool calls are not what was said."""
    parts = (content.parts or []) if content else []
    return "\n".join(p.text for p in parts if p.text and not p.thought).strip()


def entry(hit: dict[str, Any]) -> MemoryEntry:
    """A memflow hit as ADK's entry. memflow stores what was said about the user, in the user's words."""
    return MemoryEntry(id=hit["id"], author="user", timestamp=hit["created_at"],
                       content=types.Content(role="user", parts=[types.Part(text=hit["content"])]),
                       custom_metadata={"score": hit["score"], "type": hit["mtype"], "about": hit.get("about", "self"),
                                        "pending": hit.get("pending", False)})
