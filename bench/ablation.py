"""The ablation ladder (docs/ranking.md#evaluation): the same data, mechanisms switched on one at a time.

Each step adds overrides to the previous one, starting from everything off. A step whose
settings do not exist yet (the mechanism is not built) is reported "not built", never
silently run as if it were the previous step. `INGEST_SETTINGS` change what is written;
the rest only change how it is searched, so steps that agree on them can share one ingest.
An override names a setting or a tuned ranking value (pipeline/ranking.py `TUNABLE`; `split`).
"""

from __future__ import annotations

from typing import Any

from memflow.pipeline.ranking import tunable
from memflow.shared.settings import FLAT_NAMES

# Everything off: one flat route, engine-side RRF of dense and BM25, turns indexed alone.
BASE: dict[str, Any] = {"episode_context": False, "fusion": "rrf", "dir_scoping": False, "intent_planning": False,
                        "collapse_records": False, "lifecycle_scoring": False}
STEPS: list[tuple[str, dict[str, Any]]] = [
    ("flat retrieval (RRF)", {}),
    ("+ context indexing", {"episode_context": True}),
    ("+ score fusion", {"fusion": "score"}),
    ("+ directory scoping", {"dir_scoping": True}),
    ("+ intent planning", {"intent_planning": True}),
    ("+ record collapse", {"collapse_records": True}),
    ("+ lifecycle scoring", {"lifecycle_scoring": True}),
]
INGEST_SETTINGS = frozenset({"episode_context"})


def built(overrides: dict[str, Any]) -> bool:
    return all(name in FLAT_NAMES or tunable(name) is not None for name in overrides)


def split(overrides: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the settings, the tuned ranking values) an override names: the first go to `Settings.replace`, the
    others to the searches' profiles (`RankingProfiles.tuned`)."""
    settings = {name: value for name, value in overrides.items() if name in FLAT_NAMES}
    return settings, {name: value for name, value in overrides.items() if name not in settings}


def ladder() -> list[tuple[str, dict[str, Any] | None]]:
    """(label, cumulative settings overrides) per step; None where the step's mechanism is not built."""
    steps: list[tuple[str, dict[str, Any] | None]] = []
    on: dict[str, Any] = {k: v for k, v in BASE.items() if k in FLAT_NAMES}
    for label, overrides in STEPS:
        if not built(overrides):
            steps.append((label, None))
            continue
        on |= overrides
        steps.append((label, dict(on)))
    return steps


def ingest_key(overrides: dict[str, Any]) -> tuple[tuple[str, Any], ...]:
    """What a step writes differently: steps with the same key can search one ingest."""
    return tuple(sorted((k, v) for k, v in overrides.items() if k in INGEST_SETTINGS))
