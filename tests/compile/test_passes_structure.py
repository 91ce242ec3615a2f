"""Exact programs the passes build, for GPU jobs of 32 ranks on 4 nodes and for CPU jobs,
compiled in this process (nothing runs): op sequences per pass, ring ids, ring members,
bucket sizes, and the bucket rule on hand-checkable numbers.

The model is the digits MLP: gradients become ready in the order linear_1.b_0 (10 floats),
linear_1.w_0 (320), linear_0.b_0 (32), linear_0.w_0 (2048).
"""
import paddle
import pytest

from fleetlite import Topology
from fleetlite.compile import group_collectives, program_edit
from fleetlite.strategies.fuse_all_reduce import plan_buckets
from support.in_process import strategy
from support.models import compiled_program, sequence

GPU_32 = Topology.grid(32, 4, rank=9, device="gpu")     # node 1, local rank 1
CPU_4 = Topology.grid(4, 2, rank=3)                      # node 1, local rank 1
READY_ORDER = ["linear_1.b_0", "linear_1.w_0", "linear_0.b_0", "linear_0.w_0"]
TWO_PER_BUCKET = {"fuse_grad_size_in_TFLOPS": 2, "last_comm_group_size_MB": 0}

PER_GRADIENT = ["all_reduce_(ring=0)", "full", "scale_"]
PACK_TWO = ["full_int_array", "reshape"] * 2 + ["full", "builtin.combine", "concat"]
UNPACK_TWO = ["full_int_array", "full", "split", "builtin.split"] + ["full_int_array", "reshape"] * 2


def compile_mlp(topology, **fields):
    main, _, built = compiled_program(strategy(**fields), topology)
    return main, built.report


def fused(ring):
    return PACK_TWO + [f"all_reduce_(ring={ring})", "full", "scale_"] + UNPACK_TWO


def test_data_parallel_reduces_each_gradient_once_on_ring_0_in_ready_order():
    main, report = compile_mlp(GPU_32, fuse_all_reduce_ops=False)
    assert sequence(main, "data_parallel") == PER_GRADIENT * 4
    collectives = [op for op in main.global_block().ops if op.name() == "pd_op.all_reduce_"]
    assert [program_edit.int_attr(op, program_edit.BUCKET) for op in collectives] == [0, 1, 2, 3]
    assert [b["gradients"] for b in report.buckets] == [[name] for name in READY_ORDER]
    assert report.applied == ["data_parallel", "sync_nccl_allreduce"]
    assert report.record("data_parallel").details["scale"] == pytest.approx(1 / 32)


def test_data_parallel_puts_each_reduction_right_after_its_gradient_and_before_the_optimizer():
    main, _ = compile_mlp(GPU_32, fuse_all_reduce_ops=False)
    ops = main.global_block().ops
    names = [op.name() for op in ops]
    first_update = names.index("pd_op.sgd_")
    for index, op in enumerate(ops):
        if op.name() == "pd_op.all_reduce_":
            assert ops[index - 1].name().endswith("_grad") and index < first_update
            assert ops[index].op_role == program_edit.BACKWARD
    assert {op.op_role for op in ops if op.name() == "pd_op.sgd_"} == {program_edit.OPTIMIZE}
    assert ops[names.index("pd_op.matmul")].op_role == program_edit.FORWARD


def test_fusion_packs_buckets_with_one_copy_in_and_one_out_and_removes_the_per_gradient_ops():
    main, report = compile_mlp(GPU_32, **TWO_PER_BUCKET)
    assert sequence(main, "fuse_all_reduce_ops") == fused(0) + fused(0)
    assert sequence(main, "data_parallel") == []
    record = report.record("fuse_all_reduce_ops")
    assert record.ops_removed.count("pd_op.all_reduce_") == 4
    assert [(b["gradients"], b["bytes"]) for b in report.buckets] == [
        (READY_ORDER[:2], (10 + 320) * 4), (READY_ORDER[2:], (32 + 2048) * 4)]
    names = {op.name() for op in main.global_block().ops}
    assert "pd_op.coalesce_tensor" not in names and "pd_op.assign_out_" not in names


def test_rings_take_buckets_round_robin_with_ids_0_to_n_minus_1():
    main, report = compile_mlp(GPU_32, nccl_comm_num=2, **TWO_PER_BUCKET)
    assert sequence(main, "fuse_all_reduce_ops") == fused(0) + fused(1)
    assert sequence(main, "nccl_comm_num") == []           # it re-labels, it creates nothing
    assert [b["ring"] for b in report.buckets] == [0, 1]
    assert [(r["ring"], r["kind"], r["size"]) for r in report.rings] == [(0, "world", 32), (1, "world", 32)]


def test_hierarchical_is_reduce_scatter_inside_the_node_all_reduce_across_all_gather():
    main, report = compile_mlp(GPU_32, nccl_comm_num=2, use_hierarchical_allreduce=True, **TWO_PER_BUCKET)
    padded = ["full", "full", "builtin.combine", "concat"]      # 330 floats -> 336, a multiple of 8
    trimmed = ["full_int_array", "full_int_array", "slice"]
    assert sequence(main, "use_hierarchical_allreduce") == (
        padded + ["reduce_scatter(ring=2)", "all_reduce_(ring=3)", "all_gather(ring=2)"] + trimmed
        + ["reduce_scatter(ring=4)", "all_reduce_(ring=5)", "all_gather(ring=4)"])
    rings = {r["ring"]: (r["kind"], r["members"]) for r in report.rings}
    assert rings == {2: ("intra", list(range(8, 16))), 3: ("inter", [1, 9, 17, 25]),
                     4: ("intra", list(range(8, 16))), 5: ("inter", [1, 9, 17, 25])}
    assert [b["ring"] for b in report.buckets] == [2, 4]


def test_hierarchical_inter_nranks_sets_the_intra_group_size():
    main, report = compile_mlp(GPU_32, use_hierarchical_allreduce=True, hierarchical_allreduce_inter_nranks=4,
                               fuse_grad_size_in_MB=64, fuse_grad_size_in_TFLOPS=0, last_comm_group_size_MB=0)
    assert {(r["kind"], r["size"]) for r in report.rings} == {("intra", 4), ("inter", 8)}
    assert {tuple(r["members"]) for r in report.rings} == {(8, 9, 10, 11), tuple(range(1, 32, 4))}


def test_hierarchical_on_one_node_is_reported_as_skipped():
    _, report = compile_mlp(Topology.grid(8, 1, device="gpu"), use_hierarchical_allreduce=True)
    record = report.record("use_hierarchical_allreduce")
    assert record.status == "skipped" and "whole world (8 ranks)" in record.reason


def group_ops(main):
    """(op, comm key, group size, layout ring it runs) of every sub-group op, in program order."""
    return [(op.name().replace("custom_op.fleetlite_group_", ""), op.attrs()["comm_key"], op.attrs()["nranks"],
             program_edit.int_attr(op, program_edit.EMULATES))
            for op in main.global_block().ops if op.name() in group_collectives.OP_NAMES]


def test_gloo_lowering_runs_each_extra_world_ring_on_a_communicator_of_its_own():
    main, report = compile_mlp(CPU_4, nccl_comm_num=2, **TWO_PER_BUCKET)
    assert sequence(main, "gloo_lowering") == ["custom_op.fleetlite_group_all_reduce(ring=0)"]
    assert group_ops(main) == [("all_reduce", "fleetlite/1/0.1.2.3", 4, 1)]     # ring 0 stays Paddle's own
    assert report.record("gloo_lowering").details["communicators"] == [("fleetlite/1/0.1.2.3", [0, 1, 2, 3])]


def test_gloo_lowering_runs_node_and_cross_node_rings_on_their_own_groups():
    main, report = compile_mlp(CPU_4, use_hierarchical_allreduce=True, fuse_grad_size_in_MB=64,
                               fuse_grad_size_in_TFLOPS=0, last_comm_group_size_MB=0)
    # rank 3: node group {2,3} (intra ring 1), cross-node group {1,3} (inter ring 2); nothing on ring 0
    assert group_ops(main) == [("reduce_scatter", "fleetlite/0/2.3", 2, 1), ("all_reduce", "fleetlite/0/1.3", 2, 2),
                               ("all_gather", "fleetlite/0/2.3", 2, 1)]
    assert report.record("gloo_lowering").details["communicators"] == [("fleetlite/0/2.3", [2, 3]),
                                                                       ("fleetlite/0/1.3", [1, 3])]
    assert not [op for op in main.global_block().ops if op.name().startswith("pd_op.") and op.has_attr("ring_id")]


def test_hierarchical_rings_of_two_flat_rings_get_two_communicators_per_group():
    _, report = compile_mlp(CPU_4, use_hierarchical_allreduce=True, nccl_comm_num=2, **TWO_PER_BUCKET)
    assert [key for key, _ in report.record("gloo_lowering").details["communicators"]] == [
        "fleetlite/0/2.3", "fleetlite/0/1.3", "fleetlite/1/2.3", "fleetlite/1/1.3"]


def test_without_group_ops_gloo_lowering_maps_world_rings_to_ring_0(no_group_ops):
    main, report = compile_mlp(CPU_4, nccl_comm_num=2, **TWO_PER_BUCKET)
    rings = [program_edit.int_attr(op, "ring_id") for op in main.global_block().ops if op.has_attr("ring_id")]
    assert rings == [0, 0]
    assert report.record("gloo_lowering").details["changes"] == {"pd_op.all_reduce_ world ring -> ring 0": 1}


def test_without_group_ops_gloo_lowering_emulates_subgroups_exactly_on_ring_0(no_group_ops):
    main, report = compile_mlp(CPU_4, use_hierarchical_allreduce=True, fuse_grad_size_in_MB=64,
                               fuse_grad_size_in_TFLOPS=0, last_comm_group_size_MB=0)
    assert "no sub-group communicators: no C++ compiler" in report.record("gloo_lowering").summary
    # rank 3 is second in its node (intra groups {0,1},{2,3}) and in its inter group ({1,3}):
    # each masked sum puts its data in the second of two slots and keeps that slot.
    masked_second_slot = ["full", "full", "builtin.combine", "concat", "all_reduce_(ring=0)",
                          "full_int_array", "full_int_array", "slice"]
    own_chunk = ["full_int_array", "full_int_array", "slice"]
    members_rows = ["all_gather(ring=0)", "full_int_array", "reshape", "full", "split_with_num", "builtin.split",
                    "full", "builtin.combine", "concat", "full_int_array", "reshape"]   # world rows -> members' rows
    assert sequence(main, "gloo_lowering") == masked_second_slot + own_chunk + masked_second_slot + members_rows
    emulated = [program_edit.int_attr(op, program_edit.EMULATES) for op in main.global_block().ops
                if op.has_attr(program_edit.EMULATES)]
    assert emulated == [1, 2, 1]            # intra, inter, intra
    assert "pd_op.reduce_scatter" not in {op.name() for op in main.global_block().ops}


def test_sync_nccl_allreduce_sets_the_flag_on_gpu_and_is_skipped_on_cpu():
    _, gpu = compile_mlp(GPU_32, sync_nccl_allreduce=False)
    assert gpu.runtime_flags == {"FLAGS_sync_nccl_allreduce": False}
    _, cpu = compile_mlp(CPU_4)
    assert cpu.record("sync_nccl_allreduce").status == "skipped" and cpu.runtime_flags == {}


def test_one_rank_needs_no_communication():
    main, report = compile_mlp(Topology.grid(1), nccl_comm_num=2)
    assert not any(op.has_attr("ring_id") for op in main.global_block().ops)
    assert report.record("data_parallel").reason == "one rank: there is nothing to reduce"
    assert report.record("nccl_comm_num").reason.startswith("needs data_parallel, which was skipped")


def test_startup_broadcasts_every_parameter_from_rank_0_before_storing_it():
    _, startup, built = compiled_program(strategy(), GPU_32)
    names = [op.name() for op in startup.global_block().ops]
    setters = [i for i, name in enumerate(names) if name == "builtin.set_parameter"]
    assert len(setters) == 4 and all(names[i - 1] == "pd_op.broadcast_" for i in setters)
    assert built.report.startup == {"broadcast_parameters": 4}


def test_resnet50_buckets_follow_the_size_count_and_tail_rule():
    from fleetlite.runtime.explain_strategy import explain
    report = explain(strategy(fuse_grad_size_in_MB=16, fuse_grad_size_in_TFLOPS=50), GPU_32, "resnet50")
    sizes = [b["bytes"] for b in report.buckets]
    counts = [len(b["gradients"]) for b in report.buckets]
    assert sum(counts) == 161 and sum(sizes) == 25_557_032 * 4
    assert all(size <= 16 << 20 or count == 1 for size, count in zip(sizes, counts))
    assert max(counts) <= 50 and sizes[-1] <= 1 << 20
    assert len(report.buckets) == 10


@pytest.mark.parametrize("sizes, dtypes, limit, count, tail, expected", [
    ([4] * 5, "fffff", 8, 0, 0, [[0, 1], [2, 3], [4]]),            # size limit
    ([4] * 5, "fffff", 100, 2, 0, [[0, 1], [2, 3], [4]]),          # count limit (int(TFLOPS))
    ([4] * 3, "fff", 0, 0, 0, [[0], [1], [2]]),                     # 0 MiB: a bucket per gradient
    ([4] * 5, "fffff", 100, 0, 8, [[0, 1, 2], [3, 4]]),             # the last 8 bytes travel alone
    ([4, 20], "ff", 100, 0, 8, [[0], [1]]),                         # tail: at least the last gradient
    ([10, 2, 2], "fff", 8, 0, 0, [[0], [1, 2]]),                    # too big for any bucket: alone
    ([4, 2, 4, 2], "fhfh", 8, 0, 0, [[0, 2], [1, 3]]),              # one dtype per bucket
    ([4, 2, 4, 2, 4], "fhfhf", 8, 0, 0, [[0, 2], [1, 3], [4]]),     # issued when their last is ready
])
def test_bucket_rule(sizes, dtypes, limit, count, tail, expected):
    assert plan_buckets(sizes, list(dtypes), limit, count, tail) == expected


def test_inserting_places_ops_before_the_given_op_inside_program_guard():
    """program_guard moves the insertion point to the end: the ops must not land there."""
    paddle.enable_static()
    main = paddle.static.Program()
    with paddle.static.program_guard(main):
        x = paddle.static.data("x", [2], "float32")
        y = paddle.scale(x, 2.0)
        paddle.scale(y, 3.0)
    anchor = [op for op in main.global_block().ops if op.name() == "pd_op.scale"][1]
    with program_edit.inserting(main, "probe", before=anchor) as created:
        paddle.assign(y)
    ops = main.global_block().ops
    position = [i for i, op in enumerate(ops) if op.id() == anchor.id()][0]
    assert [op.name() for op in created] == ["pd_op.assign"]
    assert ops[position - 1].id() == created[0].id() and program_edit.provenance(created[0]) == "probe"
