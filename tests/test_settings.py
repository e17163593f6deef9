"""A child process rebuilds exactly the parent's settings from the environment; the flat MEMFLOW_* names
and keywords land in the settings group of the part that reads them."""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import pytest
from pydantic import SecretStr

from memflow.pipeline.lifecycle import Policy
from memflow.pipeline.ranking import RankingProfiles
from memflow.pipeline.score import Lifecycle
from memflow.shared.search.reader import profile_for
from memflow.shared.settings import FLAT_NAMES, GROUPS, RedisSettings, Settings, get_settings, to_env, unknown_variables
from memflow.shared.settings_doc import COMMAND, markdown
from memflow.shared.streaming.consumer import READ_COUNT, ConsumerConfig


def test_to_env_round_trips_every_setting(monkeypatch: pytest.MonkeyPatch) -> None:
    parent = Settings(redis_url="redis://127.0.0.1:1/0", stream_prefix="p:", data_dir=Path("/tmp/x"),
                      reclaim_idle_ms=300, intent_planning=False, qdrant_api_key=SecretStr("k"),
                      candidate_pool=80, decay_tau_hours={"preference": 100.0},
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
    assert settings.lifecycle.decay_tau_hours == {"preference": 2160.0, "fact": 4320.0}
    assert settings.ranking.reserved_types == {}
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
    assert child == parent and child.llm.api_key is not None
    assert child.llm.api_key.get_secret_value() == "sk-never-printed"


def test_no_llm_unless_a_base_url_is_set(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMFLOW_LLM_BASE_URL", "")
    assert not Settings().llm.base_url


# -- settings per concern: the flat MEMFLOW_* names and keywords land in their groups ---------------

# The environment contract (README, docker-compose, child processes): every name as it was when the
# settings were one flat object. A group may rename its fields; none of these may change.
ENV_NAMES = {f"MEMFLOW_{name.upper()}" for name in (
    "archive_below", "edge_shards", "block_ms", "consumers", "pending_enabled", "pending_per_subject", "pending_subjects",
    "pending_ttl_s", "lease_ms", "partitions", "retention_s", "candidate_pool", "changes_maxlen", "collapse_records",
    "collection", "data_dir", "decay_tau_hours",
    "dir_scoping", "duplicate_threshold", "embedder", "embedder_api_key", "embedder_dim",
    "embedder_input_type", "embedder_max_retries", "embedder_model", "embedder_passage_prefix",
    "embedder_query_prefix", "embedder_timeout_s", "embedder_url", "encode_batch", "episode_context",
    "fusion", "intent_planning", "lifecycle_scoring",
    "llm_api_key", "llm_base_url", "llm_daily_token_budget", "llm_extract", "llm_json_mode", "llm_judge",
    "llm_max_concurrency", "llm_max_output_tokens", "llm_max_retries", "llm_model", "llm_plan",
    "llm_plan_cache_ttl_s", "llm_plan_timeout_s", "llm_timeout_s", "log_level", "max_deliveries",
    "max_text_bytes", "model",
    "second_look", "qdrant_api_key", "qdrant_url",
    "reclaim_idle_ms", "redis_server", "redis_url", "reserved_types",
    "retry_base_s", "retry_max_s", "rpc_timeout_s", "scheduler_job_timeout_s",
    "scheduler_timezone", "search_k", "search_timeout_s",
    "session_buffer_max_turns", "session_buffer_ttl_s", "stream_prefix", "traces_maxlen",
    "type_quotas",
    # issue 16: `memflow serve` and `memflow mcp`
    "http_host", "http_port", "http_max_body_bytes", "http_max_batch", "api_key",
    # issue 17: a cluster, and writes acknowledged once replicas hold them
    "redis_cluster", "redis_wait_replicas", "redis_wait_timeout_ms", "redis_queue_url",
    # issue 29: an acknowledged publish is fsynced to the AOF (WAITAOF)
    "redis_wait_aof", "redis_wait_aof_timeout_ms",
    # issue 29: a lease means progress (the bound on one batch's time)
    "max_batch_s",
    # issue 29: every client connection has a socket timeout; the HTTP API's bounds
    "socket_timeout_s", "connect_timeout_s", "http_max_requests", "http_threads", "http_thread_wait_s",
    # issue 30: fairness per key, and search workers past one
    "http_key_concurrency", "http_key_rate_per_s", "http_key_burst", "query_workers",
    # issue 30: a key's places lapse (a process that died holding one)
    "http_key_lease_s",
    # issue 30: the host names `serve` answers to
    "http_allowed_hosts",
    # issue 31: export and import
    "http_max_import_bytes",
    # issue 31: the change feed's streams
    "http_max_streams", "http_max_streams_per_key", "http_stream_keepalive_s")}
# issue 40: tuned constants and internal knobs no deployment sets, now named constants beside their code
# (shared/streaming/consumer.READ_COUNT, workers/resolve.RESOLVE_LINGER_MS and NEIGHBOUR_THRESHOLD,
# workers/upsert.MAX_RESOLVE_RETRIES, pipeline/lifecycle.Policy, scheduler/app.MISFIRE_GRACE_S).
REMOVED = {f"MEMFLOW_{name.upper()}" for name in (
    "read_count", "resolve_linger_ms", "neighbour_threshold", "max_resolve_retries", "promote_sessions",
    "pattern_days", "pattern_sessions", "review_after_hours", "scheduler_misfire_grace_s")}


def every_name_set() -> Settings:
    """Settings with a value other than the default for every name that has one, and a key for each secret."""
    return Settings(redis_url="redis://127.0.0.1:1/0", redis_server="/bin/valkey", qdrant_url="http://q:6333",
                    redis_queue_url="redis://127.0.0.1:2/0",
                    qdrant_api_key=SecretStr("qk"), embedder="openai", embedder_url="http://e/v1",
                    embedder_api_key=SecretStr("ek"), embedder_dim=8, llm_base_url="http://l/v1",
                    llm_api_key=SecretStr("lk"), api_key=SecretStr("mf_x"))


def test_every_flat_name_is_still_a_variable_of_the_environment() -> None:
    assert set(to_env(every_name_set())) == ENV_NAMES


def test_a_removed_setting_is_named_as_unknown_never_read_silently() -> None:
    """A deployment that still sets one hears that nothing reads it (the warning at start)."""
    assert not REMOVED & ENV_NAMES
    assert {name.split(" ")[0] for name in unknown_variables(dict.fromkeys(REMOVED, "1"))} == REMOVED
    with pytest.raises(TypeError, match="unknown setting"):
        Settings(read_count=7)


def test_flat_variables_land_in_their_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"REDIS_URL": "redis://h:1/0", "STREAM_PREFIX": "p:", "QDRANT_URL": "http://q:6333",
                        "COLLECTION": "c", "EMBEDDER": "openai", "EMBEDDER_URL": "http://e/v1", "MODEL": "st-model",
                        "EMBEDDER_MODEL": "served", "MAX_DELIVERIES": "7", "CANDIDATE_POOL": "25",
                        "DECAY_TAU_HOURS": '{"preference": 2160}', "ARCHIVE_BELOW": '{"short_term": 0.2}',
                        "LLM_PLAN": "false",
                        "LLM_MODEL": "m", "SCHEDULER_TIMEZONE": "Asia/Shanghai", "MAX_TEXT_BYTES": "9",
                        "CHANGES_MAXLEN": "11", "SEARCH_K": "3", "DUPLICATE_THRESHOLD": "0.9",
                        "LOG_LEVEL": "DEBUG"}.items():
        monkeypatch.setenv(f"MEMFLOW_{name}", value)
    s = Settings()
    assert (s.redis.url, s.redis.stream_prefix, s.store.qdrant_url, s.store.collection) == (
        "redis://h:1/0", "p:", "http://q:6333", "c")
    assert (s.embedder.kind, s.embedder.url, s.embedder.model, s.embedder.served_model) == (
        "openai", "http://e/v1", "st-model", "served")
    assert (s.consumer.max_deliveries, s.ranking.candidate_pool, s.lifecycle.decay_tau_hours) == (
        7, 25, {"preference": 2160.0})
    assert (s.lifecycle.archive_below, s.llm.plan, s.llm.model, s.scheduler.timezone) == (
        {"short_term": 0.2}, False, "m", "Asia/Shanghai")
    assert (s.limits.max_text_bytes, s.limits.changes_maxlen, s.client.search_k, s.write.duplicate_threshold,
            s.log_level) == (9, 11, 3, 0.9, "DEBUG")


def test_flat_keywords_land_in_their_groups_and_win_over_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMFLOW_REDIS_URL", "redis://from-env:1/0")
    monkeypatch.setenv("MEMFLOW_EMBEDDER_URL", "http://from-env/v1")
    s = Settings(redis_url="redis://kw:1/0", embedder="openai", embedder_model="served", model="st",
                 candidate_pool=40, llm_plan_timeout_s=1.5, scheduler_job_timeout_s=5, block_ms=3)
    assert (s.redis.url, s.embedder.kind, s.embedder.url) == ("redis://kw:1/0", "openai", "http://from-env/v1")
    assert (s.embedder.served_model, s.embedder.model, s.ranking.candidate_pool) == ("served", "st", 40)
    assert (s.llm.plan_timeout_s, s.scheduler.job_timeout_s, s.consumer.block_ms) == (1.5, 5, 3)


def test_an_unknown_keyword_is_refused_naming_it_and_the_name_meant() -> None:
    """A misspelt keyword was dropped silently: the setting it meant kept its default."""
    with pytest.raises(TypeError, match=r"qdrant_ur\b.*did you mean qdrant_url"):
        Settings(qdrant_ur="http://q:6333")
    with pytest.raises(TypeError, match="no_such_setting"):
        Settings(no_such_setting=1)
    with pytest.raises(TypeError, match=r"qdrant_ur\b.*did you mean qdrant_url"):
        Settings().replace(qdrant_ur="http://q:6333")
    with pytest.raises(TypeError, match="colour"):
        Settings().replace(colour="red", candidate_pool=30)
    # Groups and their own fields are still taken whole.
    assert Settings(redis=RedisSettings(url="redis://h:1/0")).replace(redis={"url": "redis://g:1/0"}).redis.url \
        == "redis://g:1/0"
    with pytest.raises(ValueError, match="urll"):
        Settings(redis={"urll": "redis://h:1/0"})


def test_an_unknown_variable_is_named_in_one_warning_at_start(monkeypatch: pytest.MonkeyPatch,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("MEMFLOW_QDRANT_UR", "http://q:6333")
    monkeypatch.setenv("memflow_no_such_setting", "1")
    monkeypatch.setenv("MEMFLOW_MCP_SUBJECT", "ann")  # read by `memflow mcp`, not a setting: no warning
    monkeypatch.setenv("MEMFLOW_SERVE_AUTH", "on")  # `memflow serve --workers N` to its processes
    monkeypatch.setenv("MEMFLOW_CANDIDATE_POOL", "30")
    get_settings.cache_clear()
    try:
        with caplog.at_level(logging.WARNING, logger="memflow.shared.settings"):
            assert get_settings().ranking.candidate_pool == 30  # the known ones are read, the unknown ignored
            get_settings.cache_clear()
            get_settings()
    finally:
        get_settings.cache_clear()
    warnings = [r.getMessage() for r in caplog.records if r.name == "memflow.shared.settings"]
    assert len(warnings) == 1, warnings
    assert "MEMFLOW_QDRANT_UR (did you mean MEMFLOW_QDRANT_URL?)" in warnings[0]
    assert "MEMFLOW_NO_SUCH_SETTING" in warnings[0].upper()
    assert "MCP_SUBJECT" not in warnings[0] and "SERVE_AUTH" not in warnings[0] and "POOL" not in warnings[0]


def test_every_caller_in_the_repository_passes_only_known_names() -> None:
    """Settings(...) and .replace(...) keywords anywhere in the code and the tests, checked statically:
    a misspelt one in a rarely run path would raise only when it runs."""
    known = FLAT_NAMES | set(GROUPS) | set(Settings.model_fields)
    root = Path(__file__).parents[1]
    unknown = []
    for path in root.rglob("*.py"):
        parts = path.relative_to(root).parts
        # Hidden folders are virtualenvs (.venv, CI's .venv-langgraph), caches and git's: none of it ours.
        if "build" in parts or any(part.startswith(".") for part in parts[:-1]):
            continue
        tree = ast.parse(path.read_text(), str(path))
        refused = {id(n) for w in ast.walk(tree) if isinstance(w, ast.With) and _expects_a_refusal(w)
                   for n in ast.walk(w)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call) or not _settings_call(node) or id(node) in refused:
                continue
            unknown += [f"{path.relative_to(root)}:{node.lineno} {kw.arg}" for kw in node.keywords
                        if kw.arg is not None and kw.arg not in known]
    assert unknown == []


def _expects_a_refusal(block: ast.With) -> bool:
    return any(ast.unparse(item.context_expr).startswith("pytest.raises") for item in block.items)


def _settings_call(node: ast.Call) -> bool:
    """Settings(...), or a .replace(...) on something named like settings (not str/datetime.replace)."""
    func = node.func
    if isinstance(func, ast.Name):
        return func.id == "Settings"
    if isinstance(func, ast.Attribute) and func.attr == "replace":
        owner = ast.unparse(func.value)
        return "settings" in owner.lower() or owner in {"lonely", "base", "parent", "s"}
    return False


def test_replace_takes_flat_names_validates_and_rereads_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    parent = Settings(stream_prefix="p:", candidate_pool=40)
    monkeypatch.setenv("MEMFLOW_STREAM_PREFIX", "from-env:")
    child = parent.replace(redis_url="redis://h:1/0", reclaim_idle_ms=2000, embedder="e5")
    assert (child.redis.url, child.redis.stream_prefix, child.consumer.reclaim_idle_ms) == ("redis://h:1/0", "p:",
                                                                                          2000)
    assert (child.embedder.kind, child.ranking.candidate_pool, parent.redis.url) == ("e5", 40, None)
    with pytest.raises(ValueError, match="candidate_pool"):
        parent.replace(candidate_pool=0)
    with pytest.raises(ValueError, match="MEMFLOW_EMBEDDER_URL"):
        parent.replace(embedder="openai")


def test_each_group_converts_to_the_type_its_part_reads() -> None:
    s = Settings(decay_tau_hours={"fact": 10.0}, archive_below={"short_term": 0.2}, type_quotas={"episode": 0.5},
                 reserved_types={"fact": 1}, max_deliveries=2, reclaim_idle_ms=20, block_ms=3,
                 retry_base_s=0.5, retry_max_s=1.0, max_text_bytes=99)
    assert s.lifecycle.policy() == Policy(tau_hours={"fact": 10.0}, archive_below={"short_term": 0.2})
    tuned = RankingProfiles().tuned({"decay_floor": 0.8, "hotness_step": 0.1, "hotness_cap": 0.3,
                                     "long_term_bonus": 0.2, "reserve_min_share": 0.5})
    assert profile_for(s, tuned, "What do I like?").lifecycle() == Lifecycle(
        tau_hours={"fact": 10.0}, floor=0.8, hotness_step=0.1, hotness_cap=0.3, long_term_bonus=0.2,
        quotas={"episode": 0.5}, reserved={"fact": 1}, reserve_min_share=0.5)
    assert profile_for(Settings(lifecycle_scoring=False), RankingProfiles(), "?").lifecycle() == Lifecycle.off()
    assert ConsumerConfig.from_settings(s) == ConsumerConfig(max_deliveries=2, reclaim_idle_ms=20, block_ms=3,
                                                             count=READ_COUNT, retry_base_s=0.5, retry_max_s=1.0,
                                                             decode_context={"max_text_bytes": 99})


def test_the_defaults_are_the_parts_own() -> None:
    s = Settings()
    assert s.lifecycle.policy() == Policy() and profile_for(s, RankingProfiles(), "?").lifecycle() == Lifecycle()


def test_a_flat_name_given_to_model_copy_is_refused_not_silently_dropped() -> None:
    """model_copy does not validate: a flat name would be set beside the groups and read by nobody."""
    with pytest.raises(TypeError, match="replace"):
        Settings().model_copy(update={"redis_url": "redis://h:1/0"})
    with pytest.raises(TypeError, match="replace"):
        Settings().model_copy(update={"embedder": "e5"})
    assert Settings().model_copy(update={"log_level": "DEBUG"}).log_level == "DEBUG"


# -- docs/settings.md: generated from the model, checked here and in CI (.ci/run) ---------------------

def test_docs_settings_md_is_the_model_as_it_is() -> None:
    """Regenerate with the command it names when a setting changes."""
    written = (Path(__file__).parents[1] / "docs" / "settings.md").read_text(encoding="utf-8")
    assert written == markdown(), f"docs/settings.md is stale: {COMMAND}"


def test_every_setting_says_what_it_means_in_one_row_whatever_the_environment(
        monkeypatch: pytest.MonkeyPatch) -> None:
    # RankingSettings is still described by comments (issue 40 moves its tuned constants out of it).
    undescribed = [f"{group}.{name}" for group, model in GROUPS.items() if group != "ranking"
                   for name, field in model.model_fields.items() if not field.description]
    assert undescribed == []
    table = markdown()
    variables = [row.split(" | ")[2].strip("`") for row in table.splitlines() if row.startswith("| `")
                 or row.startswith("| —")]
    assert sorted(variables) == sorted(f"MEMFLOW_{name.upper()}" for name in FLAT_NAMES)
    monkeypatch.setenv("MEMFLOW_REDIS_URL", "redis://elsewhere:1/0")  # the defaults are the model's, not a process's
    monkeypatch.setenv("MEMFLOW_DECAY_TAU_HOURS", '{"fact": 1}')
    assert markdown() == table
