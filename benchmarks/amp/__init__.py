"""The amp benchmarks: drivers and the workers they start."""
