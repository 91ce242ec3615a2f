"""The deferred rendezvous of a static-mode `fleet.init` happens at the first run of a program
with collectives, as Paddle connects when the startup program runs.

`watch_executor_runs` wraps `paddle.static.Executor.run` once per process: while a rendezvous is
deferred (process_group.defer), a run whose program holds a collective op (any op with a
`ring_id`: the startup broadcast, the gradient all-reduce, ...) connects first. Programs without
collectives (an evaluation program, a startup program at world 1) run without the job. Once
connected, the wrapper only checks one flag, and binds ring 0 back to the CPU device context
(runtime.subgroups.bind_world_ring: an eager collective on another ring would otherwise leave
that ring under every static ring-0 collective of the run).
"""
import functools

import paddle

from fleetlite.compile import program_edit
from fleetlite.runtime import process_group, subgroups

NEEDED_BY = "the first run of a program with collectives"
_watching = False


def watch_executor_runs():
    """Connect a deferred rendezvous before the first Executor.run that needs the other ranks;
    bind ring 0 back before every run."""
    global _watching
    if _watching:
        return
    original = paddle.static.Executor.run

    @functools.wraps(original)
    def run(executor, program=None, *args, **kwargs):
        if process_group.deferred() and has_collectives(program):
            process_group.connect(NEEDED_BY)
        if process_group.is_up():
            subgroups.bind_world_ring()
        return original(executor, program, *args, **kwargs)

    paddle.static.Executor.run = run
    _watching = True


def has_collectives(program):
    """Whether running `program` (None: the default main program) needs the other ranks."""
    program = paddle.static.default_main_program() if program is None else program
    program = getattr(program, "_program", program)   # a CompiledProgram runs its program
    if not isinstance(program, paddle.pir.Program):
        return True   # not a PIR program we can inspect: connect to be safe
    return any("ring_id" in op.attrs() for op in program_edit.walk(program.global_block()))
