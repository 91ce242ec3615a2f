"""The gradsync benchmarks: drivers and the workers they start."""
