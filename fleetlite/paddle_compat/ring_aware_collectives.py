"""Paddle 3.3's static CPU collective kernels ignore their `ring_id`: each runs on the one gloo
communicator attached to the process's CPU device context (the first ring an instruction
attached, or the last ring an eager collective used), so a sub-group ring silently sums over
another group (shared/notes/gloo_subgroups.md). fleetlite.compile.group_collectives runs
sub-group collectives as compiled ops that look their communicator up by key instead, and
binds ring 0 back before every static run. On a later Paddle this stands aside: the gloo
lowering then emulates sub-groups on ring 0 (correct, more bytes) until the canary is rerun.
"""
from fleetlite.paddle_compat.version_gate import needed

WORKAROUND = "CPU collectives ignore ring_id"


def refusal():
    """None where the sub-group ops are for the installed Paddle; otherwise why not."""
    if needed(WORKAROUND):
        return None
    return (f"the installed Paddle is past the last release known to ignore ring_id on CPU ({WORKAROUND}): "
            f"rerun tests/paddle_compat and move the bound")
