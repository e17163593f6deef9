"""Isolation between subjects (issue 7): randomised probes on a real redis-server and Edge shard.

Fifty subjects say overlapping things (a shared pool of statements, Chinese and English) and each
one thing of its own (a marker token); a thousand searches, a hundred packs, every inspect, the
search traces, feedback and forget must then show each subject its own memories and nothing else.
Subject ids that look like filters or paths are isolated too, and ids the model refuses never
reach a stream. Run with `-s` to see the figures.
"""

from __future__ import annotations

import random
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
from pydantic import SecretStr

from memflow.bench.llm_echo import echo
from memflow.bench.llm_stub import ScriptedLLM
from memflow.pipeline.models import SearchResult
from memflow.shared.errors import InvalidInput, RpcError
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.keys import FIELD
from memflow.shared.redisdb.server import RedisServer
from memflow.shared.settings import Settings
from tests.conftest import System, start_system, wait_for

# The thousand probes take most of a minute on a quiet two-core machine; a loaded CI runner gets room.
pytestmark = pytest.mark.timeout(300)

SEED = 20260307
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
LATER = T0 + timedelta(days=1)
SUBJECTS = [f"s{i:02d}" for i in range(50)]
SEARCHES = 1000
PACKS = 100
# (statement, a question about it): every subject says a handful of these, so subjects overlap.
SHARED = [
    ("I prefer short answers with bullet points.", "how should answers be formatted"),
    ("My project is called Atlas.", "what is my project called"),
    ("我住在上海。", "我住在哪里"),
    ("I usually drink green tea in the morning.", "what do I drink in the morning"),
    ("Remember: the deploy window is Friday afternoon.", "when is the deploy window"),
    ("我喜欢用Python写代码。", "我喜欢用什么语言写代码"),
    ("My manager is Dana Whitfield.", "who is my manager"),
    ("I always review pull requests before lunch.", "when do I review pull requests"),
    ("We decided to use Postgres for the billing service.", "which database do we use for billing"),
    ("I am allergic to peanuts.", "what am I allergic to"),
    ("我的猫叫小白。", "我的猫叫什么名字"),
    ("Remember: my favourite editor is Neovim.", "which editor do I like"),
]
WORDS = ["kestrel", "heliotrope", "marzipan", "obsidian", "quokka", "tamarind", "zephyr", "lantern", "juniper",
         "saffron", "basalt", "nimbus", "origami", "pelican", "quartz", "verbena", "walnut", "yarrow"]
# Valid by the model (SUBJECT_PATTERN) though they look like paths, filters or key separators.
ODD_SUBJECTS = ["../etc", "a/b", "a:b", "..", ".", "L" * 128, "plain"]
# Refused by the model: the client must raise InvalidInput and append nothing.
REFUSED_SUBJECTS = ["*", "a*", "?", "L" * 129, "a b", "", "a\nb", "ab\n", "a\tb", "é", "ａ", "a\x00b", "[ab]"]


@dataclass
class World:
    system: System
    markers: dict[str, str]  # subject -> the token only it ever said
    ids: dict[str, set[str]]  # subject -> its memory ids, read once after ingest
    rng: random.Random


@dataclass
class Probes:
    runs: list[tuple[str, str, SearchResult]] = field(default_factory=list)
    traces_before: int = 0  # entries of the traces feed before the probes began


# -- seeding -------------------------------------------------------------------------


def marker_statement(marker: str) -> str:
    return f"Remember: my boat is named {marker}."


def say(system: System, subject: str, session: str, n: int, text: str) -> None:
    system.client.publish({"event_id": f"{subject}-{session}-{n}", "subject": subject, "session_id": session,
                           "kind": "message", "role": "user", "text": text, "ts": T0 + timedelta(minutes=n)})


def end(system: System, subject: str, session: str) -> None:
    system.client.publish({"event_id": f"end-{subject}-{session}", "subject": subject, "session_id": session,
                           "kind": "session_end", "ts": T0 + timedelta(hours=1)})


def seed_subject(system: System, rng: random.Random, subject: str, marker: str, index: int) -> None:
    """A handful of shared statements and the subject's marker; a third say the marker through write()."""
    statements = [text for text, _ in rng.sample(SHARED, rng.randint(2, 5))]
    if index % 3 == 0:
        system.client.write(subject, f"My boat is named {marker}.", ts=T0, event_id=f"write-{subject}")
    else:
        statements.insert(rng.randrange(len(statements) + 1), marker_statement(marker))
    for n, text in enumerate(statements):
        say(system, subject, "s1", n, text)
    end(system, subject, "s1")


def own_ids(system: System, subject: str) -> set[str]:
    return {m.id for m in system.client.inspect(subject).memories}


def isolated_settings(redis_server: RedisServer, data_dir: Path) -> Settings:
    # As conftest's `settings`, for a system shared by the module (a prefix of its own, never FLUSHALL).
    return Settings(redis_url=redis_server.url, stream_prefix=f"t{uuid.uuid4().hex[:10]}:", data_dir=data_dir,
                    reclaim_idle_ms=300, block_ms=50, retry_base_s=0.01, retry_max_s=0.2)


@pytest.fixture(scope="module")
def world(redis_server: RedisServer, embedder: Embedder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    system = start_system(isolated_settings(redis_server, tmp_path_factory.mktemp("isolation")), embedder)
    try:
        rng = random.Random(SEED)
        markers = {s: f"{s}-{rng.choice(WORDS)}{rng.randrange(1000, 10000)}" for s in SUBJECTS}
        for index, subject in enumerate(SUBJECTS):
            seed_subject(system, rng, subject, markers[subject], index)
        assert system.client.wait_idle(timeout_s=90), "the pipeline did not drain"
        yield World(system, markers, {s: own_ids(system, s) for s in SUBJECTS}, rng)
    finally:
        system.shutdown()


# -- checking --------------------------------------------------------------------------


def foreign_markers(world: World, subject: str, text: str) -> list[str]:
    """The other subjects' markers that appear in `text`."""
    lowered = text.lower()
    return [m for s, m in world.markers.items() if s != subject and m.lower() in lowered]


def hit_leaks(world: World, subject: str, result: SearchResult) -> list[str]:
    """What in a search result belongs to someone else: foreign ids and foreign markers."""
    leaks = [f"id {h.id} is not {subject}'s" for h in result.hits if h.id not in world.ids[subject]]
    return leaks + [f"{m} in {h.content!r}" for h in result.hits for m in foreign_markers(world, subject, h.content)]


def probe_query(world: World, subject: str) -> str:
    """Shared words, another subject's marker, both, or a question only the subject's marker answers."""
    rng = world.rng
    other = world.markers[rng.choice([s for s in SUBJECTS if s != subject])]
    question = rng.choice(SHARED)[1]
    return rng.choice([question, other, f"{question} {other}", f"{other} {rng.choice(SHARED)[0]}",
                       "what is my boat named"])


def search_traces(system: System, skip: int) -> list[dict[str, Any]]:
    entries = system.ctx.transient.xrange(system.ctx.keys.traces)[skip:]
    found = [orjson.loads(fields[FIELD.encode()]) for _, fields in entries]
    return [t for t in found if t.get("kind") == "search"]


@pytest.fixture(scope="module")
def probes(world: World) -> Probes:
    """The thousand searches, spread over the subjects (k=10), run once for the tests that read them."""
    client = world.system.client
    run = Probes(traces_before=client.queue_redis.xlen(world.system.ctx.keys.traces))
    for i in range(SEARCHES):
        subject = SUBJECTS[i % len(SUBJECTS)] if i < len(SUBJECTS) else world.rng.choice(SUBJECTS)
        query = probe_query(world, subject)
        run.runs.append((subject, query, client.search(subject, query, k=10, now=LATER)))
    return run


# -- the randomised probes -----------------------------------------------------------------


def test_every_subject_keeps_its_own_copy_of_what_others_also_said(world: World) -> None:
    """Overlapping statements are never merged across subjects: each has its own marker and memories."""
    leaks, shared_copies = [], 0
    for subject in SUBJECTS:
        memories = world.system.client.inspect(subject).memories
        assert any(world.markers[subject] in m.content for m in memories), f"{subject} lost its marker"
        leaks += [f"{subject}: {m.id} has subject {m.subject}" for m in memories if m.subject != subject]
        leaks += [f"{subject}: {x}" for m in memories for x in foreign_markers(world, subject, m.content)]
        shared_copies += sum(1 for m in memories if any(text in m.content for text, _ in SHARED))
    everyone = [i for ids in world.ids.values() for i in ids]
    assert len(everyone) == len(set(everyone)), "two subjects share a memory id"
    print(f"\nisolation: inspect of {len(SUBJECTS)} subjects, {len(everyone)} memories "
          f"({shared_copies} holding a shared statement), {len(leaks)} leaks")
    assert not leaks


def test_a_thousand_searches_find_only_the_subjects_own_memories(world: World, probes: Probes) -> None:
    leaks, failed, found_own = [], [], 0
    for subject, query, result in probes.runs:
        failed += [f"{subject} {query!r}: {result.error}"] if result.status == "failed" else []
        leaks += [f"search({subject!r}, {query!r}): {x}" for x in hit_leaks(world, subject, result)]
        found_own += any(world.markers[subject] in h.content for h in result.hits)
    hits = sum(len(r.hits) for _, _, r in probes.runs)
    print(f"\nisolation: {len(probes.runs)} searches, {hits} hits, {len(leaks)} leaks, "
          f"{found_own} found the subject's own marker")
    assert len(probes.runs) == SEARCHES and not failed, failed[:3]
    # Not vacuous: most answers hold memories, and the subject's own marker is among them.
    assert hits >= 3 * SEARCHES and found_own >= SEARCHES // 2
    assert not leaks, leaks[:5]


def test_search_traces_name_only_the_queried_subject_and_its_memories(world: World, probes: Probes) -> None:
    traces = search_traces(world.system, probes.traces_before)[:SEARCHES]
    assert len(traces) == SEARCHES
    leaks = []
    for trace, (subject, _, result) in zip(traces, probes.runs, strict=True):
        chosen, candidates = [str(i) for i in trace["chosen"]], [str(c["id"]) for c in trace["candidates"]]
        assert trace["subject"] == subject and chosen == [h.id for h in result.hits]
        leaks += [f"trace of {subject}: {i}" for i in chosen + candidates if i not in world.ids[subject]]
    print(f"\nisolation: {len(traces)} search traces, {len(leaks)} leaks")
    assert not leaks, leaks[:5]


def test_a_hundred_packs_hold_only_the_subjects_own_memories(world: World) -> None:
    rng, leaks = random.Random(SEED + 1), []
    for _ in range(PACKS):
        subject = rng.choice(SUBJECTS)
        query = f"{rng.choice(SHARED)[1]} {world.markers[rng.choice(SUBJECTS)]}"
        packed = world.system.client.pack(subject, query, budget_tokens=600, now=LATER)
        lines = [packed.system, *packed.preferences, *packed.rules, *packed.memories]
        leaks += [f"pack({subject!r}, {query!r}): {x}" for line in lines for x in foreign_markers(world, subject, line)]
        leaks += [f"pack({subject!r}): used {i}" for i in packed.used_ids if i not in world.ids[subject]]
    print(f"\nisolation: {PACKS} packs, {len(leaks)} leaks")
    assert not leaks, leaks[:5]


def access_count(system: System, subject: str, memory_id: str) -> int:
    [found] = [m for m in system.client.inspect(subject).memories if m.id == memory_id]
    return int(found.access_count)


def test_feedback_through_another_subject_adopts_nothing(world: World) -> None:
    """Hotness: naming another subject's memory as adopted neither counts nor warms it."""
    rng, client = random.Random(SEED + 2), world.system.client
    for _ in range(10):
        a, b = rng.sample(SUBJECTS, 2)
        target = rng.choice(sorted(world.ids[b]))
        before, adopted = access_count(world.system, b, target), client.inspect(b).utilisation.adopted
        assert client.feedback(a, [target], at=LATER) == 0
        assert access_count(world.system, b, target) == before
        assert client.inspect(b).utilisation.adopted == adopted


def test_forget_through_another_subject_forgets_nothing(world: World) -> None:
    rng, client = random.Random(SEED + 3), world.system.client
    for _ in range(10):
        a, b = rng.sample(SUBJECTS, 2)
        assert client.forget(a, contains=world.markers[b]) == 0
        assert client.forget(a, sorted(world.ids[b])) == 0
        assert own_ids(world.system, b) == world.ids[b]
        result = client.search(b, f"what is my boat named {world.markers[b]}", k=10, now=LATER)
        assert any(world.markers[b] in h.content for h in result.hits), f"{b} lost its marker"


# -- subject ids that look like filters or paths ------------------------------------------


def test_subject_ids_like_paths_and_separators_are_isolated_from_each_other(system: System) -> None:
    markers = {s: f"odd{i}-{w}" for i, (s, w) in enumerate(zip(ODD_SUBJECTS, WORDS, strict=False))}
    for subject, marker in markers.items():
        for n, (text, _) in enumerate(SHARED[:4]):
            say(system, subject, "s1", n, text)
        say(system, subject, "s1", 9, marker_statement(marker))
        end(system, subject, "s1")
    assert system.client.wait_idle(timeout_s=60)
    assert sorted(system.ctx.store.subjects()) == sorted(ODD_SUBJECTS)
    ids = {s: own_ids(system, s) for s in ODD_SUBJECTS}
    for subject, marker in markers.items():
        memories = system.client.inspect(subject).memories
        assert {m.subject for m in memories} == {subject} and any(marker in m.content for m in memories)
        others = [m for s, m in markers.items() if s != subject]
        assert not [m for m in memories if any(o in m.content for o in others)], subject
        for query in [*others, "what is my boat named", SHARED[0][1]]:
            result = system.client.search(subject, query, k=10, now=LATER)
            assert result.status == "ok" and {h.id for h in result.hits} <= ids[subject], (subject, query)
    with pytest.raises(InvalidInput):  # a wildcard is no subject: refused before it reaches a filter
        system.client.inspect("*")


def test_a_session_buffer_belongs_to_one_subject_whatever_the_separators(system: System) -> None:
    say(system, "a", "b:c", 0, "I keep my spare keys under the blue flowerpot.")
    say(system, "a:b", "c", 0, "I prefer tea over coffee.")
    end(system, "a:b", "c")
    end(system, "a", "b:c")
    assert system.client.wait_idle(timeout_s=60)
    leaked = [m.content for m in system.client.inspect("a:b").memories if "flowerpot" in m.content]
    assert not leaked, f"subject 'a:b' holds subject 'a''s words: {leaked}"


def test_refused_subject_ids_never_reach_a_stream(system: System) -> None:
    for subject in REFUSED_SUBJECTS:
        with pytest.raises(InvalidInput) as refused:
            say(system, subject, "s1", 0, "I prefer short answers.")
        assert refused.value.field == "subject", subject
        with pytest.raises(InvalidInput):
            system.client.write(subject, "My project is called Atlas.")
        with pytest.raises(InvalidInput):
            end(system, subject, "s1")
        with pytest.raises(InvalidInput):
            system.client.search(subject, "what is my project called")
    assert sum(system.ctx.client.xlen(s) for s in system.ctx.keys.inputs_of("trigger")) == 0
    assert system.ctx.store.subjects() == []


def test_an_event_that_skips_the_client_with_a_refused_subject_goes_to_the_dlq(system: System) -> None:
    """The trigger stage validates again: a raw XADD with a bad subject is dead-lettered, never stored."""
    raw = {"v": 1, "event_id": "raw-1", "subject": "a b", "session_id": "s1", "kind": "message", "role": "user",
           "text": "Remember: my project is called Atlas.", "ts": T0.isoformat(), "agent_id": None, "meta": {}}
    system.ctx.client.xadd(system.ctx.keys.input_of("trigger", 0), {FIELD: orjson.dumps(raw)})
    dlq = system.ctx.keys.dlq("trigger", 0)
    wait_for(lambda: system.ctx.client.xlen(dlq) == 1, what="the bad event in dlq:trigger")
    assert system.client.wait_idle(timeout_s=30)
    assert system.ctx.store.subjects() == []


def test_a_wildcard_subject_id_shows_no_one_elses_llm_counters(settings: Settings, embedder: Embedder) -> None:
    """inspect(SUBJECT) reports the subject's LLM use; "*" (refused as a subject) must not report everyone's."""
    with ScriptedLLM(echo) as server:
        configured = settings.replace(llm_base_url=server.url, llm_model="scripted",
                                      llm_api_key=SecretStr("sk-test-isolation-0123456789"))
        running = start_system(configured, embedder)
        try:
            say(running, "alice", "s1", 0, "I prefer short answers with bullet points.")
            end(running, "alice", "s1")
            assert running.client.wait_idle(timeout_s=60)
            assert running.client.inspect("alice").llm.subject.events == 2
            with pytest.raises(InvalidInput):
                running.client.inspect("*")
            # ...and the query worker refuses it too, whoever calls it; no subject id names the totals.
            with pytest.raises(RpcError, match="subject"):
                running.client._call("inspect", "*", None)
            keys = running.ctx.keys
            assert keys.llm_usage(None) not in {keys.llm_usage(s) for s in ("*", "all", "-all", ":all", "")}
        finally:
            running.shutdown()
