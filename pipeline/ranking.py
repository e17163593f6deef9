"""What one search ranks by: a profile of values, a request's or a dialogue's, chosen once per search.

A query of three lines or more is a dialogue handed over as the query (`pipeline.plan.is_transcript`); anything
shorter is a request. They differ in six values (`DIALOGUE`); everything else is the same for both. The numbers
were tuned on the benchmarks and are constants, not settings: each one's measurement is in docs/ranking.md, under
the section its comment names. What a deployment chooses (the candidate pool, fusion, the feature switches of the
ablation ladder, the quotas, τ) comes from its settings (shared/settings.py `RankingSettings`) and is written into
the profile when a search resolves it (shared/search/reader.py `profile_for`). A benchmark's variant replaces
values here by name (`RankingProfiles.tuned`), never through the environment.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from memflow.pipeline.plan import TOPIC_WEIGHT, is_transcript
from memflow.pipeline.score import DEFAULT_QUOTAS, DEFAULT_RESERVED, DEFAULT_TAU_HOURS, Fusion, Lifecycle

Kind = Literal["request", "dialogue"]
_LC = Lifecycle()


@dataclass(frozen=True)
class RankingProfile:
    """Every value a search ranks by (pipeline/search.py), a request's by default."""

    kind: Kind = "request"

    # -- what a deployment chooses (its settings; these are their defaults) --
    candidate_pool: int = 50  # per list and route, at least 4 × k (docs/ranking.md#fusion)
    intent_planning: bool = True  # the ablation ladder's switches (docs/ranking.md#evaluation)
    dir_scoping: bool = True
    fusion: Fusion = "score"
    collapse_records: bool = True
    lifecycle_scoring: bool = True
    type_quotas: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_QUOTAS))
    reserved_types: Mapping[str, int] = field(default_factory=lambda: dict(DEFAULT_RESERVED))
    decay_tau_hours: Mapping[str, float] = field(default_factory=lambda: dict(DEFAULT_TAU_HOURS))

    # -- tuned constants, the same for both kinds (docs/ranking.md#the-tuned-constants) --
    # Routes (docs/ranking.md#routes): the whole-subject route beside scoped ones, the share of its best a scoped
    # route must reach to count, the planner's extra routes (0 drops them), the topic-key route.
    whole_subject_weight: float = 1.0
    scope_min_share: float = 0.8
    exact_match_weight: float = 0.0
    bm25_route_weight: float = 0.0
    topic_route_weight: float = TOPIC_WEIGHT
    # The cosine that counts 0: None measures the query's own noise floor (docs/ranking.md#noise-floor).
    dense_floor: float | None = None
    # A dialogue is also asked by its last this-many lines (docs/ranking.md#routes).
    recent_turns: int = 2
    context_smoothing: float = 0.2  # docs/ranking.md#context-smoothing
    holder_mismatch: float = 0.2  # docs/ranking.md#holders
    assistant_turn: float = 0.2  # docs/ranking.md#the-assistants-turns
    second_look_depth: int = 20  # docs/ranking.md#the-second-look
    # Lifecycle scoring's weights (docs/ranking.md#lifecycle-scoring, #quotas): pipeline/score.py's.
    decay_floor: float = _LC.floor
    hotness_step: float = _LC.hotness_step
    hotness_cap: float = _LC.hotness_cap
    long_term_bonus: float = _LC.long_term_bonus
    reserve_min_share: float = _LC.reserve_min_share

    # -- tuned constants, a request's; a dialogue's are `DIALOGUE`'s --
    dense_weight: float = 0.5  # docs/ranking.md#fusion
    keyword_ceiling: float = 0.5  # docs/ranking.md#keyword-evidence
    second_look_weight: float = 0.0  # docs/ranking.md#the-second-look
    # A request is judged again only when it asks about the user or their people (the plan's `about`).
    second_look_needs_about: bool = True
    cross_language_weight: float = 0.7  # docs/ranking.md#across-languages
    period_boost: float = 1.0  # docs/ranking.md#periods

    def lifecycle(self) -> Lifecycle:
        """The weights `pipeline.score.rank` scores with (`Lifecycle.off()` when lifecycle scoring is off)."""
        if not self.lifecycle_scoring:
            return Lifecycle.off()
        return Lifecycle(tau_hours=self.decay_tau_hours, floor=self.decay_floor, hotness_step=self.hotness_step,
                         hotness_cap=self.hotness_cap, long_term_bonus=self.long_term_bonus,
                         quotas=self.type_quotas, reserved=self.reserved_types,
                         reserve_min_share=self.reserve_min_share)


REQUEST = RankingProfile()
# A dialogue leans on meaning (its words are mostly talk around what it is about), scales keywords by its best hit
# (no memory covers its many words), is judged again by its last turns whoever it is about, leaves the other
# language to that second look, and names no period: its time words are the story told (docs/ranking.md).
DIALOGUE = replace(REQUEST, kind="dialogue", dense_weight=1.5, keyword_ceiling=0.0, second_look_weight=0.55,
                   second_look_needs_about=False, cross_language_weight=0.0, period_boost=0.0)

# What a deployment sets (`RankingSettings`): not a benchmark variant's to tune.
DEPLOYED = frozenset({"candidate_pool", "intent_planning", "dir_scoping", "fusion", "collapse_records",
                      "lifecycle_scoring", "type_quotas", "reserved_types", "decay_tau_hours"})
# The values a benchmark variant may replace: by name for both kinds, or "request.name" / "dialogue.name".
TUNABLE = frozenset(f.name for f in fields(RankingProfile)) - DEPLOYED - {"kind"}


@dataclass(frozen=True)
class RankingProfiles:
    """The two profiles a process ranks with: the constants above, or a benchmark variant's."""

    request: RankingProfile = REQUEST
    dialogue: RankingProfile = DIALOGUE

    def of(self, query: str) -> RankingProfile:
        """The profile of this query: a dialogue's for a conversation handed over as the query, else a request's."""
        return self.dialogue if is_transcript(query) else self.request

    def tuned(self, values: Mapping[str, Any]) -> RankingProfiles:
        """These profiles with `values` replaced: "name" in both, "request.name" or "dialogue.name" in one.
        ValueError naming a value that is no tunable one."""
        unknown = sorted(name for name in values if tunable(name) is None)
        if unknown:
            raise ValueError(f"not a tunable ranking value: {', '.join(unknown)}")
        mine: dict[Kind, dict[str, Any]] = {"request": {}, "dialogue": {}}
        for name, value in values.items():
            kinds, plain = tunable(name) or ((), name)
            for kind in kinds:
                mine[kind][plain] = value
        return RankingProfiles(replace(self.request, **mine["request"]), replace(self.dialogue, **mine["dialogue"]))


def tunable(name: str) -> tuple[tuple[Kind, ...], str] | None:
    """Which profiles a variant's value names, and the value's name in them; None if it names none."""
    kind, _, plain = name.rpartition(".")
    if plain not in TUNABLE:
        return None
    if not kind:
        return ("request", "dialogue"), plain
    if kind == "request":
        return ("request",), plain
    return (("dialogue",), plain) if kind == "dialogue" else None
