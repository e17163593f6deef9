"""trigger: `events` → `extract`. Decides when something is worth reading.

Every message passes the gate (filler dropped, secrets redacted, injections refused)
and is kept in the session's buffer; a user statement with a realtime signal
(preference, correction, rule, "remember", decision) goes to extraction at once;
`session_end` and `task_complete` send the whole buffered session.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import redis

from memflow.pipeline.fates import CLOSES_SESSION, FEEDBACK, WAITS_FOR_CLOSE, FateState, gate_refusal
from memflow.pipeline.gate import gate
from memflow.pipeline.models import ChatEvent, ExtractTask, Kind, Role, TriggerReason, Turn
from memflow.pipeline.triggers import realtime_signals
from memflow.shared.inference.llm import LLM
from memflow.shared.redisdb.keys import Keys
from memflow.shared.streaming.consumer import StreamConsumer
from memflow.shared.streaming.handlers import Emit, per_item
from memflow.shared.unstored import fates, pending
from memflow.shared.unstored.buffers import SessionBuffers
from memflow.workers.runtime import Context

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Trigger:
    """What the trigger stage touches: the events' pending layer and the extract streams (`client`, `keys`), the
    session buffers, and the LLM's per-subject counters (None: no LLM configured)."""

    client: redis.Redis
    keys: Keys
    buffers: SessionBuffers
    llm: LLM | None

    @classmethod
    def of(cls, ctx: Context) -> Trigger:
        return cls(ctx.client, ctx.keys, buffers(ctx), ctx.llm)


def build(ctx: Context) -> StreamConsumer[ChatEvent]:
    # Unpacked per event, as the context builds its parts when first used (the LLM client).
    return StreamConsumer(ctx.client, ctx.keys, "trigger", ChatEvent,
                          per_item(lambda event: handle(Trigger.of(ctx), event)), ctx.consumer_config())


def handle(stage: Trigger, event: ChatEvent) -> list[Emit]:
    if stage.llm is not None:  # what the LLM path costs is reported per event (memflow inspect)
        stage.llm.count(event.subject, {"events": 1})
    if event.kind is Kind.message:
        return on_message(stage, event)
    if event.kind in (Kind.session_end, Kind.task_complete):
        emits = on_close(stage.buffers, stage.keys, event)
        if not _reads_itself(emits, event):  # its own text, if any, is a turn with a fate of its own
            closed(stage, event)
        return emits
    # feedback: adoption is recorded by the query worker's `feedback` call
    fates.record(stage.client, stage.keys, event.subject, FateState.nothing_to_remember, [event.event_id], FEEDBACK)
    return []


def _reads_itself(emits: list[Emit], event: ChatEvent) -> bool:
    """Whether the close's own text (a task's summary) goes to extraction among its session's turns."""
    return any(isinstance(e.message, ExtractTask) and any(t.event_id == event.event_id for t in e.message.turns)
               for e in emits)


def closed(stage: Trigger, event: ChatEvent) -> None:
    """The fate of a close that is no turn: its summary refused by the gate, or nothing of its own to remember."""
    verdict = gate(event.text, Role.assistant) if event.text.strip() else None
    if verdict is not None and not verdict.keep:
        fates.record(stage.client, stage.keys, event.subject, FateState.dropped, [event.event_id],
                     gate_refusal(verdict))
    else:
        fates.record(stage.client, stage.keys, event.subject, FateState.nothing_to_remember, [event.event_id],
                     CLOSES_SESSION)


def on_message(stage: Trigger, event: ChatEvent) -> list[Emit]:
    assert event.role is not None  # guaranteed by ChatEvent's validation
    verdict = gate(event.text, event.role)
    pending.regate(stage.client, stage.keys, event, verdict)  # what a search may show of it, as gated
    if not verdict.keep:
        log.info("event %s dropped by the gate: %s", event.event_id, verdict.reason)
        fates.record(stage.client, stage.keys, event.subject, FateState.dropped, [event.event_id],
                     gate_refusal(verdict))
        return []
    turn = Turn(event_id=event.event_id, role=event.role, text=verdict.text, ts=event.ts,
                speaker=event.meta.get("speaker"))
    if event.meta.get("explicit"):
        return [_emit(stage.keys, event, TriggerReason.explicit_write, [turn],
                      external_ref=event.meta.get("external_ref"))]
    buffer_turn(stage.buffers, event, turn)
    signals = realtime_signals(turn.text) if event.role is Role.user else []
    if not signals:  # why it is still `accepted` when asked: nothing is read of it before its session closes
        fates.record(stage.client, stage.keys, event.subject, FateState.accepted, [event.event_id], WAITS_FOR_CLOSE)
    return [_emit(stage.keys, event, TriggerReason.realtime, [turn], signals=signals)] if signals else []


def on_close(held: SessionBuffers, keys: Keys, event: ChatEvent) -> list[Emit]:
    turns = buffered_turns(held, event)
    if event.kind is Kind.task_complete and event.text.strip():
        verdict = gate(event.text, Role.assistant)
        if verdict.keep:
            turns.append(Turn(event_id=event.event_id, role=Role.assistant, text=verdict.text, ts=event.ts))
    held.close(event.subject, event.session_id)
    if not turns:
        return []
    reason = TriggerReason.session_end if event.kind is Kind.session_end else TriggerReason.task_complete
    return [_emit(keys, event, reason, turns, outcome=event.meta.get("outcome"))]


def buffers(ctx: Context) -> SessionBuffers:
    """The session buffers, bounded as the settings say (MEMFLOW_SESSION_BUFFER_*)."""
    limits = ctx.settings.limits
    return SessionBuffers(ctx.client, ctx.keys, limits.session_buffer_max_turns, limits.session_buffer_ttl_s)


def buffer_turn(held: SessionBuffers, event: ChatEvent, turn: Turn) -> None:
    # Keyed by event id: a redelivered or re-published event overwrites itself.
    held.add(event.subject, event.session_id, turn)


def buffered_turns(held: SessionBuffers, event: ChatEvent) -> list[Turn]:
    """The session's turns up to `event`, by event time. A close ends what was said before it: a turn
    said after it waits for the session's next close, and a close published again (a replay) reads
    exactly what it read the first time."""
    return held.turns(event.subject, event.session_id, until=event.ts)


def _emit(keys: Keys, event: ChatEvent, reason: TriggerReason, turns: list[Turn], *,
          signals: list[str] | None = None, outcome: str | None = None, external_ref: str | None = None) -> Emit:
    task = ExtractTask(subject=event.subject, session_id=event.session_id, reason=reason, signals=signals or [],
                       turns=turns, ts=event.ts, outcome=outcome, external_ref=external_ref)
    return Emit(keys.work("extract", task.subject), task)
