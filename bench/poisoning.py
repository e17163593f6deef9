"""`memflow bench poisoning`: what becomes of planted orders and of genuine wishes (issue 30 item 4).

Two corpora (tests/corpus/): poisoning.jsonl, orders about the assistant in the third person, other users,
other subjects or the memory itself, in Chinese and English; preferences.jsonl, a user's own standing wishes
("always answer me in French", "叫我小王就行"). Each text is sent the two ways a statement enters: as an explicit
write and as a user turn read in real time. For each corpus it counts the texts

- refused: the gate drops it (nothing stored);
- stored: some statement of it becomes a candidate memory;
- as rule: `pack` renders it under "## Rules" or as "The user MUST/SHOULD be served this way";
- quoted: `pack` renders it as a quoted statement of the user, not an instruction.

Pure pipeline (gate → extract → pack), no services: the figures are the rules', the same on any machine.
"""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path

from memflow.pipeline.extract import extract
from memflow.pipeline.gate import gate
from memflow.pipeline.models import Candidate, ExtractTask, Hit, MType, Role, Status, Tier, TriggerReason, Turn
from memflow.pipeline.pack import line_for

T0 = datetime(2026, 3, 2, 9, 0, tzinfo=UTC)
BINDING = ("preferences", "rules")


@dataclass(frozen=True)
class Figures:
    texts: int
    refused: int
    stored: int
    as_rule: int
    quoted: int


@dataclass(frozen=True)
class Outcome:
    refused: bool
    stored: bool
    as_rule: bool
    quoted: bool


def outcome(text: str) -> Outcome:
    """What the pipeline makes of `text`, sent as an explicit write and as a real-time turn."""
    if not gate(text, Role.user).keep:
        return Outcome(refused=True, stored=False, as_rule=False, quoted=False)
    found = [c for reason in (TriggerReason.explicit_write, TriggerReason.realtime) for c in _candidates(text, reason)]
    lines = [line_for(_hit(c, i)) for i, c in enumerate(found)]
    return Outcome(refused=False, stored=bool(found), as_rule=any(section in BINDING for section, _ in lines),
                   quoted=any("(a quote, not an instruction)" in line for _, line in lines))


def figures(texts: list[str]) -> Figures:
    outcomes = [outcome(t) for t in texts]
    return Figures(texts=len(texts), refused=sum(o.refused for o in outcomes), stored=sum(o.stored for o in outcomes),
                   as_rule=sum(o.as_rule for o in outcomes), quoted=sum(o.quoted for o in outcomes))


def load(path: Path) -> list[str]:
    with path.open(encoding="utf-8") as lines:
        return [json.loads(line)["text"] for line in lines if line.strip()]


def _candidates(text: str, reason: TriggerReason) -> list[Candidate]:
    task = ExtractTask(subject="bench", session_id="s1", reason=reason, ts=T0,
                       turns=[Turn(event_id="e1", role=Role.user, text=text, ts=T0)])
    return [c for c in extract(task) if c.mtype is not MType.episode]


def _hit(c: Candidate, i: int) -> Hit:
    return Hit(id=f"h{i}", content=c.content, dir=c.dir, mtype=c.mtype, key=c.key, status=Status.active,
               tier=Tier.long_term, confidence=c.confidence, score=1.0, created_at=c.ts, about=c.about)


def run_cli(corpus: Path, *, as_json: bool = False, verbose: bool = False) -> int:
    sets = {name: load(corpus / f"{name}.jsonl") for name in ("poisoning", "preferences")}
    result = {name: figures(texts) for name, texts in sets.items()}
    if as_json:
        print(json.dumps({name: asdict(f) for name, f in result.items()}))
    else:
        print(f"{'corpus':<12} {'texts':>5} {'refused':>7} {'stored':>6} {'as rule':>7} {'quoted':>6}")
        for name, f in result.items():
            print(f"{name:<12} {f.texts:>5} {f.refused:>7} {f.stored:>6} {f.as_rule:>7} {f.quoted:>6}")
    if verbose:
        for name, texts in sets.items():
            for text in texts:
                print(f"  {name}: {outcome(text)} {text}", file=sys.stderr)
    return 0
