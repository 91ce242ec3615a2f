"""Optimizer state that pto shards over the ranks, saved as one checkpoint any world size loads.

Under pto each rank holds only its part's optimizer state, so the first worker alone cannot
save it. `gather` (every rank calls it) collects each rank's part on every rank, between
executor runs, through `fleet.util.all_gather`; the first worker then writes its own
persistables as usual and the other ranks' state beside them, one file per variable in
Paddle's format. The directory is the checkpoint an unsharded job of any size would write, so
`fleet.load_model` reads it at any world size: each rank loads the variables its program has.
"""
import os

import numpy as np
import paddle
from paddle.base import core

PTO = "pto"


def state_owners(report):
    """{state variable: owning rank} when `report`'s program shards optimizer state, else None."""
    if report is None or PTO not in report.applied:
        return None
    return report.record(PTO).details["state_owners"]


def gather(job_values, owners, rank, scope):
    """{state variable: numpy value} of the other ranks' parts (every rank must call this)."""
    mine = {name: np.array(scope.find_var(name).get_tensor()) for name, owner in owners.items() if owner == rank}
    parts = job_values.all_gather(mine)
    return {name: value for owner, part in enumerate(parts) if owner != rank for name, value in part.items()}


def write(directory, arrays):
    """Write `arrays` as Paddle variable files (what paddle.static.save_vars writes) into `directory`."""
    for name, value in arrays.items():
        tensor = core.DenseTensor()
        tensor.set(value, paddle.CPUPlace())
        core.save_func(tensor, name, os.path.join(directory, name), True, False)
