"""Bad input, fuzzed (hypothesis): the client's validation and every stage's decoding.

- The client: `MemoryClient.publish` (which validates) is fed event dicts mixing valid and bad
  fields: wrong types, strings over the text limit, lone surrogates, meta nested 1,000 deep or
  holding what JSON cannot say (NaN, 2**70, bytes, sets), naive datetimes, unknown kinds and
  roles, subject ids like "*", "../x", "a b". Each call either publishes an event that the
  trigger stage reads back exactly as validated, or raises InvalidInput naming a field; never
  another exception type.
- Every stage: raw entries XADDed straight onto its input stream: random bytes, invalid UTF-8,
  lone surrogate escapes, truncated JSON, JSON of the wrong shape, another stage's valid message,
  megabyte payloads, arrays nested 300,000 deep, NaN where JSON has none, and a valid message of
  the stage with fields made bad (confidence 7.0, a naive or year-9999 timestamp, an unknown
  enum...). With the whole pipeline running, each ends in dlq:<stage> with its reason at its
  first delivery (not after a handler failed on it five times), acknowledged, with every worker
  thread alive; and an event published after them is still remembered.
- What the client accepts, the stages take: events at the first and last moments allowed, texts
  of exactly the limit and meta as deep as allowed pass every stage with no dead letter. Two
  two defects found outside this module (time references past the calendar; a vector of
  another dimension) are fixed, and their tests guard them.

A crash is another exception type from the client, a bad entry that is not dead-lettered at its
first delivery (processed, left pending, or given up on after retries), an accepted event that
is dead-lettered, or a dead worker thread. `TALLY` keeps inputs tried and crashes per surface;
it is printed when the module is done (`pytest -s tests/test_fuzz_input.py`). HYPOTHESIS_DEEP=1
tries ten times as many inputs, at random.
"""

from __future__ import annotations

import math
import os
from collections import Counter
from collections.abc import Iterator
from datetime import UTC, date, datetime, time, timedelta, timezone
from decimal import Decimal
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from memflow.pipeline.checks import DEFAULT_MAX_TEXT_BYTES, EVENT_YEARS
from memflow.pipeline.models import (
    SCHEMA_VERSION,
    Candidate,
    ChatEvent,
    ExtractTask,
    Kind,
    Role,
    WriteBatch,
)
from memflow.shared.codec import decode
from memflow.shared.errors import InvalidInput
from memflow.shared.redisdb.keys import FIELD, STAGES
from memflow.shared.sdk.client import MemoryClient
from tests.conftest import System, wait_for

DEEP = bool(os.environ.get("HYPOTHESIS_DEEP"))
CLIENT_EXAMPLES = 3000 if DEEP else 300
# Generated entries per stage, on top of the fixed ones (`landmarks`).
STAGE_EXAMPLES = 400 if DEEP else 30
LIMIT = DEFAULT_MAX_TEXT_BYTES  # the Settings default too
# Derandomized: CI tries the same inputs every time (a found bug is a fixed example, not a flake).
FUZZ = settings(max_examples=CLIENT_EXAMPLES, deadline=None, derandomize=not DEEP, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                       HealthCheck.data_too_large, HealthCheck.large_base_example])

TALLY: dict[str, Counter[str]] = {}
CRASHES: list[str] = []


def tally(surface: str, outcome: str, crash: str | None = None) -> None:
    counts = TALLY.setdefault(surface, Counter())
    counts["tried"] += 1
    counts[outcome] += 1
    if crash is not None:
        counts["crashes"] += 1
        CRASHES.append(f"{surface}: {crash}")


@pytest.fixture(scope="module", autouse=True)
def summary() -> Iterator[None]:
    yield
    lines = [f"{surface:>16}: {c['tried']} tried, {c['crashes']} crashes  "
             f"({', '.join(f'{k} {v}' for k, v in sorted(c.items()) if k not in ('tried', 'crashes'))})"
             for surface, c in TALLY.items()]
    print("\nfuzzed input (inputs tried / crashes):\n" + "\n".join(lines + CRASHES[:20]))


# ---------------------------------------------------------------------------
# Values: what a caller or a broken producer may hand us.

AT = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
OFFSETS = [UTC, timezone(timedelta(hours=14)), timezone(-timedelta(hours=12)), timezone(timedelta(hours=5, minutes=45))]


def nested(depth: int) -> Any:
    """Dicts and lists inside each other, `depth` levels deep (built without recursion)."""
    value: Any = "bottom"
    for level in range(depth):
        value = {"d": value} if level % 2 else [value]
    return value


surrogates = st.characters(categories=["Cs"])
nasty_text = st.lists(st.one_of(st.characters(), surrogates), max_size=12).map("".join)
# Around the limit in bytes, in characters of 1 to 4 bytes each.
huge_text = st.tuples(st.sampled_from("xé字😀"), st.integers(LIMIT - 8, LIMIT + 8)).map(
    lambda t: t[0] * (t[1] // len(t[0].encode())))
numbers = st.one_of(st.integers(), st.integers(min_value=2**64), st.floats(),
                    st.sampled_from([math.nan, math.inf, -math.inf, -0.0]))
offsets = st.sampled_from(OFFSETS)
aware = st.datetimes(min_value=datetime(1, 1, 2), max_value=datetime(9999, 12, 30), timezones=offsets)
in_years = st.datetimes(min_value=datetime(EVENT_YEARS.start, 1, 1), max_value=datetime(EVENT_YEARS.stop - 1, 12, 31),
                        timezones=offsets)
naive = st.one_of(st.datetimes(), st.datetimes().map(datetime.isoformat))
odd = st.sampled_from([set(), frozenset({1}), b"\xff\xfe", b"bytes", object(), Decimal("NaN"), 1j, (1, 2),
                       date(2026, 1, 1), time(9, 0), timedelta(days=1), Ellipsis, type])
deep = st.sampled_from([255, 256, 1000, 1200]).map(nested)
junk = st.one_of(st.none(), st.booleans(), numbers, nasty_text, huge_text, naive, aware, odd, deep,
                 st.lists(st.integers(), max_size=3), st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
subject_like = st.one_of(st.sampled_from(["*", "../x", "a b", "x" * 200, "x" * 128, "x" * 129, "a/b", "", "\x00",
                                          "alice\n", "é", "..", "/", "tenant:1", "a*"]), nasty_text)

json_scalar = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1),
                        st.floats(allow_nan=False, allow_infinity=False), st.text(max_size=10))
json_value = st.recursive(json_scalar, lambda kids: st.lists(kids, max_size=3)
                          | st.dictionaries(st.text(max_size=5), kids, max_size=3), max_leaves=8)
junk_value = st.recursive(st.one_of(json_scalar, junk), lambda kids: st.lists(kids, max_size=3)
                          | st.dictionaries(st.one_of(st.text(max_size=5), nasty_text), kids, max_size=3), max_leaves=6)
META_KEYS = st.sampled_from(["speaker", "explicit", "external_ref", "outcome"])

GOOD = {
    "event_id": st.text(st.characters(codec="utf-8"), min_size=1, max_size=40),
    "subject": st.sampled_from(["alice", "tenant-1", "org:7/user.3", "x" * 128]),
    "agent_id": st.one_of(st.none(), st.just("agent-1")),
    "session_id": st.sampled_from(["s1", "会话-2"]),
    "kind": st.sampled_from([k.value for k in Kind] + list(Kind)),
    "role": st.sampled_from([r.value for r in Role] + list(Role)),
    "text": st.sampled_from(["I prefer short answers.", "我住在北京", "Remember: the code is 42.", "😀" * 8192]),
    "ts": st.one_of(in_years, in_years.map(datetime.isoformat)),
    "meta": st.dictionaries(st.one_of(META_KEYS, st.text(max_size=8)), json_value, max_size=4),
}
BAD = {
    "event_id": st.one_of(st.just("e" * 257), st.just(""), nasty_text, junk),
    "subject": st.one_of(subject_like, junk),
    "agent_id": st.one_of(nasty_text, junk),
    "session_id": st.one_of(st.just("s" * 257), nasty_text, junk),
    "kind": st.one_of(st.sampled_from(["shout", "MESSAGE", ""]), junk),
    "role": st.one_of(st.sampled_from(["robot", "User", ""]), junk),
    "text": st.one_of(nasty_text, huge_text, junk),
    "ts": st.one_of(naive, junk),
    "meta": st.one_of(st.dictionaries(st.one_of(META_KEYS, nasty_text), junk_value, min_size=1, max_size=4),
                      deep.map(lambda d: {"thread": d}), junk),
}
ABSENT = object()


@st.composite
def event_dicts(draw: st.DrawFn, most_spoiled: int = 3) -> dict[str, Any]:
    """A valid event with some fields made bad or left out, and maybe unknown fields."""
    spoiled = draw(st.sets(st.sampled_from(sorted(GOOD)), min_size=1, max_size=most_spoiled))
    event = {}
    for name in GOOD:
        value = draw(st.one_of(BAD[name], st.just(ABSENT)) if name in spoiled else GOOD[name])
        if value is not ABSENT:
            event[name] = value
    return event


@st.composite
def odd_meta_events(draw: st.DrawFn) -> dict[str, Any]:
    """Every field valid but meta, which holds anything (what validation alone cannot see)."""
    event = {name: draw(GOOD[name]) for name in GOOD}
    return event | {"meta": draw(BAD["meta"])}


valid_events = st.fixed_dictionaries(GOOD)
unknown_fields = st.dictionaries(st.one_of(st.sampled_from(["confidence", "v", "extra"]), nasty_text), junk,
                                 min_size=1, max_size=2)
client_inputs = st.one_of(
    valid_events, event_dicts(most_spoiled=1), event_dicts(), odd_meta_events(),
    st.tuples(valid_events, unknown_fields).map(lambda t: t[0] | t[1]), junk)


# ---------------------------------------------------------------------------
# The client.


@pytest.fixture
def fuzz_client(settings) -> MemoryClient:
    return MemoryClient(settings)


@FUZZ
@given(event=client_inputs)
def test_the_client_publishes_a_valid_event_or_names_the_bad_field(fuzz_client: MemoryClient, event: Any) -> None:
    try:
        entry_id = fuzz_client.publish(event)
    except InvalidInput as exc:
        named = exc.field.split(".")[0]
        assert exc.reason and (named in GOOD or named == "event" or (isinstance(event, dict) and named in event)), \
            f"InvalidInput does not name a field: {exc!r}"
        tally("client", "refused")
        return
    except Exception as exc:
        tally("client", "crashed", crash=f"{type(exc).__name__}: {str(exc)[:200]}")
        raise
    # What the trigger stage will read is exactly the event as validated.
    [(_, fields)] = fuzz_client.redis.xrange(fuzz_client.keys.work("events", fuzz_client.validate(event).subject),
                                                entry_id, entry_id)
    context = {"max_text_bytes": fuzz_client.settings.limits.max_text_bytes}
    assert decode(fields[FIELD.encode()], ChatEvent, context) == fuzz_client.validate(event)
    tally("client", "published")


# ---------------------------------------------------------------------------
# Every stage's decoding.

WHEN = AT.isoformat()
TURN = {"event_id": "fz-1", "role": "user", "text": "I prefer green tea MARK.", "ts": WHEN}
EVENT = {"event_id": "fz-1", "subject": "fuzz", "session_id": "s1", "kind": "message", "role": "user",
         "text": "I prefer green tea MARK.", "ts": WHEN, "meta": {}}
TASK = {"subject": "fuzz", "session_id": "s1", "reason": "realtime", "signals": ["preference"], "turns": [TURN],
        "ts": WHEN}
CANDIDATE = {"subject": "fuzz", "session_id": "s1", "mtype": "preference", "dir": "preferences", "key": "drink.tea",
             "content": "prefers green tea MARK", "confidence": 0.9, "source": "explicit",
             "source_event_ids": ["fz-1"], "ts": WHEN}
MEMORY = {"id": "00000000-0000-4000-8000-000000000001", "subject": "fuzz", "uri": "mem://fuzz/preferences/drink.tea",
          "dir": "preferences", "mtype": "preference", "key": "drink.tea", "content": "prefers green tea MARK",
          "confidence": 0.9, "source": "explicit", "created_at": WHEN, "updated_at": WHEN}
BATCH = {"subject": "fuzz", "action": "add", "why": "new", "candidate": CANDIDATE,
         "ops": [{"op": "put", "memory": MEMORY}], "vector": [0.05] * 384}
VALID = {"trigger": EVENT, "extract": TASK, "resolve": CANDIDATE, "upsert": BATCH}
DROP = object()
NAIVE = "2026-03-02T09:00:00"
# Aware, but at the ends of datetime's range: a year later (or earlier) does not exist.
EXTREMES = ("9999-12-30T23:00:00+14:00", "0001-01-01T00:00:00-12:00")
# Stands for 1,000 levels of arrays in a message (orjson will not write them; `wire` splices them in).
TOO_DEEP = "\x00too deep"

# Per stage, changes that each make its valid message one the stage must refuse.
SUBJECTS = [(("subject",), v) for v in ("*", "a b", "x" * 200, "", None, 7, "../x y", DROP)]
MUTATIONS: dict[str, list[tuple[tuple[Any, ...], Any]]] = {
    "trigger": SUBJECTS + [
        (("event_id",), v) for v in ("", "e" * 257, 5, None, DROP)] + [
        (("session_id",), v) for v in ("", None, ["s"])] + [
        (("kind",), v) for v in ("shout", None, 3)] + [
        (("role",), v) for v in ("robot", None, DROP)] + [
        (("text",), v) for v in ("", "   ", "x" * (LIMIT + 1), "é" * (LIMIT // 2 + 1), 12, ["a"])] + [
        (("ts",), v) for v in (NAIVE, "yesterday", "2026-02-30T09:00:00Z", None, DROP, 1e20, "NaN", *EXTREMES)] + [
        (("meta",), v) for v in ("x", [1], {"t": nested(40)}, TOO_DEEP, {"speaker": 5}, {"external_ref": {"a": 1}},
                                 {"outcome": [1]})] + [
        (("confidence",), 7.0), (("v",), 2), (("v",), "1"), (("v",), None)],
    "extract": SUBJECTS + [
        (("reason",), v) for v in ("because", None)] + [
        (("signals",), v) for v in ("preference", [1], None)] + [
        (("turns",), v) for v in (None, "x", [{}], [[TURN]])] + [
        (("turns", 0, "role"), "robot"), (("turns", 0, "ts"), NAIVE), (("turns", 0, "text"), None),
        (("turns", 0, "event_id"), DROP), (("turns", 0, "extra"), 1), (("turns", 0, "speaker"), 5)] + [
        (("ts",), v) for v in (NAIVE, "soon", *EXTREMES)] + [
        (("session_id",), None), (("outcome",), 5), (("external_ref",), []), (("v",), 0)],
    "resolve": SUBJECTS + [
        (("confidence",), v) for v in (7.0, -0.1, "NaN", "Infinity", "-Infinity", None, "high", 1.0000001)] + [
        (("importance",), v) for v in (2.0, "NaN")] + [
        (("mtype",), "memo"), (("dir",), "attic"), (("source",), "hearsay"), (("key",), ""), (("key",), "k" * 201),
        (("content",), ""), (("content",), None), (("source_event_ids",), []), (("source_event_ids",), "fz-1"),
        (("source_event_ids",), [1]), (("ts",), NAIVE), (("ts",), "never"), (("ts",), EXTREMES[0]), (("expires_at",), NAIVE),
        (("extractor",), "gpt"), (("retries",), "many"), (("pinned",), "maybe"), (("v",), None)],
    "upsert": SUBJECTS + [
        (("action",), "delete"), (("why",), None), (("ops",), "put"), (("ops",), [{"op": "drop", "id": "x"}]),
        (("ops",), [{"op": "put"}]), (("ops",), [{"op": "patch", "id": "x", "expected_rev": "one", "why": "w"}]),
        (("ops",), [{"op": "patch", "id": "x", "expected_rev": 1}]),
        (("ops", 0, "memory", "confidence"), 7.0), (("ops", 0, "memory", "created_at"), NAIVE),
        (("ops", 0, "memory", "status"), "zombie"), (("ops", 0, "memory", "strength"), "NaN"),
        (("candidate", "confidence"), 7.0), (("candidate", "ts"), NAIVE), (("candidate",), None),
        (("vector",), ["NaN"] * 384), (("vector",), ["Infinity"] * 384), (("vector",), "x"), (("vector",), [[0.1]]),
        (("v",), 2)],
}


def with_change(message: dict[str, Any], path: tuple[Any, ...], value: Any) -> dict[str, Any]:
    """A copy of the message with the value at `path` changed (or dropped); unchanged if an
    earlier change took the path away."""
    copy = orjson.loads(orjson.dumps(message))
    *parents, last = path
    holder = copy
    for step in parents:
        holder = _child(holder, step)
    if not isinstance(holder, dict):
        return copy
    if value is DROP:
        holder.pop(last, None)
    else:
        holder[last] = value
    return copy


def _child(holder: Any, step: Any) -> Any:
    if isinstance(holder, dict):
        return holder.get(step)
    if isinstance(holder, list) and isinstance(step, int) and step < len(holder):
        return holder[step]
    return None


def wire(message: dict[str, Any]) -> bytes:
    raw = orjson.dumps({"v": SCHEMA_VERSION} | message)
    return raw.replace(orjson.dumps(TOO_DEEP), b"[" * 1000 + b"]" * 1000)


def landmarks(stage: str) -> list[dict[str, bytes]]:
    """One of each kind of bad entry the stage must refuse, and each mutation of its valid message alone
    (the generated entries come on top)."""
    good = wire(VALID[stage])
    other = next(s for s in STAGES if s != stage)
    return [
        {FIELD: b"\xff\xfe\x00garbage"},
        {FIELD: good.replace(b"MARK", b"\xc3\x28\xed\xa0\x80")},  # invalid UTF-8, a CESU-8 surrogate
        {FIELD: good.replace(b"MARK", b"\\ud800")},  # a lone surrogate escape
        {FIELD: good[: len(good) // 2]},
        {FIELD: b"[" + good + b"]"},
        {FIELD: wire(VALID[other])},
        {FIELD: orjson.dumps(VALID[stage])},  # no schema version
        {FIELD: wire(VALID[stage] | {"junk": "x" * (2 << 20)})},
        {FIELD: b"[" * 300_000 + b"]" * 300_000},
        {FIELD: good.replace(b'"ts":', b'"confidence":NaN,"ts":', 1)},
        {"not-" + FIELD: good},
    ] + [{FIELD: wire(with_change(VALID[stage], path, value))} for path, value in MUTATIONS[stage]]


def bad_entries(stage: str) -> st.SearchStrategy[dict[str, bytes]]:
    good = wire(VALID[stage])
    others = [wire(VALID[s]) for s in STAGES if s != stage]
    mutated = st.lists(st.sampled_from(MUTATIONS[stage]), min_size=1, max_size=3, unique_by=lambda m: m[0]).map(
        lambda changes: _apply(VALID[stage], changes))
    payload = st.one_of(
        st.binary(max_size=64),
        st.tuples(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x80", b"\\udc00", b"\\ud83d"]),
                  st.just(good)).map(lambda t: t[1].replace(b"MARK", t[0])),
        st.integers(0, len(good) - 1).map(lambda n: good[:n]),
        st.sampled_from([b"[]", b"null", b"42", b'"text"', b"true", b"{}", b'{"v": 1}', b"", wire({}),
                         good.replace(b'"v":1', b'"v":"1"'), good.replace(b'{"v":1,', b"{")]),
        json_value.map(orjson.dumps),
        st.sampled_from(others),
        st.sampled_from([1 << 20, 3 << 20]).map(lambda n: wire(VALID[stage] | {"junk": "x" * n})),
        st.sampled_from([1000, 100_000, 300_000]).map(lambda n: b"[" * n + b"]" * n),
        st.just(good.replace(b'"ts":', b'"confidence":NaN,"ts":', 1)),
        mutated.map(wire),
    )
    with_field = payload.map(lambda raw: {FIELD: raw})
    return st.one_of(with_field, with_field, with_field, payload.map(lambda raw: {"x": raw}))


def _apply(message: dict[str, Any], changes: list[tuple[tuple[Any, ...], Any]]) -> dict[str, Any]:
    for path, value in changes:
        message = with_change(message, path, value)
    return message


def generated(strategy: st.SearchStrategy[Any], count: int) -> list[Any]:
    """`count` examples of a strategy, drawn the way a test would be (derandomized in CI)."""
    found: list[Any] = []

    @settings(max_examples=count, deadline=None, derandomize=not DEEP, database=None, phases=[Phase.generate],
              suppress_health_check=list(HealthCheck))
    @given(strategy)
    def collect(value: Any) -> None:
        found.append(value)

    collect()
    return found


def test_the_valid_messages_the_mutations_start_from_are_valid() -> None:
    models = {"trigger": ChatEvent, "extract": ExtractTask, "resolve": Candidate, "upsert": WriteBatch}
    for stage, message in VALID.items():
        decode(wire(message), models[stage], {"max_text_bytes": LIMIT})


@pytest.mark.parametrize("stage", STAGES)
def test_every_bad_entry_of_a_stage_is_dead_lettered_and_the_stream_flows(system: System, stage: str) -> None:
    redis, keys = system.ctx.client, system.ctx.keys
    entries = landmarks(stage) + generated(bad_entries(stage), STAGE_EXAMPLES)
    sent = [redis.xadd(keys.input_of(stage, 0), fields).decode() for fields in entries]
    subject = f"fuzz-{stage}"
    system.client.publish({"event_id": f"after-{stage}", "subject": subject, "session_id": "s1", "kind": "message",
                           "role": "user", "text": f"Remember: my {stage} locker code word is heliotrope.",
                           "ts": AT})
    wait_for(lambda: system.client.is_idle() or not all(t.is_alive() for t in system.threads), timeout_s=90,
             what=f"{stage} to settle")

    dead = dead_letters(system, stage)
    for entry_id, fields in zip(sent, entries, strict=True):
        letter, shown = dead.get(entry_id), repr(fields)[:300]
        if letter is None:
            tally(stage, "not dead-lettered", crash=f"taken for a valid message: {shown}")
        elif letter["attempts"] != "1" or not letter["error"]:
            tally(stage, "retried", crash=f"failed {letter['attempts']} times ({letter['error'][:300]}): {shown}")
        else:
            tally(stage, "refused")
    alive = [t.name for t in system.threads if t.is_alive()]
    assert len(alive) == len(system.threads), f"worker threads died: {alive}"
    [group] = redis.xinfo_groups(keys.input_of(stage, 0))
    assert group["pending"] == 0
    assert not [c for c in CRASHES if c.startswith(f"{stage}:")], CRASHES
    found = system.client.search(subject, "locker code word", now=AT + timedelta(days=1))
    assert any("heliotrope" in hit.content for hit in found.hits), found


def dead_letters(system: System, stage: str) -> dict[str, dict[str, str]]:
    """The stage's dead letters by the id they had on its input stream: error and attempts."""
    return {f[b"source_id"].decode(): {"error": f[b"error"].decode(), "attempts": f[b"attempts"].decode()}
            for stream in system.ctx.keys.dlqs(stage) for _, f in system.ctx.client.xrange(stream)}


# ---------------------------------------------------------------------------
# What the client accepts, the stages must take: events at the edges of validity.

# The first and the last moments an event may have (the pipeline counts days, months and years from them).
EDGE_TIMES = [datetime(EVENT_YEARS.start, 1, 1, tzinfo=OFFSETS[1]),
              datetime(EVENT_YEARS.stop - 1, 12, 31, 23, 0, tzinfo=OFFSETS[2])]
EDGE_TEXTS = ["Remember: I prefer green tea.", "我下个月去上海出差", "I have a dentist appointment next Tuesday at 3pm.",
              "我习惯早上喝咖啡", "Today I want short answers.", "Last year I moved to Oslo.", "明天下午三点开会",
              "I'll be back in 900 years."]
# Texts of exactly the limit, in 4- and 2-byte characters.
FULL_TEXTS = ["😀" * (LIMIT // 4), "é" * (LIMIT // 2)]
EDGE_META = {"speaker": "Ann", "external_ref": "crm:1", "t": nested(31), "n": 2**64 - 1, "f": -1e308}


def test_events_at_the_edges_of_what_the_client_accepts_pass_every_stage(system: System) -> None:
    sent = []
    for i, at in enumerate(EDGE_TIMES):
        for n, text in enumerate(EDGE_TEXTS + (FULL_TEXTS if i == 0 else [])):
            sent.append(f"edge-{i}-{n}")
            system.client.publish({"event_id": sent[-1], "subject": f"edge-{i}", "session_id": "s1",
                                   "kind": "message", "role": "user", "text": text, "ts": at + timedelta(seconds=n),
                                   "meta": EDGE_META if n % 2 else {}})
        sent.append(f"edge-{i}-end")
        system.client.publish({"event_id": sent[-1], "subject": f"edge-{i}", "session_id": "s1",
                               "kind": "session_end", "ts": at + timedelta(minutes=5), "meta": {"outcome": "ok"}})
    assert system.client.wait_idle(timeout_s=90)
    tally_events(system, "accepted events", sent)
    assert all(t.is_alive() for t in system.threads)
    assert {stage: dead_letters(system, stage) for stage in STAGES} == {stage: {} for stage in STAGES}
    for i, at in enumerate(EDGE_TIMES):
        found = system.client.search(f"edge-{i}", "green tea", now=at + timedelta(days=1))
        assert any("green tea" in hit.content for hit in found.hits), (at, found)


def test_a_time_reference_past_the_calendar_does_not_fail_extraction(system: System) -> None:
    texts = ["I met her 5000 years ago.", "My lease ends in 99999 years.", "我10000年后回来", "Back in 10000000000000000000 days."]
    for n, text in enumerate(texts):
        system.client.publish({"event_id": f"far-{n}", "subject": "far", "session_id": "s1", "kind": "message",
                               "role": "user", "text": text, "ts": AT + timedelta(seconds=n)})
    system.client.publish({"event_id": "far-end", "subject": "far", "session_id": "s1", "kind": "session_end",
                           "ts": AT + timedelta(minutes=5)})
    assert system.client.wait_idle(timeout_s=90)
    tally_events(system, "far time refs", [f"far-{n}" for n in range(len(texts))])
    assert dead_letters(system, "extract") == {}


def test_a_vector_of_another_dimension_is_dead_lettered_at_once(system: System) -> None:
    raw = wire(with_change(BATCH, ("vector",), [0.1] * 3))
    entry_id = system.ctx.client.xadd(system.ctx.keys.input_of("upsert", 0), {FIELD: raw}).decode()
    assert system.client.wait_idle(timeout_s=90)
    letter = dead_letters(system, "upsert")[entry_id]
    if letter["attempts"] != "1":
        tally("vector dimension", "retried", crash=f"upsert: {letter['error'][:200]}")
    assert letter["attempts"] == "1"


def tally_events(system: System, surface: str, event_ids: list[str]) -> None:
    """Count each published event, and as a crash each one a dead letter carries (any stage)."""
    letters = [(stage, f) for stage in STAGES for stream in system.ctx.keys.dlqs(stage)
               for _, f in system.ctx.client.xrange(stream)]
    for event_id in event_ids:
        carried = [(stage, f[b"error"].decode()) for stage, f in letters if f'"{event_id}"'.encode() in f[b"payload"]]
        if carried:
            tally(surface, "dead-lettered", crash=f"{event_id} in {carried[0][0]}: {carried[0][1][:200]}")
        else:
            tally(surface, "passed")
