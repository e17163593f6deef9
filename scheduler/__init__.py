"""The APScheduler app and the job bodies (decay, consolidate, review).

Not built yet: the scheduled jobs arrive with the memory-evolution work. The package
exists so that the layout (and the import rules between packages) is fixed from the start.
"""
