"""Provable forgetting: after `forget`, nothing returns the memory and no Redis place keeps its words."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from memflow.pipeline.models import ChatEvent, Kind, Role
from memflow.shared.codec import encode
from memflow.shared.errors import InvalidInput
from memflow.shared.redisdb.keys import FIELD
from tests.conftest import System, run_cli

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
SECRET_WORD = "heliotrope"


def said(system: System, subject: str) -> None:
    for i, text in enumerate([f"Remember: my locker code word is {SECRET_WORD}-42.",
                              "I prefer short answers with bullet points."]):
        system.client.publish({"event_id": f"{subject}-e{i}", "subject": subject, "session_id": "s1",
                               "kind": "message", "role": "user", "text": text, "ts": T0 + timedelta(minutes=i)})
    system.client.publish({"event_id": f"{subject}-end", "subject": subject, "session_id": "s1",
                           "kind": "session_end", "ts": T0 + timedelta(minutes=5)})
    assert system.client.wait_idle(timeout_s=60)


def redis_values_naming(system: System, word: bytes) -> list[str]:
    """Every key under this deployment's prefix whose value holds `word` (the search traces aside:
    they keep the queries people typed, redacted, not memories)."""
    r, keys = system.ctx.client, system.ctx.keys
    found = []
    for key in r.scan_iter(match=keys.prefix + "*"):
        if key.decode() == keys.traces:
            continue
        kind = r.type(key).decode()
        if kind == "stream":
            blob = b"".join(v for _, fields in r.xrange(key) for v in fields.values())
        elif kind == "hash":
            blob = b"".join(r.hgetall(key).values())
        elif kind == "string":
            blob = r.get(key) or b""
        else:
            continue
        if word in blob:
            found.append(key.decode())
    return found


def test_forget_leaves_no_point_and_no_words_and_verify_proves_it(system: System,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    said(system, "fran")
    said(system, "gus")  # another subject saying the same: must keep every word of it
    before = [m.id for m in system.client.inspect("fran").memories if SECRET_WORD in m.content]
    assert len(before) >= 2  # the statement and the verbatim record of its turn
    assert redis_values_naming(system, SECRET_WORD.encode())

    report = system.client.forget_report("fran", contains=SECRET_WORD)
    assert sorted(report.ids) == sorted(before) and report.scrubbed

    now = T0 + timedelta(days=1)
    found = system.client.search("fran", f"what is my locker code word {SECRET_WORD}?", k=20, now=now)
    assert not {h.id for h in found.hits} & set(before)
    assert all(SECRET_WORD not in h.content for h in found.hits)
    packed = system.client.pack("fran", "locker code word", budget_tokens=800, now=now)
    assert SECRET_WORD not in " ".join([*packed.preferences, *packed.rules, *packed.memories])
    assert all(SECRET_WORD not in m.content for m in system.client.inspect("fran").memories)
    # ...nor in the context of the turn said after it (a record is indexed with the turns beside it).
    assert all(SECRET_WORD not in m.context for m in system.client.inspect("fran").memories)
    assert not [k for k in redis_values_naming(system, SECRET_WORD.encode()) if "fran" in k or "gus" not in k
                and _fran_entries(system, k)]

    proof = system.client.verify_forgotten("fran", before)
    assert proof.verified and proof.in_store == [] and proof.residue == {}
    # The other subject lost nothing.
    assert any(SECRET_WORD in m.content for m in system.client.inspect("gus").memories)
    out = run_cli(system, monkeypatch, "forget", "fran", *before, "--verify")
    assert "verified: True" in out and "points in the store: 0" in out


def _fran_entries(system: System, key: str) -> bool:
    """Whether a shared stream still holds an entry of fran's naming the word."""
    r = system.ctx.client
    if r.type(key).decode() != "stream":
        return False
    return any(b"fran" in b"".join(f.values()) and SECRET_WORD.encode() in b"".join(f.values())
               for _, f in r.xrange(key))


def test_verify_fails_for_what_was_never_forgotten(system: System) -> None:
    said(system, "hal")
    kept = [m.id for m in system.client.inspect("hal").memories][:1]
    proof = system.client.verify_forgotten("hal", kept)
    assert not proof.verified and proof.unknown == kept and proof.in_store == kept


def test_words_forgotten_while_in_flight_are_never_written_back(system: System) -> None:
    """A session's end still being read when one of its memories is forgotten: not written back."""
    said(system, "ida")
    forgotten = system.client.forget_report("ida", contains=SECRET_WORD).ids
    assert forgotten
    # The same session end delivered again (a redelivery after a crash, or a task still queued).
    system.client.publish({"event_id": "ida-e0", "subject": "ida", "session_id": "s2", "kind": "message",
                           "role": "user", "text": f"Remember: my locker code word is {SECRET_WORD}-42.",
                           "ts": T0 + timedelta(minutes=10)})
    system.client.publish({"event_id": "ida-end2", "subject": "ida", "session_id": "s2", "kind": "session_end",
                           "ts": T0 + timedelta(minutes=15)})
    assert system.client.wait_idle(timeout_s=60)
    assert all(SECRET_WORD not in m.content for m in system.client.inspect("ida").memories)
    # No point came back (the stream now holds the words again: they were published again).
    assert system.client.verify_forgotten("ida", forgotten).in_store == []


def test_verify_finds_a_record_still_quoting_a_forgotten_turn(system: System) -> None:
    said(system, "hal")
    shown = system.client.inspect("hal").memories
    records = [m for m in shown if m.mtype == "episode"]
    secret = next(m for m in records if SECRET_WORD in m.content)
    neighbour = next(m for m in records if m.id != secret.id)
    fact = next(m for m in shown if m.mtype != "episode" and SECRET_WORD in m.content)
    report = system.client.forget_report("hal", [fact.id])
    assert report.count == 1 and report.records == [secret.id]  # the turn's record holds its words: it goes too
    assert system.client.verify_forgotten("hal", report.forgotten_ids).verified
    # A store written before forget took turns out of their neighbours' context (issue 14's wider window).
    system.ctx.store.set_fields(neighbour.subject, neighbour.id, {"context": secret.content})
    proof = system.client.verify_forgotten("hal", report.forgotten_ids)
    assert not proof.verified and proof.residue == {"record_context": 1} and proof.still_held == [neighbour.id]


def test_forgetting_a_record_alone_names_the_memory_still_quoting_its_words(system: System) -> None:
    """The verbatim record of a turn forgotten by id, the memory distilled from it kept: its words are still
    held (the memory's content and the span it was read from), and both the forget and its proof say so."""
    said(system, "ike")
    shown = system.client.inspect("ike").memories
    secret = next(m for m in shown if m.mtype == "episode" and SECRET_WORD in m.content)
    fact = next(m for m in shown if m.mtype != "episode" and SECRET_WORD in m.content)
    report = system.client.forget_report("ike", [secret.id])
    assert report.records == [] and report.still_held == [fact.id]
    proof = system.client.verify_forgotten("ike", [secret.id])
    assert not proof.verified and proof.still_held == [fact.id] and proof.in_store == []


# -- secrets leave every copy (issue 30 item 6) ----------------------------------------------------------------

SECRETS = {"sk-live-9fQ2xW7mZ4kP1vB8nR3tY6cJ": "api_key", "AKIAJ7Q3LX5RZ2M4WN8P": "api_key",
           "Maple!Leaf77": "password", "4111 1111 1111 1111": "bank_card"}
TURN = ("Setting up billing: key sk-live-9fQ2xW7mZ4kP1vB8nR3tY6cJ, AWS AKIAJ7Q3LX5RZ2M4WN8P, "
        "my password is Maple!Leaf77 and the card 4111 1111 1111 1111. I prefer invoices by e-mail.")


def test_a_secret_never_reaches_the_events_stream_or_any_redis_copy(system: System) -> None:
    """Before: the memories and traces were redacted, but the `events` stream (and with it the AOF and the
    replicas) kept the turn verbatim for the retention window."""
    system.client.publish({"event_id": "kim-e1", "subject": "kim", "session_id": "s1", "kind": "message",
                           "role": "user", "text": TURN, "ts": T0})
    # At once, before any stage read it: the stream entry and the pending entry are what publish wrote.
    assert {s: redis_values_naming(system, s.encode()) for s in SECRETS} == {s: [] for s in SECRETS}
    system.client.publish({"event_id": "kim-end", "subject": "kim", "session_id": "s1", "kind": "session_end",
                           "ts": T0 + timedelta(minutes=5)})
    assert system.client.wait_idle(timeout_s=60)
    assert {s: redis_values_naming(system, s.encode()) for s in SECRETS} == {s: [] for s in SECRETS}
    stored = " ".join(m.content for m in system.client.inspect("kim").memories)
    assert "invoices by e-mail" in stored and "[REDACTED:api_key]" in stored


def test_an_explicit_write_that_holds_a_secret_is_refused_not_dropped(system: System) -> None:
    """Before: 202 and nothing stored, with no signal."""
    for alone in ("sk-live-9fQ2xW7mZ4kP1vB8nR3tY6cJ", "AKIAJ7Q3LX5RZ2M4WN8P", "password: Maple!Leaf77",
                  "4111 1111 1111 1111"):
        with pytest.raises(InvalidInput, match=r"holds a secret"):
            system.client.write("lou", alone)
    with pytest.raises(InvalidInput, match=r"content: holds a secret \(password\)"):
        system.client.write("lou", "Remember that my password is Maple!Leaf77")
    assert system.ctx.client.xlen(system.ctx.keys.work("events", "lou")) == 0


def test_forget_contains_finds_and_removes_the_raw_copies_of_a_secret(system: System,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    """A raw copy written before publish redacted (an older client, a direct XADD): forget --contains of the
    secret answered count 0, nothing scrubbed, and verify said True while the stream still held it."""
    secret = "sk-live-9fQ2xW7mZ4kP1vB8nR3tY6cJ"
    event = ChatEvent(event_id="max-e1", subject="max", session_id="s1", kind=Kind.message, role=Role.user,
                      text=f"my deploy key is {secret}, keep the staging box up", ts=T0)
    system.ctx.client.xadd(system.ctx.keys.work("events", "max"), {FIELD: encode(event)})
    system.client.publish({"event_id": "max-end", "subject": "max", "session_id": "s1", "kind": "session_end",
                           "ts": T0 + timedelta(minutes=5)})
    assert system.client.wait_idle(timeout_s=60)
    assert redis_values_naming(system, secret.encode())  # the raw copy, in the events stream

    rewrites = _aof_rewrites(system)
    report = system.client.forget_report("max", contains=secret)
    events = system.ctx.keys.work("events", "max")
    assert _aof_rewrites(system) > rewrites  # the AOF on disk still held the XADD: rewritten
    assert report.scrubbed.get(events) == 1, report
    assert redis_values_naming(system, secret.encode()) == []
    assert system.client.verify_forgotten("max", report.ids, contains=secret).verified
    out = run_cli(system, monkeypatch, "forget", "max", "--contains", secret, "--verify")
    assert "verified: True" in out


def _aof_rewrites(system: System) -> int:
    """AOF rewrites started so far, running or done (a rewrite is forked: it may not be over yet)."""
    info = system.ctx.client.info("persistence")
    return int(info.get("aof_rewrites", 0)) + int(info["aof_rewrite_in_progress"]) + int(info["aof_rewrite_scheduled"])


def test_verify_with_contains_finds_raw_copies_still_held(system: System) -> None:
    secret = "AKIAJ7Q3LX5RZ2M4WN8P"
    event = ChatEvent(event_id="ned-e1", subject="ned", session_id="s1", kind=Kind.message, role=Role.user,
                      text=f"aws {secret}", ts=T0)
    system.ctx.client.xadd(system.ctx.keys.work("events", "ned"), {FIELD: encode(event)})
    assert system.client.wait_idle(timeout_s=60)
    proof = system.client.verify_forgotten("ned", [], contains=secret)
    assert not proof.verified and proof.residue == {f"raw:{system.ctx.keys.work('events', 'ned')}": 1}


def test_forget_contains_scrubs_only_its_own_subjects_entries_of_a_shared_partition(system: System) -> None:
    """A partition's streams carry many subjects. A forget of "rosa"'s words deleted another tenant's entries
    that held the same words (its events, its dead letters) and counted them in rosa's proof: one tenant could
    erase and probe another's raw history by guessing its words."""
    keys = system.ctx.keys
    owner = "rosa"
    other = next(n for n in (f"tenant-{i}" for i in range(1000)) if keys.work("events", n) == keys.work("events", owner))
    word = "marmalade-7731"
    event = ChatEvent(event_id="shared-e1", subject=other, session_id="s1", kind=Kind.message, role=Role.user,
                      text=f"the gate code is {word}", ts=T0)
    stream = keys.work("events", other)
    kept = system.ctx.client.xadd(stream, {FIELD: encode(event)})
    assert system.client.wait_idle(timeout_s=60)

    report = system.client.forget_report(owner, contains=word)
    assert report.scrubbed == {}, report
    assert [i for i, _ in system.ctx.client.xrange(stream, kept, kept)] == [kept]  # the other's entry stays
    assert system.client.verify_forgotten(owner, [], contains=word).verified  # and is not told of
    # The other subject's own forget still reaches it.
    assert system.client.forget_report(other, contains=word).scrubbed.get(stream) == 1
