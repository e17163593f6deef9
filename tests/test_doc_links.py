"""The documentation's links resolve: every relative link of README.md and docs/*.md names a file that exists
and, with a `#section`, a heading of it (GitHub's anchors); and every `docs/<file>.md` (or `#<section>` of it)
that a code comment cites is there. Pure file reading: no service."""

from __future__ import annotations

import os
import re
from fnmatch import fnmatch
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "clients" / "typescript" / "README.md"]
CITING = ("*.py", "*.ts", "*.yml", "*.toml", "*.md", "Dockerfile", "run")
SKIPPED_DIRS = {".git", ".venv", "node_modules", "build", "dist", ".memflow"}
FENCE = re.compile(r"^(```|~~~).*?^\1", re.S | re.M)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
CITATION = re.compile(r"\bdocs/([\w-]+\.md)(?:#([\w-]+))?")


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped (but `-` and `_`), spaces to `-`."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    """Every heading's anchor, a repeated one numbered as GitHub numbers it (`-1`, `-2`)."""
    seen: dict[str, int] = {}
    found = set()
    for line in FENCE.sub("", path.read_text()).splitlines():
        heading = re.match(r"#{1,6}\s+(.*)", line)
        if heading:
            base = slug(heading.group(1))
            count = seen.get(base, 0)
            found.add(base if count == 0 else f"{base}-{count}")
            seen[base] = count + 1
    return found


def broken(document: Path, target: str) -> str | None:
    """Why `target`, linked from `document`, does not resolve; None when it does."""
    path_part, _, anchor = target.partition("#")
    path = (document.parent / path_part).resolve() if path_part else document
    if not path.exists():
        return f"{target}: no such file"
    if anchor and path.suffix == ".md" and anchor not in anchors(path):
        return f"{target}: no heading #{anchor} in {path.relative_to(ROOT)}"
    return None


def relative_links(document: Path) -> list[str]:
    text = INLINE_CODE.sub("", FENCE.sub("", document.read_text()))
    return [t for t in LINK.findall(text) if not re.match(r"[a-z][a-z+.-]*:", t)]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_resolves(document: Path) -> None:
    problems = [p for t in relative_links(document) if (p := broken(document, t))]
    assert not problems, "\n".join(problems)


def citing_files() -> list[Path]:
    """The repository's own text files, without walking into a virtualenv or node_modules."""
    found = []
    for folder, dirs, files in os.walk(ROOT):
        dirs[:] = [d for d in dirs if d not in SKIPPED_DIRS and not d.startswith(".venv")]
        found += [Path(folder, f) for f in files if any(fnmatch(f, pattern) for pattern in CITING)]
    return sorted(found)


def test_every_section_a_comment_cites_exists() -> None:
    problems = []
    for path in citing_files():
        for name, anchor in CITATION.findall(path.read_text(errors="replace")):
            target = ROOT / "docs" / name
            if not target.exists() or (anchor and anchor not in anchors(target)):
                problems.append(f"{path.relative_to(ROOT)}: docs/{name}#{anchor}")
    assert not problems, "\n".join(sorted(set(problems)))
