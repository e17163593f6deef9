"""The applier's rules (pipeline/writes.py): what a retry completes and what a replay must not force."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from memflow.pipeline import writes
from memflow.pipeline.ids import new_memory
from memflow.pipeline.models import Action, Candidate, Dir, Memory, MType, PatchOp, PutOp, Source, Status, WriteBatch

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def memory(content: str, version: int, events: list[str]) -> Memory:
    c = Candidate(subject="u1", mtype=MType.fact, dir=Dir.entities, key="location.city", content=content,
                  confidence=0.9, source=Source.explicit, source_event_ids=events, ts=T0 + timedelta(days=version))
    return new_memory(c, version=version)


def supersession() -> tuple[WriteBatch, Memory, Memory]:
    old, new = memory("我住在北京", 1, ["e1"]), memory("我搬到上海了", 2, ["e2"])
    cand = Candidate(subject="u1", mtype=MType.fact, dir=Dir.entities, key="location.city", content=new.content,
                     confidence=0.9, source=Source.explicit_correction, source_event_ids=["e2"], ts=new.created_at)
    batch = WriteBatch(subject="u1", action=Action.supersede, why="corrected", candidate=cand,
                       ops=[PutOp(memory=new), PatchOp(id=old.id, expected_rev=1, set={"status": "superseded"},
                                                       why="corrected")])
    return batch, old, new


def test_a_batch_cut_short_is_recognised_as_started() -> None:
    batch, old, new = supersession()
    m = writes.of_batch(batch)
    first = writes.plan(m, {old.id: old})
    put = next(w for w in first.writes if w.memory is not None)
    assert not first.stale and not first.started
    # The put landed, then the store failed; meanwhile the old point moved on (a job patched it).
    moved = old.model_copy(update={"rev": 2})
    again = writes.plan(m, {old.id: moved, new.id: put.memory})  # type: ignore[dict-item]
    assert again.stale == [old.id] and again.started
    assert writes.plan(m, {old.id: moved, new.id: put.memory}, rebase=True).stale == []  # type: ignore[dict-item]


def test_a_replay_meeting_its_put_by_content_alone_is_not_forced() -> None:
    """Written long ago by another attempt (or before op keys were recorded), then changed since: a
    replay finds the put by its content, but the patch is stale and must be decided again, not forced."""
    batch, old, new = supersession()
    later = new.model_copy(update={"status": Status.superseded, "rev": 3, "last_op": "another:0"})
    replay = writes.plan(writes.of_batch(batch), {old.id: old.model_copy(update={"rev": 4}), new.id: later})
    assert replay.stale == [old.id] and not replay.started
