"""The write path's joints, on a real redis-server and a real Edge shard: distinct statements stay
distinct, replays change nothing, a half-applied batch is completed, revisions never collide, uses are
never lost, and a deletion stays announced (docs/write-path.md#the-applier)."""

from __future__ import annotations

import os
import threading
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, Phase, given
from hypothesis import settings as settings_
from hypothesis import strategies as st

from memflow.pipeline.ids import new_memory
from memflow.pipeline.lifecycle import Step
from memflow.pipeline.models import (
    Action,
    Candidate,
    Change,
    ChatEvent,
    Dir,
    Kind,
    Memory,
    MType,
    PatchOp,
    PutOp,
    Role,
    Source,
    Status,
    WriteBatch,
)
from memflow.shared.codec import decode
from memflow.shared.errors import EmbedderRejected, StoreUnavailable
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.keys import FIELD
from memflow.shared.storage.edge_shards import shard_of
from memflow.shared.storage.store import MemoryFilter, Store
from memflow.shared.writer.uses import Uses
from memflow.workers import ops, resolve, upsert
from memflow.workers.runtime import Context
from tests.conftest import System, wait_for

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)


def snapshot(system: System, subject: str) -> dict[str, tuple[Any, ...]]:
    return {m.id: (m.key, m.status.value, m.version, m.rev, m.content, tuple(m.source_event_ids))
            for m in system.ctx.store.get(MemoryFilter(subject))}


def changes(ctx: Context) -> list[Change]:
    return [decode(fields[FIELD.encode()], Change) for _, fields in ctx.client.xrange(ctx.keys.changes, "-", "+")]


def settle(system: System) -> None:
    assert system.client.wait_idle(60), "the pipeline did not drain"


# -- distinct statements stay distinct --------------------------------------------------------------


@pytest.mark.parametrize("first,second", [
    ("Lisa went to the aquarium and saw her favorite dolphins, feeling very happy.",
     "Lisa went to the aquarium and saw her favorite sharks, feeling a little scared."),
    ("Lisa因为搬家到一个新城市感到孤独，但她交到了新朋友。", "Lisa现在住在杭州。"),
])
def test_statements_that_share_a_rule_key_are_both_kept(system: System, first: str, second: str) -> None:
    for i, text in enumerate((first, second)):
        system.client.write("lisa", text, ts=T0 + timedelta(days=i), event_id=f"w{i}")
    settle(system)
    active = {m.content for m in system.ctx.store.get(MemoryFilter("lisa", statuses=[Status.active]))}
    assert {first.rstrip(".。"), second.rstrip(".。")} <= active


def test_a_new_value_of_a_slot_still_replaces_the_old_one(system: System) -> None:
    system.client.write("lisa", "I live in Berlin.", ts=T0, event_id="w1")
    settle(system)
    system.client.write("lisa", "I moved to Lisbon.", ts=T0 + timedelta(days=3), event_id="w2")
    settle(system)
    city = system.ctx.store.get(MemoryFilter("lisa", keys=["location.city"]))
    assert {(m.content, m.status) for m in city} == {("I live in Berlin", Status.superseded),
                                                     ("I moved to Lisbon", Status.active)}


# -- replays change nothing -------------------------------------------------------------------------


def conversation(subject: str) -> list[ChatEvent]:
    said = [
        ("s1", "My manager is Tom Becker."), ("s1", "I prefer short answers."),
        ("s1", "We went to the aquarium and saw the dolphins, it was great."),
        ("s2", "Correction: my manager is now Aisha Khan."), ("s2", "Actually I like detailed answers."),
        ("s2", "We went to the aquarium and saw the sharks, it was scary."),
    ]
    events = []
    for i, (session, text) in enumerate(said):
        events.append(ChatEvent(event_id=f"{subject}-m{i}", subject=subject, session_id=session, kind=Kind.message,
                                role=Role.user, text=text, ts=T0 + timedelta(days=i)))
        if i in (2, 5):
            events.append(ChatEvent(event_id=f"{subject}-end{i}", subject=subject, session_id=session,
                                    kind=Kind.session_end, ts=T0 + timedelta(days=i, minutes=5)))
    return events


def test_publishing_the_same_events_again_changes_nothing(system: System) -> None:
    def publish_all() -> None:
        for e in conversation("replay"):
            system.client.publish(e)
        for i, animal in enumerate(("pandas", "lions")):
            system.client.write("replay", f"Bart went to the zoo and saw his favorite {animal}, feeling very happy.",
                                ts=T0 + timedelta(days=i), event_id=f"z{i}")
        settle(system)

    publish_all()
    first, announced = snapshot(system, "replay"), len(changes(system.ctx))
    assert first
    for _ in range(3):
        publish_all()
        assert snapshot(system, "replay") == first
    assert len(changes(system.ctx)) == announced


def sessions_one_after_another(system: System, subject: str, said: Sequence[str]) -> list[ChatEvent]:
    """Each text a session of its own, an hour apart, each stored before the next is published (so each is decided
    on a store that holds the one before); the events, to publish again."""
    events = []
    for i, text in enumerate(said):
        session = [ChatEvent(event_id=f"{subject}-{i}", subject=subject, session_id=f"s{i}", kind=Kind.message,
                             role=Role.user, text=text, ts=T0 + timedelta(hours=i)),
                   ChatEvent(event_id=f"{subject}-{i}-end", subject=subject, session_id=f"s{i}",
                             kind=Kind.session_end, ts=T0 + timedelta(hours=i, minutes=1))]
        for e in session:
            system.client.publish(e)
        settle(system)
        events += session
    return events


def published_again(system: System, events: Sequence[ChatEvent]) -> None:
    for e in events:
        system.client.publish(e)
    settle(system)


def test_a_turn_said_again_later_is_a_record_of_its_own_and_a_replay_writes_none(system: System) -> None:
    """The same words in two sessions, then a correction that retires the first turn's record. Each turn keeps its
    own record; published again, nothing changes. Before, the second turn's record was merged into the first's (a
    near-duplicate), and once that one was retired, a replay wrote the second turn's record anew: the write path's
    property found it under load, when batches split the turns so."""
    events = sessions_one_after_another(system, "twice", ["Correction: I live in Lisbon now.",
                                                          "Correction: I live in Lisbon now.", "更正一下，我搬到上海了。"])
    first = snapshot(system, "twice")
    records = {v[0]: v for v in first.values() if v[0].startswith("episode.")}
    assert set(records) == {"episode.twice-0", "episode.twice-1", "episode.twice-2"}
    assert records["episode.twice-1"][5] == ("twice-1",)
    published_again(system, events)
    assert snapshot(system, "twice") == first


def test_a_replay_of_a_statement_merged_into_another_key_does_not_bring_it_back(system: System) -> None:
    """"Every morning I drink oolong tea" is merged into "I drink oolong tea every morning" (another key, the same
    words); "I don't drink oolong anymore" supersedes that one. Published again, the merged statement was found under
    neither its own key (nothing there) nor among the live neighbours, and came back active: a replay or a DLQ
    re-drive resurrected a habit the user had ended. Its events now find it."""
    events = sessions_one_after_another(system, "tea", ["I drink oolong tea every morning.",
                                                        "Every morning I drink oolong tea.",
                                                        "Honestly I don't drink oolong anymore."])
    first = snapshot(system, "tea")
    habits = [v for v in first.values() if v[0].startswith("preference.habit")]
    assert [(v[1], v[5]) for v in habits] == [("superseded", ("tea-0", "tea-1"))]  # merged, then ended
    published_again(system, events)
    assert snapshot(system, "tea") == first


def test_another_subjects_event_ids_are_no_replay_of_this_subjects(system: System) -> None:
    """A second tenant who reuses this subject's event ids (any publisher can name an event as it likes): resolve asks
    what those events were read into within the candidate's own subject only, so the other's statements are stored
    as new, and this subject's memories are not touched. "tea-x" hashes to the same Edge shard as "tea-a": only the
    subject filters keep them apart."""
    shards = system.ctx.settings.store.edge_shards
    assert shard_of("tea-x", shards) == shard_of("tea-a", shards)
    sessions_one_after_another(system, "tea-a", ["I drink oolong tea every morning.", "Every morning I drink oolong tea."])
    mine = snapshot(system, "tea-a")
    for i, text in enumerate(["I drink oolong tea every morning.", "Every morning I drink oolong tea."]):
        for e in (ChatEvent(event_id=f"tea-a-{i}", subject="tea-x", session_id=f"s{i}", kind=Kind.message,
                            role=Role.user, text=text, ts=T0 + timedelta(hours=i)),
                  ChatEvent(event_id=f"tea-a-{i}-end", subject="tea-x", session_id=f"s{i}", kind=Kind.session_end,
                            ts=T0 + timedelta(hours=i, minutes=1))):
            system.client.publish(e)
        settle(system)
    theirs = [m for m in system.ctx.store.get(MemoryFilter("tea-x")) if m.subject == "tea-x"]
    assert sorted(m.key for m in theirs) == sorted(v[0] for v in mine.values())  # stored as new, not replays
    assert snapshot(system, "tea-a") == mine


# -- one applier: half-applied batches, revisions, uses, deletions ----------------------------------


class FailingStore:
    """The real store, failing once on the n-th `set_fields` (a store outage between two writes)."""

    def __init__(self, inner: Store, fail_at: int) -> None:
        self.inner, self.fail_at, self.calls = inner, fail_at, 0

    def set_fields(self, subject: str, memory_id: str, fields: dict[str, Any], *, if_rev: int | None = None) -> None:
        self.calls += 1
        if self.calls == self.fail_at:
            raise StoreUnavailable("injected: the store went away between two writes")
        self.inner.set_fields(subject, memory_id, fields, if_rev=if_rev)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def keyed(content: str, key: str, version: int, events: Sequence[str], at: datetime) -> Memory:
    c = Candidate(subject="u1", session_id="s", mtype=MType.fact, dir=Dir.entities, key=key, content=content,
                  confidence=0.9, source=Source.explicit, source_event_ids=list(events), ts=at)
    return new_memory(c, version=version)


def test_a_batch_cut_short_by_the_store_is_completed_by_its_retry(store_ctx: Context,
                                                                  embedder: Embedder) -> None:
    ctx = store_ctx
    old = [keyed("我住在北京", "location.city", 1, ["e1"], T0), keyed("我住在天津", "location.city.x", 1, ["e2"], T0)]
    ctx.store.put(old, embedder.encode_passages([m.content for m in old]))
    newer = keyed("我搬到上海了", "location.city", 2, ["e3"], T0 + timedelta(days=1))
    cand = Candidate(subject="u1", mtype=MType.fact, dir=Dir.entities, key="location.city", content=newer.content,
                     confidence=0.9, source=Source.explicit_correction, source_event_ids=["e3"], ts=newer.created_at)
    retire = {"status": Status.superseded.value, "superseded_by": newer.id}
    batch = WriteBatch(subject="u1", action=Action.supersede, why="explicit correction", candidate=cand,
                       ops=[PutOp(memory=newer), *(PatchOp(id=m.id, expected_rev=1, set=retire, why="corrected")
                                                   for m in old)],
                       vector=embedder.encode_passages([newer.content])[0], vector_model=embedder.model_id)
    ctx._store = FailingStore(ctx.store, fail_at=2)
    with pytest.raises(StoreUnavailable):
        upsert.handle(upsert.Upserter.of(ctx), batch)
    emits = upsert.handle(upsert.Upserter.of(ctx), batch)  # the redelivery
    assert not [e for e in emits if e.stream == ctx.keys.work("resolve", "u1")], "sent back instead of completed"
    stored = {m.id: m for m in ctx.store.get(MemoryFilter("u1"))}
    assert stored[newer.id].status is Status.active
    assert all(stored[m.id].status is Status.superseded and stored[m.id].rev == 2 for m in old)
    said = [c.memory_id for c in changes(ctx)] + [e.message.memory_id for e in emits if isinstance(e.message, Change)]
    assert sorted(said) == sorted([newer.id, *(m.id for m in old)]), "each change announced exactly once"
    assert upsert.handle(upsert.Upserter.of(ctx), batch) == [] and len(changes(ctx)) == 3  # a third delivery: nothing at all


def test_concurrent_changes_never_share_a_revision(store_ctx: Context, embedder: Embedder) -> None:
    """Jobs, ops and upsert change one point from many threads: every change gets its own revision,
    logged once; none is written over another built on the same revision."""
    ctx = store_ctx
    memory = keyed("我住在北京", "location.city", 1, ["e1"], T0)
    ctx.store.put([memory], embedder.encode_passages([memory.content]))
    rounds, workers = 15, 4

    def worker(n: int) -> None:
        for i in range(rounds):
            while True:  # a planner reads, plans and applies; a stale plan is planned again
                current = ctx.store.get(MemoryFilter("u1", ids=[memory.id]))[0]
                if ops.apply_steps(ctx.applier, [Step(current, {"confidence": round(0.5 + (n * rounds + i) / 1000, 4)},
                                                  f"thread {n} round {i}")], "review", T0) == []:
                    break

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(workers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    final = ctx.store.get(MemoryFilter("u1", ids=[memory.id]))[0]
    assert final.rev == 1 + rounds * workers
    assert [r.rev for r in final.revisions] == list(range(2, final.rev + 1))


def test_uses_counted_from_many_threads_are_all_kept(store_ctx: Context, embedder: Embedder) -> None:
    ctx = store_ctx
    memory = keyed("我住在北京", "location.city", 1, ["e1"], T0)
    ctx.store.put([memory], embedder.encode_passages([memory.content]))
    applier, uses, utilisation = ctx.applier, Uses(ctx.client, ctx.keys), ops.UtilisationCounters(ctx.client, ctx.keys)
    threads = [threading.Thread(target=lambda: [ops.feedback(applier, uses, utilisation, "u1", [memory.id], T0,
                                                             uuid.uuid4().hex) for _ in range(20)])
               for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    ops.fold_uses(applier, uses, "u1")  # what a call found the write lock taken for stayed recorded: counted now
    assert ctx.store.get(MemoryFilter("u1", ids=[memory.id]))[0].access_count == 80


def test_a_forgotten_memory_stays_announced_as_deleted(system: System) -> None:
    system.client.write("f1", "My locker code is 4471 at the gym.", ts=T0, event_id="f1-e1")
    settle(system)
    target = wait_for(lambda: system.ctx.store.get(MemoryFilter("f1", statuses=[Status.active])), what="stored")
    ids = [m.id for m in target]  # type: ignore[attr-defined]
    report = system.client.forget_report("f1", ids)
    assert report.count == len(ids)
    deleted = [c for c in changes(system.ctx) if c.action == "forget"]
    assert sorted(c.memory_id for c in deleted) == sorted(ids)
    raw = b"".join(orjson.dumps(c.model_dump(mode="json")) for c in deleted)
    assert b"4471" not in raw and b"locker" not in raw, "an announcement of a deletion holds no words"
    assert system.client.verify_forgotten("f1", ids).verified


# A vocabulary that collides: slots and their corrections, words keys shared by chance, preferences, zh and en.
SAYINGS = (
    "I live in Berlin.", "Correction: I live in Lisbon now.", "I moved to Porto.", "我住在北京。", "更正一下，我搬到上海了。",
    "I prefer short answers.", "Actually I like detailed answers.", "My manager is Tom Becker.",
    "We went to the aquarium and saw the dolphins, it was great.", "We went to the aquarium and saw the sharks.",
    "Remember that I am allergic to peanuts.", "我们决定用PostgreSQL做数据库。", "I always write tests first.",
)


# Sequences per run (PYTEST_WRITE_PATH_EXAMPLES to try more): ~0.8 s each here. Derandomized: CI tries the same ones
# (the seed is drawn from this test's source: an edit of it draws others). At 24 it found, under load, a turn's
# record merged into an earlier turn's and written anew by the replay once that one was retired
# (test_a_turn_said_again_later_is_a_record_of_its_own_and_a_replay_writes_none); 6 had never met it.
SEQUENCES = int(os.environ.get("PYTEST_WRITE_PATH_EXAMPLES", "24"))


@pytest.mark.timeout(900)
@settings_(max_examples=SEQUENCES, deadline=None, derandomize=True, phases=[Phase.generate],
           suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, len(SAYINGS) - 1), st.integers(0, 2), st.booleans()), min_size=1,
                max_size=10))
def test_any_sequence_of_events_published_again_changes_nothing(system: System, said: list[Any]) -> None:
    subject = f"p{uuid.uuid4().hex[:8]}"
    events, open_sessions = [], set()
    for i, (n, session, ends) in enumerate(said):
        at = T0 + timedelta(hours=i)
        events.append(ChatEvent(event_id=f"{subject}-{i}", subject=subject, session_id=f"s{session}",
                                kind=Kind.message, role=Role.user, text=SAYINGS[n], ts=at))
        open_sessions.add(session)
        if ends:
            events.append(ChatEvent(event_id=f"{subject}-{i}-end", subject=subject, session_id=f"s{session}",
                                    kind=Kind.session_end, ts=at + timedelta(minutes=1)))
            open_sessions.discard(session)
    for e in events:
        system.client.publish(e)
    settle(system)
    first, announced = snapshot(system, subject), len(changes(system.ctx))
    for e in events:
        system.client.publish(e)
    settle(system)
    again = snapshot(system, subject)
    assert again == first, ([SAYINGS[n] for n, _, _ in said], {i: (first.get(i), again.get(i)) for i in set(first) | set(again) if first.get(i) != again.get(i)})
    assert len(changes(system.ctx)) == announced


# -- resolve asks the store once per batch ------------------------------------------------------------


class CountingStore:
    """The real store, counting the searches asked of it; `down` makes them fail (a store outage)."""

    def __init__(self, inner: Store) -> None:
        self.inner, self.single, self.batches, self.down = inner, 0, 0, False

    def query(self, *args: Any, **kwargs: Any) -> Any:
        self.single += 1
        return self.inner.query(*args, **kwargs)

    def query_many(self, queries: Any) -> Any:
        self.batches += 1
        if self.down:
            raise StoreUnavailable("injected: the store is down")
        return self.inner.query_many(queries)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class RejectingEmbedder:
    """The real embedder, but an endpoint's refusal of any text that says REJECT (`EmbedderRejected`)."""

    def __init__(self, inner: Embedder) -> None:
        self.inner = inner

    def encode_passages(self, texts: Sequence[str]) -> list[list[float]]:
        if any("REJECT" in t for t in texts):
            raise EmbedderRejected("injected: the endpoint refuses this input")
        return self.inner.encode_passages(texts)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


def test_resolve_places_a_batch_from_one_store_call_as_it_would_one_at_a_time(store_ctx: Context,
                                                                             embedder: Embedder) -> None:
    ctx = store_ctx
    home = keyed("我住在北京", "location.city", 1, ["e1"], T0)
    ctx.store.put([home], embedder.encode_passages([home.content]))

    def said(content: str, key: str, event: str, mtype: MType = MType.fact) -> Candidate:
        return Candidate(subject="u1", session_id="s", mtype=mtype, dir=Dir.entities, key=key, content=content,
                         confidence=0.9, source=Source.explicit, source_event_ids=[event], ts=T0 + timedelta(days=1))

    batch = [said("我住在北京", "location.city", "e2"),  # a duplicate of what is stored
             said("我搬到上海了", "location.city.new", "e3"),  # close to it, under another key
             said("REJECT this one", "note.x", "e4"),  # refused by the endpoint: fails alone
             said("我养了一只猫", "pet.kind", "e5")]  # nothing known on it
    ctx._embedder = RejectingEmbedder(embedder)
    counting = CountingStore(ctx.store)
    ctx._store = counting
    outcomes = resolve.handle(resolve.Resolver.of(ctx), batch)
    assert (counting.batches, counting.single) == (1, 0), "one engine call for the whole batch"
    assert isinstance(outcomes[2], EmbedderRejected)
    for candidate, outcome in zip(batch, outcomes, strict=True):
        if candidate.key == "note.x":
            continue
        vector = embedder.encode_passages([candidate.content])[0]
        alone = resolve.find_neighbours(counting.inner, candidate, vector, resolve.NEIGHBOUR_THRESHOLD)
        assert outcome == resolve.resolve_one(resolve.Resolver.of(ctx), candidate, vector, alone), candidate.content
    actions = [o[0].message.action for o in outcomes if isinstance(o, list) and isinstance(o[0].message, WriteBatch)]
    assert actions == [Action.duplicate, Action.add, Action.add]  # the second: another key, not a duplicate

    counting.down = True
    failed = resolve.handle(resolve.Resolver.of(ctx), batch)
    assert all(isinstance(o, StoreUnavailable) for i, o in enumerate(failed) if i != 2), "each is retried"
    assert isinstance(failed[2], EmbedderRejected)
