"""The scheduler only enqueues: each firing is one RQ job on the jobs queue, named by its scheduled
time (in the scheduler's timezone), enqueued once however often it fires. No query worker runs here."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from apscheduler.schedulers.background import BackgroundScheduler
from apscheduler.schedulers.blocking import BlockingScheduler
from apscheduler.triggers.cron import CronTrigger
from rq import Queue
from rq.job import Job
from rq.serializers import JSONSerializer

from memflow.pipeline.models import Tier
from memflow.scheduler.app import MISFIRE_GRACE_S, SCHEDULE, build_scheduler, fire, next_fire_times
from memflow.scheduler.firings import RESULT_TTL_S, RUN_JOB, Entry, enqueue_firing, firing_id, last_fire_time
from memflow.shared.errors import MemflowError
from memflow.shared.redisdb.connections import connect
from memflow.shared.redisdb.keys import Keys
from memflow.shared.settings import Settings, to_env

SHANGHAI = ZoneInfo("Asia/Shanghai")
DECAY_SHORT = SCHEDULE[0]


def jobs_queue(settings: Settings) -> Queue:
    assert settings.redis.url
    return Queue(Keys(settings.redis.stream_prefix).jobs_queue, connection=connect(settings.redis.url),
                 serializer=JSONSerializer)


def queued(settings: Settings) -> list[Job]:
    queue = jobs_queue(settings)
    return [Job.fetch(job_id, connection=queue.connection, serializer=JSONSerializer) for job_id in queue.job_ids]


def fire_at(scheduler: Any, job_id: str, now: datetime) -> Job | None:
    """Run the callback APScheduler would run for `job_id`, as if the clock said `now`."""
    job = scheduler.get_job(job_id)
    result: Job | None = job.func(*job.args, **job.kwargs, now=now)
    return result


@pytest.fixture
def shanghai(settings: Settings) -> Settings:
    return settings.replace(scheduler_timezone="Asia/Shanghai", scheduler_job_timeout_s=600)


def test_the_schedule_has_its_documented_jobs(shanghai: Settings) -> None:
    scheduler = build_scheduler(shanghai, BlockingScheduler, misfire_grace_s=1234)
    jobs = {job.id: job for job in scheduler.get_jobs()}
    assert {job_id: str(job.trigger) for job_id, job in jobs.items()} == {
        "decay:short_term": "cron[minute='5']",
        "decay:long_term": "cron[hour='3', minute='0']",
        "consolidate": "cron[hour='3', minute='30']",
        "review": "cron[hour='4', minute='0']",
        "index": "cron[minute='*/10']",
        "uses": "cron[minute='*/5']",
    }
    assert scheduler.timezone == SHANGHAI
    for job in jobs.values():
        assert job.func is fire
        assert isinstance(job.trigger, CronTrigger) and job.trigger.timezone == SHANGHAI
        assert (job.coalesce, job.max_instances, job.misfire_grace_time) == (True, 1, 1234)
    assert {job.misfire_grace_time for job in build_scheduler(shanghai, BlockingScheduler).get_jobs()} == {
        MISFIRE_GRACE_S}


def test_next_fire_times_are_read_in_the_schedulers_timezone(shanghai: Settings) -> None:
    scheduler = build_scheduler(shanghai, BlockingScheduler)
    now = datetime(2026, 3, 2, 0, 0, tzinfo=UTC)  # 08:00 in Shanghai
    assert {job_id: when for job_id, _, when in next_fire_times(scheduler, now)} == {
        "decay:short_term": datetime(2026, 3, 2, 8, 5, tzinfo=SHANGHAI),
        "decay:long_term": datetime(2026, 3, 3, 3, 0, tzinfo=SHANGHAI),
        "consolidate": datetime(2026, 3, 3, 3, 30, tzinfo=SHANGHAI),
        "review": datetime(2026, 3, 3, 4, 0, tzinfo=SHANGHAI),
        "index": datetime(2026, 3, 2, 8, 0, tzinfo=SHANGHAI),  # a firing due at now is next
        "uses": datetime(2026, 3, 2, 8, 0, tzinfo=SHANGHAI),
    }


@pytest.mark.parametrize(("job_id", "now", "fired", "tier"), [
    ("decay:short_term", datetime(2026, 3, 2, 10, 7, tzinfo=UTC), datetime(2026, 3, 2, 10, 5, tzinfo=UTC), "short_term"),
    ("decay:long_term", datetime(2026, 3, 2, 3, 40, tzinfo=UTC), datetime(2026, 3, 2, 3, 0, tzinfo=UTC), "long_term"),
    ("consolidate", datetime(2026, 3, 2, 3, 30, tzinfo=UTC), datetime(2026, 3, 2, 3, 30, tzinfo=UTC), None),
    ("review", datetime(2026, 3, 2, 4, 1, tzinfo=UTC), datetime(2026, 3, 2, 4, 0, tzinfo=UTC), None),
])
def test_a_firing_enqueues_one_run_job(settings: Settings, job_id: str, now: datetime, fired: datetime,
                                       tier: str | None) -> None:
    scheduler = build_scheduler(settings, BlockingScheduler)
    enqueued = fire_at(scheduler, job_id, now)
    [job] = queued(settings)
    assert enqueued is not None and job.id == enqueued.id
    name = job_id.split(":")[0]
    assert job.id == firing_id(settings.redis.stream_prefix, name, Tier(tier) if tier else None, fired)
    assert job.func_name == RUN_JOB == "memflow.workers.query.run_job"
    assert list(job.args) == [name, None, fired.isoformat(), False]  # the fire time is the job's `now`
    assert job.kwargs == {"tier": tier}
    assert (job.timeout, job.result_ttl, job.failure_ttl) == (settings.scheduler.job_timeout_s, RESULT_TTL_S,
                                                              RESULT_TTL_S)
    assert job.origin == f"{settings.redis.stream_prefix.rstrip(':')}-jobs"


def test_the_same_firing_twice_is_one_job_and_another_firing_is_another(settings: Settings) -> None:
    scheduler = build_scheduler(settings, BlockingScheduler)
    first = fire_at(scheduler, "decay:short_term", datetime(2026, 3, 2, 10, 5, tzinfo=UTC))
    late = fire_at(scheduler, "decay:short_term", datetime(2026, 3, 2, 10, 59, tzinfo=UTC))  # same firing, late
    restarted = fire_at(build_scheduler(settings, BlockingScheduler), "decay:short_term",
                        datetime(2026, 3, 2, 10, 6, tzinfo=UTC))  # another scheduler, same firing
    assert first is not None and late is None and restarted is None
    assert [j.id for j in queued(settings)] == [first.id]

    following = fire_at(scheduler, "decay:short_term", datetime(2026, 3, 2, 11, 5, tzinfo=UTC))
    other_job = fire_at(scheduler, "decay:long_term", datetime(2026, 3, 2, 11, 5, tzinfo=UTC))
    assert following is not None and other_job is not None
    jobs = queued(settings)
    assert [j.id for j in jobs] == [first.id, following.id, other_job.id]
    assert [j.args[2] for j in jobs] == ["2026-03-02T10:05:00+00:00", "2026-03-02T11:05:00+00:00",
                                         "2026-03-02T03:00:00+00:00"]


def test_schedulers_racing_for_one_firing_enqueue_it_once(settings: Settings) -> None:
    queue, fired = jobs_queue(settings), datetime(2026, 3, 2, 10, 5, tzinfo=UTC)
    start = threading.Barrier(8)
    results: list[Job | None] = []

    def race() -> None:
        start.wait(timeout=10)
        results.append(enqueue_firing(queue, settings.redis.stream_prefix, DECAY_SHORT, fired, job_timeout_s=60))

    threads = [threading.Thread(target=race) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert len(results) == 8 and len([r for r in results if r is not None]) == 1
    assert queue.count == 1


def test_a_firing_in_shanghai_is_named_by_its_instant(shanghai: Settings) -> None:
    scheduler = build_scheduler(shanghai, BlockingScheduler)
    # 19:30 UTC is 03:30 the next day in Shanghai: long-term decay fired at 03:00 there, 19:00 UTC.
    enqueued = fire_at(scheduler, "decay:long_term", datetime(2026, 3, 2, 19, 30, tzinfo=UTC))
    assert enqueued is not None
    assert enqueued.args[2] == "2026-03-03T03:00:00+08:00"
    assert enqueued.id == f"{shanghai.redis.stream_prefix.rstrip(':')}-decay-long_term-20260302T190000Z"
    # The same instant seen from UTC is the same firing.
    assert firing_id(shanghai.redis.stream_prefix, "decay", Tier.long_term,
                     datetime(2026, 3, 2, 19, 0, tzinfo=UTC)) == enqueued.id


@pytest.mark.parametrize(("now", "fired"), [
    (datetime(2026, 3, 2, 19, 0, tzinfo=UTC), datetime(2026, 3, 3, 3, 0, tzinfo=SHANGHAI)),  # on the dot
    (datetime(2026, 3, 2, 19, 30, tzinfo=UTC), datetime(2026, 3, 3, 3, 0, tzinfo=SHANGHAI)),
    (datetime(2026, 3, 2, 18, 59, tzinfo=UTC), datetime(2026, 3, 2, 3, 0, tzinfo=SHANGHAI)),  # 02:59 there
    (datetime(2026, 3, 3, 18, 0, tzinfo=UTC), datetime(2026, 3, 3, 3, 0, tzinfo=SHANGHAI)),
])
def test_the_fire_time_is_the_latest_due_in_the_triggers_timezone(now: datetime, fired: datetime) -> None:
    trigger = CronTrigger(timezone=SHANGHAI, hour=3, minute=0)
    assert last_fire_time(trigger, now, timedelta(days=2)) == fired


def test_an_hour_that_repeats_at_the_end_of_summer_time_fires_twice_under_two_ids() -> None:
    trigger, berlin = CronTrigger(timezone=ZoneInfo("Europe/Berlin"), minute=5), timedelta(hours=2)
    summer = last_fire_time(trigger, datetime(2026, 10, 25, 0, 10, tzinfo=UTC), berlin)  # 02:10 CEST
    winter = last_fire_time(trigger, datetime(2026, 10, 25, 1, 10, tzinfo=UTC), berlin)  # 02:10 CET
    assert summer is not None and winter is not None
    assert (summer.astimezone(UTC).hour, winter.astimezone(UTC).hour) == (0, 1)
    assert firing_id("p:", "decay", Tier.short_term, summer) != firing_id("p:", "decay", Tier.short_term, winter)


def test_no_firing_within_the_lookback_enqueues_nothing(settings: Settings) -> None:
    entry = Entry("review", None, {"month": 1, "day": 1}, timedelta(days=1))
    trigger = CronTrigger(timezone=UTC, **entry.cron)
    assert fire(jobs_queue(settings), settings.redis.stream_prefix, entry, trigger, 60,
                now=datetime(2026, 3, 2, tzinfo=UTC)) is None
    assert jobs_queue(settings).count == 0


def test_a_firing_id_is_a_valid_rq_job_id_whatever_the_prefix(settings: Settings) -> None:
    job_id = firing_id("my.app:", "consolidate", None, datetime(2026, 3, 2, 10, 5, tzinfo=UTC))
    assert job_id == "my_app-consolidate-all-20260302T100500Z"
    assert Job.create(RUN_JOB, id=job_id, connection=jobs_queue(settings).connection).id == job_id  # RQ validates it


def test_an_unknown_timezone_is_a_clear_error(settings: Settings) -> None:
    with pytest.raises(MemflowError, match="Mars/Olympus"):
        build_scheduler(settings.replace(scheduler_timezone="Mars/Olympus"), BlockingScheduler)


def test_the_background_scheduler_of_memflow_up_starts_and_stops(shanghai: Settings) -> None:
    scheduler = build_scheduler(shanghai, BackgroundScheduler)
    scheduler.start()
    try:
        job = scheduler.get_job("review")
        assert job.next_run_time.tzinfo == SHANGHAI and (job.next_run_time.hour, job.next_run_time.minute) == (4, 0)
    finally:
        scheduler.shutdown()
    assert not scheduler.running


@pytest.mark.parametrize("stop", [signal.SIGTERM, signal.SIGINT])
def test_memflow_scheduler_prints_its_schedule_and_stops_on_a_signal(shanghai: Settings, stop: int) -> None:
    env = dict(os.environ) | to_env(shanghai) | {"PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "memflow.workers.cli", "scheduler"], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        lines = [proc.stdout.readline() for _ in range(len(SCHEDULE) + 1)]  # type: ignore[union-attr]
        assert lines[0].startswith("scheduler: timezone Asia/Shanghai, enqueues on "), lines
        assert [line.split()[0] for line in lines[1:]] == [e.id for e in SCHEDULE]
        assert all("+08:00" in line for line in lines[1:]), lines
        proc.send_signal(stop)
        out, err = proc.communicate(timeout=30)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    assert "memflow scheduler: stopped" in out
