"""The dygraph benchmarks: drivers and the workers they start."""
