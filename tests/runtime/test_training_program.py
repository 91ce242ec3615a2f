"""training_program.build, what `minimize` runs, refuses a model built outside `program_guard`
(its parameters in Paddle's default programs: backward found no gradient, "0 gradients
all-reduced", and the first run failed with `Not found key in IRMapping`)."""
import re

import paddle
import pytest

from fleetlite import CompileError, DistributedStrategy, Topology
from fleetlite.runtime import training_program

CPU_2 = Topology.grid(2, 1, rank=0)


def build(model_outside_the_guard):
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard():
        layer = paddle.nn.Linear(4, 1) if model_outside_the_guard else None
        with paddle.static.program_guard(main, startup):
            x = paddle.static.data("x", [None, 4], "float32")
            loss = (layer or paddle.nn.Linear(4, 1))(x).mean()
            return training_program.build(loss, paddle.optimizer.SGD(0.1), DistributedStrategy(), CPU_2, startup)


def test_a_model_built_outside_program_guard_is_refused_naming_program_guard():
    with pytest.raises(CompileError, match=re.escape(
            "the loss reads linear_0.w_0, linear_0.b_0 from another program: the model was built outside "
            "`with paddle.static.program_guard(main, startup):`, so its parameters are in Paddle's default "
            "programs; create the layers inside the program_guard that builds the data and the loss")):
        build(model_outside_the_guard=True)


def test_the_same_model_inside_the_guard_builds_and_reduces_its_gradients():
    built = build(model_outside_the_guard=False)
    assert built.report.record("data_parallel").summary.startswith("2 gradients all-reduced")
