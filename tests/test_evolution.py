"""Memories that evolve, through the real pipeline and a query worker on a real redis-server and a
real Edge shard: decay, consolidation, review, history and rollback, reactivation, utilisation.
Time travels through `now` and event timestamps; nothing sleeps."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import orjson
import pytest

from memflow.pipeline.ids import episode_key, new_memory
from memflow.pipeline.models import Candidate, Dir, MType, Source
from memflow.shared.redisdb.keys import FIELD
from memflow.shared.sdk.rpc import MemoryState
from tests.conftest import System, run_cli
from tests.test_system import end, memories, say

T0 = datetime(2026, 1, 5, 9, 0, tzinfo=UTC)


def active(system: System, subject: str, now: datetime) -> list[MemoryState]:
    return [m for m in system.client.inspect(subject, now=now).memories if m.status == "active"]


def feed(system: System) -> list[dict]:
    return [orjson.loads(f[FIELD.encode()]) for _, f in system.ctx.client.xrange(system.ctx.keys.changes)]


def test_decay_archives_what_faded_keeps_what_lasts_and_runs_once_per_date(system: System) -> None:
    say(system, "dee", "e1", "我正在写第三版方案，今天下午三点要开评审会。", at=T0)
    say(system, "dee", "e2", "我一直偏好结构化、要点式的文档，不要长段落。", at=T0 + timedelta(minutes=1))
    end(system, "dee", at=T0 + timedelta(minutes=30))
    assert system.client.wait_idle(timeout_s=60)
    later = T0 + timedelta(days=46)

    dry = system.client.run_job("decay", subject="dee", now=later, dry_run=True)
    archived = {c.id for c in dry.changed if c.after.get("status") == "archived"}
    assert archived and len(active(system, "dee", later)) == len(memories(system, "dee"))  # dry: nothing moved

    done = system.client.run_job("decay", subject="dee", now=later)
    assert {c.id for c in done.changed if c.after.get("status") == "archived"} == archived
    left = " | ".join(m.content for m in active(system, "dee", later))
    assert "要点" in left and "下午三点" not in left
    assert system.client.run_job("decay", subject="dee", now=later).changed == []  # same date: nothing

    found = system.client.search("dee", "帮我写文档的时候要注意什么？", k=5, now=later)
    assert found.hits and not any("下午三点" in h.content for h in found.hits)
    assert {c["memory_id"] for c in feed(system) if c["action"] == "decay"} >= archived


def test_a_later_mention_brings_an_archived_preference_back_with_less_confidence(system: System) -> None:
    say(system, "rita", "e1", "I prefer dark mode in every editor.", at=T0)
    end(system, "rita", at=T0 + timedelta(minutes=5))
    assert system.client.wait_idle(timeout_s=60)
    (pref,) = [m for m in memories(system, "rita") if m.mtype == "preference"]
    gone = T0 + timedelta(days=900)
    system.client.run_job("decay", subject="rita", now=gone)
    assert next(m for m in memories(system, "rita") if m.id == pref.id).status == "archived"
    assert not any(h.id == pref.id for h in system.client.search("rita", "dark mode", now=gone).hits)

    say(system, "rita", "e2", "I prefer dark mode in every editor.", session="s2", at=gone)
    assert system.client.wait_idle(timeout_s=60)
    back = next(m for m in memories(system, "rita") if m.id == pref.id)
    assert back.status == "active" and back.confidence == pytest.approx(pref.confidence * 0.8)
    assert back.revisions[-1].before["status"] == "archived"
    assert any(h.id == pref.id for h in system.client.search("rita", "dark mode", now=gone).hits)


def test_history_and_rollback_keep_every_version(system: System, monkeypatch: pytest.MonkeyPatch) -> None:
    say(system, "carl", "e1", "我住在北京。", at=T0)
    end(system, "carl", at=T0 + timedelta(minutes=5))
    assert system.client.wait_idle(timeout_s=60)
    say(system, "carl", "e2", "更正一下，我已经搬到上海了，不在北京了。", session="s2", at=T0 + timedelta(days=3))
    end(system, "carl", session="s2", at=T0 + timedelta(days=3, minutes=5))
    assert system.client.wait_idle(timeout_s=60)
    (now_city,) = [m for m in memories(system, "carl") if m.key == "location.city" and m.status == "active"]

    report = system.client.history(now_city.id)
    assert [(v.version, v.status) for v in report.versions] == [(1, "superseded"), (2, "active")]
    assert "北京" in report.versions[0].content and report.versions[0].revisions[-1].why
    text = run_cli(system, monkeypatch, "history", now_city.id)
    assert "v1" in text and "superseded" in text and "v2" in text

    out = run_cli(system, monkeypatch, "rollback", now_city.id, "--to", "1")
    assert "restored version 1 as v3" in out
    versions = system.client.history(now_city.id, subject="carl").versions
    assert [(v.version, v.status) for v in versions] == [(1, "superseded"), (2, "superseded"), (3, "active")]
    assert "北京" in versions[2].content
    assert any(c["action"] == "rollback" for c in feed(system))
    hits = system.client.search("carl", "我住在哪个城市？", k=3, now=T0 + timedelta(days=4)).hits
    assert "北京" in hits[0].content
    assert system.client.rollback(now_city.id, 1).restored is None  # already current: a no-op


def test_consolidation_promotes_across_sessions_and_holds_a_found_rule_for_review(
        system: System, monkeypatch: pytest.MonkeyPatch) -> None:
    for i in range(3):  # kept asking for more detail, in three sessions: an inferred preference, repeated
        at = T0 + timedelta(days=i)
        say(system, "pat", f"p{i}a", "Can you go into more detail?", session=f"s{i}", at=at)
        say(system, "pat", f"p{i}b", "Please elaborate on the second point.", session=f"s{i}", at=at)
        end(system, "pat", session=f"s{i}", at=at + timedelta(minutes=5))
    # A record whose statements were never extracted (written before a crash, or by an older version).
    record = Candidate(subject="pat", session_id="open", mtype=MType.episode, dir=Dir.events, key=episode_key("r1"),
                       content="Never send me messages on weekends.", evidence="Never send me messages on weekends.",
                       confidence=0.6, source=Source.explicit, source_event_ids=["r1"], ts=T0 + timedelta(days=2))
    system.ctx.store.put([new_memory(record)], system.ctx.embedder.encode_passages([record.content]))
    assert system.client.wait_idle(timeout_s=60)
    day = T0 + timedelta(days=2, hours=1)

    report = system.client.run_job("consolidate", subject="pat", now=day)
    promoted = [c for c in report.changed if c.after.get("tier") == "long_term"]
    assert promoted and "3 sessions" in promoted[0].why
    assert any(s.mtype == "rule" for s in report.sent)
    assert system.client.wait_idle(timeout_s=60)
    again = system.client.run_job("consolidate", subject="pat", now=day)
    assert (again.changed, again.written, again.sent) == ([], [], [])  # same date: nothing

    waiting = system.client.review_list("pat")
    (rule,) = [m for m in waiting if m.mtype == "rule"]
    assert rule.status == "pending_review" and "weekend" in rule.content
    assert rule.id in run_cli(system, monkeypatch, "review", "list", "pat")
    hits = system.client.search("pat", "when must you not message me?", now=day).hits
    assert all(h.id != rule.id for h in hits)  # held rules are never served
    assert "accepted" in run_cli(system, monkeypatch, "review", "accept", rule.id)
    hits = system.client.search("pat", "when must you not message me?", now=day).hits
    assert hits[0].id == rule.id


def test_review_settles_a_contest_once_newer_evidence_favours_one_side(system: System) -> None:
    say(system, "vic", "e1", "My manager is Dana.", at=T0)
    end(system, "vic", at=T0 + timedelta(minutes=5))
    assert system.client.wait_idle(timeout_s=60)
    (dana,) = [m for m in memories(system, "vic") if m.key.endswith("manager") and m.status == "active"]
    system.client.feedback("vic", [dana.id] * 1, at=T0 + timedelta(hours=1))
    for i in range(3):  # used enough that a plain restatement only contests it
        system.client.feedback("vic", [dana.id], at=T0 + timedelta(hours=2 + i))
    say(system, "vic", "e2", "My manager is Priya.", session="s2", at=T0 + timedelta(days=1))
    end(system, "vic", session="s2", at=T0 + timedelta(days=1, minutes=5))
    assert system.client.wait_idle(timeout_s=60)
    contested = [m for m in memories(system, "vic") if m.status == "contested"]
    assert len(contested) == 2

    early = system.client.run_job("review", subject="vic", now=T0 + timedelta(days=2))
    assert early.changed == []  # before the timeout nothing is re-judged
    late = system.client.run_job("review", subject="vic", now=T0 + timedelta(days=10))
    winners = {c.id for c in late.changed if c.after.get("status") == "active"}
    assert winners == {dana.id}  # four adoptions against one mention
    assert system.client.run_job("review", subject="vic", now=T0 + timedelta(days=10)).changed == []


def test_inspect_shows_utilisation_strength_uses_and_last_change(system: System,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    say(system, "uma", "e1", "I prefer short answers with bullet points.", at=T0)
    end(system, "uma", at=T0 + timedelta(minutes=5))
    assert system.client.wait_idle(timeout_s=60)
    day = T0 + timedelta(days=1)
    found = system.client.search("uma", "how should answers look?", k=3, now=day)
    system.client.feedback("uma", [found.hits[0].id], at=day)
    report = system.client.inspect("uma", now=day)
    use = report.utilisation
    assert use.recalled == len(found.hits) and use.adopted == 1
    assert use.share == pytest.approx(1 / len(found.hits), abs=1e-4)
    top = next(m for m in report.memories if m.id == found.hits[0].id)
    assert top.access_count == 1 and 0 < top.strength_now <= 1 and top.last_change.at
    assert system.client.inspect("uma", now=day + timedelta(days=31)).utilisation.recalled == 0
    assert "utilisation (30 days): 1 adopted" in run_cli(system, monkeypatch, "inspect", "uma",
                                                           "--now", day.isoformat())
    assert system.client.inspect("other", now=day).utilisation.recalled == 0  # per subject


def test_a_scheduled_firing_runs_in_the_query_worker_as_of_its_fire_time(system: System) -> None:
    """The scheduler's callback enqueues; the query worker (holding the store) runs the job with the
    scheduled time as `now`: the session context said on T0 is archived by the 05:00 short-term decay."""
    from apscheduler.schedulers.background import BackgroundScheduler
    from rq.job import Job
    from rq.serializers import JSONSerializer

    from memflow.scheduler.app import build_scheduler
    from tests.conftest import wait_for

    say(system, "sam", "e1", "我正在写第三版方案，今天下午三点要开评审会。", at=T0)
    end(system, "sam", at=T0 + timedelta(minutes=30))
    assert system.client.wait_idle(timeout_s=60)
    scheduler = build_scheduler(system.ctx.settings, BackgroundScheduler)
    job = scheduler.get_job("decay:short_term")
    enqueued = job.func(*job.args, **job.kwargs, now=T0 + timedelta(days=10, minutes=7))
    assert enqueued is not None

    def finished() -> object:
        fetched = Job.fetch(enqueued.id, connection=system.ctx.client, serializer=JSONSerializer)
        return fetched.latest_result()

    result = wait_for(finished, timeout_s=60, what="the scheduled decay to run")
    report = result.return_value  # type: ignore[attr-defined]
    assert report["job"] == "decay" and report["tier"] == "short_term"
    assert report["now"] == (T0 + timedelta(days=10, minutes=5)).isoformat()  # the fire time, not the clock
    assert any(c["after"].get("status") == "archived" for c in report["changed"])
    assert not any("下午三点" in m["content"] for m in active(system, "sam", T0 + timedelta(days=10)))
