"""Executor and device knobs: what each becomes in Paddle 3 (flags set at minimize, a core.Plan
for N steps per run), what is reported instead on CPU or for want of an equivalent, and N steps
per executor call training exactly like N calls.
"""
import numpy as np
import paddle
import pytest

import fleetlite as fleet
from fleetlite import CompileError, Topology
from support import models
from support.in_process import compile_only, strategy

CPU_2, GPU_32 = Topology.grid(2), Topology.grid(32, 4, rank=9, device="gpu")
EXECUTOR_FLAGS = ("FLAGS_new_executor_serial_run", "FLAGS_new_executor_sequential_run", "FLAGS_pir_apply_inplace_pass")


def runtime_flags(topology=CPU_2, **fields):
    return compile_only(strategy(**fields), topology)[2].report.runtime_flags


@pytest.mark.parametrize("fields, flags", [
    ({"execution_strategy": {"num_threads": 1}}, {"FLAGS_new_executor_serial_run": True}),
    ({"execution_strategy": {"num_threads": 4}}, {"FLAGS_new_executor_serial_run": False}),
    ({"build_strategy": {"enable_sequential_execution": True}}, {"FLAGS_new_executor_sequential_run": True}),
    ({"build_strategy": {"enable_inplace": False}}, {"FLAGS_pir_apply_inplace_pass": False}),
    ({}, {}),
])
def test_executor_knobs_become_paddle_flags_only_when_written(fields, flags):
    assert runtime_flags(**fields) == flags


def test_num_threads_says_the_pool_is_paddles():
    report = compile_only(strategy(execution_strategy={"num_threads": 3}), CPU_2)[2].report
    assert report.record("execution_strategy.num_threads").summary == (
        "FLAGS_new_executor_serial_run = False: ops run concurrently; Paddle sizes the interpreter's pool itself "
        "(4 host threads on CPU), so 3 is not a pool size")


CUDNN = {"cudnn_exhaustive_search": True, "conv_workspace_size_limit": 256, "cudnn_batchnorm_spatial_persistent": True}


def test_cudnn_knobs_become_flags_on_gpu():
    assert runtime_flags(GPU_32, **CUDNN) == {"FLAGS_sync_nccl_allreduce": True, "FLAGS_cudnn_exhaustive_search": True,
                                              "FLAGS_conv_workspace_size_limit": 256,
                                              "FLAGS_cudnn_batchnorm_spatial_persistent": True}


def test_cudnn_knobs_are_reported_as_skipped_on_cpu():
    report = compile_only(strategy(**CUDNN), CPU_2)[2].report
    for knob in CUDNN:
        assert report.record(knob).reason == "no cuDNN on CPU: the flag exists only in CUDA builds of Paddle"
    assert report.runtime_flags == {}


def test_knobs_without_a_paddle_3_equivalent_are_reported_and_rejected_under_strict():
    fields = {"execution_strategy": {"num_iteration_per_drop_scope": 100, "use_thread_barrier": True}}
    report = compile_only(strategy(**fields), CPU_2)[2].report
    assert report.record("execution_strategy").reason.startswith("no Paddle 3 equivalent: its executor keeps no "
                                                                "per-iteration scope to drop")
    with pytest.raises(CompileError, match="strict: execution_strategy was requested but no Paddle 3 equivalent"):
        compile_only(strategy(strict=True, **fields), CPU_2)


# --- through the fleet API, in this process (one rank) ---------------------------------------------
@pytest.fixture
def restored_flags():
    saved = paddle.get_flags(list(EXECUTOR_FLAGS))
    yield
    paddle.set_flags(saved)


def minimized(fields, rows=8):
    """(main, startup, loss, distributed optimizer) for the digits MLP under `fields`."""
    paddle.enable_static()
    fleet.init(is_collective=True)
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [rows, 64], "float32")
        y = paddle.static.data("y", [rows, 1], "int64")
        loss = models.loss("mlp", x, y, 1)
        optimizer = fleet.distributed_optimizer(paddle.optimizer.Momentum(0.1, momentum=0.9), strategy(**fields))
        optimizer.minimize(loss)
    return main, startup, loss, optimizer


def test_minimize_sets_the_flags_on_cpu_too(restored_flags):
    minimized({"execution_strategy": {"num_threads": 1}, "build_strategy": {"enable_sequential_execution": True}})
    assert paddle.get_flags(list(EXECUTOR_FLAGS)) == {"FLAGS_new_executor_serial_run": True,
                                                      "FLAGS_new_executor_sequential_run": True,
                                                      "FLAGS_pir_apply_inplace_pass": True}


def train_steps(fields, steps_per_call, calls, rows=8):
    main, startup, loss, optimizer = minimized(fields, rows)
    x_all, y_all = models.digits(rows * steps_per_call * calls)
    scope = paddle.static.Scope()
    with paddle.static.scope_guard(scope):
        paddle.seed(3)
        paddle.static.Executor(paddle.CPUPlace()).run(startup)
        exe = optimizer.prepare_executor(paddle.static.Executor(paddle.CPUPlace()))
        batch = rows * steps_per_call
        fetched = [exe.run(main, feed={"x": x_all[i * batch:(i + 1) * batch], "y": y_all[i * batch:(i + 1) * batch]},
                           fetch_list=[loss])[0] for i in range(calls)]
        params = {p.name: np.array(scope.find_var(p.name).get_tensor()) for p in main.global_block().all_parameters()}
    return np.concatenate([np.ravel(f) for f in fetched]), params


def test_n_steps_per_executor_call_train_like_n_calls():
    losses, params = train_steps({"execution_strategy": {"num_iteration_per_run": 3}}, steps_per_call=3, calls=2)
    expected_losses, expected_params = train_steps({}, steps_per_call=1, calls=6)
    assert losses.shape == (6,)
    np.testing.assert_allclose(losses, expected_losses, rtol=0, atol=1e-6)
    for name, values in expected_params.items():
        np.testing.assert_allclose(params[name], values, rtol=0, atol=1e-6, err_msg=name)


def test_prepare_executor_needs_minimize_first():
    paddle.enable_static()
    fleet.init(is_collective=True)
    optimizer = fleet.distributed_optimizer(paddle.optimizer.SGD(0.1), strategy())
    with pytest.raises(fleet.FleetliteError, match="call minimize"):
        optimizer.prepare_executor(paddle.static.Executor(paddle.CPUPlace()))
