"""Rule-based extraction: an ExtractTask's turns → candidates (docs/write-path.md#extraction).

Chinese and English, no model. Per trigger reason:
- realtime: one candidate per signalled statement of the user (preference, correction,
  rule, remember, decision);
- session_end: one episode per user/assistant turn, tool output kept apart, plus every
  fact, event, preference, rule and decision the user stated;
- task_complete: the trigger appends the task_complete event itself as the last turn
  (stamped with the task's time); a skill on success, decisions, episodes;
- explicit_write: the whole text as one memory, typed by what it says.
Every turn passes the gate again here: a secret or an injection that slipped past the
trigger still never becomes a candidate.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import replace
from datetime import datetime

from memflow.pipeline import cues
from memflow.pipeline.clauses import parts
from memflow.pipeline.drafts import EMPHATIC_CONFIDENCE, EXPLICIT_CONFIDENCE, Draft, stamp
from memflow.pipeline.gate import gate, untrusted_directive
from memflow.pipeline.ids import is_keyed
from memflow.pipeline.models import Candidate, ExtractTask, MType, Role, Source, TriggerReason, Turn
from memflow.pipeline.records import behaviour, skill, task_record, turn_record
from memflow.pipeline.statements import CJK, clean, split_sentences, strip_correction, strip_remember
from memflow.pipeline.timeref import find_time, strip_time, temp_expiry
from memflow.pipeline.topics import habit_key, key_basis, key_for, project_of, salient_words, topic_of
from memflow.pipeline.triggers import Cues, read_cues

_PLACEHOLDER = re.compile(r"\[REDACTED:[a-z_]+\]")


def extract(task: ExtractTask, *, episode_context: bool = True,
            statements: list[Candidate] | None = None) -> list[Candidate]:
    """The candidates in a task, one per statement, merged where two say the same.

    `statements`, when given, stand in for the rules' statements (the LLM path: see
    `pipeline.llm_extract`); the verbatim records are the rules' either way.
    `episode_context=False` leaves episodes without the turns around them (the ablation's baseline).
    """
    records, said = read(task)
    return assemble(records, said if statements is None else statements, episode_context=episode_context)


def assemble(records: list[Candidate], statements: list[Candidate], *, episode_context: bool = True
             ) -> list[Candidate]:
    """A task's candidates from its records and its statements (whoever read them), merged."""
    found = records + statements
    if not episode_context:
        found = [c.model_copy(update={"context": "", "context_event_ids": []}) for c in found]
    return _merged(found)


def read(task: ExtractTask) -> tuple[list[Candidate], list[Candidate]]:
    """The task's verbatim records (episodes, tool output, task records, behaviour) and, apart, the
    statements the rules find in it (preferences, rules, facts, events, decisions, skills)."""
    handlers: dict[TriggerReason, Callable[[ExtractTask], tuple[list[Candidate], list[Candidate]]]] = {
        TriggerReason.realtime: _realtime,
        TriggerReason.session_end: _session_end,
        TriggerReason.task_complete: _task_complete,
        TriggerReason.explicit_write: _explicit_write,
    }
    return handlers[task.reason](task)


def _realtime(task: ExtractTask) -> tuple[list[Candidate], list[Candidate]]:
    return [], [c for turn in gated(task.turns) if turn.role is Role.user for c in _statements(task, turn, True)]


def _session_end(task: ExtractTask) -> tuple[list[Candidate], list[Candidate]]:
    turns = gated(task.turns)
    said = [c for turn in turns if turn.role is Role.user for c in _statements(task, turn, False)]
    return _records(task, turns) + behaviour(task, turns), said


def _task_complete(task: ExtractTask) -> tuple[list[Candidate], list[Candidate]]:
    turns = gated(task.turns)
    # Of the session's statements only decisions are taken here (docs/write-path.md#triggers: written
    # once confirmed); facts wait for session_end.
    summary = turns[-1] if turns and turns[-1].ts == task.ts else None
    session = turns[:-1] if summary is not None else turns
    records = _records(task, session)
    decisions = [c for t in session if t.role is Role.user for c in _statements(task, t, False)]
    said = [c for c in decisions if c.mtype is MType.decision]
    if summary is not None:
        records.append(task_record(task, summary))
    if task.outcome == "success" and (summary or session):
        said += skill(task, summary or session[-1], summary, session)
    return records, said


# The turns indexed with a record: two before (a reply's question, and what the question was
# about: "Did you go?" follows "I signed up for a pottery class") and one after (the answer to
# a question). One more turn before: LoCoMo R@10 +1.5 (bench/RESULTS.md); one more after cost 2.
CONTEXT_BEFORE = 2
CONTEXT_AFTER = 1


def _records(task: ExtractTask, turns: list[Turn]) -> list[Candidate]:
    """One record per turn, each with the turns of its exchange around it (`exchange`) as context."""
    said = [t for t in turns if t.role is not Role.tool]
    around = {t.event_id: exchange(said, i) for i, t in enumerate(said)}
    return [turn_record(task, t, *around.get(t.event_id, ((), ()))) for t in turns]


def exchange(said: list[Turn], i: int) -> tuple[list[Turn], list[Turn]]:
    """The turns around turn `i` that belong to its exchange: up to `CONTEXT_BEFORE` before it and `CONTEXT_AFTER`
    after it, each side only if the other party speaks in it. A reply means nothing without the question it
    answers; a statement said right after another of the same speaker's is a statement of its own: "I do yoga
    on Sundays", indexed with "My brother does marketing for a living" said just before it, answered "What do I
    do for a living?"."""
    before, after = said[max(0, i - CONTEXT_BEFORE):i], said[i + 1:i + 1 + CONTEXT_AFTER]
    party = _party(said[i])
    return (before if any(_party(t) != party for t in before) else [],
            after if any(_party(t) != party for t in after) else [])


def _party(turn: Turn) -> tuple[Role, str | None]:
    return turn.role, turn.speaker


def _explicit_write(task: ExtractTask) -> tuple[list[Candidate], list[Candidate]]:
    found = []
    for turn in gated(task.turns):
        draft = _draft(turn.text, read_cues(turn.text), turn.ts, written=True)
        if draft is not None:
            found.append(stamp(task, turn, draft))
    return [], found


def gated(turns: Iterable[Turn]) -> list[Turn]:
    """The turns the gate keeps, with their text redacted; system turns are configuration."""
    kept = []
    for turn in turns:
        verdict = gate(turn.text, turn.role)
        if verdict.keep and turn.role is not Role.system:
            kept.append(turn.model_copy(update={"text": verdict.text.strip()}))
    return kept


def _statements(task: ExtractTask, turn: Turn, realtime: bool) -> list[Candidate]:
    """One candidate per fact the user states: per sentence, and per part of a compound one (pipeline/clauses.py)."""
    found = []
    for part in (p for sentence in split_sentences(turn.text) for p in parts(sentence)):
        cue = read_cues(part.text)
        if cue.question or (realtime and not cue.signals):
            continue
        draft = _draft(part.text, cue, turn.ts, evidence=part.evidence)
        if draft is not None:
            found.append(stamp(task, turn, draft))
    return found


def _draft(sentence: str, cue: Cues, ts: datetime, written: bool = False, evidence: str | None = None) -> Draft | None:
    """One statement as a draft; None when it states nothing worth keeping."""
    corrected = cue.correction and not written  # an explicit write is taken as written
    # A change said in passing replaces the old value as a correction does, in the user's own words.
    replaces = corrected or (cue.change and not written)
    body = strip_remember(sentence) if cue.remember else clean(sentence)
    body = strip_correction(body) if corrected else body
    if not salient_words(body) or _PLACEHOLDER.search(body):
        return None  # names nothing ("I love it"), or a secret was here
    mtype = _mtype(body, cue, ts) or (MType.fact if written else None)
    if mtype is None:
        return None
    untrusted = mtype in _BINDING and untrusted_directive(body) is not None
    if untrusted:  # an order about someone else than the user served is kept as what the user said (issue 30)
        mtype = MType.fact
    emphatic = written or cue.remember or cue.correction
    draft = Draft(
        mtype=mtype,
        key=statement_key(mtype, body),
        slot=statement_slot(mtype, body),
        content=body,
        evidence=(evidence or sentence).strip(),
        source=Source.explicit_correction if replaces else Source.explicit,
        confidence=EMPHATIC_CONFIDENCE if emphatic else EXPLICIT_CONFIDENCE,
        pinned=cue.forever and (mtype is MType.rule or cue.remember) and not untrusted,
    )
    return timed(draft, ts)


# What binds the assistant once stored: rendered as a rule or as how the user must be served.
_BINDING = frozenset({MType.rule, MType.preference, MType.temp_preference})


def statement_slot(mtype: MType, body: str) -> bool:
    """Whether the key of this statement names one single-valued thing (a topic or an attribute), so that
    a newer value on it may replace this one; a routine, an event or a words key names no such thing."""
    if not is_keyed(mtype) or (mtype is MType.preference and _bare_habit(body)):
        return False
    return key_basis(mtype, body) != "words"


def statement_key(mtype: MType, body: str) -> str:
    """The key of a statement of this type, for every extractor: a routine is keyed by its own words,
    an event without its time phrase, anything else by its topic (pipeline.topics.key_for)."""
    if mtype is MType.preference and _bare_habit(body):
        return habit_key(body)
    return key_for(mtype, strip_time(body) if mtype is MType.event else body)


def _mtype(body: str, cue: Cues, ts: datetime) -> MType | None:
    """What a statement is, most binding first: a rule over a decision over a preference."""
    if cue.rule:
        return MType.rule
    if cue.decision:
        return MType.decision
    if cue.preference:
        return _wish_or_habit(body, cue)
    # "We moved to Leipzig last month": the new value, not an event over once its month has passed. "The standup
    # moved to tomorrow" is still an event: a change is told when it has happened.
    ref = find_time(body, ts)
    if ref is not None and not cues.RECURRING_DATE.search(body) and not (cue.change and ref.past):
        return MType.event
    if cues.CONTEXT.search(body) and topic_of(body) is None:
        return MType.session_context
    if _states_fact(body) or cue.remember or cue.correction or cue.change:
        return MType.fact
    return None


def _wish_or_habit(body: str, cue: Cues) -> MType:
    """A preference, temporary or standing (a habit is a standing one; so is a new one that replaces it:
    "these days it's a flat white" is no wish for today)."""
    return MType.temp_preference if cue.temporary and not cue.change else MType.preference


def _bare_habit(body: str) -> bool:
    """"我平时用手机看新闻比较多": a routine, said without 喜欢/prefer. It is keyed by its own words,
    never by a single-valued topic it mentions: it must not replace which phone the user has."""
    return bool(cues.HABIT.search(body)) and not cues.STATED_PREFERENCE.search(body)


def _states_fact(body: str) -> bool:
    """First-person facts, or an assertion about a known topic or a named project."""
    topic = topic_of(body)
    about = (topic is not None and topic.mtype is MType.fact) or project_of(body) is not None
    return bool(cues.FIRST_PERSON_FACT.search(body) or (about and cues.ASSERTION.search(body)))


def timed(draft: Draft, ts: datetime) -> Draft:
    """Events carry their resolved date and expire when it is over; temporary wishes lapse."""
    if draft.mtype is MType.temp_preference:
        return replace(draft, expires_at=temp_expiry(draft.content, ts))
    ref = find_time(draft.content, ts) if draft.mtype is MType.event else None
    if ref is None:
        return draft
    dated = f"{draft.content}（{ref.label}）" if CJK.search(draft.content) else f"{draft.content} ({ref.label})"
    return replace(draft, content=dated, expires_at=None if ref.past else ref.end)


def _merged(found: list[Candidate]) -> list[Candidate]:
    """One candidate per (type, key, content): a statement repeated in a task keeps all its events."""
    by_statement: dict[tuple[MType, str, str], Candidate] = {}
    for c in found:
        seen = by_statement.get((c.mtype, c.key, c.content))
        if seen is not None:
            ids = list(dict.fromkeys([*seen.source_event_ids, *c.source_event_ids]))
            c = seen.model_copy(update={"source_event_ids": ids})
        by_statement[(c.mtype, c.key, c.content)] = c
    return list(by_statement.values())
