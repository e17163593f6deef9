"""What the deployment is doing, read from Redis where every process writes it: per stage what
waits, failed and how fast it goes, and the queues and query workers (status.py: `memflow status`); the
Prometheus metrics of `GET /metrics` (metrics.py)."""
