"""A subject's profile (docs/profile.md): what memflow knows that holds now, without a query — who the user is
(facts about them), how they want things (standing preferences) and what must always be done (rules), the people
in their life with what is known of each, and the contests still open, flagged. Pure assembly from the memories
of one subject; the cache that keeps it current from the `changes` feed is shared/changes/profiles.py.

"Holds now": a memory searchable now (active, or contested: a contest is shown, flagged, never decided here),
not past its `valid_to` or `expires_at`. A superseded, archived or forgotten memory is not in it, so a
correction replaces the old value and a forget removes it. Events, session context and task state are what
happened, not what holds: they stay out (a search finds them). So does an episode (a turn kept verbatim),
except one about a person in the user's life that nothing was distilled from ("My husband works at Bosch in
Stuttgart.": said, kept, understood by no rule), shown as said among what is known of that person, as
`holders.people` shows it. The user's own such turns stay out: most are conversation ("That worked,
thanks!", "we compared MongoDB and PostgreSQL"), not who they are."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import datetime

from pydantic import Field

from memflow.pipeline.holders import SELF, Person
from memflow.pipeline.models import SEARCHABLE_STATUSES, Memory, MType, Status, Wire
from memflow.pipeline.tokens import approximate_tokens

# What a profile holds of the user's own memories, by section; of another person's, these types together.
IDENTITY = (MType.fact,)
PREFERENCES = (MType.preference,)
RULES = (MType.rule, MType.decision)
ABOUT_PEOPLE = (MType.fact, MType.preference, MType.rule, MType.decision)
# What a profile may show of another person: the kinds above, and an episode nothing was distilled from.
SHOWN = (*ABOUT_PEOPLE, MType.episode)
# A profile opens a conversation: a page, not a dump of every standing fact (at 10k memories a long-lived user's
# mix held 4,000 items, 1 MB, a read 10 ms p95 and its prompt text 100 ms to build). Past these bounds the
# strongest are kept (`strength`: what uses and restatements keep up and decay brings down), then the most
# recently updated; the rest is counted in `omitted`, and a search finds it.
MAX_SECTION = 100
MAX_PEOPLE = 30
MAX_KNOWN = 10  # of each person


class Item(Wire):
    """One memory as the profile shows it."""

    id: str
    content: str
    mtype: MType
    key: str
    confidence: float
    updated_at: datetime
    contested: bool = False
    # The memories it is contested with (their ids: each is in the profile too, flagged).
    contested_with: list[str] = Field(default_factory=list)
    # When it stops holding (its `valid_to` or `expires_at`, the earlier): a profile read later leaves it out.
    until: datetime | None = None


class PersonProfile(Wire):
    about: str = Field(description='The holder: a relation chain ("wife.sister"), a name (":tom") or both')
    relation: str | None = None
    name: str | None = None
    known: list[Item]


class Profile(Wire):
    """A subject's profile at `revision` (the id of the last change of the subject on the `changes` feed, "0-0":
    none yet)."""

    subject: str
    revision: str
    identity: list[Item] = Field(default_factory=list)
    preferences: list[Item] = Field(default_factory=list)
    rules: list[Item] = Field(default_factory=list)
    people: list[PersonProfile] = Field(default_factory=list)
    # The contests still open, each side flagged where it stands above too.
    contested: list[Item] = Field(default_factory=list)
    omitted: dict[str, int] = Field(
        default_factory=dict,
        description="By section, how many items hold now but are past the profile's bounds (a search finds them)")


class SinceRevision(Wire):
    """What changed in the profile after revision `since`: the items changed or added (as they are now), and
    the ids of memories changed since that are not in the profile now (forgotten, superseded, expired).
    `complete` false: the feed no longer reaches back to `since`, or more changed than one look reads —
    read the whole profile."""

    since: str
    changed: list[Item] = Field(default_factory=list)
    removed: list[str] = Field(default_factory=list)
    complete: bool = True


class ProfileReply(Profile):
    """The profile; `prompt` when a `max_tokens` was given; `changes` when a `since` was."""

    prompt: str | None = None
    changes: SinceRevision | None = None


def holds(m: Memory, now: datetime) -> bool:
    ends = [t for t in (m.valid_to, m.expires_at) if t is not None]
    return m.status in SEARCHABLE_STATUSES and all(now < t for t in ends)


def undistilled(memories: Iterable[Memory], forgotten_events: Iterable[str] = ()) -> set[str]:
    """The ids of the episodes nothing was distilled from. `memories`: all the subject's, whatever their status
    (a fact since superseded or archived was distilled from its turn all the same); `forgotten_events`: the
    events of forgotten memories (gone from the store, distilled all the same: their turn must not come back)."""
    memories = list(memories)
    told = {e for m in memories if m.mtype is not MType.episode for e in m.source_event_ids} | set(forgotten_events)
    return {m.id for m in memories if m.mtype is MType.episode and not told.intersection(m.source_event_ids)}


def assemble(subject: str, revision: str, memories: Iterable[Memory], now: datetime,
             forgotten_events: Iterable[str] = ()) -> Profile:
    """The profile of `subject` from its memories (all of them, whatever their status: `undistilled` reads the
    ones that no longer hold), as they hold at `now`."""
    memories = list(memories)
    verbatim = undistilled(memories, forgotten_events)
    held = [m for m in memories if holds(m, now) and m.mtype in SHOWN
            and (m.mtype is not MType.episode or (m.about != SELF and m.id in verbatim))]
    own = [m for m in held if m.about == SELF]
    others: dict[str, list[Memory]] = {}
    for m in held:
        if m.about != SELF:
            others.setdefault(m.about, []).append(m)
    omitted: dict[str, int] = {}

    def section(name: str, of: list[Memory], cap: int = MAX_SECTION) -> list[Item]:
        kept = strongest(of, cap)
        if len(kept) < len(of):
            omitted[name] = omitted.get(name, 0) + len(of) - len(kept)
        return [item(m) for m in kept]

    ranked = sorted(others.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    people = [PersonProfile(about=who, relation=Person.of(who).relation, name=Person.of(who).name,
                            known=section("people", known, MAX_KNOWN))
              for who, known in ranked[:MAX_PEOPLE]]
    if beyond := sum(len(known) for _, known in ranked[MAX_PEOPLE:]):
        omitted["people"] = omitted.get("people", 0) + beyond
    return Profile(subject=subject, revision=revision,
                   identity=section("identity", [m for m in own if m.mtype in IDENTITY]),
                   preferences=section("preferences", [m for m in own if m.mtype in PREFERENCES]),
                   rules=section("rules", [m for m in own if m.mtype in RULES]),
                   people=people,
                   contested=section("contested", [m for m in held if m.status is Status.contested]),
                   omitted=omitted)


def strongest(memories: list[Memory], cap: int) -> list[Memory]:
    """At most `cap` of `memories`: the strongest, then the surest, then the most recently updated; shown in the
    order of their keys (two reads of an unchanged subject are the same)."""
    kept = sorted(memories, key=lambda m: (-m.strength, -m.confidence, -m.updated_at.timestamp(), m.id))[:cap]
    return sorted(kept, key=lambda m: (m.key, m.created_at, m.id))


def item(m: Memory) -> Item:
    contested = m.status is Status.contested
    ends = [t for t in (m.valid_to, m.expires_at) if t is not None]
    return Item(id=m.id, content=m.content, mtype=m.mtype, key=m.key, confidence=m.confidence,
                updated_at=m.updated_at, contested=contested,
                contested_with=list(m.conflicts_with) if contested else [], until=min(ends) if ends else None)


def as_of(profile: Profile, now: datetime) -> Profile:
    """A materialized profile read at `now`: without the items that stopped holding since it was made."""
    def kept(section: list[Item]) -> list[Item]:
        return [i for i in section if i.until is None or now < i.until]
    people = [p.model_copy(update={"known": kept(p.known)}) for p in profile.people]
    return profile.model_copy(update={
        "identity": kept(profile.identity), "preferences": kept(profile.preferences), "rules": kept(profile.rules),
        "people": [p for p in people if p.known], "contested": kept(profile.contested)})


def items(profile: Profile) -> dict[str, Item]:
    """Every item of the profile by id (an item is in one section, and in `contested` too when it is)."""
    found = {i.id: i for section in (profile.identity, profile.preferences, profile.rules) for i in section}
    found.update({i.id: i for p in profile.people for i in p.known})
    return found


def since(profile: Profile, since_revision: str, changed_ids: Sequence[str], complete: bool) -> SinceRevision:
    """What changed after `since_revision`, given the memories the feed says changed after it."""
    now_in = items(profile)
    ids = list(dict.fromkeys(changed_ids))
    return SinceRevision(since=since_revision, changed=[now_in[i] for i in ids if i in now_in],
                         removed=[i for i in ids if i not in now_in], complete=complete)


# -- as prompt text -----------------------------------------------------------------------------------

_HEADINGS = {
    "en": {"identity": "About the user", "preferences": "Preferences", "rules": "Rules to follow",
           "people": "People in the user's life", "contested": "Unsure (contradicting statements, not settled)"},
    "zh": {"identity": "关于用户", "preferences": "偏好", "rules": "须遵守的规则", "people": "用户生活中的人",
           "contested": "不确定（说法相互矛盾，尚未确定）"},
}


def language(profile: Profile) -> str:
    """The language the user spoke, as the profile's words show it: Chinese when most of its characters are."""
    text = "".join(i.content for i in items(profile).values())
    cjk = sum(1 for ch in text if "\u4e00" <= ch <= "\u9fff")
    letters = sum(1 for ch in text if ch.isalpha())
    return "zh" if letters and cjk * 2 > letters else "en"


def prompt(profile: Profile, max_tokens: int) -> str:
    """The profile as prompt text within `max_tokens` (approximate_tokens, which leans high): sections in the
    order identity, rules, preferences, people, contested; within each, lines while they fit. A line that does
    not fit is left out whole, never cut."""
    words = _HEADINGS[language(profile)]
    sections: list[tuple[str, list[str]]] = [
        (words["identity"], [_line(i) for i in profile.identity if not i.contested]),
        (words["rules"], [_line(i) for i in profile.rules if not i.contested]),
        (words["preferences"], [_line(i) for i in profile.preferences if not i.contested]),
        (words["people"], [f"- {p.about}: {k.content}" for p in profile.people for k in p.known if not k.contested]),
        (words["contested"], [_line(i) for i in profile.contested]),
    ]
    out: list[str] = []
    used = 0
    for heading, lines in sections:
        head = f"{heading}:"
        cost = approximate_tokens(head)
        taken: list[str] = []
        for line in lines:
            need = approximate_tokens(line) + (0 if taken else cost)
            if used + need > max_tokens:
                continue
            used += need
            taken.append(line)
        if taken:
            out += ([""] if out else []) + [head, *taken]
    return "\n".join(out)


def _line(i: Item) -> str:
    return f"- {i.content}"
