"""The deferred rendezvous of a static-mode `fleet.init` happens at the first run of a program
with collectives, as Paddle connects when the startup program runs.

`watch_executor_runs` wraps `paddle.static.Executor.run` once per process: while a rendezvous is
deferred (process_group.defer), a run whose program holds a collective op (any op with a
`ring_id`: the startup broadcast, the gradient all-reduce, ...) connects first. Programs without
collectives (an evaluation program, a startup program at world 1) run without the job. Once
connected, the wrapper only checks one flag.
"""
import paddle

from fleetlite.compile import program_edit
from fleetlite.runtime import process_group

NEEDED_BY = "the first run of a program with collectives"
_watching = False


def watch_executor_runs():
    """Connect a deferred rendezvous before the first Executor.run that needs the other ranks."""
    global _watching
    if _watching:
        return
    original = paddle.static.Executor.run

    def run(executor, program=None, *args, **kwargs):
        if process_group.deferred() and has_collectives(program):
            process_group.connect(NEEDED_BY)
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
