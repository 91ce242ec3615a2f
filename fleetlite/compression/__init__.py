"""Gradient compression: top-k selection, its compiled kernel, the sparse exchange."""
