"""N training steps per executor call (`execution_strategy.num_iteration_per_run`).

Paddle 3's executor runs a `core.Plan`: a list of jobs over named programs. A plan of N jobs
on the training program, micro-batch ids 0..N-1, makes one `executor.run` split every fed
array into N equal parts along axis 0 and run the program once per part, in order; each fetch
returns its N values stacked. Results equal N separate runs (measured); the saving is N-1
Python round trips into the executor per call.

The plan replaces whatever program `run` is given, so an executor prepared this way must only
run the training program: run the startup program (and evaluation) with another executor, or
before preparing it.
"""
from paddle.base import core

JOB = "default"


def install(executor, program, steps):
    """Make `executor.run` run `steps` steps of `program` per call; returns the executor."""
    jobs = []
    for micro_batch in range(steps):
        job = core.Job(JOB)
        job.set_micro_batch_id(micro_batch)
        jobs.append(job)
    executor._set_plan(core.Plan(jobs, {JOB: program}))
    return executor
