"""What a publish writes, in one script per partition: each event's fate `accepted` (shared/unstored/fates.py), the
pending entries a search serves until what they say is stored (shared/unstored/pending.py), both hashes' bounds, and
then the events themselves, XADDed to the partition's stream.

Why one script: a publish is acknowledged once the server's AOF holds it on disk, and with `appendfsync always` every
round trip that writes pays an fsync. The bounds used to be enforced after the write from Python (the hash read back,
decoded, its oldest entries deleted: two more round trips, one more fsync) on every publish of a subject at its bound,
which is every publish of a busy one. Here they cost nothing beyond the one round trip: the script reads the sizes it
has just made and trims in the server. The fates and entries and the events land together, atomically: no search can
find an event's entry without the event, no caller its fate.

Sent by EVALSHA inside the publish's pipeline (`queue`); a server that does not know the script (restarted, a replica
promoted) answers NOSCRIPT before running any of it, so the caller loads it (`SCRIPT`) and sends that part again
(shared/sdk/client.py `_append`): nothing was written twice.
"""

from __future__ import annotations

import hashlib
import logging
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import orjson
from redis.client import Pipeline

from memflow.pipeline.models import ChatEvent
from memflow.pipeline.pending import said
from memflow.shared.codec import encode
from memflow.shared.redisdb.keys import FIELD, Keys
from memflow.shared.settings import PendingSettings
from memflow.shared.unstored import fates

log = logging.getLogger(__name__)

# KEYS, in order: the stream, the partition's pending subjects; per fated subject its fates hash; per subject with
# entries its pending hash. ARGV: the header (the stream field; now in ms; the fates' TTL, bound and size once trimmed;
# the entries' TTL, per-subject bound and subjects per partition; the partition's pending key prefix), then the fates
# (n subjects, each: n events, then id, fate), the entries (n subjects, each: the subject, n entries, then id, entry),
# the events (n, then each encoded). Returns {stream ids, pending entries trimmed, pending subjects evicted}.
#
# The oldest go first: a fate's by its `at`, an entry's by its turn's time (ISO 8601 with any offset, read here as an
# instant), then by event id. Something that does not parse counts as oldest (Python's decode would have raised, and
# failed the publish of a well-formed event over a malformed entry).
SCRIPT = """
local a, k = 1, 1
local function arg() a = a + 1; return ARGV[a - 1] end
local function key() k = k + 1; return KEYS[k - 1] end
local field, now = arg(), tonumber(arg())
local fate_ttl, fate_bound, fate_keep = arg(), tonumber(arg()), tonumber(arg())
local said_ttl, said_bound, subjects_cap, said_prefix = arg(), tonumber(arg()), tonumber(arg()), arg()

local function chunked(cmd, target, items)
  for i = 1, #items, 500 do redis.call(cmd, target, unpack(items, i, math.min(i + 499, #items))) end
end

local function oldest_first(x, y)
  if x[1] ~= y[1] then return x[1] < y[1] end
  return x[2] < y[2]
end

local function drop_oldest(target, held, n)
  if n <= 0 then return 0 end
  local gone = {}
  if n <= 4 then  -- a subject at its bound sheds one entry a publish: a scan, not a sort
    for i = 1, n do
      local at = i
      for j = i + 1, #held do if oldest_first(held[j], held[at]) then at = j end end
      held[i], held[at] = held[at], held[i]
      gone[i] = held[i][2]
    end
  else
    table.sort(held, oldest_first)
    for i = 1, n do gone[i] = held[i][2] end
  end
  chunked('HDEL', target, gone)
  return n
end

local function decoded(raw)
  local ok, value = pcall(cjson.decode, raw)
  if ok and type(value) == 'table' then return value end
  return {}
end

-- (seconds since the epoch, microseconds) of an ISO 8601 time with any offset, or nil
local function instant(ts)
  local y, mo, d, h, mi, s, rest = string.match(ts, '^(%d+)-(%d+)-(%d+)T(%d+):(%d+):(%d+)(.*)$')
  if not y then return nil end
  local frac, zone = string.match(rest, '^%.(%d+)(.*)$')
  if not frac then frac, zone = '', rest end
  local off = 0
  if zone ~= 'Z' and zone ~= '' then
    local sign, oh, om, osec = string.match(zone, '^([+-])(%d%d):?(%d%d):?(%d*)$')
    if not sign then return nil end
    off = tonumber(oh) * 3600 + tonumber(om) * 60 + (tonumber(osec) or 0)
    if sign == '-' then off = -off end
  end
  y, mo, d = tonumber(y), tonumber(mo), tonumber(d)
  if mo <= 2 then y = y - 1 end
  local era = math.floor(y / 400)
  local yoe = y - era * 400
  local doy = math.floor((153 * ((mo + 9) % 12) + 2) / 5) + d - 1
  local days = era * 146097 + yoe * 365 + math.floor(yoe / 4) - math.floor(yoe / 100) + doy - 719468
  return days * 86400 + tonumber(h) * 3600 + tonumber(mi) * 60 + tonumber(s) - off,
         tonumber(string.sub(frac .. '000000', 1, 6))
end

-- The instant as UTC text, YYYY-MM-DDTHH:MM:SS.ffffff: compared as strings, in time order (the years are 4 digits)
local function utc(secs, micros)
  local days = math.floor(secs / 86400)
  local rem = secs - days * 86400
  local z = days + 719468
  local era = math.floor(z / 146097)
  local doe = z - era * 146097
  local yoe = math.floor((doe - math.floor(doe / 1460) + math.floor(doe / 36524) - math.floor(doe / 146096)) / 365)
  local doy = doe - (365 * yoe + math.floor(yoe / 4) - math.floor(yoe / 100))
  local mp = math.floor((5 * doy + 2) / 153)
  local day = doy - math.floor((153 * mp + 2) / 5) + 1
  local month = mp < 10 and mp + 3 or mp - 9
  local year = yoe + era * 400 + (month <= 2 and 1 or 0)
  return string.format('%04d-%02d-%02dT%02d:%02d:%02d.%06d', year, month, day, math.floor(rem / 3600),
                       math.floor(rem % 3600 / 60), rem % 60, micros)
end

-- An entry's place in time: its turn's time as UTC text, '' (the oldest) when it has none that parses. The one
-- "ts" key of an entry is found as text (a quote inside the words is escaped, so they cannot fake one); a time
-- already in UTC (what the models write for one) is only padded, the arithmetic is for the other offsets.
local function entry_time(raw)
  local ts
  local p = string.find(raw, '"ts":"', 1, true)
  local q = p and string.find(raw, '"', p + 6, true)
  if q then
    ts = string.sub(raw, p + 6, q - 1)
  else
    local turn = decoded(raw).turn
    ts = type(turn) == 'table' and turn.ts or nil
  end
  if type(ts) ~= 'string' then return '' end
  if string.byte(ts, -1) == 90 and string.find(ts, '^%d%d%d%d%-%d%d%-%d%dT%d%d:%d%d:%d%d') then  -- ...Z
    if #ts == 20 then return string.sub(ts, 1, 19) .. '.000000' end
    if #ts == 27 then return string.sub(ts, 1, 26) end
  end
  local secs, micros = instant(ts)
  return secs and utc(secs, micros) or ''
end

local function trim_fates(target)
  local flat, held = redis.call('HGETALL', target), {}
  for i = 1, #flat, 2 do held[#held + 1] = {tonumber(decoded(flat[i + 1]).at) or 0, flat[i]} end
  drop_oldest(target, held, #held - fate_keep)
end

local function trim_said(target, excess)
  local flat, held = redis.call('HGETALL', target), {}
  for i = 1, #flat, 2 do held[#held + 1] = {entry_time(flat[i + 1]), flat[i]} end
  return drop_oldest(target, held, excess)
end

local stream, subjects = key(), key()
for _ = 1, tonumber(arg()) do
  local target = key()
  for _ = 1, tonumber(arg()) do redis.call('HSETNX', target, arg(), arg()) end
  redis.call('EXPIRE', target, fate_ttl)
  if redis.call('HLEN', target) > fate_bound then trim_fates(target) end
end
local trimmed, evicted, entered = 0, 0, tonumber(arg())
for _ = 1, entered do
  local target, subject, flat = key(), arg(), {}
  for _ = 1, 2 * tonumber(arg()) do flat[#flat + 1] = arg() end
  for i = 1, #flat, 1000 do redis.call('HSET', target, unpack(flat, i, math.min(i + 999, #flat))) end
  redis.call('EXPIRE', target, said_ttl)
  local size = redis.call('HLEN', target)
  if size > said_bound then trimmed = trimmed + trim_said(target, size - said_bound) end
  redis.call('ZADD', subjects, now, subject)
end
if entered > 0 then
  local excess = redis.call('ZCARD', subjects) - subjects_cap
  if excess > 0 then
    local popped, gone = redis.call('ZPOPMIN', subjects, excess), {}
    for i = 1, #popped, 2 do gone[#gone + 1] = said_prefix .. popped[i] end
    for i = 1, #gone, 500 do redis.call('DEL', unpack(gone, i, math.min(i + 499, #gone))) end
    evicted = #gone
  end
end
local ids = {}
for i = 1, tonumber(arg()) do ids[i] = redis.call('XADD', stream, '*', field, arg()) end
return {ids, trimmed, evicted}
"""
SHA = hashlib.sha1(SCRIPT.encode()).hexdigest()


@dataclass(frozen=True)
class Part:
    """One partition's share of a publish: the stream and the events, as written (secrets redacted)."""

    stream: str
    events: Sequence[ChatEvent]


def queue(pipe: Pipeline, keys: Keys, cfg: PendingSettings, part: Part) -> None:
    """Queue on `pipe` (a connection to the partition's node) the script that writes the part: one reply, read
    by `ids`."""
    partition = keys.partition_in(part.stream)
    accepted = _accepted(part.events)
    entries = _entries(part.events) if cfg.enabled else {}
    script_keys = [part.stream, keys.pending_subjects(partition), *(keys.fates(s) for s in accepted),
                   *(keys.pending(s) for s in entries)]
    args: list[Any] = [FIELD, int(time.time() * 1000), fates.TTL_S, fates.PER_SUBJECT,
                       int(fates.PER_SUBJECT * fates.TRIM_TO), cfg.ttl_s, cfg.per_subject,
                       math.ceil(cfg.subjects / keys.partitions), keys.tagged(partition, "pending:"), len(accepted)]
    for by_id in accepted.values():
        args += [len(by_id), *(x for pair in by_id.items() for x in pair)]
    args.append(len(entries))
    for subject, by_id in entries.items():
        args += [subject, len(by_id), *(x for pair in by_id.items() for x in pair)]
    args += [len(part.events), *(encode(event) for event in part.events)]
    pipe.evalsha(SHA, len(script_keys), *script_keys, *args)


def ids(reply: Sequence[Any]) -> list[str]:
    """The stream ids of the part's events, from its script's reply (logging the bounds it enforced)."""
    stream_ids, trimmed, evicted = reply
    if trimmed:
        log.info("pending entries over the per-subject bound: %d oldest no longer served early", trimmed)
    if evicted:
        log.info("pending subjects over the bound of their partition: %d quiet ones evicted", evicted)
    return [i.decode() if isinstance(i, bytes) else str(i) for i in stream_ids]


def _accepted(events: Sequence[ChatEvent]) -> dict[str, dict[str, bytes]]:
    """{subject: {event id: the fate `accepted`}}: written only where the event has none (published again, it keeps
    the fate decided meanwhile)."""
    now_ms = int(time.time() * 1000)
    by_subject: dict[str, dict[str, bytes]] = {}
    for event in events:
        by_subject.setdefault(event.subject, {})[event.event_id] = orjson.dumps({"state": "accepted", "at": now_ms})
    return by_subject


def _entries(events: Sequence[ChatEvent]) -> dict[str, dict[str, bytes]]:
    """{subject: {event id: its pending entry}} of the events that leave one (pipeline/pending.py `said`)."""
    by_subject: dict[str, dict[str, bytes]] = {}
    for event in events:
        entry = said(event)
        if entry is not None:
            by_subject.setdefault(event.subject, {})[event.event_id] = encode(entry)
    return by_subject
