"""A subject's profile (`client.profile`, `GET /v1/subjects/{s}/profile`, docs/profile.md) on real services:
what holds now by section, a correction replacing the old value, a forget leaving it, a contest flagged, what
changed since a revision, the prompt text within its budget, the materialized profile kept current from the
change feed, and another tenant refused."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest

from memflow.pipeline.models import Dir, Memory, MType, Source, Status
from memflow.pipeline.profile import ProfileReply, assemble, undistilled
from memflow.pipeline.tokens import approximate_tokens
from memflow.shared.changes import profiles
from memflow.shared.errors import InvalidInput, RpcError
from memflow.shared.inference.embedder import Embedder
from memflow.shared.redisdb.server import RedisServer
from memflow.shared.storage.store import MemoryFilter
from tests.test_api import Served, error_of, serving

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
NOW = T0 + timedelta(days=3)


@pytest.fixture(scope="module")
def served(redis_server: RedisServer, embedder: Embedder, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    yield from serving(redis_server, embedder, tmp_path_factory.mktemp("profile"))


def subject() -> str:
    return f"prof-{uuid.uuid4().hex[:8]}"


def said(served: Served, subj: str, *texts: str, start: int = 0) -> None:
    for i, text in enumerate(texts, start):
        served.system.client.write(subj, text, ts=T0 + timedelta(hours=i), event_id=f"{subj}-w{i}",
                                   session_id=f"s{i}")
    assert served.system.client.wait_idle(60)


def contents(profile: ProfileReply) -> dict[str, list[str]]:
    return {"identity": [i.content for i in profile.identity], "preferences": [i.content for i in profile.preferences],
            "rules": [i.content for i in profile.rules], "contested": [i.content for i in profile.contested],
            "people": [f"{p.about}: {k.content}" for p in profile.people for k in p.known]}


def test_the_profile_holds_what_holds_now_and_a_correction_replaces_the_old_value(served: Served) -> None:
    subj = subject()
    said(served, subj, "My name is Alice Martin.", "I live in Berlin.", "I prefer short answers.",
         "My sister Anna lives in Lyon.", "We went to the cinema yesterday.",
         "Correction: I live in Munich, not Berlin.")
    found = contents(served.system.client.profile(subj, now=NOW))
    assert "My name is Alice Martin" in found["identity"]
    assert any("Munich" in c for c in found["identity"]) and not any(c == "I live in Berlin" for c in found["identity"])
    assert found["preferences"] == ["I prefer short answers"]
    assert found["people"] == ["sister:anna: My sister Anna lives in Lyon"]
    assert not any("cinema" in c for section in found.values() for c in section)  # what happened is not what holds
    assert found["contested"] == []


def test_the_prompt_text_keeps_within_its_budget_whole_lines_only(served: Served) -> None:
    subj = subject()
    said(served, subj, "My name is Bob Stone.", "I prefer tea over coffee.", "My wife Clara is a pilot.")
    whole = served.system.client.profile(subj, now=NOW, max_tokens=1000).prompt
    assert whole is not None and "Bob Stone" in whole and "Clara" in whole and "tea" in whole
    for budget in (1, 8, 15):
        text = served.system.client.profile(subj, now=NOW, max_tokens=budget).prompt
        assert text is not None and approximate_tokens(text) <= budget
        assert all(line in whole.splitlines() for line in text.splitlines())
    assert served.system.client.profile(subj, now=NOW).prompt is None


def test_a_contest_is_flagged_on_both_sides(served: Served) -> None:
    subj = subject()
    said(served, subj, "The project database is Postgres.")
    rival = next(m.id for m in served.system.ctx.store.get(MemoryFilter(subj)) if "Postgres" in m.content)
    for i in range(6):  # stubborn by use: a later offhand statement contests it instead of replacing it
        served.system.client.feedback(subj, [rival], at=T0 + timedelta(hours=10 + i), request_id=f"{subj}-use-{i}")
    said(served, subj, "The project database is MySQL.", start=20)
    profile = served.system.client.profile(subj, now=NOW)
    flagged = {i.content: i for i in profile.contested}
    assert set(flagged) == {"The project database is Postgres", "The project database is MySQL"}, flagged
    assert all(i.contested and i.contested_with for i in flagged.values())
    sides = {i.id for i in flagged.values()}
    assert all(set(i.contested_with) <= sides for i in flagged.values())
    assert "Unsure" in (served.system.client.profile(subj, now=NOW, max_tokens=200).prompt or "")


def test_a_forget_leaves_the_profile_and_since_a_revision_says_what_changed(served: Served) -> None:
    subj = subject()
    client = served.system.client
    said(served, subj, "I live in Oslo.", "I prefer window seats.")
    before = client.profile(subj, now=NOW)
    assert before.revision != "0-0" and before.changes is None
    unchanged = client.profile(subj, since=before.revision, now=NOW).changes
    assert unchanged is not None and unchanged.model_dump() == {
        "since": before.revision, "changed": [], "removed": [], "complete": True}
    oslo = next(i.id for i in before.identity if "Oslo" in i.content)
    assert client.forget(subj, [oslo]) >= 1
    said(served, subj, "I prefer aisle seats now.", start=5)
    after = client.profile(subj, since=before.revision, now=NOW)
    assert after.revision != before.revision
    assert not any("Oslo" in i.content for i in after.identity)
    assert after.changes is not None and after.changes.complete
    assert oslo in after.changes.removed
    assert any("aisle" in i.content for i in after.changes.changed)
    cached = client.redis.get(client.keys.profile(subj))
    assert cached is not None and b"Oslo" not in cached  # the materialized profile holds no forgotten words
    assert client.verify_forgotten(subj, [oslo]).verified
    client.redis.set(client.keys.profile(subj), before.model_dump_json())  # as if one had outlived the forget
    proof = client.verify_forgotten(subj, [oslo])
    assert not proof.verified and proof.residue == {"profile": 1}


def test_a_sealed_cursor_as_since_is_an_input_error_naming_since(served: Served) -> None:
    """A page's sealed `next` (the feed's, docs/changes.md) is no revision: 422 naming `since`, at the HTTP door and
    the SDK, never a 503 carrying the stream engine's message (schemathesis found it)."""
    subj = subject()
    said(served, subj, "I live in Oslo.")
    sealed = "~" + "A" * 59
    with served.http(served.key(subj)) as http:
        reply = http.get(f"/v1/subjects/{subj}/profile", params={"since": sealed})
    assert reply.status_code == 422 and error_of(reply)["field"] == "since", reply.text
    with pytest.raises(InvalidInput, match="since"):
        served.system.client.profile(subj, since=sealed, now=NOW)


def test_the_profile_is_materialized_and_dropped_by_the_next_change(served: Served) -> None:
    subj = subject()
    client = served.system.client
    said(served, subj, "I work as a carpenter.")
    key = client.keys.profile(subj)
    assert client.redis.get(key) is None
    first = client.profile(subj, now=NOW)
    assert client.redis.hget(client.keys.revisions, subj).decode() == first.revision
    assert client.redis.get(key) is not None
    with served.http(served.admin) as http:  # served from the materialized profile, as the worker built it
        reply = http.get(f"/v1/subjects/{subj}/profile")
        assert reply.status_code == 200 and reply.json()["revision"] == first.revision
    said(served, subj, "I prefer working mornings.", start=3)
    assert client.redis.get(key) is None  # dropped in the step that announced the change
    with served.http(served.admin) as http:
        again = http.get(f"/v1/subjects/{subj}/profile", params={"since": first.revision, "max_tokens": 50}).json()
    assert again["revision"] != first.revision and any("mornings" in i["content"] for i in again["preferences"])
    assert [i["content"] for i in again["changes"]["changed"]] == ["I prefer working mornings"]
    with served.http(served.admin) as http:  # since the beginning, short form: everything is new
        whole = http.get(f"/v1/subjects/{subj}/profile", params={"since": "0"}).json()["changes"]
    assert len(whole["changed"]) == 2 and whole["complete"]
    assert "mornings" in again["prompt"]


def test_over_http_another_tenant_is_refused_and_bad_input_named(served: Served) -> None:
    mine, theirs = subject(), subject()
    said(served, theirs, "My PIN hint is the cat's name.")
    key = served.key(mine)
    with served.http(key) as http:
        refused = http.get(f"/v1/subjects/{theirs}/profile")
        assert refused.status_code == 403 and error_of(refused)["code"] == "forbidden"
        assert "PIN" not in refused.text
        empty = http.get(f"/v1/subjects/{mine}/profile")
        assert empty.status_code == 200, empty.text
        assert empty.json()["identity"] == [] and empty.json()["revision"] == "0-0"
        for bad in ({"max_tokens": 0}, {"max_tokens": 100_000}, {"since": "last week"}):
            reply = http.get(f"/v1/subjects/{mine}/profile", params=bad)
            assert reply.status_code == 422 and error_of(reply)["field"] == next(iter(bad)), reply.text
    with pytest.raises((InvalidInput, RpcError)):
        served.system.client.profile(mine, since="last week")


def test_a_plain_read_over_http_serves_the_kept_reply_as_it_is_the_same_document_as_a_rebuild(served: Served) -> None:
    subj = subject()
    client = served.system.client
    said(served, subj, "My name is Dora Lind.", "I prefer green tea.", "My brother Tom is a nurse.",
         "Never call me before 9am.")
    built = client.profile(subj)  # a query worker builds it from the store and keeps it
    key = client.keys.profile(subj)
    kept = client.redis.get(key)
    assert kept is not None and kept.startswith(profiles.FORM)
    with served.http(served.admin) as http:
        plain = http.get(f"/v1/subjects/{subj}/profile")
        assert plain.status_code == 200 and plain.json() == built.model_dump(mode="json")
        assert client.redis.get(key) == kept  # read from what was kept, not built again
        # Served as kept, not parsed and written out again: a mark put into the kept bytes shows as it is.
        client.redis.set(key, kept.replace(b'"prompt":null', b'"prompt":null '))
        assert http.get(f"/v1/subjects/{subj}/profile").content.endswith(b'"prompt":null ,"changes":null}')
        client.redis.set(key, kept)
        asked = http.get(f"/v1/subjects/{subj}/profile", params={"max_tokens": 100}).json()  # parsed: a prompt
        assert asked == {**plain.json(), "prompt": asked["prompt"]} and "Dora" in asked["prompt"]
    client.redis.delete(key)
    assert client.profile(subj) == built  # built again from the store: the same document


def test_a_kept_profile_whose_item_stopped_holding_is_read_without_it(served: Served) -> None:
    subj = subject()
    client = served.system.client
    said(served, subj, "I live in Porto.")
    held = client.profile(subj)
    assert [i.content for i in held.identity] == ["I live in Porto"]
    ended = held.identity[0].model_copy(update={"until": datetime.now(UTC) - timedelta(minutes=1)})
    client.redis.set(client.keys.profile(subj), profiles.stored(held.model_copy(update={"identity": [ended]})))
    assert profiles.served(client.redis.get(client.keys.profile(subj)), datetime.now(UTC)) is None
    with served.http(served.admin) as http:
        reply = http.get(f"/v1/subjects/{subj}/profile")
    assert reply.status_code == 200 and reply.json()["identity"] == [] and reply.json()["revision"] == held.revision


def memory(n: int, content: str, mtype: MType, about: str = "self", status: Status = Status.active) -> Memory:
    return Memory(id=f"m{n}", subject="s", uri=f"mem://s/general/k{n}", dir=Dir.general, mtype=mtype, key=f"k{n}",
                  content=content, confidence=0.9, source=Source.explicit, status=status, about=about,
                  created_at=T0, updated_at=T0, source_event_ids=[f"e{n % 10}"])


def test_a_turn_about_a_person_nothing_was_distilled_from_is_shown_as_said_the_users_own_is_not() -> None:
    """Pure: `pipeline.profile.assemble` over hand-made memories (the event of memory n is e{n % 10})."""
    memories = [
        memory(1, "My husband works at Bosch in Stuttgart.", MType.episode, "husband"),  # nothing distilled
        memory(2, "That worked, thanks!", MType.episode),  # the user's own turn: conversation, not who they are
        memory(3, "My wife is on a keto diet.", MType.episode, "wife"),
        memory(13, "My wife is on a keto diet", MType.fact, "wife"),  # distilled from e3: the fact is shown
        memory(4, "My son plays chess.", MType.episode, "son"),
        memory(14, "My son plays chess", MType.fact, "son", Status.superseded),  # distilled, since replaced
        memory(5, "My son lives in Rome.", MType.episode, "son"),  # what was distilled from it is forgotten
    ]
    found = assemble("s", "0-0", memories, NOW, forgotten_events=["e5"])
    assert {p.about: [k.content for k in p.known] for p in found.people} == {
        "husband": ["My husband works at Bosch in Stuttgart."], "wife": ["My wife is on a keto diet"]}
    assert found.identity == [] and found.contested == []
    assert undistilled(memories, ["e5"]) == {"m1", "m2"}


def test_a_profile_stays_a_page_the_strongest_kept_and_what_is_past_its_bounds_counted() -> None:
    """Pure: a long-lived user's standing facts past the bounds (`MAX_SECTION`, `MAX_PEOPLE`, `MAX_KNOWN`): the
    strongest of each section are shown in key order, the rest counted in `omitted`, nothing shown twice."""
    from memflow.pipeline import profile as assembly
    over = assembly.MAX_SECTION + 7
    facts = [memory(n, f"fact {n}", MType.fact).model_copy(update={"strength": n / over}) for n in range(over)]
    people = [memory(1000 + n, f"person {n} fact", MType.fact, f":p{n:03d}") for n in range(assembly.MAX_PEOPLE + 3)]
    talked_of = [memory(2000 + n, f"anna {n}", MType.fact, "sister:anna") for n in range(assembly.MAX_KNOWN + 4)]
    found = assemble("s", "0-0", [*facts, *people, *talked_of], NOW)
    shown = [i.content for i in found.identity]
    assert len(shown) == assembly.MAX_SECTION and "fact 0" not in shown and f"fact {over - 1}" in shown
    assert [i.key for i in found.identity] == sorted(i.key for i in found.identity)  # key order, as before
    assert found.people[0].about == "sister:anna" and len(found.people[0].known) == assembly.MAX_KNOWN
    assert len(found.people) == assembly.MAX_PEOPLE
    assert found.omitted == {"identity": 7, "people": 4 + 4}  # anna's 4 beyond MAX_KNOWN, 4 people beyond MAX_PEOPLE
    small = assemble("s", "0-0", facts[:3], NOW)
    assert small.omitted == {} and len(small.identity) == 3
