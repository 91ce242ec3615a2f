"""The pto benchmarks: drivers and the workers they start."""
