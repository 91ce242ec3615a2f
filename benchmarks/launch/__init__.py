"""The launch benchmarks: drivers and the workers they start."""
