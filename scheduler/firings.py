"""One firing of a schedule entry: the time it stands for, its id, and how it is enqueued once.

A firing is named by its scheduled time, never by the wall clock at which the callback
happened to run: a run that starts late (a busy host, a scheduler restarted within the
misfire grace) is still the same firing, so it carries the same `now` to the job and the
same RQ job id. That id is what makes a second enqueue of the same firing (two schedulers,
a restart) a no-op.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from apscheduler.triggers.base import BaseTrigger
from redis.exceptions import WatchError
from rq import Queue
from rq.job import Job

from memflow.pipeline.models import Tier

log = logging.getLogger(__name__)

# The job entry point, named by string: the scheduler never imports the workers (it only publishes).
RUN_JOB = "memflow.workers.query.run_job"
# A finished job's report (what it changed) stays readable this long; a failed one as long, for a look.
RESULT_TTL_S = 7 * 24 * 3600
# RQ job ids allow letters, digits, "_" and "-" only.
_NOT_IN_JOB_ID = re.compile(r"[^A-Za-z0-9_-]")


@dataclass(frozen=True)
class Entry:
    """One line of the schedule: a job (for one tier, or all), and when it fires.

    `cron` holds CronTrigger fields (numbers, or expressions such as "*/10"), read in the scheduler's
    timezone. `period` is the longest gap between two firings (a day may last 25 h across a DST change:
    the lookback below allows for it); a firing still queued after one period is dropped, the next covers it.
    """

    name: str
    tier: Tier | None
    cron: dict[str, int | str]
    period: timedelta

    @property
    def id(self) -> str:
        return f"{self.name}:{self.tier.value}" if self.tier else self.name


def firing_id(prefix: str, name: str, tier: Tier | None, fire_time: datetime) -> str:
    """The RQ job id of one firing: the same (prefix, job, tier, instant) always gives the same id.

    The instant is written in UTC, so the same firing seen from two timezones is one id.
    """
    stamp = fire_time.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    raw = f"{prefix.rstrip(':')}-{name}-{tier.value if tier else 'all'}-{stamp}"
    return _NOT_IN_JOB_ID.sub("_", raw)


def last_fire_time(trigger: BaseTrigger, now: datetime, lookback: timedelta) -> datetime | None:
    """The latest time `trigger` fires at or before `now` (None if none within `lookback`).

    APScheduler 3 does not hand a job its scheduled run time; with `coalesce` the time it runs
    for is exactly this one (the latest due), so the callback recomputes it from the trigger.
    """
    fire = trigger.get_next_fire_time(None, now - lookback)
    last = None
    while fire is not None and fire <= now:
        last = fire
        fire = trigger.get_next_fire_time(fire, fire)
    return last


def enqueue_firing(queue: Queue, prefix: str, entry: Entry, fire_time: datetime, *,
                   job_timeout_s: int) -> Job | None:
    """Put one firing on the jobs queue unless a job with its id exists; the job, or None.

    Checked and written in one WATCH/MULTI transaction on the job's hash: of two schedulers
    firing the same time, one enqueues and the other sees the job (or loses the race and
    gets a WatchError): either way one job. The job exists until its result expires, long
    after any duplicate could still fire (misfire grace).
    """
    job_id = firing_id(prefix, entry.name, entry.tier, fire_time)
    job_key = queue.job_class.key_for(job_id)
    with queue.connection.pipeline() as pipe:
        try:
            pipe.watch(job_key)  # type: ignore[no-untyped-call]  # redis-py leaves it unannotated
            if pipe.exists(job_key):
                log.info("firing %s is already enqueued", job_id)
                return None
            pipe.multi()
            job = queue.enqueue_call(
                RUN_JOB, args=(entry.name, None, fire_time.isoformat(), False),
                kwargs={"tier": entry.tier.value if entry.tier else None}, job_id=job_id,
                timeout=job_timeout_s, ttl=int(entry.period.total_seconds()), result_ttl=RESULT_TTL_S,
                failure_ttl=RESULT_TTL_S, description=f"{entry.id} as of {fire_time.isoformat()}", pipeline=pipe)
            pipe.execute()
        except WatchError:
            log.info("firing %s was enqueued by another scheduler", job_id)
            return None
    log.info("enqueued %s on %s", job_id, queue.name)
    return job
