"""Which `Executor.run` calls are training steps, and what the script says about its progress,
told to whoever listens (fleetrun's worker bootstrap: step records and the live progress line).

A training step is one run of a program fleetlite compiled (`minimize`, hence every
`fleet.train_step` call too); the startup program and a test program cloned before `minimize`
are not. The script may add what fleetrun cannot see: its last loss and how many steps it will
run (`fleet.report_progress`), for the progress line's loss and ETA. Without a listener (outside
fleetrun) reporting costs nothing.
"""
import numpy as np

_compiled = {}      # id(program): (program, its compiled step events or None), kept alive so no id is reused
_listener = None


def mark_compiled(program, step_events=None):
    """`program` is a training program: each run of it is a step; `step_events`: the timestamp
    pairs compiled into it (fleetlite.compile.step_events), if any."""
    _compiled[id(program)] = (program, step_events)


def is_compiled(program):
    return program is not None and _compiled.get(id(program), (None,))[0] is program


def step_events(program):
    """The step events compiled into `program` (a compiled training program), or None."""
    return _compiled[id(program)][1]


def any_compiled():
    return bool(_compiled)


def listen(listener):
    """From now on, call `listener.report(loss, total_steps)` for each `report_progress`."""
    global _listener
    _listener = listener


def report_progress(loss=None, total_steps=None):
    """Tell fleetrun's progress line the last loss (a number, array or Tensor) and, once, how
    many training steps this job runs (for its ETA). Call it on any rank; rank 0's is shown."""
    if _listener is None:
        return
    value = None if loss is None else float(np.asarray(loss).reshape(-1)[0])
    _listener.report(value, None if total_steps is None else int(total_steps))
