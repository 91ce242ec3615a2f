"""Benchmarks by topic, each driver beside its workers; run as modules from the repository root."""
