"""The read-your-writes layer in Redis: what each subject said that is not stored yet (pipeline/pending.py).

Where it lives: one hash per subject (`Keys.pending`, event id → `Said`), in the subject's partition slot
beside its events stream, so that `MemoryClient` writes the entry in the script that XADDs the event, and before
it (shared/unstored/published.py): a search that starts after `publish` returned always finds it. It lives in
Redis, not in a process, so it outlives the restart of any stage.

When it goes: the stage that settles what an entry became deletes it once that is in the store (upsert, after
the write) or once it is known to become nothing (extract: a closed session's turn that yields no candidate;
resolve: a candidate that writes nothing; any stage: the work message carrying it dead-lettered, `settle_dead`,
just before it is moved to the DLQ, so a crash in between leaves it to be dead-lettered again, never served for
good). A dead letter replayed is served again (`serve_again`), as a publish is. A search reads the entries
*before* it queries the store, so that an entry deleted in between was stored before the store was read:
never neither. An entry whose memory the search also found is dropped (`pipeline.pending.landed`), and one
resolve would skip as a duplicate is not shown: never both.

Bounded three ways (settings `MEMFLOW_PENDING_*`): per subject (the oldest entries go first), per deployment
(each partition keeps `subjects / partitions` subjects, those that published longest ago go first), and in time
(a subject's hash expires once it has published nothing for `ttl_s`), all three enforced by the publish's own
script, in its round trip. An evicted entry is still written; it is only not served before it lands.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable, Mapping

import redis

from memflow.pipeline.gate import GateVerdict
from memflow.pipeline.models import Candidate, ChatEvent, ExtractTask, Role, TriggerReason
from memflow.pipeline.pending import Said, gated, said
from memflow.shared.codec import decode, encode
from memflow.shared.errors import DecodeError
from memflow.shared.redisdb.keys import Keys
from memflow.shared.settings import PendingSettings
from memflow.shared.unstored.fates import events_in

log = logging.getLogger(__name__)

Client = redis.Redis | redis.RedisCluster


def read(client: Client, keys: Keys, subject: str) -> list[Said]:
    """The subject's pending entries, oldest first, without those of forgotten events."""
    raw = client.hgetall(keys.pending(subject))
    if not raw:
        return []
    entries = sorted((decode(v, Said) for v in raw.values()), key=lambda s: (s.turn.ts, s.turn.event_id))
    forgotten = client.smismember(keys.forgotten_events(subject), [s.turn.event_id for s in entries])
    return [s for s, gone in zip(entries, forgotten, strict=True) if not gone]


# The gated entry replaces the raw one only if that is still there: an entry already settled stays settled.
_REPLACE_IF_HELD = """
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then redis.call('HSET', KEYS[1], ARGV[1], ARGV[2]) end
"""


def regate(client: Client, keys: Keys, event: ChatEvent, verdict: GateVerdict) -> None:
    """The trigger's gate applied to the event's entry: deleted when the gate refused the turn, redacted in place
    when it took secrets out; untouched when the gate kept the words as they were (most messages: no call)."""
    entry = said(event)
    if entry is None or (verdict.keep and verdict.text.strip() == event.text.strip()):
        return
    kept = gated(entry, verdict)
    if kept is None:
        client.hdel(keys.pending(event.subject), event.event_id)
    else:
        client.eval(_REPLACE_IF_HELD, 1, keys.pending(event.subject), event.event_id, encode(kept))


def settle(client: Client, keys: Keys, settled: Mapping[str, Iterable[str]]) -> None:
    """Delete the entries of these events ({subject: event ids}): what they became is stored, or is nothing."""
    wanted = {s: sorted(set(ids)) for s, ids in settled.items() if ids}
    if not wanted:
        return
    pipe = client.pipeline(transaction=False)
    for subject, ids in wanted.items():
        pipe.hdel(keys.pending(subject), *ids)
    pipe.execute()


def settled_by(candidates: Iterable[Candidate]) -> dict[str, list[str]]:
    """{subject: the events whose entries these candidates settle}: each candidate read from one turn settles
    that turn's entry. One read from several turns (a behaviour, a statement made twice) settles none of them:
    each turn's own statement or record does, and until then the turn is still served as pending."""
    out: dict[str, list[str]] = {}
    for c in candidates:
        if len(c.source_event_ids) == 1:
            out.setdefault(c.subject, []).extend(c.source_event_ids)
    return out


# -- dead letters ------------------------------------------------------------------------------


def held_by(stage: str, payload: bytes | None) -> dict[str, list[str]]:
    """{subject: event ids} of the entries a work message of `stage` stands for: the events it carries
    (`fates.events_in`, read without the model, so a message dead-lettered because it does not validate still
    settles its entries), but of a candidate (resolve) or a write batch's candidate (upsert) only one read from a
    single event: those it settles (`settled_by`)."""
    carried = events_in(stage, payload)
    if stage in ("resolve", "upsert"):
        return {subject: ids for subject, ids in carried.items() if len(ids) == 1}
    return carried


def settle_dead(client: Client, keys: Keys, stage: str, payload: bytes | None) -> None:
    """A work message is being dead-lettered: what it carries will not be stored, so it is no longer served."""
    settle(client, keys, held_by(stage, payload))


def _served_again(stage: str, payload: bytes) -> tuple[str, dict[str, Said]] | None:
    """(subject, the entries) a replayed message of `stage` stands for again: a published event's (as a publish
    leaves it), an extract task's turns'. A candidate or a write batch carries no turn to serve: it is only
    not served before it lands."""
    try:
        if stage == "trigger":
            event = decode(payload, ChatEvent)
            entry = said(event)
            return (event.subject, {event.event_id: entry}) if entry is not None else None
        if stage == "extract":
            task = decode(payload, ExtractTask)
            explicit = task.reason is TriggerReason.explicit_write
            entries = {t.event_id: Said(turn=t, session_id=task.session_id, explicit=explicit,
                                        external_ref=task.external_ref)
                       for t in task.turns if t.role is Role.user or explicit}
            return (task.subject, entries) if entries else None
    except DecodeError:
        return None
    return None


def serve_again(client: Client, keys: Keys, cfg: PendingSettings, stage: str, payload: bytes) -> dict[str, list[str]]:
    """Serve again the entries of a dead letter about to be replayed, before it is back on its stream (so none
    is settled before it is added); {subject: event ids} served, for `settle` to undo if the replay is refused."""
    found = _served_again(stage, payload) if cfg.enabled else None
    if found is None:
        return {}
    subject, entries = found
    key = keys.pending(subject)
    pipe = client.pipeline(transaction=True)  # one slot: the subject's partition
    pipe.hset(key, mapping={i: encode(s) for i, s in entries.items()})
    pipe.expire(key, cfg.ttl_s)
    pipe.zadd(keys.pending_subjects(keys.partition(subject)), {subject: int(time.time() * 1000)})
    pipe.execute()
    return {subject: list(entries)}
