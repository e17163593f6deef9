"""Records: what happened, kept verbatim with provenance (docs/write-path.md#episodes).

One episode per user/assistant turn (a chunk is one turn: two topics of two turns never
share a record); tool output kept apart, low-confidence and short-lived; a skill from a
task that succeeded; preferences shown by behaviour rather than said.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from memflow.pipeline import cues
from memflow.pipeline.drafts import (
    INFERRED_CONFIDENCE,
    RECORD_CONFIDENCE,
    SKILL_CONFIDENCE,
    TOOL_CONFIDENCE,
    Draft,
    stamp,
)
from memflow.pipeline.ids import episode_key
from memflow.pipeline.models import Candidate, ExtractTask, Memory, MType, PatchOp, Role, Source, Turn
from memflow.pipeline.statements import CJK, clean, is_question
from memflow.pipeline.topics import key_for, normalize_key

# Follow-ups in one session before they count as a preference (docs/write-path.md#triggers).
FOLLOWUPS_FOR_PREFERENCE = 2

# What a procedure looks like: commands in backticks, numbered or bulleted steps, "run …".
_PROCEDURE = re.compile(
    r"`[^`]+`|^\s*(?:\d+[.)、]|[-*•])\s|\$ |\b(?:run|execute|install|then|first|step)\b|运行|执行|安装|然后|步骤|命令",
    re.IGNORECASE | re.MULTILINE,
)
# Repeated follow-ups → an inferred reply-length preference: (cue, key, content zh, content en).
_BEHAVIOURS = (
    (
        cues.MORE_DETAIL,
        "reply.length",
        "偏好更详细的回答（多次追问细节）",
        "Prefers more detailed answers (kept asking)",
    ),
    (cues.LESS_DETAIL, "reply.length", "偏好更简短的回答（多次嫌回答太长）", "Prefers shorter answers (kept asking)"),
)


def turn_record(task: ExtractTask, turn: Turn, before: Sequence[Turn] = (), after: Sequence[Turn] = ()) -> Candidate:
    """The verbatim record of a turn: an episode (with the turns `before` and `after` it as
    context), or tool output kept apart from what was said. Its context events are the turns
    just before and after it: a search lifts it by their keyword scores (`pipeline.score.smoothed`)."""
    if turn.role is Role.tool:
        key = normalize_key(f"tool.{turn.event_id}")
        draft = Draft(MType.session_context, key, said(turn), turn.text, Source.tool, TOOL_CONFIDENCE)
        return stamp(task, turn, draft)
    source = Source.explicit if turn.role is Role.user else Source.derived
    draft = Draft(MType.episode, episode_key(turn.event_id), said(turn), turn.text, source, RECORD_CONFIDENCE)
    neighbours = [*before[-1:], *after[:1]]
    return stamp(task, turn, draft).model_copy(
        update={"context": "\n".join(said(t) for t in (*before, *after)),
                "context_event_ids": [t.event_id for t in neighbours]})


def said_by_assistant(memory: Memory) -> bool:
    """Whether a record is the verbatim turn of the assistant (or the system): an episode not said by the user
    (`turn_record` gives those `Source.derived`) that is no task's record. Its words are the assistant's, not a
    fact of the user's; what the user answered to it is in the user's own record, whose context holds it."""
    return (memory.mtype is MType.episode and memory.source is Source.derived
            and not memory.content.startswith(TASK_RECORD))


def said(turn: Turn) -> str:
    return f"{turn.speaker}: {turn.text}" if turn.speaker else turn.text


# How a task's record opens: the other episode not said by the user (`said_by_assistant`).
TASK_RECORD = "task "


def task_record(task: ExtractTask, summary: Turn) -> Candidate:
    """The task_complete event as an episode: what was attempted and how it ended."""
    said = f"{TASK_RECORD}{task.outcome or 'complete'}: {summary.text}"
    draft = Draft(MType.episode, episode_key(summary.event_id), said, summary.text, Source.derived, RECORD_CONFIDENCE)
    return stamp(task, summary, draft)


def skill(task: ExtractTask, anchor: Turn, summary: Turn | None, session: list[Turn]) -> list[Candidate]:
    """What worked, as a reusable procedure: the outcome, what was asked, the steps given."""
    asked = next((t for t in session if t.role is Role.user and is_question(t.text)), None)
    steps = [t for t in session if t.role is not Role.tool and _PROCEDURE.search(t.text)]
    steps = steps or [t for t in session if t.role is Role.assistant][-1:]
    used = [t for t in (summary, asked, *steps) if t is not None]
    content = " — ".join(dict.fromkeys(clean(t.text) for t in used))
    if not content:
        return []
    key = key_for(MType.skill, clean(used[0].text))
    draft = Draft(MType.skill, key, content, content, Source.derived, SKILL_CONFIDENCE)
    ids = list(dict.fromkeys([anchor.event_id, *(t.event_id for t in used)]))
    return [stamp(task, anchor, draft, ids)]


def behaviour(task: ExtractTask, turns: list[Turn]) -> list[Candidate]:
    """Preferences shown rather than said: the same kind of follow-up, again and again."""
    found = []
    for cue, key, zh, en in _BEHAVIOURS:
        asked = [t for t in turns if t.role is Role.user and cue.search(t.text)]
        if len(asked) < FOLLOWUPS_FOR_PREFERENCE:
            continue
        # Fixed wording, so that the same behaviour in a later session is a repeat, not a rival.
        content = zh if any(CJK.search(t.text) for t in asked) else en
        evidence = " / ".join(t.text for t in asked)
        draft = Draft(MType.preference, key, content, evidence, Source.inferred, INFERRED_CONFIDENCE)
        found.append(stamp(task, asked[-1], draft, [t.event_id for t in asked]))
    return found


def unsaid(records: Sequence[Memory], forgotten: Sequence[Memory],
           why: str = "a turn beside it was forgotten", quiet: bool = True) -> list[PatchOp]:
    """Patches taking forgotten turns out of the context of the records around them.

    A record is indexed with the turns beside it (`turn_record`), so a forgotten turn's words live
    on in its neighbours' `context` until they are taken out. Quiet patches: a revision or an
    announcement would keep the very words they remove.
    """
    lines = {m.content for m in forgotten if m.mtype is MType.episode}
    events = {e for m in forgotten for e in m.source_event_ids}
    gone = {m.id for m in forgotten}
    patches = []
    for r in records:
        kept = [line for line in r.context.split("\n") if line not in lines]
        if r.id in gone or len(kept) == len(r.context.split("\n")):
            continue
        patches.append(PatchOp(id=r.id, expected_rev=r.rev, quiet=quiet, why=why,
                               set={"context": "\n".join(kept),
                                    "context_event_ids": [e for e in r.context_event_ids if e not in events]}))
    return patches

