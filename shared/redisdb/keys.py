"""Every Redis key and stream name memflow uses, in one place.

All of them hang off one prefix so that two deployments, or two test runs, can share
a Redis without seeing each other's data.

Partitions. Each stage's work stream is split into `partitions` streams by a hash of the subject:
all of one subject's work goes through one partition, in order, and one consumer owns a partition
at a time (shared/streaming/leases.py). Every key of a partition — its four work streams, their dead-letter
streams, their lease, reclaim cursor and error hash — carries the partition's hash tag `{p<n>}`, so
that in a Redis Cluster they live in one slot: the MULTI and the scripts that move an entry from one
stage to the next (XADD downstream + XACK upstream) stay atomic there too.

The partition count is the deployment's, not a process's: a subject's partition depends on it, so two
processes with two counts would send one subject's work through two partitions (two consumers, out of
order), and a smaller count would leave partitions no one owns. The first process that opens the
streams records it in Redis (`partition_count`); every consumer and publisher after it checks it and
refuses another (`check_partitions`). It changes only drained, through `memflow partitions set`
(shared/streaming/backlog.change_partitions).
"""

from __future__ import annotations

import secrets
import zlib
from dataclasses import dataclass

import redis

from memflow.pipeline.ids import IdSpace
from memflow.shared.errors import MemflowError

STAGES = ("trigger", "extract", "resolve", "upsert")
# The stream a stage reads from: each stage is named after what it does, each stream
# after what it carries.
INPUT_STREAM = {"trigger": "events", "extract": "extract", "resolve": "resolve", "upsert": "upsert"}
# The field of a stream entry that holds the orjson message.
FIELD = "m"
DEFAULT_PARTITIONS = 4


def partition_of(subject: str, partitions: int) -> int:
    """The partition of a subject's work: CRC-32, the same in every process and every version."""
    return zlib.crc32(subject.encode()) % partitions


@dataclass(frozen=True)
class Keys:
    prefix: str = "memflow:"
    partitions: int = DEFAULT_PARTITIONS

    def stream(self, name: str) -> str:
        """An unpartitioned stream (the capped feeds, a benchmark's scratch)."""
        return f"{self.prefix}{name}"

    def partition(self, subject: str) -> int:
        return partition_of(subject, self.partitions)

    def tagged(self, partition: int, name: str) -> str:
        """A key of one partition: its hash tag puts every key of the partition in one cluster slot."""
        return f"{self.prefix}{{p{partition}}}:{name}"

    def partition_in(self, key: str) -> int:
        """The partition a partition's key belongs to (its hash tag)."""
        return int(key[key.index("{p") + 2:key.index("}", key.index("{p"))])

    def work(self, name: str, subject: str) -> str:
        """The partition stream `name` ("events", "extract", "resolve", "upsert") that carries `subject`'s work."""
        return self.tagged(self.partition(subject), name)

    def input_of(self, stage: str, partition: int) -> str:
        return self.tagged(partition, INPUT_STREAM[stage])

    def inputs_of(self, stage: str) -> list[str]:
        """Every partition's input stream of `stage`, by partition."""
        return [self.input_of(stage, p) for p in range(self.partitions)]

    def group(self, stage: str) -> str:
        # One consumer group per stage; its name is the stage's.
        return stage

    def dlq(self, stage: str, partition: int) -> str:
        # Beside its partition's input, so that dead-lettering (XADD here + XACK there) is one MULTI.
        return self.tagged(partition, f"dlq:{stage}")

    def dlqs(self, stage: str) -> list[str]:
        return [self.dlq(stage, p) for p in range(self.partitions)]

    def autoclaim_cursor(self, stage: str, partition: int) -> str:
        # XAUTOCLAIM is a scan: keeping the cursor lets every consumer continue where
        # the last sweep stopped instead of re-reading the head of the PEL.
        return self.tagged(partition, f"autoclaim:{stage}")

    def errors(self, stage: str, partition: int) -> str:
        # The last error of each pending entry, so the DLQ can say why it finally gave up.
        return self.tagged(partition, f"errors:{stage}")

    def lease(self, stage: str, partition: int) -> str:
        """String: the consumer that owns this partition of `stage`, expiring unless renewed
        (shared/streaming/leases.py)."""
        return self.tagged(partition, f"lease:{stage}")

    @property
    def partition_count(self) -> str:
        """String: how many partitions this deployment's streams are split into, recorded at first start."""
        return f"{self.prefix}partitions"

    @property
    def id_secret(self) -> str:
        """String: the secret this deployment names its memories' ids with (`id_space`), made at first start."""
        return f"{self.prefix}id-secret"

    def consumers(self, stage: str) -> str:
        """Sorted set: the live consumers of `stage` by their last heartbeat (server time, ms)."""
        return f"{self.prefix}consumers:{stage}"

    def pending(self, subject: str) -> str:
        """Hash: event id → what the subject said that is not stored yet (shared/unstored/pending.py). In the subject's
        partition, beside the events stream, so that a publish writes both on one connection to one node."""
        return self.tagged(self.partition(subject), f"pending:{subject}")

    def fates(self, subject: str) -> str:
        """Hash: event id → what became of the subject's published event (shared/unstored/fates.py). In the subject's
        partition, beside its streams and pending entries: a publish writes it on the same connection."""
        return self.tagged(self.partition(subject), f"fates:{subject}")

    def pending_subjects(self, partition: int) -> str:
        """Sorted set: the subjects of a partition with pending entries, by when they last published (ms)."""
        return self.tagged(partition, "pending-subjects")

    def session_buffer(self, subject: str, session_id: str) -> str:
        # \x1f (unit separator) can be in no subject: with ":" subject "a" + session "b:c" and subject
        # "a:b" + session "c" shared one buffer, and one subject's turns were stored under the other.
        return f"{self.prefix}session:{subject}\x1f{session_id}"

    def uses(self, subject: str) -> str:
        """Hash: the uses of the subject's memories recorded and not yet counted on their points
        (shared/writer/uses.py). Its hash tag keeps the subject's use keys in one cluster slot: one script records a
        request once."""
        return f"{self.prefix}{{uses:{subject}}}"

    def uses_folding(self, subject: str) -> str:
        """Hash: the uses being counted on the points now (taken from `uses`; kept until they are)."""
        return f"{self.prefix}{{uses:{subject}}}:folding"

    def uses_seen(self, subject: str) -> str:
        """Sorted set: the request ids whose uses were recorded lately, by when (ms): a retry counts once."""
        return f"{self.prefix}{{uses:{subject}}}:seen"

    @property
    def uses_subjects(self) -> str:
        """Set: the subjects with uses recorded and not yet counted (what the `uses` job walks)."""
        return f"{self.prefix}uses-subjects"

    def session_buffers(self, subject: str) -> str:
        """Set: the sessions of the subject with a buffer (shared/unstored/buffers.py): what forget reads, not the
        keyspace."""
        return f"{self.prefix}sessions:{subject}"

    def traces_of(self, subject: str) -> str:
        """List: the ids of the subject's newest search traces in the `traces` feed (shared/monitoring/status.py)."""
        return f"{self.prefix}traces-of:{subject}"

    def utilisation(self, subject: str) -> str:
        # Per-day counters of recalled and adopted memories (workers/ops.py).
        return f"{self.prefix}util:{subject}"

    def llm_usage(self, subject: str | None) -> str:
        # Per-day LLM counters: calls, tokens, fallbacks by reason, events, candidates (shared/inference/llm.py);
        # everyone's under a key no subject id can produce.
        return f"{self.prefix}llm-all" if subject is None else f"{self.prefix}llm:{subject}"

    @property
    def search_latency(self) -> str:
        # Hash: every search's latency by status and bucket, and their sum (shared/monitoring/metrics.py).
        return f"{self.prefix}metrics:search-latency"

    def forgotten(self, subject: str) -> str:
        # Receipts of forgotten memories: id → {events, sha256 of the content} (workers/forgetting.py).
        return f"{self.prefix}forgotten:{subject}"

    def forgotten_events(self, subject: str) -> str:
        # The events forgotten memories were read from: nothing is written from them again.
        return f"{self.prefix}forgotten-events:{subject}"

    def forgotten_contents(self, subject: str) -> str:
        # SHA-256 of a forgotten memory's words → when it was forgotten: a put of the same words said
        # before then is not written back (pipeline/writes.py Tombstones).
        return f"{self.prefix}forgotten-contents:{subject}"

    def announced(self, mutation_id: str) -> str:
        # Which ops of one mutation the `changes` feed has heard of: a retry announces each once
        # (shared/writer/applier.py). Beside the feed (one slot): the announcement checks the ledger and appends in one
        # script.
        return f"{self.prefix}{{changes}}:announced:{mutation_id}"

    def write_lock(self, subject: str) -> str:
        # Held while one subject's points are read, checked, written and announced. Beside the feed (one slot):
        # the announcement checks, in the script that appends it, that the lock is still its owner's.
        return f"{self.prefix}{{changes}}:write-lock:{subject}"

    def plan_cache(self, subject: str, query_key: str) -> str:
        return f"{self.prefix}plan:{subject}:{query_key}"

    @property
    def changes(self) -> str:
        return f"{self.prefix}{{changes}}"

    @property
    def revisions(self) -> str:
        # Each subject's last entry on `changes` (its profile's revision), set in the announcement's step.
        return f"{self.prefix}{{changes}}:revisions"

    def profile(self, subject: str) -> str:
        # A subject's materialized profile (shared/changes/profiles.py), dropped in the step that announces its next
        # change.
        return f"{self.prefix}{{changes}}:profile:{subject}"

    @property
    def api_keys(self) -> str:
        """Hash: key id → the key's record (its name, patterns, read-only flag and secret's hash)."""
        return f"{self.prefix}{{apikeys}}"

    def api_key_hash(self, digest: str) -> str:
        """String: the record of the key whose secret hashes to `digest` (the lookup every request makes)."""
        return f"{self.prefix}{{apikeys}}:{digest}"

    def key_share(self, key_id: str) -> str:
        """Hash: an API key's share of the front doors (shared/admission/shares.py): its bucket and its places in
        flight, kept until the last place lapses and the bucket is full again."""
        return f"{self.prefix}share:{key_id}"

    def import_undone(self, attempt: str) -> str:
        """String: an import run whose writes were taken back (workers/transfer.py): a slice of it that comes
        later is refused. Kept as long as a slice's call may wait in the queue and run."""
        return f"{self.prefix}import-undone:{attempt}"

    def key_streams(self, key_id: str) -> str:
        """Hash: an API key's open change-feed streams, every server process's (shared/admission/shares.py): place id →
        when it lapses unless renewed, kept until the last one lapses."""
        return f"{self.prefix}streams:{key_id}"

    @property
    def traces(self) -> str:
        return self.stream("traces")

    @property
    def query_queue(self) -> str:
        return f"{self.prefix.rstrip(':')}-query"

    @property
    def jobs_queue(self) -> str:
        return f"{self.prefix.rstrip(':')}-jobs"


class PartitionCountMismatch(MemflowError):
    """MEMFLOW_PARTITIONS is not the count this deployment's streams were started with."""

    def __init__(self, recorded: int, configured: int, key: str) -> None:
        super().__init__(
            f"MEMFLOW_PARTITIONS is {configured} but this deployment's streams are split into {recorded} partitions "
            f"(recorded in Redis under {key}): with {configured}, a subject's new work would go to another partition "
            f"than its work in flight. Start with MEMFLOW_PARTITIONS={recorded}; to change the count, drain the "
            f"pipeline, stop every worker, run `memflow partitions set {configured}`, then start them with "
            f"MEMFLOW_PARTITIONS={configured} (docs/operations.md#scaling-out).")
        self.recorded, self.configured = recorded, configured


# Change the recorded count only from the one the caller checked the pipeline under (two `set`s race safely).
_SWAP_COUNT = """
local now = redis.call('GET', KEYS[1])
if now and now ~= ARGV[1] then return now end
redis.call('SET', KEYS[1], ARGV[2])
return ARGV[2]
"""


def id_space(client: redis.Redis, keys: Keys) -> IdSpace:
    """The deployment's id space (pipeline/ids.py): named with a secret of 32 random bytes that the first process
    records (SET NX) and every later one reads, so that every process names a memory alike and no tenant can
    name one of another's. A store made before the secret keeps the ids it gave
    (docs/write-path.md#ids-belong-to-their-subject)."""
    client.set(keys.id_secret, secrets.token_hex(32), nx=True)
    recorded = client.get(keys.id_secret)
    if recorded is None:  # deleted between the two calls: a second try records it again
        return id_space(client, keys)
    return IdSpace(bytes.fromhex(recorded.decode() if isinstance(recorded, bytes) else str(recorded)))


def recorded_partitions(client: redis.Redis, keys: Keys) -> int | None:
    """The deployment's partition count, or None before anything opened its streams."""
    recorded = client.get(keys.partition_count)
    return None if recorded is None else int(recorded)


def check_partitions(client: redis.Redis, keys: Keys) -> None:
    """At the start of a consumer or publisher: record `keys.partitions` if no count is recorded yet (the
    deployment's first start), else refuse a count other than the recorded one (PartitionCountMismatch)."""
    client.set(keys.partition_count, keys.partitions, nx=True)
    recorded = recorded_partitions(client, keys)
    if recorded is not None and recorded != keys.partitions:
        raise PartitionCountMismatch(recorded, keys.partitions, keys.partition_count)


def swap_partitions(client: redis.Redis, keys: Keys, recorded: int | None, count: int) -> bool:
    """Record `count` if `recorded` is still the recorded count (None: none is); False if it changed meanwhile.
    Only after checking the pipeline drained under `recorded` (shared/streaming/backlog.change_partitions)."""
    got = client.eval(_SWAP_COUNT, 1, keys.partition_count, "" if recorded is None else str(recorded), str(count))
    return int(got) == count
