"""Train a 6-block tanh MLP in a static program with recompute on this rank's rows (r::N of the
global batch) for each way of naming checkpoints, and beside it, in the same process, the
one-process reference: the same program without recompute on the full batch, from the trained
program's parameters after its startup broadcast. Writes each case's losses, the reference's,
the largest parameter difference and the compile report's recompute record to
OUT/result.<rank>.json.

Usage: recompute_worker.py OUT        (under fleetlite run / fleetrun, world size dividing 16)
"""
import functools
import sys
from pathlib import Path

import numpy as np
import paddle
from paddle.distributed.fleet.utils import recompute

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
import fleetlite as fleet  # noqa: E402
from support.rank_results import write_rank_results  # noqa: E402

BATCH, STEPS, SEED, BLOCKS, WIDTH = 16, 4, 9, 6, 32
# name: recompute_configs given the block outputs (None: the blocks are marked by fleet.utils.recompute)
CASES = {
    "values": lambda outputs: {"checkpoints": [outputs[1], outputs[3]]},
    "layer_names": lambda outputs: {"checkpoints": ["linear_2", "linear_4"]},
    "marks": None,
}


def forward(x, y, marked):
    """The blocks' outputs and the loss; `marked`: blocks 1-2 and 3-4 each under fleet.utils.recompute
    (layers built outside it: Paddle marks the ops by their positions in the block, which a
    parameter built inside the call shifts)."""
    layers = [paddle.nn.Linear(64 if i == 0 else WIDTH, WIDTH) for i in range(BLOCKS)]
    outputs, h = [], x
    for i, layer in enumerate(layers):
        block = functools.partial(lambda layer, h: paddle.tanh(layer(h)), layer)
        h = recompute(block, h) if marked and i in (1, 2, 3, 4) else block(h)
        outputs.append(h)
    return outputs, paddle.nn.functional.cross_entropy(paddle.nn.Linear(WIDTH, 10)(h), y)


def program(rows, case, world):
    """(main, startup, loss, optimizer, parameter names); case None builds the plain reference."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [rows, 64], "float32")
        y = paddle.static.data("y", [rows, 1], "int64")
        outputs, loss = forward(x, y, case == "marks")
        strategy = fleet.DistributedStrategy()
        if case is not None:
            strategy.recompute = True
            if CASES[case] is not None:
                strategy.recompute_configs = CASES[case](outputs)
        optimizer = fleet.distributed_optimizer(paddle.optimizer.Momentum(0.1, momentum=0.9), strategy)
        _, params_grads = optimizer.minimize(loss)
    return main, startup, loss, optimizer, sorted(p.name for p, _ in params_grads)


def train(main, startup, loss, names, feeds, seed, initial=None):
    """(losses, {name: values before training}, {name: values after})."""
    exe, scope = paddle.static.Executor(paddle.CPUPlace()), paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        paddle.seed(seed)
        exe.run(startup)
        for name, value in (initial or {}).items():
            scope.find_var(name).get_tensor().set(value, paddle.CPUPlace())
        start = {n: np.array(scope.find_var(n).get_tensor()) for n in names}
        losses = [float(exe.run(main, feed=feed, fetch_list=[loss])[0]) for feed in feeds]
        return losses, start, {n: np.array(scope.find_var(n).get_tensor()) for n in names}


def compare(case, x, y):
    rank, world = fleet.worker_index(), fleet.worker_num()
    rows = [slice(step * BATCH, (step + 1) * BATCH) for step in range(STEPS)]
    main, startup, loss, optimizer, names = program(BATCH // world, case, world)
    losses, initial, trained = train(main, startup, loss, names, [
        {"x": x[r][rank::world], "y": y[r][rank::world]} for r in rows], SEED + rank)
    ref_main, ref_startup, ref_loss, _, _ = program(BATCH, None, world)
    reference_losses, _, expected = train(ref_main, ref_startup, ref_loss, names,
                                          [{"x": x[r], "y": y[r]} for r in rows], SEED, initial)
    record = optimizer.compile_report.record("recompute")
    return {"losses": losses, "reference_losses": reference_losses,
            "param_diff": max(float(np.abs(trained[n] - expected[n]).max()) for n in names),
            "moved": max(float(np.abs(trained[n] - initial[n]).max()) for n in names),
            "applied": optimizer.compile_report.applied, "summary": record.summary, "details": record.details}


if __name__ == "__main__":
    write_rank_results(compare, CASES, BATCH * STEPS)
