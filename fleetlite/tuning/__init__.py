"""Autotuning (`fleetlite tune`, `fleetrun --tune`): short timed trials of the real job over the
communication knobs, then the winner written back into the strategy file.

space: the knobs and values searched (data); search: the pure decisions over recorded timings;
trial_worker: the worker side of a trial (knob overrides, step timing); trials: one trial as a
fleetrun job; strategy_writer: the winner into a YAML or prototxt file; tuner: the whole run.
"""


def tune(spec, environ, stop):
    """The whole tuning run for fleetrun's --tune (what the entry points hand the launcher); the
    tuner loads only here, so launches without --tune never import it."""
    from fleetlite.tuning.tuner import tune as run
    return run(spec, environ, stop)
