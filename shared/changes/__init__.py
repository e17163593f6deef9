"""The `changes` feed the applier announces every change on, as its readers take it (feed.py:
pages of it, on the blocking client and on an event loop), and a subject's profile kept current from it
(profiles.py)."""
