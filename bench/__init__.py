"""Quality evaluation and performance benchmarks."""
