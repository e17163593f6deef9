"""The stages' transport on Redis streams: the one consumer loop every stage runs on (consumer.py),
what a stage's handler returns to it (handlers.py), the leases that give each partition one owner at a time
(leases.py), the dead-letter streams and what can be done with them (dlq.py), and what the streams hold as a
whole: backlog, retention, partition count (backlog.py)."""
