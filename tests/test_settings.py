"""A child process rebuilds exactly the parent's settings from the environment."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from shared.settings import Settings, to_env


def test_to_env_round_trips_every_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    parent = Settings(redis_url="redis://127.0.0.1:1/0", stream_prefix="p:", data_dir=Path("/tmp/x"),
                      reclaim_idle_ms=300, intent_planning=False, qdrant_api_key=SecretStr("k"),
                      whole_subject_weight=0.25)
    for name, value in to_env(parent).items():
        monkeypatch.setenv(name, value)
    assert Settings() == parent
