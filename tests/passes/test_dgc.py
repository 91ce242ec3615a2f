"""The dgc pass: its schedule against Fleet's formula, the exact program it builds, the knobs and
optimizers it refuses, what it computes on 2 real ranks against a NumPy reference of DGC
(momentum correction, exact top-k of the accumulation, factor masking, SGD update, dense Momentum
before rampup_begin_step), step by step; and the digits example trained with it through fleetrun.
"""
import base64
import json
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest

from fleetlite import StrategyConflictError, Topology
from fleetlite.compile import program_edit
from fleetlite.compression import topk_select as topk
from fleetlite.runtime import training_program
from fleetlite.errors import CompileError
from fleetlite.strategies.dgc import ACCUMULATED_SUFFIX, MOMENTUM_SUFFIX, phases
from support.multiprocess import run_job
from workers.dgc_worker import LEARNING_RATE, MOMENTUM, STEPS
from support.in_process import strategy

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parents[1] / "workers" / "dgc_worker.py"
TAKEN, NUMEL = "linear_0.w_0", 64 * 300        # the one weight of at least 16,384 elements
SCHEDULE = {"rampup_begin_step": 2, "rampup_step": 3, "sparsity": [0.75, 0.9, 0.99]}
CONSTANT = {"sparsity": [0.99]}


def fleet_sparsity(configs, step):
    """Fleet's DGC kernel: None before rampup_begin_step, else sparsity[(step - begin) * S / rampup_step]."""
    sparsity = configs.get("sparsity") or [0.999]
    begin, ramp = configs.get("rampup_begin_step", 0), configs.get("rampup_step", 1)
    if step < begin:
        return None
    return sparsity[min(int((step - begin) * len(sparsity) / ramp), len(sparsity) - 1)]


@pytest.mark.parametrize("configs", [
    {"rampup_begin_step": 0, "rampup_step": 100, "sparsity": [0.75, 0.9375, 0.984375, 0.996, 0.999]},
    {"rampup_begin_step": 10, "rampup_step": 7, "sparsity": [0.5, 0.9, 0.99]},
    {"rampup_begin_step": 3, "rampup_step": 1, "sparsity": [0.5, 0.9, 0.99]},     # stages of no step
    {"rampup_begin_step": 0, "rampup_step": 1},                                     # Fleet's default [0.999]
])
def test_the_schedule_is_fleets_step_by_step(configs):
    found = phases(strategy(dgc=True, dgc_configs=configs).dgc_configs)
    assert found == sorted(found) and len({start for start, _ in found}) == len(found)
    for step in range(130):
        current = [sparsity for start, sparsity in found if start <= step][-1]
        assert current == pytest.approx(fleet_sparsity(configs, step), rel=1e-6) if current else \
            fleet_sparsity(configs, step) is None, step


def build(configs, optimizer=None, topology=Topology.grid(2, rank=0), weight_attr=None, **fields):
    """The 64-300-10 MLP's training program under dgc; (main, startup, report)."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [8, 64], "float32")
        y = paddle.static.data("y", [8, 1], "int64")
        hidden = paddle.nn.functional.relu(paddle.nn.Linear(64, 300, weight_attr=weight_attr)(x))
        loss = paddle.nn.functional.cross_entropy(paddle.nn.Linear(300, 10)(hidden), y)
        built = training_program.build(loss, optimizer or paddle.optimizer.Momentum(0.1, momentum=0.9),
                                       strategy(dgc=True, dgc_configs=configs, **fields), topology, startup)
    return main, startup, built.report


def sequence(ops):
    return [op.name().replace("pd_op.", "") for op in ops]


def mstopk_ops(numel, k):
    """The ops fleetlite.compression.topk_select.mstopk builds for a [numel] float32 value (its finite
    flag's data op aside)."""
    program = paddle.static.Program()
    with paddle.static.program_guard(program, paddle.static.Program()):
        topk.mstopk(paddle.static.data("v", [numel], "float32"), k)
    return [name for name in sequence(program_edit.walk(program.global_block())) if name != "data"]


STATE = ["data", "data", "data"]                      # u, v, and MSTopK's finite flag
RESHAPE = ["full_int_array", "reshape"]
CORRECT_AND_ACCUMULATE = ["full", "scale", "add", "add"]      # u = m * u + g; v = v + u
GATHER_AND_SCATTER_ADD = ["cast", "all_gather", "all_gather", "full", "full_int_array", "reshape", "scatter_nd_add"]
MASK = ["full", "full_like", "full", "scale_", "scatter", "scatter"]   # zeros, the 1/N scale, u and v masked
WRITE_BACK = ["assign_out_", "assign_out_"]


def test_constant_sparsity_builds_one_straight_exchange_and_an_sgd_update():
    main, startup, report = build(CONSTANT)
    k = math.ceil(0.01 * NUMEL)
    assert sequence(program_edit.created_by(main.global_block(), "dgc")) == (
        STATE + RESHAPE + CORRECT_AND_ACCUMULATE + mstopk_ops(NUMEL, k) + GATHER_AND_SCATTER_ADD + MASK + WRITE_BACK
        + RESHAPE)
    ops = main.global_block().ops
    sgd = [op for op in ops if op.name() == "pd_op.sgd_"]
    assert sequence(program_edit.created_by(main.global_block(), "dgc_update")) == ["sgd_"]
    assert sgd[0].operand_source(0).get_defining_op().attrs()["parameter_name"] == TAKEN
    assert sum(op.name() == "pd_op.momentum_" for op in ops) == 3        # the dense three keep Momentum
    names = {op.attrs()["name"] for op in ops if op.name() == "pd_op.data"}
    assert {TAKEN + MOMENTUM_SUFFIX, TAKEN + ACCUMULATED_SUFFIX} <= names
    assert not any(n.startswith(TAKEN + "_velocity") for n in names)   # u replaces Momentum's velocity
    initialised = {op.attrs()["output_name"] for op in startup.global_block().ops
                   if op.name() == "builtin.shadow_output"}
    assert not any(n.startswith(TAKEN + "_velocity") for n in initialised)
    assert report.runtime_flags == {} and "pd_op.increment_" not in [op.name() for op in ops]   # no schedule
    record = report.record("dgc")
    assert record.summary == ("1 gradients by DGC (sparsity 0.99 from step 0; finally density 0.01: 1.5 KiB per "
                              "rank per step instead of 75.0 KiB), momentum correction and factor masking; 3 dense "
                              "(12.9 KiB)")
    assert record.details["bytes_per_step"] == k * 8 + (300 + 3000 + 10) * 4
    assert report.applied == ["data_parallel", "dgc", "fuse_all_reduce_ops", "gloo_lowering", "copy_free_buckets",
                              "dgc_update"]


def test_the_schedule_branches_on_a_step_counter_dense_first_and_runs_in_program_order():
    main, _, report = build(SCHEDULE)
    ops = main.global_block().ops
    names = [op.name() for op in ops]
    assert names.index("pd_op.increment_") < names.index("pd_op.if")
    def phase(block):     # the chain's pd_op.if yields (update, u, v); MSTopK's own yields (values, indices)
        return next((op for op in block.ops if op.name() == "pd_op.if" and op.num_results() == 3), None)

    chain, branch = [], phase(main.global_block())
    while branch is not None:
        first, rest = branch.blocks()
        chain.append(sequence(first.ops))
        branch = phase(rest)
        if branch is None:
            chain.append(sequence(rest.ops))
    dense, *sparse = chain
    assert dense == ["all_reduce", "full", "scale_", "full", "scale", "add", "cf.yield"]
    assert len(sparse) == 3 and all(s.count("all_gather") == 2 and "all_reduce" not in s for s in sparse)
    assert report.runtime_flags == {"FLAGS_new_executor_sequential_run": True}
    details = report.record("dgc").details
    assert details["gradients"][0]["k"] == [math.ceil(d * NUMEL) for d in (0.25, 0.1, 0.01)]
    assert [(s["from_step"], s.get("sparsity")) for s in details["stages"]] == [(0, None), (2, 0.75), (3, 0.9),
                                                                                (4, 0.99)]


def test_gradients_under_16384_elements_go_dense_with_plain_momentum():
    paddle.enable_static()
    from support.models import compiled_program
    main, _, built = compiled_program(strategy(dgc=True), Topology.grid(2, rank=0),
                                      optimizer=paddle.optimizer.Momentum(0.1, momentum=0.9))
    assert built.report.record("dgc").summary == ("no float gradient has 16384 elements: all go dense, the "
                                                  "optimizer's update unchanged")
    assert sum(op.name() == "pd_op.momentum_" for op in main.global_block().ops) == 4


def test_one_rank_skips_it_and_trains_plain_momentum():
    main, _, report = build(CONSTANT, topology=Topology.grid(1))
    skipped = "needs data_parallel, which was skipped (one rank: there is nothing to reduce)"
    assert report.record("dgc").reason == skipped
    assert report.record("dgc_update").reason == f"needs dgc, which was skipped ({skipped})"
    assert sum(op.name() == "pd_op.momentum_" for op in main.global_block().ops) == 4


@pytest.mark.parametrize("fields, message", [
    ({"amp": True}, "'dgc' and 'amp' cannot be used together: u and v carry gradients across steps"),
    ({"fp16_allreduce": True}, "'dgc' and 'fp16_allreduce' cannot be used together"),
    ({"topk": True}, "'dgc' and 'topk' cannot be used together: both replace the dense gradient all-reduce"),
    ({"use_hierarchical_allreduce": True}, "'dgc' and 'use_hierarchical_allreduce' cannot be used together"),
    ({"gradient_merge": True, "gradient_merge_configs": {"k_steps": 2}}, "'dgc' and 'gradient_merge' cannot"),
    ({"pto": True}, "'dgc' and 'pto' cannot be used together"),
    ({"build_strategy": {"enable_sequential_execution": False}},
     r"dgc's schedule .* puts collectives inside a branch, which only program order keeps"),
])
def test_combinations_that_cannot_work_are_named_errors(fields, message):
    with pytest.raises(StrategyConflictError, match=message):
        build(SCHEDULE, **fields)


@pytest.mark.parametrize("optimizer, message", [
    (lambda: paddle.optimizer.SGD(0.1), "dgc works with the Momentum optimizer only, and this one is SGD; "
                                        r"train with paddle.optimizer.Momentum\(learning_rate, momentum=...\)"),
    (lambda: paddle.optimizer.Momentum(0.1, use_nesterov=True), "does not build Momentum with use_nesterov=True"),
    (lambda: paddle.optimizer.Momentum(0.1, weight_decay=1e-4), "does not build Momentum with weight_decay"),
    (lambda: paddle.optimizer.Momentum(0.1, grad_clip=paddle.nn.ClipGradByNorm(1.0)),
     "does not build Momentum with a grad_clip"),
])
def test_other_optimizers_and_momentum_options_are_refused_by_name(optimizer, message):
    paddle.enable_static()
    with pytest.raises(CompileError, match=message):
        build(CONSTANT, optimizer=optimizer())


@pytest.mark.parametrize("regularizer, message", [
    (paddle.regularizer.L2Decay(1e-4), "with weight decay"),          # Momentum folds it into momentum_
    (paddle.regularizer.L1Decay(1e-4), "with an op between the exchange and the update"),   # ops before it
])
def test_a_regularizer_on_a_taken_parameter_is_refused_by_the_update_rewrite(regularizer, message):
    with pytest.raises(CompileError, match=f"in pass dgc_update .*Momentum update of {TAKEN} {message}"):
        build(CONSTANT, weight_attr=paddle.ParamAttr(regularizer=regularizer))


# ---- 2 real ranks against the NumPy reference -------------------------------------------------

CASES = {
    "schedule": {"dgc": True, "dgc_configs": SCHEDULE},
    "density_1": {"dgc": True, "dgc_configs": {"sparsity": [0.0]}},      # one phase: the program without branches
    "momentum": {},
}


@pytest.fixture(scope="module")
def ranks():
    return run_job(WORKER, 2, args=[json.dumps(CASES)], timeout=240)


def decoded(text):
    return np.frombuffer(base64.b64decode(text), dtype=np.float32).copy()


def reference(run, configs):
    """Per step the parameters of the NumPy DGC (dense Momentum for the other parameters) on the ranks' gradients."""
    params = {name: decoded(value) for name, value in run[0]["initial"].items()}
    velocity = {name: np.zeros_like(value) for name, value in params.items()}
    u, v = ([np.zeros(NUMEL, np.float32) for _ in run] for _ in range(2))
    lr, m, half = np.float32(LEARNING_RATE), np.float32(MOMENTUM), np.float32(0.5)
    for step in range(STEPS):
        for name in params:
            grads = [decoded(rank["steps"][step]["raw"][name]) for rank in run]
            sparsity = fleet_sparsity(configs, step) if configs is not None and name == TAKEN else None
            if sparsity is None:
                velocity[name] = velocity[name] * m + (grads[0] + grads[1]) * half
                params[name] = params[name] - lr * velocity[name]
                if name == TAKEN:
                    u = [velocity[name].copy() for _ in run]
                continue
            k = max(1, math.ceil(round(1 - sparsity, 9) * NUMEL))
            summed = np.zeros(NUMEL, np.float32)
            for rank in range(len(run)):
                u[rank] = m * u[rank] + grads[rank]
                v[rank] = v[rank] + u[rank]
                chosen = np.argsort(-np.abs(v[rank]), kind="stable")[:k]
                np.add.at(summed, chosen, v[rank][chosen])
                u[rank][chosen] = 0
                v[rank][chosen] = 0
            params[name] = params[name] - lr * (summed * half)
        yield {name: value.copy() for name, value in params.items()}


def params_at(run, step):
    return {name: decoded(value) for name, value in run[0]["steps"][step]["params"].items()}


def test_both_ranks_hold_the_same_parameters_after_every_step(ranks):
    for case in CASES:
        for step in range(STEPS):
            assert ranks[0][case]["steps"][step]["params"] == ranks[1][case]["steps"][step]["params"], (case, step)


@pytest.mark.parametrize("case", CASES)
def test_each_step_equals_the_numpy_reference(ranks, case):
    run = [rank[case] for rank in ranks]
    configs = CASES[case].get("dgc_configs")
    for step, expected in enumerate(reference(run, configs)):
        for name, values in params_at(run, step).items():
            np.testing.assert_allclose(values, expected[name], rtol=0, atol=1e-5, err_msg=f"{case} {name} {step}")
    assert ("dgc" in run[0]["applied"]) == (configs is not None)


def test_before_rampup_begin_step_dgc_is_momentum_data_parallel_exactly(ranks):
    for step in range(SCHEDULE["rampup_begin_step"]):
        assert ranks[0]["schedule"]["steps"][step]["params"] == ranks[0]["momentum"]["steps"][step]["params"]
    later = SCHEDULE["rampup_begin_step"]
    schedule, momentum = (ranks[0][case]["steps"][later]["params"][TAKEN] for case in ("schedule", "momentum"))
    assert schedule != momentum


def test_density_1_sends_everything_and_factor_masking_makes_the_update_sgd(ranks):
    """All of v is sent, so u and v are emptied every step: p -= lr * (the averaged gradient)."""
    run = [rank["density_1"] for rank in ranks]
    params = decoded(run[0]["initial"][TAKEN])
    for step in range(STEPS):
        grads = [decoded(rank["steps"][step]["raw"][TAKEN]) for rank in run]
        params = params - np.float32(LEARNING_RATE) * ((grads[0] + grads[1]) * np.float32(0.5))
        np.testing.assert_allclose(params_at(run, step)[TAKEN], params, rtol=0, atol=1e-6)
    assert run[0]["dgc"]["achieved_density"] == 1.0


def test_the_report_gives_each_stage_its_density_and_bytes(ranks):
    stages = ranks[0]["schedule"]["dgc"]["stages"]
    dense_rest = (300 + 3000 + 10) * 4
    assert stages[0] == {"from_step": 0, "dense": True, "bytes_per_step": NUMEL * 4 + dense_rest}
    for stage, density in zip(stages[1:], (0.25, 0.1, 0.01)):
        k = math.ceil(density * NUMEL)
        assert stage["density"] == k / NUMEL and stage["sparse_bytes_per_step"] == k * 8
        assert stage["bytes_per_step"] == k * 8 + dense_rest


# ---- fleetrun ---------------------------------------------------------------------------------

@pytest.mark.parametrize("model, options", [("mlp", ["--hidden", "256"]), ("conv", [])])
def test_the_digits_example_trains_with_dgc_through_fleetrun(tmp_path, model, options):
    """The MLP with 256 hidden units (64 x 256 = 16,384 elements) and the conv net (its linear
    layer, 2,048 x 10) each have one weight dgc takes."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(("PADDLE_", "FLEETLITE_"))}
    result = subprocess.run([sys.executable, "-m", "fleetlite.launcher", "--nproc_per_node", "2", "--job_id", "dgc",
                             "--log_dir", str(tmp_path / "log"), str(ROOT / "examples" / "train_digits.py"),
                             "--strategy", str(ROOT / "configs" / "cpu_gloo_dgc.yaml"), "--epochs", "4",
                             "--model", model, *options], cwd=tmp_path, env=env, capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert re.search(r"dgc\s+COMMUNICATION\s+applied\s+.*1 gradients by DGC.*finally density 0.001", output)
    assert re.search(r"dgc_update\s+UPDATE_REWRITE\s+applied", output)
    losses = [float(v) for v in re.findall(r"epoch \d+: loss ([0-9.]+)", output)]
    assert len(losses) == 4 and losses[-1] < 0.5 * losses[0], losses
    accuracy = float(re.search(r"test accuracy ([0-9.]+)", output).group(1))
    # chance is 0.1; measured after these 88 steps (density 0.001 from step 50): mlp 0.94 (dense Momentum
    # 0.95), conv 0.94
    assert accuracy > 0.85
