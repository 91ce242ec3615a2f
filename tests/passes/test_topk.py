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

from fleetlite import CompileError, DistributedStrategy, StrategyConflictError, Topology
from fleetlite.compile import compiler, invariants, program_edit
from fleetlite.runtime import training_program
from fleetlite.compile.ring_table import RingTable
from fleetlite.strategies.topk_exchange import RESIDUAL_SUFFIX, Levels
from support.multiprocess import run_job
from support.in_process import strategy
from support.models import compiled_program, loss
from workers.topk_worker import LEARNING_RATE, STEPS

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).resolve().parents[1] / "workers" / "topk_worker.py"
CPU_4 = Topology.grid(4, 2, rank=3)                       # node 1, local rank 1
GPU_32 = Topology.grid(32, 4, rank=9, device="gpu")       # node 1, local rank 1
WORLD = 2
TOPK = {"topk": True, "topk_configs": {"density": 0.05, "min_numel": 1000}}   # the MLP's linear_0.w_0 (2048)

FINITE_FLAG = ["data"]                   # the persistable flag pd_op.assert names in its error
RESIDUAL = ["data"]
ACCUMULATE = ["full_int_array", "reshape", "add"]                 # flattened gradient + residual
CHECK_FINITE = ["isfinite", "all", "assign_out_", "builtin.combine", "assert"]
EXACT_TOP_K = ["abs", "full", "topk", "full", "gather"]           # 2048 elements: the exact path
GATHER = ["cast", "all_gather", "all_gather"]                     # values, then int32 indices
PLACE_IN_NODE = ["full", "add", "all_gather", "all_gather"]       # indices moved to the share's place; values, indices
SCATTER_ADD = ["full", "full_int_array", "reshape", "scatter_nd_add"]
KEEP_UNSENT = ["subtract", "scatter"]
SCALE = ["full", "scale_"]
WRITE_RESIDUAL = ["assign_out_"]
RESHAPE = ["full_int_array", "reshape"]
# the CPU bucket path: every gradient of a bucket selected by one op (reading them, and their residuals in place),
# the bucket's pairs gathered once, one op overwriting each gradient with its reduced value
BUCKET_SELECT = ["builtin.combine", "builtin.combine", "custom_op.fleetlite_topk_bucket_select_accumulated_",
                 "builtin.split"]
BUCKET_GATHER = ["all_gather", "all_gather"]
BUCKET_SCATTER = ["builtin.combine", "custom_op.fleetlite_topk_bucket_scatter_", "builtin.split"]
HIERARCHICAL = {"topk": True, "topk_configs": {"density": 0.05, "min_numel": 1000, "hierarchical": True}}


def sequence(main, pass_name):
    return [op.name().replace("pd_op.", "") for op in program_edit.created_by(main.global_block(), pass_name)]


def collectives(main):
    """(op, ring, ranks, ring it emulates) of every collective, in program order (nested blocks included)."""
    return [(op.name().replace("pd_op.", ""), program_edit.int_attr(op, "ring_id"), op.attrs().get("nranks"),
             program_edit.int_attr(op, program_edit.EMULATES))
            for op in program_edit.walk(main.global_block()) if op.has_attr("ring_id")]


def compile_mlp(topology=CPU_4, **fields):
    main, startup, built = compiled_program(strategy(**{**TOPK, **fields}), topology)
    return main, startup, built.report


def test_on_cpu_a_bucket_is_selected_gathered_and_scattered_by_one_op_each_with_error_feedback_in_place():
    main, _, report = compile_mlp()
    assert sequence(main, "topk") == RESIDUAL + BUCKET_SELECT + BUCKET_GATHER + BUCKET_SCATTER
    gathers = [op for op in main.global_block().ops if op.name() == "pd_op.all_gather"]
    assert [(op.operand_source(0).dtype, program_edit.int_attr(op, "ring_id"), op.attrs()["nranks"])
            for op in gathers] == [(paddle.float32, 0, 4), (paddle.int32, 0, 4)]
    scatter = next(op for op in main.global_block().ops if op.name() == BUCKET_SCATTER[1])
    assert scatter.attrs()["scale"] == 0.25
    assert [b["gradients"] for b in report.buckets] == [["linear_1.b_0", "linear_1.w_0", "linear_0.b_0"]]
    record = report.record("topk")
    assert record.summary == ("1 gradients as top-k in 1 buckets, one selection and one exchange each (density "
                              "0.05029: 103 of 2048 elements; 824 B per rank per step instead of 8.0 KiB), error "
                              "feedback; 3 dense (1.4 KiB)")
    assert record.details["bytes_per_step"] == 103 * 8 + (10 + 320 + 32) * 4
    assert report.applied == ["data_parallel", "topk", "fuse_all_reduce_ops", "gloo_lowering", "copy_free_buckets"]
    assert [b["path"] for b in report.buckets] == ["copy-free"]     # the dense rest


@pytest.mark.parametrize("size_in_mb, buckets", [(32, [0, 0, 0, 0]), (0, [0, 1, 2, 3])])
def test_buckets_follow_fuse_grad_size_in_mb_one_selection_op_each(size_in_mb, buckets):
    """min_numel 1 takes all 4 gradients (in ready order): one bucket within 32 MiB, one each at 0."""
    main, _, report = compile_mlp(topk_configs={"density": 0.05, "min_numel": 1}, fuse_grad_size_in_MB=size_in_mb)
    details = report.record("topk").details
    assert [row["bucket"] for row in details["gradients"]] == buckets and details["buckets"] == buckets[-1] + 1
    names = [op.name() for op in main.global_block().ops]
    assert names.count(BUCKET_SELECT[2]) == names.count(BUCKET_SCATTER[1]) == buckets[-1] + 1


def test_under_paddles_n_step_plan_the_residuals_cannot_feed_the_bucket_op_so_gradients_go_one_by_one():
    main, _, report = compile_mlp(execution_strategy={"num_iteration_per_run": 2})
    assert BUCKET_SELECT[2] not in [op.name() for op in main.global_block().ops]
    assert "each one by one (Paddle's N-step plan" in report.record("topk").summary


def test_on_gpu_each_gradient_is_exchanged_on_its_own_with_paddle_ops():
    main, _, report = compile_mlp(GPU_32)
    assert sequence(main, "topk") == (RESIDUAL + FINITE_FLAG + ACCUMULATE + CHECK_FINITE + EXACT_TOP_K + GATHER
                                      + SCATTER_ADD + SCALE + KEEP_UNSENT + WRITE_RESIDUAL + RESHAPE)
    record = report.record("topk")
    assert record.summary.startswith("1 gradients as top-k (density 0.05029: 103 of 2048 elements; 824 B per rank")
    assert record.details["buckets"] == 0 and record.details["one_by_one"] == "the bucket kernels are CPU code"


@pytest.mark.parametrize("topology, kernel_op", [(CPU_4, BUCKET_SELECT[2]), (GPU_32, None)], ids=["cpu", "gpu"])
def test_the_compiled_kernel_selects_only_in_programs_built_for_cpus(topology, kernel_op):
    """A 25,600-element gradient takes MSTopK's sampled path: on CPUs the compiled bucket operator; a
    program for GPUs gets the Paddle-op composition even when a CPU machine builds it."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [8, 64], "float32")
        training_program.build(paddle.mean(paddle.nn.Linear(64, 400)(x)), paddle.optimizer.SGD(0.1),
                               strategy(**TOPK), topology, startup)
    names = [op.name() for op in program_edit.walk(main.global_block())]
    assert names.count(BUCKET_SELECT[2]) == (kernel_op is not None)
    assert ("pd_op.nonzero" in names) == (kernel_op is None)


def test_the_residual_is_persistable_zero_at_start_and_written_in_place_each_step():
    main, startup, _ = compile_mlp()
    name = "linear_0.w_0" + RESIDUAL_SUFFIX
    residual = next(op for op in main.global_block().ops if op.name() == "pd_op.data" and op.attrs()["name"] == name)
    assert residual.attrs()["persistable"] == [True]
    combined = residual.result(0).all_used_ops()
    assert [op.name() for op in combined] == ["builtin.combine"]
    assert [op.name() for op in combined[0].result(0).all_used_ops()] == [BUCKET_SELECT[2]]
    initialised = {op.attrs()["output_name"]: op.operand_source(0).get_defining_op()
                   for op in startup.global_block().ops if op.name() == "builtin.shadow_output"}
    assert initialised[name].name() == "pd_op.full" and initialised[name].attrs()["value"] == 0


def test_without_error_feedback_there_is_no_residual():
    main, _, report = compile_mlp(topk_configs={**TOPK["topk_configs"], "error_feedback": False})
    assert sequence(main, "topk") == (["builtin.combine", "custom_op.fleetlite_topk_bucket_select"]
                                      + BUCKET_GATHER + BUCKET_SCATTER)
    assert "no error feedback" in report.record("topk").summary


def test_fp16_allreduce_puts_float16_values_on_the_wire_and_keeps_the_rounding_in_the_residual():
    main, _, report = compile_mlp(fp16_allreduce=True)
    select = next(op for op in main.global_block().ops if op.name() == BUCKET_SELECT[2])
    assert select.attrs()["wire_float16"] is True
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


def test_hierarchical_on_gpu_reduce_scatters_in_the_node_gathers_pairs_across_nodes_and_hands_them_to_the_node():
    """Rank 9 of 4 nodes x 8: its share is 1/8 of linear_0.w_0 (256 of 2048), k = 13 pairs cross nodes; the
    node's members then all-gather the 4 x 13 pairs each received (offset to their shares), not dense shares."""
    main, _, report = compile_mlp(GPU_32, **HIERARCHICAL)
    assert sequence(main, "topk") == (RESIDUAL + FINITE_FLAG + RESHAPE + ["reduce_scatter", "add"] + CHECK_FINITE
                                      + EXACT_TOP_K + GATHER + PLACE_IN_NODE + SCATTER_ADD + SCALE + KEEP_UNSENT
                                      + WRITE_RESIDUAL + RESHAPE)
    ops = [(name, ring, ranks) for name, ring, ranks, _ in collectives(main) if ring != 0]
    assert ops == [("reduce_scatter", 1, 8), ("all_gather", 2, 4), ("all_gather", 2, 4), ("all_gather", 1, 8),
                   ("all_gather", 1, 8)]
    offset = next(op for op in main.global_block().ops if op.name() == "pd_op.add" and
                  op.operand_source(0).dtype == paddle.int32).operand_source(1).get_defining_op()
    assert offset.attrs()["value"] == 1 * 256                   # rank 9 is member 1 of its node: its share's place
    placing = [op for op in main.global_block().ops if op.has_attr(program_edit.PLACES)]
    assert [program_edit.int_attr(op, "ring_id") for op in placing] == [1, 1]
    rings = {r["ring"]: (r["kind"], r["members"]) for r in report.rings}
    assert rings[1] == ("intra", list(range(8, 16))) and rings[2] == ("inter", [1, 9, 17, 25])
    record = report.record("topk")
    assert record.summary == ("1 gradients as hierarchical top-k (4 nodes x 8 ranks; density 0.05078: 104 of 2048 "
                              "elements per node; between nodes 104 B per rank per step instead of 8.0 KiB, inside the "
                              "node 9.8 KiB), error feedback; 3 dense (1.4 KiB)")
    assert record.details["gradients"][0]["k"] == 13
    assert record.details["inter_node_bytes_per_step"] == 13 * 8
    assert record.details["intra_node_bytes_per_step"] == 7 * (256 * 4 + 4 * 13 * 8)   # its share, 4 x 13 pairs
    assert record.details["hierarchical"] == {"ranks_per_node": 8, "nodes": 4, "intra_ring": 1, "inter_ring": 2}
    main, _, report = compile_mlp(GPU_32, fp16_allreduce=True, **HIERARCHICAL)
    gathers = [op for op in main.global_block().ops if op.name() == "pd_op.all_gather"]
    assert [(op.operand_source(0).dtype, program_edit.int_attr(op, "ring_id")) for op in gathers] == [
        (paddle.float16, 2), (paddle.int32, 2), (paddle.float32, 1), (paddle.int32, 1)]   # float16 between nodes only
    assert report.record("topk").details["inter_node_bytes_per_step"] == 13 * 6


def test_hierarchical_pads_the_gradient_to_a_multiple_of_the_node_size_and_trims_it_back():
    main, _, report = compile_mlp(Topology.grid(6, 2, rank=4, device="gpu"), **HIERARCHICAL)   # 2048 -> 3 x 683
    ops = sequence(main, "topk")
    pad = ["full", "builtin.combine", "concat", "reduce_scatter"]
    assert ops[ops.index("reduce_scatter") - 3:ops.index("reduce_scatter") + 1] == pad
    assert ops[-5:] == ["full_int_array", "full_int_array", "slice"] + RESHAPE
    summed = next(op for op in main.global_block().ops if op.name() == "pd_op.scatter_nd_add").result(0)
    assert summed.shape == [3 * 683]                 # the node's padded gradient, before the trim
    assert report.record("topk").details["gradients"][0]["k"] == 35          # ceil(0.05 * 683)


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_hierarchical_with_one_rank_per_node_is_the_one_level_exchange(device):
    """No node level: the pairs cross nodes and are summed, nothing is handed around in a node (the
    compile's own check counts every gradient summed over the 2 ranks once)."""
    main, _, report = compile_mlp(Topology.grid(2, 2, rank=1, device=device), **HIERARCHICAL)
    assert [name for name, *_ in collectives(main)] == ["all_reduce_", "all_gather", "all_gather"]
    assert not [op for op in main.global_block().ops if op.has_attr(program_edit.PLACES)]
    assert report.record("topk").details["hierarchical"]["ranks_per_node"] == 1


def test_hierarchical_on_cpu_runs_every_level_on_ring_0_emulating_the_node_and_cross_node_rings(no_group_ops):
    """Rank 3 of 2 nodes x 2: the node's reduce-scatter is a masked world sum, the cross-node and
    node all-gathers are world all-gathers keeping the group's rows (the gloo lowering). The share is
    selected and the node's pairs summed by the compiled bucket ops (GPUs: Paddle's ops, above)."""
    main, _, report = compile_mlp(CPU_4, **HIERARCHICAL)
    assert sequence(main, "topk") == (RESIDUAL + RESHAPE + BUCKET_SELECT + ["full", "add"] + ["full_int_array", "empty"]
                                      + BUCKET_SCATTER + RESHAPE)
    node = next(op for op in main.global_block().ops if op.name() == "pd_op.empty").result(0)
    scatter = next(op for op in main.global_block().ops if op.name() == BUCKET_SCATTER[1])
    assert node.shape == [2048] and scatter.attrs()["scale"] == 0.25     # the node's whole gradient, 1/W
    masked_second_slot = ["full", "full", "builtin.combine", "concat", "all_reduce_", "full_int_array",
                          "full_int_array", "slice"]
    own_share = ["full_int_array", "full_int_array", "slice"]
    members_rows = ["all_gather", "full_int_array", "reshape", "full", "split_with_num", "builtin.split", "full",
                    "builtin.combine", "concat", "full_int_array", "reshape"]
    assert sequence(main, "gloo_lowering") == masked_second_slot + own_share + members_rows * 4
    assert collectives(main) == [("all_reduce_", 0, None, None),     # the dense bucket, then the node's sum
                                 ("all_reduce_", 0, None, 1), ("all_gather", 0, 4, 2), ("all_gather", 0, 4, 2),
                                 ("all_gather", 0, 4, 1), ("all_gather", 0, 4, 1)]
    placing = [op for op in main.global_block().ops if op.has_attr(program_edit.PLACES)]
    assert [program_edit.int_attr(op, program_edit.EMULATES) for op in placing] == [1, 1]   # the mark survives
    assert report.record("topk").details["hierarchical"] == {"ranks_per_node": 2, "nodes": 2, "intra_ring": 1,
                                                             "inter_ring": 2}


def test_hierarchical_on_cpu_runs_the_node_and_cross_node_levels_on_their_own_gloo_groups():
    """Rank 3 of 2 nodes x 2: the node's reduce-scatter and the all-gathers of the pairs it received on
    {2,3}, the pairs' all-gathers between node leaders' positions on {1,3}; only the dense bucket stays
    on ring 0."""
    main, _, report = compile_mlp(CPU_4, **HIERARCHICAL)
    assert [(op.name(), op.attrs().get("comm_key"), program_edit.int_attr(op, program_edit.EMULATES))
            for op in program_edit.walk(main.global_block()) if op.has_attr("ring_id")] == [
        ("pd_op.all_reduce_", None, None),
        ("custom_op.fleetlite_group_reduce_scatter", "fleetlite/0/2.3", 1),
        ("custom_op.fleetlite_group_all_gather", "fleetlite/0/1.3", 2),
        ("custom_op.fleetlite_group_all_gather", "fleetlite/0/1.3", 2),
        ("custom_op.fleetlite_group_all_gather", "fleetlite/0/2.3", 1),
        ("custom_op.fleetlite_group_all_gather", "fleetlite/0/2.3", 1)]
    assert report.record("gloo_lowering").details["communicators"] == [("fleetlite/0/2.3", [2, 3]),
                                                                       ("fleetlite/0/1.3", [1, 3])]


def test_hierarchical_on_cpu_exchanges_a_bucket_of_gradients_with_one_reduce_scatter_and_four_all_gathers():
    """Rank 3 of 2 nodes x 2, two taken gradients in one bucket: their padded rows side by side, one
    reduce-scatter in the node, one selection, the pairs' all-gathers across nodes and in the node
    once for both, one scatter into the node's buffer, cut back into the two gradients."""
    main, _, report = compile_mlp(CPU_4, topk_configs={**HIERARCHICAL["topk_configs"], "min_numel": 300})
    names = [op.name() for op in program_edit.walk(main.global_block()) if op.has_attr("ring_id")]
    assert names == ["pd_op.all_reduce_", "custom_op.fleetlite_group_reduce_scatter"] + [
        "custom_op.fleetlite_group_all_gather"] * 4
    assert [op.name() for op in main.global_block().ops].count(BUCKET_SCATTER[1]) == 1
    record = report.record("topk")
    assert record.summary.startswith("2 gradients as hierarchical top-k in 1 buckets (2 nodes x 2 ranks;")
    assert [row["bucket"] for row in record.details["gradients"]] == [0, 0]


def test_hierarchical_warm_up_lowers_the_cross_node_all_reduce_inside_its_branch(no_group_ops):
    main, _, _ = compile_mlp(CPU_4, topk_configs={**HIERARCHICAL["topk_configs"], "warmup_steps": 3})
    branch = next(op for op in main.global_block().ops if op.name() == "pd_op.if"
                  and any(o.has_attr("ring_id") for o in list(op.blocks())[0].ops))
    warm, sparse = ([(o.name(), program_edit.int_attr(o, program_edit.EMULATES)) for o in block.ops
                     if o.has_attr("ring_id")] for block in branch.blocks())
    assert warm == [("pd_op.all_reduce_", 2)] and sparse == [("pd_op.all_gather", 2)] * 2
    assert all(ring == 0 for _, ring, _, _ in collectives(main))


def test_with_hierarchical_all_reduce_the_dense_remainder_goes_two_level_and_top_k_stays_as_configured():
    main, _, report = compile_mlp(GPU_32, use_hierarchical_allreduce=True)
    assert {"topk", "use_hierarchical_allreduce"} <= set(report.applied)
    assert [(name, ring) for name, ring, _, _ in collectives(main)] == [        # the dense bucket first
        ("reduce_scatter", 1), ("all_reduce_", 2), ("all_gather", 1), ("all_gather", 0), ("all_gather", 0)]
    main, _, report = compile_mlp(GPU_32, use_hierarchical_allreduce=True, **HIERARCHICAL)
    assert [(name, ring) for name, ring, _, _ in collectives(main)] == [
        ("reduce_scatter", 3), ("all_reduce_", 4), ("all_gather", 3),
        ("reduce_scatter", 1), ("all_gather", 2), ("all_gather", 2), ("all_gather", 1), ("all_gather", 1)]


def test_with_amp_top_k_selects_the_unscaled_gradient_and_writes_the_residual_after_the_agreed_overflow_flag():
    main, _, report = compile_mlp(Topology.grid(2), amp=True, amp_configs=OVERFLOW)
    unscale = ["reciprocal", "multiply"]
    zero_non_finite = ["isfinite", "all", "logical_not", "full_int_array", "reshape", "full", "full_like", "where"]
    assert sequence(main, "topk") == (RESIDUAL + FINITE_FLAG + RESHAPE + unscale + ["add"] + zero_non_finite
                                      + CHECK_FINITE + EXACT_TOP_K + GATHER + SCATTER_ADD + SCALE + KEEP_UNSENT
                                      + RESHAPE)
    assert sequence(main, "amp_loss_scaling") == (
        ["builtin.combine", "check_finite_and_unscale_", "builtin.split", "logical_or", "cast", "all_reduce_", "cast",
         "full", "builtin.combine", "update_loss_scaling_", "builtin.split"]
        + ["full_int_array", "expand", "where", "assign_out_"])          # residual = found_inf ? residual : unsent
    ops = {op.name(): op for op in main.global_block().ops}
    unscaled_by_amp = ops["pd_op.check_finite_and_unscale_"].operand_source(0).get_defining_op()
    zeroed = ops["pd_op.update_loss_scaling_"].operand_source(0).get_defining_op()
    assert (unscaled_by_amp.num_operands(), zeroed.num_operands()) == (3, 4)    # the top-k gradient is unscaled once
    assert "1 unscaled before their top-k selection" in report.record("amp_loss_scaling").summary


def test_gradients_under_min_numel_all_go_dense():
    main, _, report = compile_mlp(topk_configs={"min_numel": 5000})
    assert report.record("topk").summary == "no float gradient has 5000 elements (min_numel): all go dense"
    assert len(report.buckets) == 1 and len(report.buckets[0]["gradients"]) == 4


@pytest.mark.parametrize("fields, message", [
    ({"topk_configs": {"hierarchical": True}, "hierarchical_allreduce_inter_nranks": 4},
     r"hierarchical_allreduce_inter_nranks = 4 does not divide the 2 ranks per node \(2 % 4 = 2\): an intra group "
     "would span two nodes"),
    ({"topk_configs": {"warmup_steps": 2}, "gradient_merge": True, "gradient_merge_configs": {"k_steps": 2}},
     "with gradient_merge the exchange runs once every k_steps micro-steps"),
    ({"topk_configs": {"warmup_steps": 2}, "build_strategy": {"enable_sequential_execution": False}},
     "only program order keeps in the same order on every rank"),
])
def test_combinations_that_cannot_work_are_named_errors(fields, message):
    with pytest.raises(StrategyConflictError, match=message):
        compile_mlp(**fields)


def test_hierarchical_top_k_needs_nodes_of_equal_size():
    uneven = Topology(rank=0, world_size=3, local_size=2, node_count=2, endpoints=["a:1", "a:2", "b:1"])
    with pytest.raises(StrategyConflictError, match="topk_configs.hierarchical needs the same number of ranks on "
                                                    "every node, numbered node by node; this job has 3 ranks but "
                                                    "2 nodes x 2 local ranks"):
        compile_mlp(uneven, **HIERARCHICAL)


@pytest.mark.parametrize("fields, summed_over", [(TOPK, 1), (HIERARCHICAL, 2)], ids=["one_level", "hierarchical"])
def test_the_invariant_rejects_a_scatter_add_of_values_that_were_not_gathered(fields, summed_over):
    """Point the scatter-add at this rank's own values: nothing crosses ranks any more (hierarchical:
    only the node's reduce-scatter sums, found through the lowering's masked sum)."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [8, 64], "float32")
        y = paddle.static.data("y", [8, 1], "int64")
        params_grads = paddle.static.append_backward(loss("mlp", x, y, 1))
        gradients, _ = compiler.compile(main, params_grads, strategy(**fields), CPU_4)
    rings = RingTable(4)
    Levels.register(strategy(**fields), CPU_4, rings)     # the node and cross-node rings the program emulates
    context = SimpleNamespace(topology=CPU_4, reduced=True, gradient_scale=1 / 4, gradients=gradients, rings=rings)
    invariants.check_gradients_reduced_once(context)
    scatter = next(op for op in main.global_block().ops if op.name() in ("pd_op.scatter_nd_add", BUCKET_SCATTER[1]))
    values = next(op for op in main.global_block().ops if op.name() in invariants.GATHERING).operand_source(0)
    scatter.operands()[2 if scatter.name() == "pd_op.scatter_nd_add" else 1].set_source(values)
    with pytest.raises(CompileError, match=f"gradient of linear_0.w_0 is summed over {summed_over} ranks on its way "
                                           f"to the optimizer, expected 4"):
        invariants.check_gradients_reduced_once(context)


# ---- 2 real ranks against the NumPy reference -------------------------------------------------

# float16 AMP as CPU runs it (tests/passes/test_amp.py): the matmuls stay float32, the loss is scaled by 1024
# (a power of 2, so unscaling gives exactly the unscaled gradient); rank 1's batch is inf at step 2.
OVERFLOW = {"custom_black_list": ["matmul", "relu", "elementwise_add"], "init_loss_scaling": 1024.0,
            "decr_every_n_nan_or_inf": 1, "decr_ratio": 0.5}
POISONED_STEP = 2
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
    "hierarchical": {"topk": True, "topk_configs": {"density": 0.01, "min_numel": 1000, "hierarchical": True}},
    "amp": {"topk": True, "topk_configs": {"density": 0.01, "min_numel": 1000}, "amp": True,
            "amp_configs": OVERFLOW, "poison": [1, POISONED_STEP]},
}
# 4 ranks as 2 nodes x 2: the node's reduce-scatter, the cross-node exchange and the node's all-gather all run
NODES_2X2 = {"hierarchical": CASES["hierarchical"],
             "hierarchical_warmup": {"topk": True, "topk_configs": {**CASES["hierarchical"]["topk_configs"],
                                                                    "warmup_steps": 3}},
             "hierarchical_amp": {**CASES["hierarchical"], "amp": True, "amp_configs": OVERFLOW,
                                  "poison": [3, POISONED_STEP]}}
TAKEN = ("linear_0.w_0", "linear_1.w_0")


@pytest.fixture(scope="module")
def ranks():
    return run_job(WORKER, WORLD, args=[json.dumps(CASES)], timeout=240)


@pytest.fixture(scope="module")
def ranks_2x2():
    return run_job(WORKER, 4, 2, args=[json.dumps(NODES_2X2)], timeout=240)


def reference_exchange(accumulated, k, fp16=False, world=None):
    """(reduced gradient, each rank's unsent part) of one top-k exchange among the ranks of
    `accumulated`, divided by `world` (default: those ranks), in float32 like the program."""
    summed, unsent = np.zeros_like(accumulated[0]), []
    for acc in accumulated:
        chosen = np.argsort(-np.abs(acc), kind="stable")[:k]
        values = acc[chosen]
        wire = values.astype(np.float16).astype(np.float32) if fp16 else values
        np.add.at(summed, chosen, wire)
        left = acc.copy()
        left[chosen] = values - wire
        unsent.append(left)
    return summed * np.float32(1 / (world or len(accumulated))), unsent


def reference_hierarchical(raw, residuals, size, density):
    """(reduced gradient, each rank's residual after) of one hierarchical exchange: `raw` the ranks'
    flat gradients, `residuals` their residuals (their share of the node sum) before, `size` ranks
    per node. The node's reduce-scatter: rank p of a node holds share p of the node's sum (zero-padded),
    plus its residual; the ranks at position p of every node exchange their top-k pairs; the node
    concatenates the shares."""
    world, numel = len(raw), raw[0].size
    part = -(-numel // size)
    padded = [np.concatenate([g, np.zeros(part * size - numel, np.float32)]) for g in raw]
    node_sums = [sum(padded[node:node + size]) for node in range(0, world, size)]
    shares, after = [], [None] * world
    for position in range(size):
        ranks = range(position, world, size)
        accumulated = [node_sums[r // size][position * part:(position + 1) * part] + residuals[r] for r in ranks]
        reduced, unsent = reference_exchange(accumulated, int(np.ceil(density * part)), world=world)
        shares.append(reduced)
        for rank, left in zip(ranks, unsent):
            after[rank] = left
    return np.concatenate(shares)[:numel], after


def flat(values):
    return np.asarray(values, dtype=np.float32).reshape(-1)


def step_values(ranks, case, step, name):
    """(raw gradient per rank, residual per rank before and after this step, reduced gradient of rank 0)."""
    steps = [rank[case]["steps"] for rank in ranks]
    raw = [flat(s[step]["raw"][name]) for s in steps]
    has_residual = name in steps[0][step]["residual"]
    before = [(flat(s[step - 1]["residual"][name]) if step else np.zeros_like(flat(s[0]["residual"][name])))
              if has_residual else np.zeros_like(raw[0]) for s in steps]
    after = [flat(s[step]["residual"][name]) for s in steps] if has_residual else None
    return raw, before, after, flat(steps[0][step]["reduced"][name])


def k_of(name, density=0.01):
    return int(np.ceil(density * {"linear_0.w_0": 64 * 300, "linear_1.w_0": 300 * 10}[name]))


@pytest.mark.parametrize("job", ["ranks", "ranks_2x2"])
def test_every_rank_applies_the_same_reduced_gradients_and_ends_with_the_same_parameters(request, job):
    ranks = request.getfixturevalue(job)
    for case in ranks[0]:
        for other in ranks[1:]:
            for step in range(STEPS):
                if case != "merged":
                    assert ranks[0][case]["steps"][step]["reduced"] == other[case]["steps"][step]["reduced"], case
            assert ranks[0][case]["params"] == other[case]["params"], case


@pytest.mark.parametrize("case, fp16", [("ef", False), ("no_ef", False), ("fp16", True)])
def test_each_step_equals_the_numpy_reference_of_the_exchange(ranks, case, fp16):
    assert ranks[0][case]["topk"]["achieved_density"] == pytest.approx((192 + 30) / (19200 + 3000))
    assert ranks[0][case]["kernel_ops"] == 1      # one compiled selection for the bucket of both gradients
    assert ranks[0][case]["topk"]["buckets"] == 1
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


@pytest.mark.parametrize("job", ["ranks", "ranks_2x2"])
def test_each_hierarchical_step_equals_the_numpy_reference(request, job):
    ranks, case, size = request.getfixturevalue(job), "hierarchical", 2
    world = len(ranks)
    details = ranks[0][case]["topk"]
    assert details["achieved_density"] == pytest.approx(2 * (96 + 15) / (19200 + 3000))   # k of each half
    assert details["hierarchical"]["nodes"] == world // size
    assert details["buckets"] == 1 and [row["bucket"] for row in details["gradients"]] == [0, 0]   # one exchange
    for name in TAKEN:
        for step in range(STEPS):
            raw, before, after, reduced = step_values(ranks, case, step, name)
            expected, unsent = reference_hierarchical(raw, before, size, 0.01)
            np.testing.assert_allclose(reduced, expected, rtol=0, atol=1e-7, err_msg=f"{job} {case} {name} step {step}")
            for rank in range(world):
                np.testing.assert_allclose(after[rank], unsent[rank], rtol=0, atol=1e-7)


@pytest.mark.parametrize("job", ["ranks", "ranks_2x2"])
def test_hierarchical_error_feedback_loses_nothing_over_the_steps(request, job):
    """N x (sum of the reduced gradients) + every rank's residual, put back at its share's place,
    == the sum of every rank's gradients."""
    ranks = request.getfixturevalue(job)
    world, size = len(ranks), 2
    for name in TAKEN:
        steps = [rank["hierarchical"]["steps"] for rank in ranks]
        numel = flat(steps[0][0]["raw"][name]).size
        part = -(-numel // size)
        left = np.zeros(part * size, np.float32)
        for rank, s in enumerate(steps):
            left[rank % size * part:(rank % size + 1) * part] += flat(s[-1]["residual"][name])
        sent = world * sum(flat(s["reduced"][name]) for s in steps[0])
        produced = sum(flat(step["raw"][name]) for s in steps for step in s)
        np.testing.assert_allclose(sent + left[:numel], produced, rtol=1e-5, atol=1e-6)
        assert np.abs(left).max() > 0


def test_hierarchical_warm_up_starts_with_the_dense_sum_then_exchanges_the_top_k(ranks_2x2):
    for name in TAKEN:
        for step in (0, 3, 4, 5):
            raw, before, after, reduced = step_values(ranks_2x2, "hierarchical_warmup", step, name)
            if step == 0:
                nodes = (raw[0] + raw[1]) + (raw[2] + raw[3])
                np.testing.assert_array_equal(reduced, nodes * np.float32(0.25))
                assert not any(a.any() for a in after)
            else:
                expected, unsent = reference_hierarchical(raw, before, 2, 0.01)
                np.testing.assert_allclose(reduced, expected, rtol=0, atol=1e-7, err_msg=f"{name} step {step}")
                np.testing.assert_allclose(after[3], unsent[3], rtol=0, atol=1e-7)


@pytest.mark.parametrize("job, case", [("ranks", "amp"), ("ranks_2x2", "hierarchical_amp")])
def test_with_amp_top_k_selects_unscaled_gradients_and_an_overflow_on_one_rank_leaves_every_residual_alone(
        request, job, case):
    """Before and after the poisoned step the exchange equals the reference on the unscaled
    gradients; at it, every rank applies zeros and keeps its residual, and training goes on."""
    ranks = request.getfixturevalue(job)
    hierarchical = job == "ranks_2x2"
    assert not np.isfinite(step_values(ranks, case, POISONED_STEP, TAKEN[0])[0][-1]).all()
    for name in TAKEN:
        residual = None
        for step in range(STEPS):
            raw, before, after, reduced = step_values(ranks, case, step, name)
            before = before if residual is None else residual
            if step == POISONED_STEP:
                np.testing.assert_array_equal(reduced, np.zeros_like(reduced))
                for rank in range(len(ranks)):
                    np.testing.assert_array_equal(after[rank], before[rank])
                residual = after
                continue
            expected, unsent = (reference_hierarchical(raw, before, 2, 0.01) if hierarchical
                                else reference_exchange([g + r for g, r in zip(raw, before)], k_of(name)))
            np.testing.assert_allclose(reduced, expected, rtol=0, atol=1e-7, err_msg=f"{case} {name} step {step}")
            for rank in range(len(ranks)):
                np.testing.assert_allclose(after[rank], unsent[rank], rtol=0, atol=1e-7)
            residual = None
    assert "amp_loss_scaling" in ranks[0][case]["applied"]
    assert all(np.isfinite(flat(values)).all() for values in ranks[0][case]["params"].values())


# ---- fleetrun ---------------------------------------------------------------------------------

@pytest.mark.parametrize("model, hierarchical, least_accuracy", [("mlp", False, 0.75), ("conv", True, 0.85)],
                         ids=["mlp_one_level", "conv_hierarchical"])
def test_the_digits_example_trains_with_topk_through_fleetrun(tmp_path, model, hierarchical, least_accuracy):
    """configs/cpu_gloo_topk.yaml as it is, and with topk_configs.hierarchical (2 ranks: one node of 2).
    The MLP has 300 hidden units: its first weight (19,200 elements) takes MSTopK's sampled path,
    the compiled kernel, in the workers fleetrun starts (one level). Each model and each level
    runs once through fleetrun; both levels' numerics are the ranks jobs' above."""
    preset = DistributedStrategy.load(ROOT / "configs" / "cpu_gloo_topk.yaml")
    preset.topk_configs.hierarchical = hierarchical
    preset.save(tmp_path / "strategy.yaml")
    env = {name: value for name, value in os.environ.items() if not name.startswith(("PADDLE_", "FLEETLITE_"))}
    result = subprocess.run([sys.executable, "-m", "fleetlite.launcher", "--nproc_per_node", "2", "--job_id", "topk",
                             "--log_dir", str(tmp_path / "log"), str(ROOT / "examples" / "train_digits.py"),
                             "--strategy", str(tmp_path / "strategy.yaml"), "--epochs", "4", "--model", model,
                             "--hidden", "300"],
                            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    output = result.stdout + result.stderr
    assert re.search(r"topk\s+COMMUNICATION\s+applied\s+\+\d+ -\d+\s+2 gradients as (hierarchical )?top-k", output)
    assert ("as hierarchical top-k (1 nodes x 2 ranks" in output) == hierarchical
    assert "MSTopK runs as Paddle ops" not in output
    losses = [float(v) for v in re.findall(r"epoch \d+: loss ([0-9.]+)", output)]
    assert len(losses) == 4 and losses[-1] < 0.5 * losses[0], losses
    accuracy = float(re.search(r"test accuracy ([0-9.]+)", output).group(1))
    # chance is 0.1; measured after these 88 steps at density 0.01: mlp 0.90, conv 0.95, mlp hierarchical 0.89
    # (128 hidden), conv hierarchical 0.94
    assert accuracy > least_accuracy
