"""Maintenance jobs through the jobs queue of a running query worker: retag (directory backfill)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest

from memflow.pipeline.ids import new_memory
from memflow.pipeline.models import Candidate, Dir, Memory, MType, Source
from memflow.pipeline.tagging import TAG_VERSION, retag
from memflow.shared.errors import RpcError
from memflow.shared.redisdb.keys import FIELD
from tests.conftest import System, run_cli

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def placed_by_old_rules(subject: str, content: str, mtype: MType = MType.fact) -> Memory:
    """A memory as an earlier tagging version left it: in `general`, tag_version 0."""
    candidate = Candidate(subject=subject, session_id="s1", mtype=mtype, dir=Dir.general, key=f"k.{abs(hash(content))}",
                          content=content, confidence=0.9, source=Source.explicit, source_event_ids=[content[:8]],
                          ts=T0)
    return new_memory(candidate).model_copy(update={"tag_version": 0})


def test_retag_moves_what_the_rules_now_place_elsewhere_and_keeps_the_rest() -> None:
    manager = placed_by_old_rules("u", "My manager is called Dana.")
    assert retag(manager) == {"dir": "entities", "uri": f"mem://u/entities/{manager.key}", "tag_version": TAG_VERSION}
    plain = placed_by_old_rules("u", "The weather was nice.")
    assert retag(plain) == {"dir": "general", "uri": plain.uri, "tag_version": TAG_VERSION}  # version still raised
    assert retag(manager.model_copy(update={"tag_version": TAG_VERSION})) is None
    tool = placed_by_old_rules("u", "npm ERR! the project name is invalid").model_copy(update={"source": Source.tool})
    assert retag(tool)["dir"] == "tools"  # type: ignore[index]


def test_retag_dry_run_then_apply_then_nothing_left(system: System, monkeypatch: pytest.MonkeyPatch) -> None:
    old = [placed_by_old_rules("ann", "My manager is called Dana."),
           placed_by_old_rules("ann", "I prefer tea over coffee.", MType.preference),
           placed_by_old_rules("bob", "We never deploy on Fridays, that is the rule.")]
    current = placed_by_old_rules("bob", "Our team is called Falcon.").model_copy(update={"tag_version": TAG_VERSION})
    everything = [*old, current]
    system.ctx.store.put(everything, system.ctx.embedder.encode_passages([m.content for m in everything]))

    dry = system.client.run_job("retag", dry_run=True, now=T0 + timedelta(days=1))
    assert dry.examined == 4 and dry.subjects == 2
    assert {c.id: c.after["dir"] for c in dry.changed} == {
        old[0].id: "entities", old[1].id: "preferences", old[2].id: "system"}
    assert "would change 3, write 0, send 0 of 4" in run_cli(system, monkeypatch, "jobs", "run", "retag", "--dry-run")
    assert system.client.inspect("ann").memories[0].dir == "general"  # a dry run changes nothing

    done = system.client.run_job("retag", subject="ann")
    assert len(done.changed) == 2 and not done.dry_run
    dirs = {m.id: m.dir for m in system.client.inspect("ann").memories}
    assert dirs == {old[0].id: "entities", old[1].id: "preferences"}
    feed = [orjson.loads(f[FIELD.encode()]) for _, f in system.ctx.client.xrange(system.ctx.keys.changes)]
    assert {c["memory_id"] for c in feed if c["action"] == "retag"} == {old[0].id, old[1].id}
    found = system.client.search("ann", "who is my manager", dirs=["entities"], now=T0 + timedelta(days=1))
    assert [h.id for h in found.hits] == [old[0].id]

    assert "did change 1, write 0, send 0 of 4" in run_cli(system, monkeypatch, "jobs", "run", "retag")  # bob's rule
    assert system.client.run_job("retag").changed == []  # idempotent: nothing left


def test_an_unknown_job_is_a_clear_error(system: System) -> None:
    with pytest.raises(RpcError, match="unknown job 'nope'"):
        system.client.run_job("nope")
