"""The APScheduler app: the maintenance schedule, and a callback per entry that only enqueues.

The jobs themselves (workers/jobs.py) run in a query worker, the process that holds the
store. A scheduler holds nothing but a Redis connection, so a second one (or a restarted
one) does no harm: each firing is enqueued once (scheduler/firings.py).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta
from typing import Any, TypeVar
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from apscheduler.schedulers.base import BaseScheduler
from apscheduler.triggers.cron import CronTrigger
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from memflow.pipeline.models import Tier
from memflow.scheduler.firings import Entry, enqueue_firing, last_fire_time
from memflow.shared.errors import MemflowError
from memflow.shared.redisdb.connections import connect_queue
from memflow.shared.settings import Settings

log = logging.getLogger(__name__)

# Cron fields in the scheduler's timezone (MEMFLOW_SCHEDULER_TIMEZONE). Long-term decay runs
# before consolidation promotes the day's short-term memories; review comes last. The index job
# looks every ten minutes and builds only once enough points changed (workers/jobs.py: searches
# never build an index; brute force over the unindexed points grows until one does).
SCHEDULE = (
    Entry("decay", Tier.short_term, {"minute": 5}, timedelta(hours=1)),
    Entry("decay", Tier.long_term, {"hour": 3, "minute": 0}, timedelta(days=1)),
    Entry("consolidate", None, {"hour": 3, "minute": 30}, timedelta(days=1)),
    Entry("review", None, {"hour": 4, "minute": 0}, timedelta(days=1)),
    Entry("index", None, {"minute": "*/10"}, timedelta(minutes=10)),
    # Uses a pack or feedback could not count at once (the write lock was taken: shared/writer/uses.py).
    Entry("uses", None, {"minute": "*/5"}, timedelta(minutes=5)),
)
# Looking back two periods finds the latest firing even when a day lasts 25 h (DST).
LOOKBACK_PERIODS = 2
# A firing missed by up to this long (a busy or restarted scheduler) is still enqueued, later it is skipped.
# An hour since the scheduler was written (d6cae23), not measured; it was MEMFLOW_SCHEDULER_MISFIRE_GRACE_S.
MISFIRE_GRACE_S = 3600

SchedulerT = TypeVar("SchedulerT", bound=BaseScheduler)


def build_scheduler(settings: Settings, kind: type[SchedulerT], *, misfire_grace_s: int = MISFIRE_GRACE_S
                    ) -> SchedulerT:
    """A scheduler (BlockingScheduler for `memflow scheduler`, BackgroundScheduler inside `memflow up`)
    holding one job per SCHEDULE entry; not started."""
    timezone = zone(settings.scheduler.timezone)
    scheduler: SchedulerT = kind(timezone=timezone)
    queue = Queue(settings.keys.jobs_queue, connection=connect_queue(settings),
                  serializer=JSONSerializer)  # the query worker reads its queues with this serializer
    for entry in SCHEDULE:
        # A trigger built without a timezone would read its fields in the host's zone, not the scheduler's.
        trigger = CronTrigger(timezone=timezone, **entry.cron)
        scheduler.add_job(fire, trigger, args=(queue, settings.redis.stream_prefix, entry, trigger,
                                               settings.scheduler.job_timeout_s),
                          id=entry.id, name=entry.id, coalesce=True, max_instances=1,
                          misfire_grace_time=misfire_grace_s, replace_existing=True)
    return scheduler


def zone(name: str) -> ZoneInfo:
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError) as exc:
        raise MemflowError(f"MEMFLOW_SCHEDULER_TIMEZONE={name!r} is not an IANA timezone name") from exc


def fire(queue: Queue, prefix: str, entry: Entry, trigger: CronTrigger, job_timeout_s: int,
         now: datetime | None = None) -> Job | None:
    """The callback of one entry: enqueue the firing due at `now` (default: the clock), once."""
    fire_time = last_fire_time(trigger, now or datetime.now(UTC), entry.period * LOOKBACK_PERIODS)
    if fire_time is None:
        log.warning("%s ran with no firing due (clock moved back?); nothing enqueued", entry.id)
        return None
    return enqueue_firing(queue, prefix, entry, fire_time, job_timeout_s=job_timeout_s)


def next_fire_times(scheduler: BaseScheduler, now: datetime) -> list[tuple[str, str, datetime | None]]:
    """(job id, trigger, next fire time after `now`) for every job, started or not."""
    jobs: list[Any] = scheduler.get_jobs()
    return [(job.id, str(job.trigger), job.trigger.get_next_fire_time(None, now)) for job in jobs]
