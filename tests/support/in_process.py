"""Train a compiled program in this process (one rank): the oracle side of the knob tests that
compare two single-process runs, e.g. k micro-steps of batch b against one step of batch k*b.
"""
import numpy as np
import paddle

from fleetlite import DistributedStrategy, Topology
from fleetlite.runtime import training_program
from support import models

SEED = 5


def strategy(**fields):
    s = DistributedStrategy()
    for name, value in fields.items():
        setattr(s, name, value)
    return s


def compile_only(strategy, topology, make_optimizer=lambda: paddle.optimizer.SGD(0.1)):
    """models.compiled_program with an optimizer made once static mode is on; (main, startup, built)."""
    paddle.enable_static()
    return models.compiled_program(strategy, topology, optimizer=make_optimizer())


def train(strategy, make_optimizer, rows, steps, model="mlp", topology=None):
    """Run `steps` steps of `rows` digits each; returns (losses, {parameter: values}, report)."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [rows, 64], "float32")
        y = paddle.static.data("y", [rows, 1], "int64")
        loss = models.loss(model, x, y, 1)
        built = training_program.build(loss, make_optimizer(), strategy, topology or Topology.grid(1), startup)
    x_all, y_all = models.digits(rows * steps)
    exe, scope = paddle.static.Executor(paddle.CPUPlace()), paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        paddle.seed(SEED)
        exe.run(startup)
        losses = [float(exe.run(main, feed={"x": x_all[i * rows:(i + 1) * rows], "y": y_all[i * rows:(i + 1) * rows]},
                                fetch_list=[loss])[0]) for i in range(steps)]
        params = {p.name: np.array(scope.find_var(p.name).get_tensor()) for p, _ in built.params_grads}
    return losses, params, built.report
