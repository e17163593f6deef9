"""Dead-letter operations: the pure filters, the selection on a real redis-server, idempotent
replay, and the command line against a running system."""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import orjson
import pytest
import redis

from memflow.pipeline.models import SCHEMA_VERSION
from memflow.shared.errors import InvalidInput
from memflow.shared.redisdb.keys import FIELD, Keys
from memflow.shared.sdk.rpc import MemoryState
from memflow.shared.streaming import dlq
from memflow.shared.streaming.dlq import DeadLetter, Where
from tests.conftest import System, run_cli, wait_for

SEC, MIN, HOUR, DAY = 1_000, 60_000, 3_600_000, 86_400_000


def alice_says(text: str, subject: str = "alice") -> bytes:
    return orjson.dumps({"v": SCHEMA_VERSION, "subject": subject, "text": text})


# -- pure ----------------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "ms"), [("30s", 30 * SEC), ("15m", 15 * MIN), ("2h", 2 * HOUR), ("7d", 7 * DAY),
                                          ("1h30m", HOUR + 30 * MIN), (" 2H ", 2 * HOUR), ("0s", 0)])
def test_durations_parse(text: str, ms: int) -> None:
    assert dlq.parse_duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "15", "m", "15x", "-5m", "1.5h", "5m!", "soon 5m"])
def test_what_is_not_a_duration_is_refused(text: str) -> None:
    with pytest.raises(InvalidInput, match="not a duration"):
        dlq.parse_duration_ms(text)


@pytest.mark.parametrize(("ms", "text"), [(0, "0s"), (999, "0s"), (45 * SEC, "45s"), (15 * MIN + 3 * SEC, "15m3s"),
                                          (2 * HOUR + 5 * MIN + 9 * SEC, "2h5m"), (DAY + 5 * MIN, "1d"),
                                          (3 * DAY + 4 * HOUR, "3d4h"), (-20, "0s")])
def test_ages_print_in_their_two_largest_units(ms: int, text: str) -> None:
    assert dlq.format_duration(ms) == text


@pytest.mark.parametrize(("payload", "subject"), [
    (alice_says("hi"), "alice"),
    (b"{not json", None),
    (b"[1, 2]", None),
    (b'{"subject": 7}', None),
    (b'{"text": "no subject"}', None),
    (b"\xff\xfe{", None),
    (b"", None),
])
def test_the_subject_is_read_from_the_payload_when_it_names_one(payload: bytes, subject: str | None) -> None:
    assert dlq.subject_of(payload) == subject


def letter(error: str = "Permanent: boom", subject: str | None = "alice", at_ms: int = 1_000_000) -> DeadLetter:
    return DeadLetter(f"{at_ms}-0", "trigger", error, 5, "events", "1-0", b"{}", subject)


def test_matching_by_reason_is_a_substring_in_any_case() -> None:
    gave_up = letter("gave up after 5 deliveries: StoreUnavailable: qdrant down")
    assert dlq.matches(gave_up, Where(error="storeunavailable"), now_ms=1_000_000)
    assert dlq.matches(gave_up, Where(error="GAVE UP"), now_ms=1_000_000)
    assert not dlq.matches(gave_up, Where(error="undecodable"), now_ms=1_000_000)


def test_matching_by_subject_is_exact_and_a_payload_without_one_matches_no_subject_filter() -> None:
    assert dlq.matches(letter(subject="alice"), Where(subject="alice"), now_ms=1_000_000)
    assert not dlq.matches(letter(subject="alice"), Where(subject="Alice"), now_ms=1_000_000)
    assert not dlq.matches(letter(subject=None), Where(subject="alice"), now_ms=1_000_000)
    assert dlq.matches(letter(subject=None), Where(error="boom"), now_ms=1_000_000)


def test_matching_by_age_reads_the_entry_id_and_older_and_newer_split_at_the_same_point() -> None:
    now_ms = 10 * HOUR
    two_hours_old = letter(at_ms=now_ms - 2 * HOUR)
    assert dlq.matches(two_hours_old, Where(older_than_ms=2 * HOUR), now_ms)
    assert not dlq.matches(two_hours_old, Where(newer_than_ms=2 * HOUR), now_ms)
    assert dlq.matches(two_hours_old, Where(older_than_ms=HOUR, newer_than_ms=3 * HOUR), now_ms)
    assert not dlq.matches(two_hours_old, Where(older_than_ms=3 * HOUR), now_ms)


def test_every_filter_must_hold() -> None:
    where = Where(error="boom", subject="alice", newer_than_ms=HOUR)
    assert dlq.matches(letter(), where, now_ms=1_000_000)
    assert not dlq.matches(letter(subject="bob"), where, now_ms=1_000_000)
    assert not dlq.matches(letter(error="other"), where, now_ms=1_000_000)
    assert Where().is_empty and not where.is_empty


# -- on redis ------------------------------------------------------------------------------


def bury(client: redis.Redis, keys: Keys, payload: bytes, error: str, age_ms: int, stage: str = "trigger") -> str:
    """A dead letter as the consumer loop writes one (`_dead_letter`), dated age_ms ago by its id."""
    record = {"payload": payload, "error": error, "attempts": 5, "source": keys.input_of(stage, 0),
              "source_id": "1-0", "stage": stage, "at": time.time()}
    entry_id = f"{dlq.server_now_ms(client) - age_ms}-0"
    return str(client.xadd(keys.dlq(stage, 0), record, id=entry_id).decode())


@pytest.fixture
def buried(client: redis.Redis, keys: Keys) -> dict[str, str]:
    """Four dead letters of trigger, oldest first (ids must grow)."""
    return {
        "alice_2d": bury(client, keys, alice_says("old"), "Permanent: rule without evidence", 2 * DAY),
        "broken_3h": bury(client, keys, b"{not json", "undecodable: invalid JSON: unexpected character", 3 * HOUR),
        "bob_20m": bury(client, keys, alice_says("x", "bob"), "gave up after 5 deliveries: StoreUnavailable: down",
                        20 * MIN),
        "alice_10s": bury(client, keys, alice_says("new"), "gave up after 5 deliveries: TimeoutError", 10 * SEC),
    }


def names(found: list[DeadLetter], buried: dict[str, str]) -> list[str]:
    by_id = {v: k for k, v in buried.items()}
    return [by_id[d.id] for d in found]


@pytest.mark.parametrize(("where", "expected"), [
    (Where(), ["alice_2d", "broken_3h", "bob_20m", "alice_10s"]),
    (Where(error="STOREUNAVAILABLE"), ["bob_20m"]),
    (Where(error="gave up"), ["bob_20m", "alice_10s"]),
    (Where(subject="alice"), ["alice_2d", "alice_10s"]),
    (Where(subject="nobody"), []),
    (Where(older_than_ms=HOUR), ["alice_2d", "broken_3h"]),
    (Where(newer_than_ms=HOUR), ["bob_20m", "alice_10s"]),
    (Where(older_than_ms=HOUR, newer_than_ms=DAY), ["broken_3h"]),
    (Where(error="gave up", subject="alice"), ["alice_10s"]),
])
def test_list_filters_by_reason_subject_and_age(client, keys, buried, where: Where, expected: list[str]) -> None:
    assert names(dlq.list_dead(client, keys, "trigger", where=where), buried) == expected


def test_list_keeps_the_reason_and_reads_the_subject(client, keys, buried) -> None:
    found = {d.id: d for d in dlq.list_dead(client, keys, "trigger")}
    assert found[buried["broken_3h"]].subject is None
    assert found[buried["broken_3h"]].error.startswith("undecodable: invalid JSON")
    assert (found[buried["bob_20m"]].subject, found[buried["bob_20m"]].attempts) == ("bob", 5)
    assert names(dlq.list_dead(client, keys, "trigger", count=1), buried) == ["alice_2d"]


def test_replay_and_drop_act_on_the_filtered_selection(client, keys, buried) -> None:
    events = keys.input_of("trigger", 0)
    assert dlq.replay(client, keys, "trigger", where=Where(subject="alice")) == 2
    assert [f[FIELD.encode()] for _, f in client.xrange(events)] == [alice_says("old"), alice_says("new")]
    assert dlq.drop(client, keys, "trigger", where=Where(error="undecodable")) == 1
    assert names(dlq.list_dead(client, keys, "trigger"), buried) == ["bob_20m"]


def test_ids_and_filters_together_select_the_named_entries_that_match(client, keys, buried) -> None:
    named = [buried["alice_2d"], buried["broken_3h"]]
    assert dlq.replay(client, keys, "trigger", named, Where(subject="alice")) == 1
    assert dlq.drop(client, keys, "trigger", named + [buried["bob_20m"]], Where(older_than_ms=HOUR)) == 1
    assert names(dlq.list_dead(client, keys, "trigger"), buried) == ["bob_20m", "alice_10s"]


def test_with_neither_ids_nor_filters_replay_and_drop_take_everything(client, keys, buried) -> None:
    assert dlq.replay(client, keys, "trigger", [buried["alice_2d"]]) == 1
    assert dlq.replay(client, keys, "trigger") == 3
    assert client.xlen(keys.input_of("trigger", 0)) == 4
    bury(client, keys, b"{}", "again", 0)
    bury(client, keys, b"{}", "and again", -1)
    assert dlq.drop(client, keys, "trigger") == 2
    assert client.xlen(keys.dlq("trigger", 0)) == 0


def test_ids_that_are_gone_or_no_ids_at_all_select_nothing(client, keys, buried) -> None:
    assert dlq.replay(client, keys, "trigger", ["1-0", "not-an-id", "12"]) == 0
    assert dlq.drop(client, keys, "trigger", ["1-0", "not-an-id"]) == 0
    assert dlq.show(client, keys, "trigger", "1-0") is None
    assert client.xlen(keys.dlq("trigger", 0)) == 4


def test_replaying_an_entry_twice_puts_it_back_once(client, keys, buried) -> None:
    entry = buried["alice_10s"]
    assert dlq.replay(client, keys, "trigger", [entry]) == 1
    assert dlq.replay(client, keys, "trigger", [entry, entry]) == 0
    assert client.xlen(keys.input_of("trigger", 0)) == 1


def test_replays_racing_for_the_same_entry_put_it_back_once(client, keys, buried) -> None:
    counts: list[int] = []
    start = threading.Barrier(8)

    def race() -> None:
        start.wait()
        counts.append(dlq.replay(client, keys, "trigger", [buried["bob_20m"]]))

    threads = [threading.Thread(target=race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert sorted(counts) == [0] * 7 + [1]
    assert client.xlen(keys.input_of("trigger", 0)) == 1


def test_a_dlq_longer_than_a_page_is_read_to_its_end(client, keys) -> None:
    now_ms = dlq.server_now_ms(client)
    pipe = client.pipeline(transaction=False)
    for n in range(1_234):
        pipe.xadd(keys.dlq("extract", 0), {"payload": alice_says("x", f"s{n % 3}"), "error": f"e{n}"},
                  id=f"{now_ms - HOUR}-{n}")
    pipe.execute()
    assert len(dlq.list_dead(client, keys, "extract", count=10_000)) == 1_234
    assert len(dlq.list_dead(client, keys, "extract", count=10_000, where=Where(subject="s2"))) == 411
    assert dlq.drop(client, keys, "extract", where=Where(error="e1233")) == 1


# -- the command line, on a running system ----------------------------------------------------


def publish_remember(system: System, event_id: str) -> None:
    system.client.publish({"event_id": event_id, "subject": "rita", "session_id": "s1", "kind": "message",
                           "role": "user", "text": "Remember: the staging database is called kestrel-7.",
                           "ts": datetime(2026, 3, 2, 9, tzinfo=UTC)})


def kestrel_memories(system: System) -> list[MemoryState]:
    return [m for m in system.client.inspect("rita").memories if "kestrel-7" in m.content]


def test_replaying_a_processed_event_twice_writes_one_memory(system: System, monkeypatch: pytest.MonkeyPatch) -> None:
    publish_remember(system, "r1")
    assert system.client.wait_idle(timeout_s=60)
    assert len(kestrel_memories(system)) == 1
    redis_, keys = system.ctx.client, system.ctx.keys
    [(source_id, fields)] = redis_.xrange(keys.work("events", "rita"))
    # A copy of the processed event, dead-lettered as the consumer loop would have done it.
    letter_id = redis_.xadd(keys.dlq("trigger", keys.partition("rita")), {
        "payload": fields[FIELD.encode()], "error": "gave up after 5 deliveries: StoreUnavailable: down",
        "attempts": 5, "source": keys.work("events", "rita"), "source_id": source_id, "stage": "trigger",
        "at": time.time()}).decode()

    assert "replayed 1" in run_cli(system, monkeypatch, "dlq", "replay", "trigger", letter_id)
    assert "replayed 0" in run_cli(system, monkeypatch, "dlq", "replay", "trigger", letter_id)
    assert redis_.xlen(keys.work("events", "rita")) == 2
    assert system.client.wait_idle(timeout_s=60)
    [memory] = kestrel_memories(system)
    assert memory.source_event_ids == ["r1"]


def test_dlq_commands_filter_and_show_stage_age_attempts_subject_reason(
        system: System, monkeypatch: pytest.MonkeyPatch) -> None:
    redis_, keys = system.ctx.client, system.ctx.keys
    redis_.xadd(keys.input_of("trigger", 0), {FIELD: b"{not json"})
    redis_.xadd(keys.input_of("trigger", 0), {FIELD: orjson.dumps({"v": SCHEMA_VERSION, "subject": "zed",
                                                                "kind": "shout"})})
    wait_for(lambda: redis_.xlen(keys.dlq("trigger", 0)) == 2, what="two dead letters")

    zed = run_cli(system, monkeypatch, "dlq", "list", "trigger", "--subject", "zed")
    [line] = [row for row in zed.splitlines() if "subject=zed" in row]
    stage, entry_id, age, attempts = line.split()[:4]
    assert (stage, attempts) == ("trigger", "attempts=1") and age.endswith("s") and "kind" in line
    assert "1 shown of 2 dead letter(s)" in zed
    assert "subject=-  undecodable: invalid JSON" in run_cli(system, monkeypatch, "dlq", "list", "trigger",
                                                             "--error", "INVALID json")
    assert "0 shown" in run_cli(system, monkeypatch, "dlq", "list", "trigger", "--older-than", "1h")
    listed = orjson.loads(run_cli(system, monkeypatch, "dlq", "list", "trigger", "--newer-than", "1h", "--json"))
    assert len(listed) == 2 and all(0 <= e["age_s"] < 3600 for e in listed)

    shown = orjson.loads(run_cli(system, monkeypatch, "dlq", "show", "trigger", entry_id))
    assert (shown["subject"], shown["error"]) == ("zed", line.split("subject=zed  ")[1])
    assert "dropped 1" in run_cli(system, monkeypatch, "dlq", "drop", "trigger", "--subject", "zed")
    assert "dropped 0" in run_cli(system, monkeypatch, "dlq", "drop", "trigger", entry_id)
    assert redis_.xlen(keys.dlq("trigger", 0)) == 1
