"""Every Redis key and stream name memflow uses, in one place.

All of them hang off one prefix so that two deployments, or two test runs, can share
a Redis without seeing each other's data.
"""

from __future__ import annotations

from dataclasses import dataclass

STAGES = ("trigger", "extract", "resolve", "upsert")
# The stream a stage reads from: each stage is named after what it does, each stream
# after what it carries.
INPUT_STREAM = {"trigger": "events", "extract": "extract", "resolve": "resolve", "upsert": "upsert"}
# The field of a stream entry that holds the orjson message.
FIELD = "m"


@dataclass(frozen=True)
class Keys:
    prefix: str = "memflow:"

    def stream(self, name: str) -> str:
        return f"{self.prefix}{name}"

    def input_of(self, stage: str) -> str:
        return self.stream(INPUT_STREAM[stage])

    def group(self, stage: str) -> str:
        # One consumer group per stage; its name is the stage's.
        return stage

    def dlq(self, stage: str) -> str:
        return f"{self.prefix}dlq:{stage}"

    def autoclaim_cursor(self, stage: str) -> str:
        # XAUTOCLAIM is a scan: keeping the cursor lets every consumer continue where
        # the last sweep stopped instead of re-reading the head of the PEL.
        return f"{self.prefix}autoclaim:{stage}"

    def session_buffer(self, subject: str, session_id: str) -> str:
        # \x1f (unit separator) can be in no subject: with ":" subject "a" + session "b:c" and subject
        # "a:b" + session "c" shared one buffer, and one subject's turns were stored under the other.
        return f"{self.prefix}session:{subject}\x1f{session_id}"

    def utilisation(self, subject: str) -> str:
        # Per-day counters of recalled and adopted memories (workers/ops.py).
        return f"{self.prefix}util:{subject}"

    def llm_usage(self, subject: str | None) -> str:
        # Per-day LLM counters: calls, tokens, fallbacks by reason, events, candidates (shared/llm.py);
        # everyone's under a key no subject id can produce.
        return f"{self.prefix}llm-all" if subject is None else f"{self.prefix}llm:{subject}"

    @property
    def search_latency(self) -> str:
        # Hash: every search's latency by status and bucket, and their sum (shared/metrics.py).
        return f"{self.prefix}metrics:search-latency"

    def forgotten(self, subject: str) -> str:
        # Receipts of forgotten memories: id → {events, sha256 of the content} (workers/forgetting.py).
        return f"{self.prefix}forgotten:{subject}"

    def forgotten_events(self, subject: str) -> str:
        # The events forgotten memories were read from: nothing is written from them again.
        return f"{self.prefix}forgotten-events:{subject}"

    def announced(self, mutation_id: str) -> str:
        # Which ops of one mutation the `changes` feed has heard of: a retry announces each once (shared/applier.py).
        return f"{self.prefix}announced:{mutation_id}"

    def write_lock(self, subject: str) -> str:
        # Held while one subject's points are read, checked and written: revision checks hold across processes.
        return f"{self.prefix}write-lock:{subject}"

    def plan_cache(self, subject: str, query_key: str) -> str:
        return f"{self.prefix}plan:{subject}:{query_key}"

    @property
    def changes(self) -> str:
        return self.stream("changes")

    @property
    def api_keys(self) -> str:
        """Hash: key id → the key's record (its name, patterns, read-only flag and secret's hash)."""
        return f"{self.prefix}apikeys"

    def api_key_hash(self, digest: str) -> str:
        """String: the record of the key whose secret hashes to `digest` (the lookup every request makes)."""
        return f"{self.prefix}apikey:{digest}"

    @property
    def traces(self) -> str:
        return self.stream("traces")

    @property
    def query_queue(self) -> str:
        return f"{self.prefix.rstrip(':')}-query"

    @property
    def jobs_queue(self) -> str:
        return f"{self.prefix.rstrip(':')}-jobs"
