"""The topk benchmarks: drivers and the workers they start."""
