"""The worker side of a tuning trial: the script runs as usual, with two changes.

fleetrun --tune starts the job with FLEETLITE_TUNE_DIR set. Then `distributed_optimizer` applies
the trial's knob values (FLEETLITE_TUNE_CONFIG) over the script's strategy, and `minimize`
installs a step timer on `Executor.run`: runs of the training program are timed (after a
warm-up), each step's time appended to `<dir>/rank<r>.jsonl` as it happens so the tuner can stop
a bad trial early. After the timed steps, the sync cost is measured on a synthetic program with
the script's gradient shapes (t(step with this strategy's sync) - t(the same step without)),
written, and the script ends with exit status 0.
"""
import json
import os
import statistics
import time
from pathlib import Path

from fleetlite import schema
from fleetlite.tuning.space import nested_fields

DIR = "FLEETLITE_TUNE_DIR"
CONFIG = "FLEETLITE_TUNE_CONFIG"        # JSON list of [field, value] pairs
STEPS = "FLEETLITE_TUNE_STEPS"
WARMUP = "FLEETLITE_TUNE_WARMUP"
SYNC_REPEATS = 5

_installed = False


def active(environ=os.environ):
    return DIR in environ


def trial_env(directory, config, steps, warmup):
    return {DIR: str(directory), CONFIG: json.dumps([list(pair) for pair in config]),
            STEPS: str(steps), WARMUP: str(warmup)}


def timings_path(directory, rank):
    return Path(directory) / f"rank{rank}.jsonl"


def override(strategy, environ=os.environ):
    """`strategy` with the trial's knob values set (a copy); unchanged outside a trial."""
    if not active(environ):
        return strategy
    copy = type(strategy)()
    copy._proto.CopyFrom(strategy._proto)
    schema.update(copy._proto, nested_fields(json.loads(environ[CONFIG])), "")
    return copy


def install_step_timer(training, params_grads, strategy, topology, environ=os.environ):
    """Time the runs of the `training` program (inside a trial only; once per process)."""
    global _installed
    if not active(environ) or _installed:
        return
    _installed = True
    import paddle
    shapes = [list(param.shape) for param, _ in params_grads]
    record = _Record(timings_path(environ[DIR], topology.rank))
    steps, warmup = int(environ[STEPS]), int(environ[WARMUP])
    original = paddle.static.Executor.run
    seen = [0]

    def timed_run(executor, program=None, *args, **kwargs):
        if (program if program is not None else paddle.static.default_main_program()) is not training:
            return original(executor, program, *args, **kwargs)
        started = time.perf_counter()
        out = original(executor, program, *args, **kwargs)
        elapsed = (time.perf_counter() - started) * 1000.0
        seen[0] += 1
        if seen[0] > warmup:
            record.write(step_ms=elapsed)
        if seen[0] == warmup + steps:
            paddle.static.Executor.run = original
            record.write(sync_ms=measure_sync(shapes, strategy, topology, executor))
            raise SystemExit(0)
        return out

    paddle.static.Executor.run = timed_run


class _Record:
    def __init__(self, path):
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = open(path, "w")

    def write(self, **values):
        self._file.write(json.dumps(values) + "\n")
        self._file.flush()


def measure_sync(shapes, strategy, topology, executor):
    """Median over a few runs of t(synthetic step with `strategy`'s sync) - t(without)."""
    import paddle   # imported here: the tuner's side of this module (trial_env...) runs without Paddle
    from fleetlite import process_group, training_program
    if topology.world_size == 1:
        return 0.0

    def build(synced):
        main, startup = paddle.static.Program(), paddle.static.Program()
        prefix = "tune_synced_" if synced else "tune_plain_"
        with paddle.static.program_guard(main, startup), paddle.utils.unique_name.guard(prefix):
            params = [paddle.static.create_parameter(shape, "float32") for shape in shapes]
            loss = paddle.add_n([p.sum() for p in params])
            if synced:
                training_program.build(loss, paddle.optimizer.SGD(0.0), strategy, topology, startup)
            else:
                paddle.optimizer.SGD(0.0).minimize(loss)
        executor.run(startup)
        return main

    synced, plain = build(True), build(False)
    differences = []
    for _ in range(SYNC_REPEATS):
        started = time.perf_counter()
        executor.run(plain)
        baseline = time.perf_counter() - started
        process_group.barrier()
        started = time.perf_counter()
        executor.run(synced)
        differences.append((time.perf_counter() - started - baseline) * 1000.0)
    return statistics.median(differences)
