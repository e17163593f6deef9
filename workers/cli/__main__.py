"""`python -m memflow.workers.cli`: the `memflow` command."""

from memflow.workers.cli import main

main()
