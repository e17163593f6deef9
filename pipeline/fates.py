"""What became of a published event (docs/front-doors.md#an-events-fate): its fate, and the words that say why.

A publish is answered before any processing (202), so a caller asks later, by the event's id, what the pipeline
made of it. The stage that decides a fate records it (shared/unstored/fates.py):

- `accepted`: published, not decided yet. A turn that waits in its session's buffer until the session closes
  stays here until then, and says so (`reason`).
- `stored`: in the store, as `memory_ids` (the memories read from it, or that it repeats: a repeat adds its
  provenance to the memory it repeats). The ids grow as its statements land, one write at a time.
- `nothing_to_remember`: read, and nothing in it was worth keeping (the agent's configuration in a system turn, the
  close of a session itself, a feedback event). Not refused: there was nothing to store.
- `dropped`: refused, and why: the gate (an instruction to the assistant, filler, nothing but a secret), or
  forgotten while it was in flight.
- `dead_lettered`: a stage gave up on it (`reason`); `memflow dlq replay` sends it through again.

How a later word meets an earlier one (`_MERGE` in shared/unstored/fates.py applies these rules in Redis):
memory ids only ever add up; `accepted` never undoes a decision (an event published again keeps its fate) and comes
back only over `dead_lettered` (a dead letter replayed); `nothing_to_remember` never hides that something of it is
stored or refused (a turn read again at its session's end, after its statement landed); `dropped` never hides that
something of it is stored; `stored` and `dead_lettered` are the latest word.
"""

from __future__ import annotations

from enum import Enum

from pydantic import Field

from memflow.pipeline.gate import GateVerdict
from memflow.pipeline.models import Action, PatchOp, PutOp, Subject, Wire, WriteBatch


class FateState(str, Enum):
    accepted = "accepted"
    stored = "stored"
    nothing_to_remember = "nothing_to_remember"
    dropped = "dropped"
    dead_lettered = "dead_lettered"


class FateAsked(Wire):
    """Which event's fate is asked: its id (as published, ChatEvent.event_id) under its subject."""

    subject: Subject
    event_id: str = Field(min_length=1, max_length=256)


class EventFate(Wire):
    """What became of one published event, as far as the pipeline has got."""

    event_id: str
    subject: Subject
    state: FateState
    memory_ids: list[str] = Field(default_factory=list)
    reason: str | None = None


# The gate's reasons (pipeline/gate.py `GateVerdict.reason`) in plain words: what a refused write is told, and a
# dropped event's fate says.
GATE_REASONS = {
    "injection": "it reads as an instruction to the assistant, not something about the user: memflow never "
                 "stores one",
    "filler": "it is filler (an acknowledgement, a greeting): there is nothing in it to remember",
    "empty": "nothing is left of it to remember once its secrets are taken out",
}

# Why a turn read from a closed session left no memory, and why a control event has no memory of its own.
WAITS_FOR_CLOSE = ("waits in its session until the session closes (a session_end or task_complete event): "
                   "nothing is read of it before")
NOTHING_IN_IT = "read, and nothing in it was worth remembering"
CLOSES_SESSION = "it closes a session: each of the session's turns has a fate of its own"
FEEDBACK = "feedback is counted on the memories it names, not stored as a memory"
FORGOTTEN_IN_FLIGHT = "forgotten while it was in flight: nothing of it is written"


def gate_refusal(verdict: GateVerdict) -> str:
    """Why the gate refused a message, in plain words."""
    return GATE_REASONS.get(verdict.reason or "", f"the gate refused it ({verdict.reason})")


def stored_as(batch: WriteBatch) -> dict[str, list[str]]:
    """Per event of a write batch's candidate, the memories the batch stores it as: those it puts, and the memory
    a repeat adds its provenance to (a retirement of another memory is none of them). An event of the candidate
    that no memory names as its source is stored as all of them: the candidate was read from it."""
    found: dict[str, list[str]] = {e: [] for e in batch.candidate.source_event_ids}
    for op in batch.ops:
        if isinstance(op, PutOp):
            events, memory_id = op.memory.source_event_ids, op.memory.id
        elif isinstance(op, PatchOp) and (op.add_source_event_ids or batch.action is Action.duplicate):
            events, memory_id = op.add_source_event_ids or batch.candidate.source_event_ids, op.id
        else:
            continue
        for event_id in events:
            found.setdefault(event_id, []).append(memory_id)
    every = list(dict.fromkeys(m for ids in found.values() for m in ids))
    return {e: ids or every for e, ids in found.items()}
