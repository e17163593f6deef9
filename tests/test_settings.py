"""A child process rebuilds exactly the parent's settings from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from shared.settings import Settings, to_env


def test_to_env_round_trips_every_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    parent = Settings(redis_url="redis://127.0.0.1:1/0", stream_prefix="p:", data_dir=Path("/tmp/x"),
                      reclaim_idle_ms=300, intent_planning=False, qdrant_api_key=SecretStr("k"),
                      whole_subject_weight=0.25, decay_tau_hours={"preference": 100.0},
                      type_quotas={"episode": 0.5}, reserved_types={}, fusion="rrf")
    for name, value in to_env(parent).items():
        monkeypatch.setenv(name, value)
    assert Settings() == parent


def test_the_embedder_settings_reach_a_child_prefixes_and_key_intact(monkeypatch: pytest.MonkeyPatch) -> None:
    parent = Settings(embedder="openai", embedder_url="http://127.0.0.1:1/v1", embedder_model="e5",
                      embedder_api_key=SecretStr("sk-embed"), embedder_dim=384, embedder_query_prefix="query: ",
                      embedder_passage_prefix="passage: ", embedder_input_type=True)
    assert "sk-embed" not in repr(parent)
    for name, value in to_env(parent).items():
        monkeypatch.setenv(name, value)
    assert Settings() == parent


def test_dict_settings_are_json_in_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMFLOW_DECAY_TAU_HOURS", '{"preference": 2160, "fact": 4320}')
    monkeypatch.setenv("MEMFLOW_RESERVED_TYPES", "{}")
    settings = Settings()
    assert settings.decay_tau_hours == {"preference": 2160.0, "fact": 4320.0} and settings.reserved_types == {}
    monkeypatch.setenv("MEMFLOW_FUSION", "max")
    with pytest.raises(ValueError, match="fusion"):
        Settings()


def test_the_llm_key_reaches_a_child_but_never_a_repr_or_a_dump(monkeypatch: pytest.MonkeyPatch) -> None:
    parent = Settings(llm_base_url="http://127.0.0.1:1/v1", llm_api_key=SecretStr("sk-never-printed"),
                      llm_daily_token_budget=10)
    assert "sk-never-printed" not in repr(parent) + parent.model_dump_json() + str(parent.model_dump())
    for name, value in to_env(parent).items():
        monkeypatch.setenv(name, value)
    child = Settings()
    assert child == parent and child.llm_api_key is not None
    assert child.llm_api_key.get_secret_value() == "sk-never-printed"


def test_no_llm_unless_a_base_url_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMFLOW_LLM_BASE_URL", "")
    assert not Settings().llm_base_url
