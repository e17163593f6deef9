"""The ablation ladder of seed 000: the same data, features switched on one at a time.

Each step is a set of settings overrides, cumulative. A step whose setting does not
exist yet (the feature is not built) is reported as "not built", never silently run
as if it were the previous step.
"""

from __future__ import annotations

from typing import Any

from shared.settings import Settings

FEATURES = ("dir_scoping", "intent_planning", "lifecycle_scoring")
STEPS: list[tuple[str, str | None]] = [
    ("flat retrieval", None),
    ("+ directory scoping", "dir_scoping"),
    ("+ intent planning", "intent_planning"),
    ("+ lifecycle scoring", "lifecycle_scoring"),
]


def built(feature: str | None) -> bool:
    return feature is None or feature in Settings.model_fields


def ladder() -> list[tuple[str, dict[str, Any] | None]]:
    """(label, settings overrides) per step; None where the step's feature is not built."""
    steps: list[tuple[str, dict[str, Any] | None]] = []
    on: set[str] = set()
    for label, feature in STEPS:
        if not built(feature):
            steps.append((label, None))
            continue
        if feature:
            on.add(feature)
        steps.append((label, {f: f in on for f in FEATURES if built(f)}))
    return steps
