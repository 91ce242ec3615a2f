"""The data benchmarks: drivers and the workers they start."""
