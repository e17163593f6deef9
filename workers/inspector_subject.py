"""The sections of a subject's inspector page beyond its memories (workers/inspector.py): the people it has talked
about, its profile (what holds now, pipeline/profile.py) and its recent changes (the change feed), each item linked
to its memory's history. Built with `el` alone, so every memory's words are escaped here as on the other pages."""

from __future__ import annotations

from memflow.pipeline.feed import FeedEntry
from memflow.pipeline.profile import Item, Profile
from memflow.shared.sdk import rpc
from memflow.workers.inspector_html import Html, badge, cell, el, history_url, table, when

# The profile's parts shown, in the order pipeline/profile.py `prompt` reads them.
PROFILE_PARTS = (("identity", "Identity"), ("preferences", "Preferences"), ("rules", "Rules"),
                 ("contested", "Contested"))


def history_link(memory_id: str, subject: str, text: object = "history") -> Html:
    return el("a", text, href=history_url(memory_id, subject))


def known_item(subject: str, memory_id: str, content: str, kind: str) -> Html:
    return el("li", badge(kind, "type"), " ", el("span", content), " · ", history_link(memory_id, subject))


def person_card(subject: str, person: rpc.PersonEntry) -> Html:
    named = " · ".join(p for p in (person.relation, person.name) if p) or person.about
    items = [known_item(subject, k.id, k.content, k.mtype.value) for k in person.memories]
    return el("div", el("h3", named), el("ul", items), class_="card")


def people_section(subject: str, people: list[rpc.PersonEntry]) -> Html:
    body: object = ([person_card(subject, p) for p in people] if people
                    else el("p", "No one else talked about yet.", class_="mute"))
    return el("section", el("h2", "People"), body, class_="people")


def profile_part(subject: str, title: str, items: list[Item]) -> Html:
    return Html(el("h3", title) + el("ul", [known_item(subject, i.id, i.content, i.mtype.value) for i in items]))


def profile_section(subject: str, profile: Profile | None, problem: str | None = None) -> Html:
    """What holds now; a profile that could not be read says why rather than hide the rest of the page."""
    if profile is None:
        body: object = el("p", el("strong", "Could not read the profile: "), problem or "no answer", class_="error")
    else:
        parts = [profile_part(subject, title, getattr(profile, name)) for name, title in PROFILE_PARTS
                 if getattr(profile, name)]
        body = [el("p", "Revision ", el("code", profile.revision), class_="mute"),
                *(parts or [el("p", "Nothing holds yet.", class_="mute")])]
    return el("section", el("h2", "Profile"), body, class_="card profile")


def change_row(subject: str, entry: FeedEntry) -> list[object]:
    revision = "—" if entry.revision is None else entry.revision
    return [when(entry.at), badge(entry.kind, "kind"), cell(revision, class_="num"),
            history_link(entry.memory_id, subject, el("span", entry.memory_id, class_="id"))]


def changes_section(subject: str, entries: list[FeedEntry]) -> Html:
    # The feed carries ids and kinds, never a memory's words: the history behind each link has them.
    body = (table("changes", ["at", "change", "revision", "memory"], [change_row(subject, e) for e in entries])
            if entries else el("p", "No recent changes.", class_="mute"))
    return el("section", el("h2", "Recent changes"), body, class_="changes")
