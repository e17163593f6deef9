"""Evidence recall as the LoCoMo paper scores it, and recall within a context budget.

Pure: ranked items in, percentages out. An item is what a system returns for a question
(a memory, or one raw turn for the baselines): the dialogue ids it was made from and
what it costs in tokens. The paper's rule (snap-research/locomo, task_eval/evaluation.py):
per question, the fraction of its evidence ids found among the retrieved ids; a question
without evidence counts 1; the mean over questions.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

KS = (5, 10, 25, 50)
BUDGETS_TOKENS = (500, 1000, 2000)
ADVERSARIAL = 5
CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}


@dataclass(frozen=True)
class Item:
    source_ids: tuple[str, ...]
    tokens: int


@dataclass(frozen=True)
class Answered:
    """One question as one system answered it: its top items, best first, and the deeper
    list that context budgets are packed from (the same list when `pool` is left empty)."""

    category: int
    evidence: tuple[str, ...]
    items: tuple[Item, ...]
    pool: tuple[Item, ...] = ()

    @property
    def packable(self) -> tuple[Item, ...]:
        return self.pool or self.items


def evidence_recall(evidence: Sequence[str], items: Iterable[Item]) -> float:
    """Fraction of the (distinct) evidence ids found in the items; 1.0 when there is no evidence."""
    wanted = set(evidence)
    if not wanted:
        return 1.0
    found = {i for item in items for i in item.source_ids}
    return len(wanted & found) / len(wanted)


def within_budget(items: Sequence[Item], budget_tokens: int) -> list[Item]:
    """Items in rank order while they fit; one that does not fit is skipped and the next
    ones still tried (as `pipeline.pack` packs a prompt), so one long item cannot end it."""
    packed, spent = [], 0
    for item in items:
        if spent + item.tokens <= budget_tokens:
            packed.append(item)
            spent += item.tokens
    return packed


def recall_at(answers: Sequence[Answered], k: int) -> float:
    return _mean_pct([evidence_recall(a.evidence, a.items[:k]) for a in answers])


def budget_recall(answers: Sequence[Answered], budget_tokens: int) -> float:
    return _mean_pct([evidence_recall(a.evidence, within_budget(a.packable, budget_tokens)) for a in answers])


def mean_tokens_at(answers: Sequence[Answered], k: int) -> float:
    """Mean context cost of the top-k: the summed tokens of a question's first k items."""
    if not answers:
        return 0.0
    return sum(sum(i.tokens for i in a.items[:k]) for a in answers) / len(answers)


def mean_pool_tokens(answers: Sequence[Answered]) -> float:
    """What the budgets are packed from: when this is below a budget, the list ran out first."""
    if not answers:
        return 0.0
    return sum(sum(i.tokens for i in a.packable) for a in answers) / len(answers)


def summarise(answers: Sequence[Answered], ks: Sequence[int] = KS,
              budgets: Sequence[int] = BUDGETS_TOKENS) -> dict[str, Any]:
    """Recall per k (overall, without adversarial, per category), budget recall, tokens per k."""
    plain = [a for a in answers if a.category != ADVERSARIAL]
    return {
        "questions": len(answers),
        "recall": _per_k(answers, ks),
        "recall_no_adversarial": _per_k(plain, ks),
        "by_category": {str(c): _category(answers, c, ks, budgets) for c in CATEGORIES},
        "budget_recall": _per_budget(answers, budgets),
        "budget_recall_no_adversarial": _per_budget(plain, budgets),
        "mean_tokens_at_k": {str(k): round(mean_tokens_at(answers, k), 1) for k in ks},
        "mean_pool_tokens": round(mean_pool_tokens(answers), 1),
    }


def percentile_ms(seconds: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of durations in seconds, in milliseconds (0 when there are none)."""
    if not seconds:
        return 0.0
    ordered = sorted(seconds)
    return round(ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] * 1000, 2)


def _category(answers: Sequence[Answered], category: int, ks: Sequence[int],
              budgets: Sequence[int]) -> dict[str, Any]:
    mine = [a for a in answers if a.category == category]
    return {"name": CATEGORIES[category], "questions": len(mine), "recall": _per_k(mine, ks),
            "budget_recall": _per_budget(mine, budgets)}


def _per_k(answers: Sequence[Answered], ks: Sequence[int]) -> dict[str, float | None]:
    # None, not 0, for a category a quick run did not ask about.
    return {str(k): round(recall_at(answers, k), 2) if answers else None for k in ks}


def _per_budget(answers: Sequence[Answered], budgets: Sequence[int]) -> dict[str, float | None]:
    return {str(b): round(budget_recall(answers, b), 2) if answers else None for b in budgets}


def _mean_pct(values: Sequence[float]) -> float:
    return 100.0 * sum(values) / len(values) if values else 0.0
