"""Gradient clipping and weight decay under data parallelism.

fleetlite builds the inner optimizer's update (`apply_gradients`: clip, regularization, update
ops) on the reduced gradients, so a clip's global norm is the norm of the averaged gradient,
as in one process on the full batch. Checked here:
- structure: the clip ops read the reduced (and, with AMP, unscaled) gradients, in that order,
  and with gradient_merge they run in the branch, on the merged gradients; the invariant names
  a clip that reads a gradient before its reduction;
- numbers, in three jobs (workers/clip_worker.py trains every case in one process per rank):
  one process on the full batch (the 1-rank job), 2 ranks, and 4 ranks as 2 nodes x 2. Every
  case is ClipGradByGlobalNorm / ClipGradByNorm / ClipGradByValue with SGD, Momentum, Adam and
  AdamW (weight decay), alone and with gradient_merge, AMP and fuse_all_optimizer_ops, plus
  regularizers on parameters and on the optimizer. N ranks must equal the one process to 1e-5;
  the one process must equal Paddle's dynamic mode on the same batches, AMP must equal float32
  (the clip sees unscaled gradients), fused Adam the per-parameter one, and gradient merge of k
  micro-steps one step of the k-fold batch. A control that clips each rank's gradients by their
  own norm must miss parity, so the comparison has teeth.
"""
import json
from pathlib import Path

import numpy as np
import paddle
import pytest

from fleetlite import CompileError, Topology
from fleetlite.compile import compiler, invariants, program_edit
from support.multiprocess import run_jobs
from support.models import backward_program
from workers import clip_worker
from support.in_process import strategy, train
from support.models import compiled_program, digits

WORKER = Path(__file__).resolve().parents[1] / "workers" / "clip_worker.py"
TOLERANCE = 1e-5
CLIPS = {"global_norm": ["global_norm", 1.0], "norm": ["norm", 0.4], "value": ["value", 0.05]}
OPTIMIZERS = ("sgd", "momentum", "adam", "adamw")
# The float16 recipe of the CPU wheel (test_amp.py): no float16 kernel runs the MLP's ops, so they
# stay float32 while the loss is scaled by 1024 and the reduced gradients unscaled before the clip.
AMP_ON_CPU = {"custom_black_list": ["matmul", "relu", "elementwise_add"], "init_loss_scaling": 1024.0}
KNOBS = {"gradient_merge": {"gradient_merge": True, "gradient_merge_configs": {"k_steps": 2}},
         "amp": {"amp": True, "amp_configs": AMP_ON_CPU},
         "fuse_all_optimizer_ops": {"build_strategy": {"fuse_all_optimizer_ops": True}}}
KNOB_OPTIMIZERS = {"gradient_merge": OPTIMIZERS, "amp": OPTIMIZERS, "fuse_all_optimizer_ops": ("adam",)}
PLAIN = {f"{opt}/{clip}": {"optimizer": opt, "clip": bound} for opt in OPTIMIZERS for clip, bound in CLIPS.items()}
DECAYED = {
    "sgd/L2-parameter": {"optimizer": "sgd", "decay": {"parameter": "L2"}},
    "momentum/L1-parameter": {"optimizer": "momentum", "decay": {"parameter": "L1"}},
    "momentum/L2-optimizer": {"optimizer": "momentum", "decay": {"optimizer": "L2"}},
    "adam/L2-optimizer": {"optimizer": "adam", "decay": {"optimizer": "L2"}},
    "sgd/L1-optimizer": {"optimizer": "sgd", "decay": {"optimizer": "L1"}},
    "momentum/L1-parameter+L2-optimizer/global_norm": {"optimizer": "momentum", "clip": CLIPS["global_norm"],
                                                      "decay": {"parameter": "L1", "optimizer": "L2"}},
    "momentum/value/hidden-weight-unclipped": {"optimizer": "momentum", "clip": CLIPS["value"],
                                               "clip_hidden_weight": False},
    "adam/global_norm/hidden-weight-unclipped": {"optimizer": "adam", "clip": CLIPS["global_norm"],
                                                 "clip_hidden_weight": False},
}
ONE_PROCESS = {**PLAIN, **DECAYED}        # what Paddle's dynamic mode can also train
WITH_KNOBS = {f"{opt}/{clip}/{knob}": {"optimizer": opt, "clip": bound, "strategy": KNOBS[knob]}
              for knob in KNOBS for opt in KNOB_OPTIMIZERS[knob] for clip, bound in CLIPS.items()}
# Gradient layouts other than the one fused bucket: a global norm reads every bucket's output.
LAYOUTS = {"unfused": {"fuse_all_reduce_ops": False},
           "two_buckets": {"fuse_grad_size_in_TFLOPS": 2, "last_comm_group_size_MB": 0},
           "hierarchical": {"use_hierarchical_allreduce": True}}     # 4 ranks: 2 nodes; skipped on 2
WITH_KNOBS.update({f"adamw/global_norm/{layout}": {"optimizer": "adamw", "clip": CLIPS["global_norm"],
                                                   "strategy": fields} for layout, fields in LAYOUTS.items()})
WITH_KNOBS.update({
    "momentum/L2-parameter/global_norm/gradient_merge": {
        "optimizer": "momentum", "clip": CLIPS["global_norm"], "decay": {"parameter": "L2"},
        "strategy": KNOBS["gradient_merge"]},
    "sgd/L1-parameter+L2-optimizer/value/gradient_merge": {
        "optimizer": "sgd", "clip": CLIPS["value"], "decay": {"parameter": "L1", "optimizer": "L2"},
        "strategy": KNOBS["gradient_merge"]},
})
PER_RANK_NORM = {"control/per_rank_norm": {"optimizer": "sgd", "clip": CLIPS["global_norm"],
                                           "clip_before_reduce": True}}
CASES = {**ONE_PROCESS, **WITH_KNOBS}
JOBS = {2: 1, 4: 2}   # world size: nodes
CPU_2 = Topology.grid(2)
BY_NAME = ["linear_0.b_0", "linear_0.w_0", "linear_1.b_0", "linear_1.w_0"]    # apply_gradients' order
UNPACK = ["all_reduce_", "builtin.combine", "custom_op.fleetlite_bucket_alias_", "builtin.split"]   # the one
# (copy-free, already averaged by the pack) bucket: reduce, then views of the reduced buffer
GLOBAL_NORM = (["squared_l2_norm"] * 4 + ["builtin.combine", "stack", "full_int_array", "sum"] * 2
               + ["sqrt", "full", "maximum", "divide"] + ["multiply"] * 4)


@pytest.fixture(scope="module")
def trained():
    """(one-process results, {world: [results of each rank]})."""
    cases = json.dumps({**CASES, **PER_RANK_NORM})
    # the oracle and both jobs side by side, done before pytest-timeout's 300 s
    oracle, *ranks = run_jobs(dict(script=WORKER, world_size=1, args=[cases], timeout=280),
                              *(dict(script=WORKER, world_size=world, node_count=nodes, args=[cases], timeout=280)
                                for world, nodes in JOBS.items()))
    return oracle[0], dict(zip(JOBS, ranks))


# --- structure -----------------------------------------------------------------------------
def names(ops):
    return [op.name().replace("pd_op.", "") for op in ops]


def clipped_program(clip, optimizer=paddle.optimizer.SGD, **fields):
    paddle.enable_static()
    return compiled_program(strategy(**fields), CPU_2, optimizer=optimizer(0.01, grad_clip=clip))


def reading(ops, name, built):
    """The parameters whose reduced gradient each `name` op reads, in program order."""
    reduced = {program_edit.key(g): p.name for p, g in built.params_grads}
    return [reduced.get(program_edit.key(op.operand_source(0))) for op in ops if op.name() == "pd_op." + name]


@pytest.mark.parametrize("clip, ops, reader", [
    (paddle.nn.ClipGradByGlobalNorm(1.0), GLOBAL_NORM, "squared_l2_norm"),
    (paddle.nn.ClipGradByNorm(0.4), ["clip_by_norm"] * 4, "clip_by_norm"),
    (paddle.nn.ClipGradByValue(0.05), ["full", "full", "clip"] * 4, "clip"),
])
def test_the_clip_reads_the_reduced_gradients_right_after_the_all_reduce(clip, ops, reader):
    main, _, built = clipped_program(clip)
    program = names(main.global_block().ops)
    assert program[program.index("all_reduce_"):] == UNPACK + ops + ["sgd_"] * 4
    assert reading(main.global_block().ops, reader, built) == BY_NAME


def test_with_amp_the_clip_reads_the_unscaled_gradients():
    main, _, built = clipped_program(paddle.nn.ClipGradByGlobalNorm(1.0), **KNOBS["amp"])
    ops = main.global_block().ops
    program = names(ops)
    assert (program.index("all_reduce_") < program.index("check_finite_and_unscale_")
            < program.index("update_loss_scaling_") < program.index("squared_l2_norm"))
    assert reading(ops, "squared_l2_norm", built) == BY_NAME
    for _, unscaled in built.params_grads:
        assert unscaled.get_defining_op().operand_source(0).get_defining_op().name() == "pd_op.update_loss_scaling_"


def test_with_gradient_merge_the_clip_runs_in_the_branch_on_the_merged_reduced_gradients():
    main, _, built = clipped_program(paddle.nn.ClipGradByGlobalNorm(1.0), **KNOBS["gradient_merge"])
    block = main.global_block()
    assert not {"squared_l2_norm", "multiply", "sgd_"} & set(names(block.ops))
    branch = next(iter(block.ops[-1].blocks()))
    inside = names(branch.ops)
    assert inside[inside.index("all_reduce_"):inside.index("sgd_")] == [
        "all_reduce_", "scale_", "split", "builtin.split", *["reshape"] * 4, *["squared_l2_norm"] * 4,
        "builtin.combine", "stack", "sum", "builtin.combine", "stack", "sum", "sqrt", "maximum", "divide",
        *["multiply"] * 4]
    assert reading(branch.ops, "squared_l2_norm", built) == BY_NAME


def test_fused_adam_updates_with_the_clipped_reduced_gradients():
    main, _, built = clipped_program(paddle.nn.ClipGradByGlobalNorm(1.0), paddle.optimizer.Adam,
                                     **KNOBS["fuse_all_optimizer_ops"])
    ops = main.global_block().ops
    program = names(ops)
    start = program.index("all_reduce_")
    assert program[start:start + len(UNPACK + GLOBAL_NORM)] == UNPACK + GLOBAL_NORM
    assert "adam_" not in program and program.count("merged_adam_") == 1
    merged = ops[program.index("merged_adam_")]
    gradients = merged.operand_source(merged.get_input_names().index("grad")).get_defining_op().operands_source()
    clipped = [op for op in ops if op.name() == "pd_op.multiply"]
    assert [g.get_defining_op().id() for g in gradients] == [op.id() for op in clipped]
    assert reading(ops, "multiply", built) == BY_NAME


def test_a_clip_whose_norm_reads_this_ranks_own_gradients_is_rejected():
    """The per-rank norm: each rank would scale its reduced gradient by a different factor."""
    main, startup, params_grads = backward_program()
    gradients, _ = compiler.compile(main, params_grads, strategy(), CPU_2)
    with paddle.static.program_guard(main, startup):
        per_rank = paddle.nn.ClipGradByGlobalNorm(1.0)(params_grads)         # the norm of the raw gradients
        factor = per_rank[0][1].get_defining_op().operand_source(1)
        paddle.optimizer.SGD(0.1).apply_gradients([(g.param, paddle.multiply(g.synced, factor)) for g in gradients])
    with pytest.raises(CompileError, match="the optimizer update of linear_0.b_0 reads the gradient of "
                                           "linear_1.b_0 before it is reduced"):
        invariants.check_optimizer_reads_synced(main.global_block(), gradients)


def test_the_users_clip_is_back_on_the_optimizer_after_minimize():
    paddle.enable_static()
    clip = paddle.nn.ClipGradByValue(0.05)
    optimizer = paddle.optimizer.SGD(0.1, grad_clip=clip)
    compiled_program(strategy(), CPU_2, optimizer=optimizer)
    assert optimizer._grad_clip is clip


# --- numbers -------------------------------------------------------------------------------
@pytest.mark.parametrize("name", CASES)
@pytest.mark.parametrize("world", JOBS)
def test_n_ranks_clip_and_decay_like_one_process_on_the_full_batch(trained, world, name):
    oracle, jobs = trained
    expected = oracle[name]
    for rank, result in enumerate(jobs[world]):
        for param, values in expected["params"].items():
            np.testing.assert_allclose(result[name]["params"][param], values, rtol=0, atol=TOLERANCE,
                                       err_msg=f"{name}: rank {rank} of {world}, parameter {param}")
    mean_loss = np.mean([result[name]["losses"] for result in jobs[world]], axis=0)
    np.testing.assert_allclose(mean_loss, expected["losses"], rtol=0, atol=TOLERANCE, err_msg=name)


@pytest.mark.parametrize("world", JOBS)
def test_a_per_rank_norm_would_fail_the_parity_test(trained, world):
    """Clipping each rank's gradients by their own norm, then averaging, trains differently."""
    oracle, jobs = trained
    assert _gap(oracle["control/per_rank_norm"], oracle["sgd/global_norm"]) == 0    # one rank: the same thing
    assert _gap(jobs[world][0]["control/per_rank_norm"], oracle["sgd/global_norm"]) > 100 * TOLERANCE
    assert _gap(jobs[world][0]["sgd/global_norm"], oracle["sgd/global_norm"]) <= TOLERANCE


def _gap(result, expected):
    return max(np.abs(np.array(result["params"][p]) - np.array(v)).max() for p, v in expected["params"].items())


@pytest.mark.parametrize("name", ONE_PROCESS)
def test_one_process_trains_like_paddles_dynamic_mode(trained, name):
    """The oracle itself: fleetlite on one rank == Paddle dygraph from the same initial parameters."""
    oracle = trained[0][name]
    losses, params = dygraph_training(ONE_PROCESS[name], oracle["initial"])
    np.testing.assert_allclose(oracle["losses"], losses, rtol=0, atol=TOLERANCE)
    for param, values in params.items():
        np.testing.assert_allclose(oracle["params"][param], values, rtol=0, atol=TOLERANCE, err_msg=param)


def dygraph_training(case, initial):
    """Train the case in Paddle's dynamic mode, one step per micro-step of the full batch."""
    x_all, y_all = digits(clip_worker.BATCH * clip_worker.MICRO_STEPS)
    paddle.disable_static()
    try:
        model = clip_worker.make_model(case)
        names = ["linear_0.w_0", "linear_0.b_0", "linear_1.w_0", "linear_1.b_0"]   # the static program's
        for param, name in zip(model.parameters(), names):
            param.set_value(np.array(initial[name], dtype="float32"))
        optimizer = clip_worker.make_optimizer(case, model.parameters())
        losses = []
        for step in range(clip_worker.MICRO_STEPS):
            rows = slice(step * clip_worker.BATCH, (step + 1) * clip_worker.BATCH)
            loss = paddle.nn.functional.cross_entropy(model(paddle.to_tensor(x_all[rows])),
                                                      paddle.to_tensor(y_all[rows]))
            loss.backward()
            optimizer.step()
            optimizer.clear_grad()
            losses.append(float(loss))
        return losses, {name: param.numpy() for param, name in zip(model.parameters(), names)}
    finally:
        paddle.enable_static()


@pytest.mark.parametrize("world", JOBS)
def test_the_gradient_layouts_really_ran(trained, world):
    ran = {layout: trained[1][world][0][f"adamw/global_norm/{layout}"] for layout in LAYOUTS}
    assert "fuse_all_reduce_ops" not in ran["unfused"]["applied"] and ran["unfused"]["buckets"] == 4
    assert ran["two_buckets"]["buckets"] == 2
    assert ("use_hierarchical_allreduce" in ran["hierarchical"]["applied"]) == (world == 4)


@pytest.mark.parametrize("name", [n for n in WITH_KNOBS if n.endswith("/amp")])
def test_amp_clips_the_unscaled_gradients(trained, name):
    """Scaling by 1024 is exact in float32: clipped after unscaling, AMP trains like float32."""
    oracle = trained[0]
    assert "amp_loss_scaling" in oracle[name]["applied"]
    assert _gap(oracle[name], oracle[name.removesuffix("/amp")]) <= TOLERANCE


@pytest.mark.parametrize("name", [n for n in WITH_KNOBS if n.endswith("/fuse_all_optimizer_ops")])
def test_fused_adam_clips_like_per_parameter_adam(trained, name):
    for result in [trained[0][name], *(ranks[0][name] for ranks in trained[1].values())]:
        assert "build_strategy.fuse_all_optimizer_ops" in result["applied"]
    assert _gap(trained[0][name], trained[0][name.removesuffix("/fuse_all_optimizer_ops")]) <= TOLERANCE


@pytest.mark.parametrize("clip", CLIPS)
@pytest.mark.parametrize("optimizer", ["momentum", "adamw"])
def test_gradient_merge_clips_the_merged_gradient(clip, optimizer):
    """k micro-steps of b rows == one step of k*b rows: the clip sees the merged gradient."""
    case = {"optimizer": optimizer, "clip": CLIPS[clip]}
    merged = train(strategy(**KNOBS["gradient_merge"]), lambda: clip_worker.make_optimizer(case), rows=8, steps=4)
    whole = train(strategy(), lambda: clip_worker.make_optimizer(case), rows=16, steps=2)
    for param, values in whole[1].items():
        np.testing.assert_allclose(merged[1][param], values, rtol=0, atol=TOLERANCE, err_msg=param)
