"""Autotuning (`fleetlite tune`, `fleetrun --tune`): short timed trials of the real job over the
communication knobs, then the winner written back into the strategy file.

space: the knobs and values searched (data); search: the pure decisions over recorded timings;
trial_worker: the worker side of a trial (knob overrides, step timing); trials: one trial as a
fleetrun job; strategy_writer: the winner into a YAML or prototxt file; tuner: the whole run.
"""
