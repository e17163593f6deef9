"""Every write to the store: the applier (applier.py), the one writer of a memory's changes, under the
subject's write lock, announced once on the `changes` stream; the uses of memories recorded off the read path
and counted on their points through it later (uses.py); and the reindex (reindex.py), which copies every memory
into an index of another model through the applier's copy writes while searches read the old one."""
