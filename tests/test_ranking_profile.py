"""A search ranks by one profile, chosen once (pipeline/ranking.py): a request's or a dialogue's tuned constants, with
what the deployment set (shared/search/reader.profile_for); a benchmark variant tunes a value by name, never through
the environment."""

from __future__ import annotations

import pytest

from memflow.pipeline.ranking import DEPLOYED, DIALOGUE, REQUEST, TUNABLE, RankingProfiles, tunable
from memflow.pipeline.score import Lifecycle
from memflow.shared.search.reader import profile_for
from memflow.shared.settings import FLAT_NAMES, RankingSettings, Settings

DIALOGUE_TEXT = "A: hi\nB: hello\nA: I lost my kite"


def test_a_dialogue_differs_from_a_request_in_six_values() -> None:
    differ = {name for name in TUNABLE if getattr(REQUEST, name) != getattr(DIALOGUE, name)}
    assert differ == {"dense_weight", "keyword_ceiling", "second_look_weight", "second_look_needs_about",
                      "cross_language_weight", "period_boost"}
    assert RankingProfiles().of("Who do I report to?") is REQUEST and RankingProfiles().of(DIALOGUE_TEXT) is DIALOGUE


def test_a_variant_tunes_both_kinds_or_one_by_name() -> None:
    tuned = RankingProfiles().tuned({"context_smoothing": 0.0, "dialogue.dense_weight": 1.0})
    assert (tuned.request.context_smoothing, tuned.dialogue.context_smoothing) == (0.0, 0.0)
    assert (tuned.request.dense_weight, tuned.dialogue.dense_weight) == (REQUEST.dense_weight, 1.0)
    assert RankingProfiles().tuned({}) == RankingProfiles()


@pytest.mark.parametrize("name", ["dense_wieght", "chat.dense_weight", "candidate_pool", "request.fusion", "kind"])
def test_a_name_that_is_no_tuned_value_is_refused(name: str) -> None:
    """A misspelt value, an unknown kind, and what a deployment sets (its settings say that) are refused."""
    assert tunable(name) is None
    with pytest.raises(ValueError, match=name):
        RankingProfiles().tuned({name: 1})


def test_the_settings_are_what_a_deployment_chooses_and_none_is_also_tuned() -> None:
    assert set(RankingSettings.model_fields) - {"second_look"} == DEPLOYED - {"decay_tau_hours"}
    assert not TUNABLE & FLAT_NAMES  # a variant's name goes to one place only (bench.ablation.split)


def test_a_search_profile_carries_what_the_deployment_set() -> None:
    settings = Settings(candidate_pool=80, fusion="rrf", lifecycle_scoring=False, type_quotas={"episode": 0.5},
                        decay_tau_hours={"fact": 10.0})
    profile = profile_for(settings, RankingProfiles().tuned({"holder_mismatch": 0.5}), DIALOGUE_TEXT)
    assert (profile.kind, profile.dense_weight, profile.holder_mismatch) == ("dialogue", 1.5, 0.5)
    assert (profile.candidate_pool, profile.fusion, profile.type_quotas) == (80, "rrf", {"episode": 0.5})
    assert profile.decay_tau_hours == {"fact": 10.0} and profile.lifecycle() == Lifecycle.off()
    defaults = profile_for(Settings(), RankingProfiles(), "What do I like?")
    assert defaults == REQUEST  # the settings' defaults are the profile's own
