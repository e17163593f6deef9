"""What a subject said that the store does not hold yet, kept in Redis: a session's buffered turns,
which its end hands to extraction (buffers.py), and the read-your-writes entries a search serves until their
memories are stored (pending.py, docs/read-your-writes.md)."""
