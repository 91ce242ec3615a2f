"""The topk pass: the exact program it builds, the knobs it refuses, what its invariant catches,
and what it computes on 2 real ranks against a NumPy reference of the same algorithm (exact
top-k of gradient + residual per rank, int32 indices, scatter-add in rank order, 1/N), step by
step; and the digits example trained with it through fleetrun.
"""
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import paddle
import pytest

from fleetlite import CompileError, StrategyConflictError, Topology, compiler, invariants, program_edit
from fleetlite.ring_table import RingTable
from fleetlite.strategies.topk import RESIDUAL_SUFFIX
from multiprocess import run_job
from workers.in_process import strategy
from workers.models import compiled_program, loss
from workers.topk_worker import LEARNING_RATE, STEPS

ROOT = Path(__file__).resolve().parent.parent
WORKER = Path(__file__).resolve().parent / "workers" / "topk_worker.py"
CPU_4 = Topology.grid(4, 2, rank=3)
WORLD = 2
TOPK = {"topk": True, "topk_configs": {"density": 0.05, "min_numel": 1000}}   # the MLP's linear_0.w_0 (2048)

FINITE_FLAG = ["data"]                   # the persistable flag pd_op.assert names in its error
RESIDUAL = ["data"]
ACCUMULATE = ["add", "full_int_array", "reshape"]                 # gradient + residual, flattened
CHECK_FINITE = ["isfinite", "all", "assign_out_", "builtin.combine", "assert"]
EXACT_TOP_K = ["abs", "full", "topk", "full", "gather"]           # 2048 elements: the exact path
GATHER = ["all_gather", "cast", "all_gather"]                     # values, then int32 indices
SCATTER_ADD = ["full", "full_int_array", "reshape", "scatter_nd_add"]
KEEP_UNSENT = ["subtract", "scatter"]
SCALE = ["full", "scale_"]
WRITE_RESIDUAL = ["full_int_array", "reshape", "assign_out_"]
RESHAPE = ["full_int_array", "reshape"]


def sequence(main, pass_name):
    return [op.name().replace("pd_op.", "") for op in program_edit.created_by(main.global_block(), pass_name)]


def compile_mlp(topology=CPU_4, **fields):
    main, startup, built = compiled_program(strategy(**{**TOPK, **fields}), topology)
    return main, startup, built.report


def test_one_gradient_is_exchanged_as_top_k_with_error_feedback_and_the_rest_stays_dense():
    main, _, report = compile_mlp()
    assert sequence(main, "topk") == (RESIDUAL + FINITE_FLAG + ACCUMULATE + CHECK_FINITE + EXACT_TOP_K + GATHER
                                      + SCATTER_ADD + SCALE + KEEP_UNSENT + WRITE_RESIDUAL + RESHAPE)
    gathers = [op for op in main.global_block().ops if op.name() == "pd_op.all_gather"]
    assert [(op.operand_source(0).dtype, program_edit.int_attr(op, "ring_id"), op.attrs()["nranks"])
            for op in gathers] == [(paddle.float32, 0, 4), (paddle.int32, 0, 4)]
    assert [b["gradients"] for b in report.buckets] == [["linear_1.b_0", "linear_1.w_0", "linear_0.b_0"]]
    record = report.record("topk")
    assert record.summary == ("1 gradients as top-k (density 0.05029: 103 of 2048 elements; 824 B per rank per "
                              "step instead of 8.0 KiB), error feedback; 3 dense (1.4 KiB)")
    assert record.details["bytes_per_step"] == 103 * 8 + (10 + 320 + 32) * 4
    assert report.applied == ["data_parallel", "topk", "fuse_all_reduce_ops", "gloo_lowering"]


def test_the_residual_is_persistable_zero_at_start_and_written_back_each_step():
    main, startup, _ = compile_mlp()
    name = "linear_0.w_0" + RESIDUAL_SUFFIX
    residual = next(op for op in main.global_block().ops if op.name() == "pd_op.data" and op.attrs()["name"] == name)
    assert residual.attrs()["persistable"] == [True]
    writes = [op for op in residual.result(0).all_used_ops() if op.name() == "pd_op.assign_out_"]
    assert len(writes) == 1
    initialised = {op.attrs()["output_name"]: op.operand_source(0).get_defining_op()
                   for op in startup.global_block().ops if op.name() == "builtin.shadow_output"}
    assert initialised[name].name() == "pd_op.full" and initialised[name].attrs()["value"] == 0


def test_without_error_feedback_there_is_no_residual():
    main, _, report = compile_mlp(topk_configs={**TOPK["topk_configs"], "error_feedback": False})
    assert sequence(main, "topk") == (FINITE_FLAG + RESHAPE + CHECK_FINITE + EXACT_TOP_K + GATHER + SCATTER_ADD
                                      + SCALE + RESHAPE)
    assert "no error feedback" in report.record("topk").summary


def test_fp16_allreduce_puts_float16_values_on_the_wire_and_keeps_the_rounding_in_the_residual():
    main, _, report = compile_mlp(fp16_allreduce=True)
    values = next(op for op in main.global_block().ops if op.name() == "pd_op.all_gather")
    assert values.operand_source(0).dtype == paddle.float16
    assert report.record("topk").details["sparse_bytes_per_step"] == 103 * 6


def test_warm_up_branches_on_a_step_counter_and_runs_the_program_in_order():
    main, _, report = compile_mlp(topk_configs={**TOPK["topk_configs"], "warmup_steps": 5})
    ops = main.global_block().ops
    names = [op.name() for op in ops]
    increment = names.index("pd_op.increment_")
    assert increment < names.index("pd_op.if") and ops[increment + 1].name() == "pd_op.cast"
    branch = next(op for op in ops if op.name() == "pd_op.if" and program_edit.provenance(op) == "topk"
                  and any(o.name() == "pd_op.all_reduce" for o in list(op.blocks())[0].ops))
    warm, sparse = ([o.name() for o in block.ops] for block in branch.blocks())
    assert warm.count("pd_op.all_reduce") == 1 and "pd_op.all_gather" not in warm
    assert sparse.count("pd_op.all_gather") == 2 and "pd_op.all_reduce" not in sparse
    assert report.runtime_flags == {"FLAGS_new_executor_sequential_run": True}
    assert report.record("topk").summary.endswith("error feedback, 5 warm-up steps ramping from dense; 3 dense (1.4 KiB)")


def test_gradients_under_min_numel_all_go_dense():
    main, _, report = compile_mlp(topk_configs={"min_numel": 5000})
    assert report.record("topk").summary == "no float gradient has 5000 elements (min_numel): all go dense"
    assert len(report.buckets) == 1 and len(report.buckets[0]["gradients"]) == 4


@pytest.mark.parametrize("fields, message", [
    ({"amp": True}, "'topk' and 'amp' cannot be used together: top-k keeps a residual"),
    ({"use_hierarchical_allreduce": True}, "'topk' and 'use_hierarchical_allreduce' cannot be used together"),
    ({"topk_configs": {"hierarchical": True}}, r"topk_configs.hierarchical .* is not implemented yet; set it to false"),
    ({"topk_configs": {"warmup_steps": 2}, "gradient_merge": True, "gradient_merge_configs": {"k_steps": 2}},
     "with gradient_merge the exchange runs once every k_steps micro-steps"),
    ({"topk_configs": {"warmup_steps": 2}, "build_strategy": {"enable_sequential_execution": False}},
     "only program order keeps in the same order on every rank"),
])
def test_combinations_that_cannot_work_are_named_errors(fields, message):
    with pytest.raises(StrategyConflictError, match=message):
        compile_mlp(**fields)


def test_the_invariant_rejects_a_scatter_add_of_values_that_were_not_gathered():
    """Point the scatter-add at this rank's own values: nothing crosses ranks any more."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [8, 64], "float32")
        y = paddle.static.data("y", [8, 1], "int64")
        params_grads = paddle.static.append_backward(loss("mlp", x, y, 1))
        gradients, _ = compiler.compile(main, params_grads, strategy(**TOPK), CPU_4)
    context = SimpleNamespace(topology=CPU_4, reduced=True, gradient_scale=1 / 4, gradients=gradients,
                              rings=RingTable(4))
    invariants.check_gradients_reduced_once(context)
    scatter = next(op for op in main.global_block().ops if op.name() == "pd_op.scatter_nd_add")
    gathered = scatter.operand_source(2).get_defining_op()
    scatter.operands()[2].set_source(gathered.operand_source(0))
    with pytest.raises(CompileError, match="gradient of linear_0.w_0 is summed over 1 ranks on its way to the optimizer, expected 4"):
        invariants.check_gradients_reduced_once(context)


# ---- 2 real ranks against the NumPy reference -------------------------------------------------

CASES = {
    "ef": {"topk": True, "topk_configs": {"density": 0.01, "min_numel": 1000}},
    "no_ef": {"topk": True, "topk_configs": {"density": 0.01, "min_numel": 1000, "error_feedback": False}},
    "fp16": {"topk": True, "topk_configs": {"density": 0.01, "min_numel": 1000}, "fp16_allreduce": True},
    "warmup": {"topk": True, "topk_configs": {"density": 0.01, "min_numel": 1000, "warmup_steps": 3}},
    "warmup_no_ef": {"topk": True, "topk_configs": {"density": 0.01, "min_numel": 1000, "warmup_steps": 3,
                                                     "error_feedback": False}},
    "merged": {"topk": True, "topk_configs": {"density": 0.01, "min_numel": 1000}, "gradient_merge": True,
               "gradient_merge_configs": {"k_steps": 2}},
    "density_1": {"topk": True, "topk_configs": {"density": 1.0, "min_numel": 1000}},
    "dense": {},
}
TAKEN = ("linear_0.w_0", "linear_1.w_0")


@pytest.fixture(scope="module")
def ranks():
    return run_job(WORKER, WORLD, args=[json.dumps(CASES)], timeout=240)


def reference_exchange(accumulated, k, fp16=False):
    """(reduced gradient, each rank's unsent part) of one top-k exchange, in float32 like the program."""
    summed, unsent = np.zeros_like(accumulated[0]), []
    for acc in accumulated:
        chosen = np.argsort(-np.abs(acc), kind="stable")[:k]
        values = acc[chosen]
        wire = values.astype(np.float16).astype(np.float32) if fp16 else values
        np.add.at(summed, chosen, wire)
        left = acc.copy()
        left[chosen] = values - wire
        unsent.append(left)
    return summed * np.float32(1 / len(accumulated)), unsent


def flat(values):
    return np.asarray(values, dtype=np.float32).reshape(-1)


def step_values(ranks, case, step, name):
    """(raw gradient per rank, residual per rank before and after this step, reduced gradient of rank 0)."""
    steps = [rank[case]["steps"] for rank in ranks]
    raw = [flat(s[step]["raw"][name]) for s in steps]
    has_residual = name in steps[0][step]["residual"]
    before = [flat(s[step - 1]["residual"][name]) if step and has_residual else np.zeros_like(raw[0]) for s in steps]
    after = [flat(s[step]["residual"][name]) for s in steps] if has_residual else None
    return raw, before, after, flat(steps[0][step]["reduced"][name])


def k_of(name, density=0.01):
    return int(np.ceil(density * {"linear_0.w_0": 64 * 300, "linear_1.w_0": 300 * 10}[name]))


def test_every_rank_applies_the_same_reduced_gradients_and_ends_with_the_same_parameters(ranks):
    for case in CASES:
        for step in range(STEPS):
            if case != "merged":
                assert ranks[0][case]["steps"][step]["reduced"] == ranks[1][case]["steps"][step]["reduced"], case
        assert ranks[0][case]["params"] == ranks[1][case]["params"], case


@pytest.mark.parametrize("case, fp16", [("ef", False), ("no_ef", False), ("fp16", True)])
def test_each_step_equals_the_numpy_reference_of_the_exchange(ranks, case, fp16):
    assert ranks[0][case]["topk"]["achieved_density"] == pytest.approx((192 + 30) / (19200 + 3000))
    assert ranks[0][case]["kernel_ops"] == 1      # linear_0.w_0's selection: the compiled kernel
    for name in TAKEN:
        for step in range(STEPS):
            raw, before, after, reduced = step_values(ranks, case, step, name)
            expected, unsent = reference_exchange([g + r for g, r in zip(raw, before)], k_of(name), fp16)
            np.testing.assert_allclose(reduced, expected, rtol=0, atol=1e-7, err_msg=f"{case} {name} step {step}")
            if after is not None:
                for rank in range(WORLD):
                    np.testing.assert_allclose(after[rank], unsent[rank], rtol=0, atol=1e-7)
            else:
                assert case == "no_ef"


def test_error_feedback_loses_nothing_over_the_steps(ranks):
    """N x (sum of the reduced gradients) + the residuals left == the sum of every rank's gradients."""
    for name in TAKEN:
        steps = [rank["ef"]["steps"] for rank in ranks]
        sent = WORLD * sum(flat(s["reduced"][name]) for s in steps[0])
        left = sum(flat(s[-1]["residual"][name]) for s in steps)
        produced = sum(flat(step["raw"][name]) for s in steps for step in s)
        np.testing.assert_allclose(sent + left, produced, rtol=1e-5, atol=1e-6)
        assert np.abs(left).max() > 0


def test_warm_up_starts_dense_ramps_down_then_exchanges_the_top_k(ranks):
    for name in TAKEN:
        counts = []
        for step in range(STEPS):
            raw, before, after, reduced = step_values(ranks, "warmup", step, name)
            accumulated = [g + r for g, r in zip(raw, before)]
            if step == 0:
                np.testing.assert_array_equal(reduced, (raw[0] + raw[1]) * np.float32(0.5))
                assert not any(a.any() for a in after)
            if step < 3:
                np.testing.assert_allclose(WORLD * reduced + sum(after), sum(accumulated), rtol=0, atol=1e-6)
                counts.append(min(np.count_nonzero(a - left) for a, left in zip(accumulated, after)))
                if step == 0:
                    nonzero = min(np.count_nonzero(a) for a in accumulated)   # dead units have zero gradients
            else:
                expected, unsent = reference_exchange(accumulated, k_of(name))
                np.testing.assert_allclose(reduced, expected, rtol=0, atol=1e-7)
                np.testing.assert_allclose(after[0], unsent[0], rtol=0, atol=1e-7)
        assert counts[0] == nonzero and nonzero > counts[1] > counts[2] > k_of(name), counts


def test_warm_up_without_error_feedback_starts_dense_then_drops_what_it_does_not_send(ranks):
    for name in TAKEN:
        for step in (0, 3, 4, 5):
            raw, _, after, reduced = step_values(ranks, "warmup_no_ef", step, name)
            assert after is None
            expected = (raw[0] + raw[1]) * np.float32(0.5) if step == 0 else reference_exchange(raw, k_of(name))[0]
            np.testing.assert_allclose(reduced, expected, rtol=0, atol=1e-7, err_msg=f"{name} step {step}")


def test_with_gradient_merge_the_merged_gradient_is_compressed(ranks):
    """Micro-steps 2j and 2j+1 accumulate (avg); the exchange and the SGD update run on odd ones."""
    merged = [rank["merged"] for rank in ranks]
    for name in TAKEN:
        params = flat(merged[0]["initial"][name])
        residual = [np.zeros_like(params)] * WORLD
        for step in range(1, STEPS, 2):
            raws = [[flat(m["steps"][s]["raw"][name]) for s in (step - 1, step)] for m in merged]
            averaged = [(first + second) * np.float32(0.5) for first, second in raws]
            reduced, residual = reference_exchange([a + r for a, r in zip(averaged, residual)], k_of(name))
            params = params - np.float32(LEARNING_RATE) * reduced
            np.testing.assert_allclose(flat(merged[0]["steps"][step]["residual"][name]), residual[0], atol=1e-7)
        np.testing.assert_allclose(flat(merged[0]["params"][name]), params, rtol=0, atol=1e-6)


def test_density_1_is_the_dense_all_reduce_exactly(ranks):
    for step in range(STEPS):
        assert ranks[0]["density_1"]["steps"][step]["reduced"] == ranks[0]["dense"]["steps"][step]["reduced"]
    assert ranks[0]["density_1"]["params"] == ranks[0]["dense"]["params"]
    assert "topk" in ranks[0]["density_1"]["applied"] and "topk" not in ranks[0]["dense"]["applied"]


# ---- fleetrun ---------------------------------------------------------------------------------

def test_the_digits_example_trains_with_topk_through_fleetrun(tmp_path):
    """300 hidden units: the first weight (19,200 elements) takes MSTopK's sampled path, the
    compiled kernel, in the workers fleetrun starts."""
    env = {name: value for name, value in os.environ.items() if not name.startswith(("PADDLE_", "FLEETLITE_"))}
    result = subprocess.run([sys.executable, "-m", "fleetlite.launcher", "--nproc_per_node", "2", "--job_id", "topk",
                             "--log_dir", str(tmp_path / "log"), str(ROOT / "examples" / "train_digits.py"),
                             "--strategy", str(ROOT / "configs" / "cpu_gloo_topk.yaml"), "--epochs", "4",
                             "--hidden", "300"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert re.search(r"topk\s+COMMUNICATION\s+applied", output)
    assert "MSTopK runs as Paddle ops" not in output
    losses = [float(v) for v in re.findall(r"epoch \d+: loss ([0-9.]+)", output)]
    assert len(losses) == 4 and losses[-1] < 0.5 * losses[0], losses
    accuracy = float(re.search(r"test accuracy ([0-9.]+)", output).group(1))
    assert accuracy > 0.75          # chance is 0.1; measured 0.90 after these 88 steps at density 0.01
