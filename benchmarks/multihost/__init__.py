"""The multihost benchmarks: drivers and the workers they start."""
