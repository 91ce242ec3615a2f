"""A gap of Paddle 3.3's N-step plan (`execution_strategy.num_iteration_per_run` > 1, a
`core.Plan` of micro-batch jobs, fleetlite.runtime.steps_per_run): it cannot build a custom
operator's instruction whose inputs are named persistable values (measured: a segfault with
several inputs, `NotImplementedError: ... not support vector<32>` with one), which a single
`Executor.run` builds fine. The copy-free buckets keep their gradients so only outside it."""
from fleetlite.paddle_compat.version_gate import needed


def custom_ops_read_named_persistables(steps_per_run):
    """Whether a program run `steps_per_run` steps per executor call may feed named persistable
    values to a custom operator."""
    return steps_per_run <= 1 or not needed("N-step plan and named persistable custom-op inputs")
