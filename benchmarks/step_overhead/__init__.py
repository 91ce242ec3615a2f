"""The step_overhead benchmarks: drivers and the workers they start."""
