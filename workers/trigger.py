"""trigger: `events` → `extract`. Decides when something is worth reading.

Every message passes the gate (filler dropped, secrets redacted, injections refused)
and is kept in the session's buffer; a user statement with a realtime signal
(preference, correction, rule, "remember", decision) goes to extraction at once;
`session_end` and `task_complete` send the whole buffered session.
"""

from __future__ import annotations

import logging
from functools import partial

from memflow.pipeline.gate import gate
from memflow.pipeline.models import ChatEvent, ExtractTask, Kind, Role, TriggerReason, Turn
from memflow.pipeline.triggers import realtime_signals
from memflow.shared import pending
from memflow.shared.buffers import SessionBuffers
from memflow.shared.streams import Emit, StreamConsumer, per_item
from memflow.workers.runtime import Context

log = logging.getLogger(__name__)


def build(ctx: Context) -> StreamConsumer[ChatEvent]:
    return StreamConsumer(ctx.client, ctx.keys, "trigger", ChatEvent, per_item(partial(handle, ctx)),
                          ctx.consumer_config())


def handle(ctx: Context, event: ChatEvent) -> list[Emit]:
    if ctx.llm is not None:  # what the LLM path costs is reported per event (memflow inspect)
        ctx.llm.count(event.subject, {"events": 1})
    if event.kind is Kind.message:
        return on_message(ctx, event)
    if event.kind in (Kind.session_end, Kind.task_complete):
        return on_close(ctx, event)
    return []  # feedback: adoption is recorded by the query worker's `feedback` call


def on_message(ctx: Context, event: ChatEvent) -> list[Emit]:
    assert event.role is not None  # guaranteed by ChatEvent's validation
    verdict = gate(event.text, event.role)
    pending.regate(ctx.client, ctx.keys, event, verdict)  # what a search may show of it, as gated
    if not verdict.keep:
        log.info("event %s dropped by the gate: %s", event.event_id, verdict.reason)
        return []
    turn = Turn(event_id=event.event_id, role=event.role, text=verdict.text, ts=event.ts,
                speaker=event.meta.get("speaker"))
    if event.meta.get("explicit"):
        return [_emit(ctx, event, TriggerReason.explicit_write, [turn], external_ref=event.meta.get("external_ref"))]
    buffer_turn(ctx, event, turn)
    signals = realtime_signals(turn.text) if event.role is Role.user else []
    return [_emit(ctx, event, TriggerReason.realtime, [turn], signals=signals)] if signals else []


def on_close(ctx: Context, event: ChatEvent) -> list[Emit]:
    turns = buffered_turns(ctx, event)
    if event.kind is Kind.task_complete and event.text.strip():
        verdict = gate(event.text, Role.assistant)
        if verdict.keep:
            turns.append(Turn(event_id=event.event_id, role=Role.assistant, text=verdict.text, ts=event.ts))
    buffers(ctx).close(event.subject, event.session_id)
    if not turns:
        return []
    reason = TriggerReason.session_end if event.kind is Kind.session_end else TriggerReason.task_complete
    return [_emit(ctx, event, reason, turns, outcome=event.meta.get("outcome"))]


def buffers(ctx: Context) -> SessionBuffers:
    limits = ctx.settings.limits
    return SessionBuffers(ctx.client, ctx.keys, limits.session_buffer_max_turns, limits.session_buffer_ttl_s)


def buffer_turn(ctx: Context, event: ChatEvent, turn: Turn) -> None:
    # Keyed by event id: a redelivered or re-published event overwrites itself.
    buffers(ctx).add(event.subject, event.session_id, turn)


def buffered_turns(ctx: Context, event: ChatEvent) -> list[Turn]:
    """The session's turns up to `event`, by event time. A close ends what was said before it: a turn
    said after it waits for the session's next close, and a close published again (a replay) reads
    exactly what it read the first time."""
    return buffers(ctx).turns(event.subject, event.session_id, until=event.ts)


def _emit(ctx: Context, event: ChatEvent, reason: TriggerReason, turns: list[Turn], *,
          signals: list[str] | None = None, outcome: str | None = None, external_ref: str | None = None) -> Emit:
    task = ExtractTask(subject=event.subject, session_id=event.session_id, reason=reason, signals=signals or [],
                       turns=turns, ts=event.ts, outcome=outcome, external_ref=external_ref)
    return Emit(ctx.keys.work("extract", task.subject), task)
