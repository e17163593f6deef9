"""The inspector's markup (workers/inspector.py): every element written by `el`, which escapes each child and
attribute value that is not already `Html`, the one style sheet and the headers that let no script run; and the
small pieces every page is built of (tables, badges, links to a subject and to a memory's history)."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Iterable
from datetime import UTC, datetime
from html import escape
from urllib.parse import quote

from fastapi.responses import HTMLResponse

# -- markup ------------------------------------------------------------------------------------


class Html(str):
    """Markup. Made only by `el` (and the constant style sheet), from values escaped on the way in."""


VOID = frozenset({"input", "meta", "br"})


def _text(child: object) -> str:
    if isinstance(child, Html):
        return child
    if isinstance(child, list | tuple):
        return "".join(_text(c) for c in child)
    return "" if child is None else escape(str(child))


def _attrs(attrs: dict[str, object]) -> str:
    # `class_` → class, `aria_label` → aria-label; True is a bare attribute; None and False, none.
    parts = [f" {name.rstrip('_').replace('_', '-')}" + ("" if value is True else f'="{escape(str(value))}"')
             for name, value in attrs.items() if value is not None and value is not False]
    return "".join(parts)


def el(tag: str, *children: object, **attrs: object) -> Html:
    """`<tag attrs>children</tag>`, every child and attribute value escaped unless it is `Html` already."""
    opening = f"<{tag}{_attrs(attrs)}>"
    return Html(opening if tag in VOID else f"{opening}{_text(children)}</{tag}>")


STYLE = Html("""
:root{--ink:#1d2330;--mute:#667085;--line:#e4e7ec;--bg:#f6f7f9;--accent:#3451b2;--warn:#b42318;--ok:#067647}
*{box-sizing:border-box}
body{margin:0;font:14px/1.5 system-ui,-apple-system,"Segoe UI",Roboto,sans-serif;color:var(--ink);background:var(--bg)}
header{display:flex;align-items:center;gap:16px;padding:10px 28px;background:#1d2330;color:#fff}
header a.brand{color:#fff;font-weight:600;text-decoration:none;letter-spacing:.02em}
header .who{margin-left:auto;color:#c9d1e0;font-size:13px} header .who code{color:#e4e7ec}
header form{margin:0}
header button{background:transparent;color:#fff;border:1px solid #56607a;border-radius:6px;padding:3px 10px}
main{max-width:1180px;margin:24px auto;padding:0 28px}
h1{font-size:22px;margin:0 0 4px} h2{font-size:16px;margin:28px 0 8px} h3{font-size:14px;margin:16px 0 6px}
a{color:var(--accent)} .mute{color:var(--mute)} .crumbs{margin:0 0 16px;color:var(--mute)}
.card{background:#fff;border:1px solid var(--line);border-radius:10px;padding:16px 18px;margin:12px 0}
table{width:100%;border-collapse:collapse;background:#fff;border:1px solid var(--line);border-radius:10px;
 overflow:hidden}
th,td{text-align:left;padding:7px 10px;border-bottom:1px solid var(--line);vertical-align:top}
th{background:#f0f2f5;font-weight:600;font-size:12px;text-transform:uppercase;letter-spacing:.04em;color:#475467}
tr:last-child td{border-bottom:0} td.num{text-align:right;font-variant-numeric:tabular-nums;white-space:nowrap}
td.content{max-width:460px;white-space:pre-wrap;word-break:break-word}
code,.id{font:12px/1.4 ui-monospace,SFMono-Regular,Menlo,monospace;color:#475467}
.badge{display:inline-block;padding:0 7px;border-radius:9px;font-size:12px;background:#eef0f4;white-space:nowrap}
.badge.active,.badge.ok{background:#dcfae6;color:var(--ok)}
.badge.contested,.badge.failed,.badge.dead{background:#fee4e2;color:var(--warn)}
.badge.superseded,.badge.archived,.badge.deleted{background:#eef0f4;color:var(--mute)}
.badge.pending_review,.badge.long_term{background:#e0eaff;color:var(--accent)}
form.inline{display:flex;gap:8px;margin:10px 0}
input[type=text],input[type=search],input[type=password]{flex:1;max-width:520px;padding:7px 10px;
 border:1px solid #cfd4dc;border-radius:6px;font:inherit}
button{padding:7px 14px;border:0;border-radius:6px;background:var(--accent);color:#fff;font:inherit;cursor:pointer}
.error{border-left:4px solid var(--warn);background:#fff5f4} .error strong{color:var(--warn)}
dl{display:grid;grid-template-columns:max-content 1fr;gap:2px 14px;margin:0} dt{color:var(--mute)} dd{margin:0}
ul.subjects{list-style:none;padding:0;margin:0;display:flex;flex-wrap:wrap;gap:8px}
ul.subjects a{display:block;padding:6px 12px;background:#fff;border:1px solid var(--line);border-radius:8px;
 text-decoration:none}
section.version.asked{border-color:var(--accent);box-shadow:0 0 0 1px var(--accent)}
blockquote{margin:8px 0;padding:8px 12px;background:var(--bg);border-radius:6px;white-space:pre-wrap}
.scores{font-size:12px;color:var(--mute)}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:12px} .pair .card{margin:0 0 12px}
.card>h2:first-child,.card>h3:first-child{margin-top:0} .card>p:last-child{margin-bottom:0}
table.dlq{width:auto;min-width:560px} table.dlq th:not(:first-child),table.memories th:nth-child(4),
table.memories th:nth-child(5),table.hits th:first-child,table.hits th:nth-child(7),table.candidates th:nth-child(2),
table.routes th:nth-child(4),table.revisions th:first-child,table.changes th:nth-child(3){text-align:right}
""")

# No script at all, the one style sheet above, forms only to this server, never inside a frame.
_STYLE_HASH = base64.b64encode(hashlib.sha256(STYLE.encode()).digest()).decode()
HEADERS = {
    "Content-Security-Policy": f"default-src 'none'; style-src 'sha256-{_STYLE_HASH}'; form-action 'self'; "
                               "frame-ancestors 'none'; base-uri 'none'",
    "X-Content-Type-Options": "nosniff",
    # Queries ride in the address (GET forms): no other site learns them, and no cache keeps a page.
    # (Not no-referrer: a browser then posts the login form with `Origin: null`, which `same_origin` refuses.)
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def respond(doc: Html, status: int = 200) -> HTMLResponse:
    return HTMLResponse(doc, status_code=status, headers=HEADERS)


def subject_url(subject: str, tail: str = "") -> str:
    return f"/subjects/{quote(subject, safe='/:')}{tail}"


def history_url(memory_id: str, subject: str) -> str:
    return f"/memories/{quote(memory_id, safe='')}/history?subject={quote(subject, safe='/:')}"


def badge(value: object, kind: str | None = None) -> Html:
    return el("span", value, class_=f"badge {kind or value}")


def when(t: datetime) -> str:
    return t.astimezone(UTC).strftime("%Y-%m-%d %H:%M")


class Cell(Html):
    """A table cell built with its class (`num`, `content`); `table` puts any other value in a plain one."""


def cell(*children: object, class_: str | None = None) -> Cell:
    return Cell(el("td", *children, class_=class_))


def num(value: object) -> Cell:
    return cell(value, class_="num")


def table(classes: str, head: Iterable[str], rows: Iterable[Iterable[object]]) -> Html:
    cells = [el("tr", [c if isinstance(c, Cell) else el("td", c) for c in row]) for row in rows]
    return el("table", el("thead", el("tr", [el("th", h) for h in head])), el("tbody", cells), class_=classes)
