"""The timeline benchmark: what `fleetrun --timeline` costs a training step."""
