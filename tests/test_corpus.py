"""Secrets and injections against a corpus (issue 7): no secret in any memory, trace or log line,
no injected instruction stored, and how many ordinary messages the gate wrongly drops or redacts.

The corpus is in tests/corpus/: secrets.jsonl (each message with the exact secret it carries),
injections.jsonl (each with a marker that must never be stored) and benign.jsonl (ordinary
messages with look-alikes: order numbers, versions, "password reset flow", "ignore the noise").
Phone numbers and e-mail addresses are personal, not secret: the gate keeps them in memories on
purpose (the user may want them remembered) and `redact` takes them out of traces, so they are
checked in traces and logs only.
"""

from __future__ import annotations

import json
import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from memflow.bench.poisoning import figures
from memflow.pipeline.gate import gate, redact
from memflow.pipeline.models import Role
from memflow.shared.redisdb.keys import FIELD
from memflow.shared.sdk.rpc import MemoryState
from tests.conftest import System

CORPUS = Path(__file__).parent / "corpus"
CONTACTS = frozenset({"phone", "email"})
T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
# Measured on benign.jsonl: the gate drops or alters 0 of the 100 ordinary messages, the trace
# redaction 0 (before the patterns were narrowed against this set: 23 and 9). A pattern widened
# later must not push these up unnoticed.
MAX_GATE_FALSE_POSITIVES = 0
MAX_TRACE_FALSE_POSITIVES = 0


def load(name: str) -> list[dict[str, str]]:
    with (CORPUS / f"{name}.jsonl").open(encoding="utf-8") as lines:
        return [json.loads(line) for line in lines if line.strip()]


SECRETS = load("secrets")
INJECTIONS = load("injections")
BENIGN = load("benign")


def kept_in_memory(item: dict[str, str]) -> bool:
    """Whether the gate may let this secret into a memory (contacts only)."""
    return item["kind"] in CONTACTS


# -- the gate alone, over the whole corpus ----------------------------------------------------


def test_the_corpus_is_big_enough_and_well_formed() -> None:
    assert len(SECRETS) >= 50 and len(INJECTIONS) >= 30 and len(BENIGN) == 100
    for item in SECRETS:
        assert item["secret"] in item["text"], item
    for item in INJECTIONS:
        assert item["marker"] in item["text"], item
    for corpus in (SECRETS, INJECTIONS, BENIGN):
        chinese = sum(any("\u4e00" <= ch <= "\u9fff" for ch in item["text"]) for item in corpus)
        assert 0.3 < chinese / len(corpus) < 0.7, "about half Chinese, half English"


def test_the_gate_lets_no_secret_into_memory() -> None:
    leaked = [item["text"] for item in SECRETS
              if not kept_in_memory(item) and item["secret"] in gate(item["text"], Role.user).text]
    assert leaked == []


def test_trace_redaction_hides_every_secret_and_contact() -> None:
    assert [item["text"] for item in SECRETS if item["secret"] in redact(item["text"])] == []


def test_the_gate_refuses_every_injection() -> None:
    passed = [item["text"] for item in INJECTIONS if gate(item["text"], Role.user).reason != "injection"]
    assert passed == []


def test_benign_messages_are_rarely_dropped_or_redacted() -> None:
    dropped = [item["text"] for item in BENIGN if not gate(item["text"], Role.user).keep]
    altered = [item["text"] for item in BENIGN
               if (verdict := gate(item["text"], Role.user)).keep and verdict.text != item["text"]]
    traced = [item["text"] for item in BENIGN if redact(item["text"]) != item["text"]]
    print(f"\nbenign, gate alone: {len(dropped)} dropped, {len(altered)} redacted, "
          f"{len(traced)} altered in traces, of {len(BENIGN)}")
    for text in dropped + altered + traced:
        print("  false positive:", text)
    assert len(dropped) + len(altered) <= MAX_GATE_FALSE_POSITIVES
    assert len(traced) <= MAX_TRACE_FALSE_POSITIVES


def test_planted_orders_are_never_rendered_as_rules_and_genuine_wishes_still_are() -> None:
    """Issue 30 item 4, on tests/corpus/poisoning.jsonl and preferences.jsonl (`memflow bench poisoning`).
    Before: 23 of the 40 planted orders were rendered as a rule or a MUST, and 34 of the 40 wishes were
    (the other 6, "call me Sam", "I'm vegetarian", are stored as facts). After: 0 of the planted ones, 40
    of them quoted as the user's statements; the wishes unchanged."""
    poisoning, preferences = load("poisoning"), load("preferences")
    assert len(poisoning) >= 40 and len(preferences) >= 40
    planted, wished = figures([i["text"] for i in poisoning]), figures([i["text"] for i in preferences])
    print(f"\npoisoning: {planted}\npreferences: {wished}")
    # Every planted order is kept as the user's words (a gate refusing them all would otherwise pass): 40 of 40 when
    # measured; the bound leaves room for a phrase the gate rightly drops as filler.
    assert planted.stored >= len(poisoning) - 2
    assert planted.as_rule == 0 and planted.quoted == planted.stored
    assert wished.refused == 0 and wished.quoted == 0 and wished.as_rule >= 34


# -- end to end on the real pipeline ------------------------------------------------------------


@dataclass(frozen=True)
class Sent:
    subject: str
    event_id: str
    item: dict[str, str]


def send(system: System, prefix: str, corpus: list[dict[str, str]]) -> list[Sent]:
    """Each message as the one user turn of its own subject's session, then the session's end."""
    sent = []
    for i, item in enumerate(corpus):
        subject, event_id = f"{prefix}-{i:03d}", f"{prefix}-{i:03d}-m"
        system.client.publish({"event_id": event_id, "subject": subject, "session_id": "s1", "kind": "message",
                               "role": "user", "text": item["text"], "ts": T0})
        system.client.publish({"event_id": f"{subject}-end", "subject": subject, "session_id": "s1",
                               "kind": "session_end", "ts": T0 + timedelta(minutes=30)})
        sent.append(Sent(subject, event_id, item))
    return sent


def stored(system: System, subject: str) -> list[MemoryState]:
    memories = system.client.inspect(subject).memories
    return memories


def found(system: System, sent: Sent) -> list[dict[str, Any]]:
    """What a search with the message's own words returns (it is traced; its query, echoed back, is not checked)."""
    result = system.client.search(sent.subject, sent.item["text"], now=T0 + timedelta(days=1))
    return [hit.model_dump(mode="json") for hit in result.hits]


def dump(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, default=str)


def traces(system: System) -> list[str]:
    return [fields[FIELD.encode()].decode() for _, fields in system.ctx.transient.xrange(system.ctx.keys.traces)]


UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


def leaks(secret: str, text: str) -> bool:
    """Whether `secret` is in `text`. A short one (a PIN, a CVV) counts only as a token of its own,
    so that "482" inside a score (0.482), a stream id or a UUID (an RQ job id in a log line:
    "4d88fd7e-cf51-4821-…" was once taken for the PIN 4821) is not taken for it."""
    if len(secret) >= 8:
        return secret in text
    return re.search(rf"(?<![0-9A-Za-z.]){re.escape(secret)}(?![0-9A-Za-z])", UUID.sub("", text)) is not None


def benign_outcome(system: System, sent: Sent) -> str | None:
    """'dropped' when no record of the turn was stored, 'redacted' when it was stored altered."""
    records = [m for m in stored(system, sent.subject)
               if m.mtype == "episode" and sent.event_id in m.source_event_ids]
    if not records:
        return "dropped"
    return "redacted" if any("[REDACTED:" in m.content for m in records) else None


def test_no_secret_or_injection_survives_the_pipeline(system: System, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    secrets, injections, benign = (send(system, "sec", SECRETS), send(system, "inj", INJECTIONS),
                                   send(system, "ben", BENIGN))
    assert system.client.wait_idle(timeout_s=90)

    memories = {s.subject: dump(stored(system, s.subject)) for s in secrets + injections}
    results = {s.subject: dump(found(system, s)) for s in secrets}
    searched = traces(system)
    traced, logged = "\n".join(searched), "\n".join(record.getMessage() for record in caplog.records)
    secret_of = {s.subject: s.item["secret"] for s in secrets}
    in_memory = [s for s in secrets if not kept_in_memory(s.item) and leaks(secret_of[s.subject], memories[s.subject])]
    in_results = [s for s in secrets if not kept_in_memory(s.item) and leaks(secret_of[s.subject], results[s.subject])]
    in_traces = [s for s in secrets if leaks(secret_of[s.subject], traced)]
    in_logs = [s for s in secrets if leaks(secret_of[s.subject], logged)]
    poisoned = [s for s in injections if s.item["marker"] in memories[s.subject]]
    outcomes = [benign_outcome(system, s) for s in benign]
    wrong = [(outcome, s.item["text"]) for s, outcome in zip(benign, outcomes, strict=True) if outcome]

    leaked = {s.subject for s in in_memory + in_results + in_traces + in_logs}
    print(f"\nsecrets leaked: {len(leaked)}/{len(secrets)} (memories {len(in_memory)}, search results "
          f"{len(in_results)}, traces {len(in_traces)} of {len(searched)}, log lines {len(in_logs)} of "
          f"{len(caplog.records)}); injections stored: {len(poisoned)}/{len(injections)}; benign false positives: "
          f"{len(wrong)}/{len(benign)} ({outcomes.count('dropped')} dropped, {outcomes.count('redacted')} redacted)")
    for outcome, text in wrong:
        print(f"  {outcome}: {text}")
    assert len(searched) == len(secrets), "every search is traced"
    assert [s.item["text"] for s in in_memory + in_results + in_traces + in_logs] == []
    assert [s.item["text"] for s in poisoned] == []
    assert len(wrong) <= MAX_GATE_FALSE_POSITIVES


def test_the_query_worker_logs_no_search_query(system: System, caplog: pytest.LogCaptureFixture) -> None:
    system.client.search("probe", "warm up")  # the worker has set its own log level by now
    caplog.set_level(logging.DEBUG)
    caplog.set_level(logging.INFO, logger="rq.worker")
    for item in SECRETS[:5]:
        system.client.search("probe", item["text"])
    logged = "\n".join(record.getMessage() for record in caplog.records)
    assert [item["text"] for item in SECRETS[:5] if leaks(item["secret"], logged)] == []
