"""The APScheduler app (`memflow scheduler`, and inside `memflow up`): decay, consolidate and
review on a cron schedule. It only enqueues: each firing becomes one RQ job on the
`<prefix>-jobs` queue, run by a query worker (workers/jobs.py holds the job bodies).
"""
