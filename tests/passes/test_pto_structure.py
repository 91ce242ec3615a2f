"""pto's program, compiled in this process (nothing runs): the partition rule on hand-checkable
sizes, the exact ops on 2 CPU ranks, the reduce-scatter program of GPU jobs, the report line,
and Fleet's sharding knob mapped onto it or refused.

The digits MLP's parameters, in gradient-ready order: linear_1.b_0 (10 floats),
linear_1.w_0 (320), linear_0.b_0 (32), linear_0.w_0 (2048 — larger than the rest together).
"""
import paddle
import pytest

from fleetlite import DistributedStrategy, Topology
from fleetlite.compile import program_edit
from fleetlite.errors import CompileError, StrategyConflictError
from fleetlite.strategies.pto import plan_exchange, plan_partition
from support.in_process import strategy
from support.models import sequence
from support.models import compiled_program

MLP_BYTES = [40, 1280, 128, 8192]
ONE_BUCKET = {"fuse_grad_size_in_MB": 1024, "fuse_grad_size_in_TFLOPS": 0, "last_comm_group_size_MB": 0}
BROADCAST_ONE = ["broadcast_(ring=0)"]
PACK_THREE = ["full_int_array", "reshape"] * 3 + ["full", "builtin.combine", "concat"]


@pytest.mark.parametrize("sizes, world, how, owners", [
    (MLP_BYTES, 2, "size", [1, 1, 1, 0]),               # the largest alone, the rest together
    (MLP_BYTES, 2, "round_robin", [0, 1, 0, 1]),
    ([8, 8, 8, 8], 2, "size", [0, 1, 0, 1]),
    ([5, 4, 3, 3, 3], 2, "size", [0, 1, 1, 0, 1]),      # greedy: 5 | 4 | 4+3 | 5+3 | 7 vs 8 -> 1
    (MLP_BYTES, 4, "size", [3, 1, 2, 0]),
    ([40, 2560], 4, "size", [1, 0]),                    # fewer parameters than ranks: 2 and 3 own nothing
])
def test_partition_rule(sizes, world, how, owners):
    assert plan_partition(sizes, world, how) == owners


def test_exchange_buckets_one_owner_each_at_most_the_limit_a_larger_parameter_alone():
    assert plan_exchange([1, 1, 1, 0], MLP_BYTES, 2000) == [(0, [3]), (1, [0, 1, 2])]
    assert plan_exchange([1, 1, 1, 0], MLP_BYTES, 1300) == [(0, [3]), (1, [0]), (1, [1]), (1, [2])]
    assert plan_exchange([0, 1, 0, 1], MLP_BYTES, 0) == [(0, [0]), (0, [2]), (1, [1]), (1, [3])]


def compile_adam(topology, grad_clip=None, **fields):
    paddle.enable_static()
    main, startup, built = compiled_program(strategy(pto=True, **fields), topology,
                                            optimizer=paddle.optimizer.Adam(0.01, grad_clip=grad_clip))
    return main, startup, built.report


def state_names(program, op_name, attr):
    """The optimizer state the program holds (not the gradients the copy-free buckets keep, `<param>@GRAD`)."""
    return sorted(op.attrs()[attr] for op in program.global_block().ops
                  if op.name() == op_name and op.attrs().get(attr, "").startswith("linear")
                  and not op.attrs()[attr].endswith("@GRAD"))


def updated(main):
    return sorted(op.operand_source(0).get_defining_op().attrs()["parameter_name"]
                  for op in main.global_block().ops if op.name() == "pd_op.adam_")


def adam_state(*params):
    return sorted(f"{p}_{s}" for p in params for s in ("moment1_0", "moment2_0", "beta1_pow_acc_0", "beta2_pow_acc_0"))


def test_rank_0_of_2_updates_the_large_weight_and_receives_the_rest_in_one_packed_broadcast():
    main, startup, report = compile_adam(Topology.grid(2, 1, rank=0), **ONE_BUCKET)
    assert updated(main) == ["linear_0.w_0"]
    assert state_names(main, "pd_op.data", "name") == adam_state("linear_0.w_0")
    assert state_names(startup, "builtin.shadow_output", "output_name") == adam_state("linear_0.w_0")
    unpack = ["full_int_array", "full", "split", "builtin.split"] + ["full_int_array", "reshape", "assign_out_"] * 3
    assert sequence(main, "pto") == BROADCAST_ONE + PACK_THREE + BROADCAST_ONE + unpack
    ops = main.global_block().ops
    sent = next(op for op in ops if op.name() == "pd_op.broadcast_")
    assert sent.operand_source(0).get_defining_op().name() == "pd_op.adam_"     # the updated value, after the update
    assert [op.attrs()["root"] for op in ops if op.name() == "pd_op.broadcast_"] == [0, 1]
    assert report.record("pto").ops_removed.count("pd_op.adam_") == 3
    assert "pd_op.all_reduce_" in {op.name() for op in ops}                      # gloo: the all-reduce stays


def test_rank_1_of_2_updates_the_three_small_parameters_and_sends_them_packed():
    main, startup, _ = compile_adam(Topology.grid(2, 1, rank=1), **ONE_BUCKET)
    assert updated(main) == ["linear_0.b_0", "linear_1.b_0", "linear_1.w_0"]
    assert state_names(startup, "builtin.shadow_output", "output_name") == adam_state(
        "linear_0.b_0", "linear_1.b_0", "linear_1.w_0")
    assert sequence(main, "pto") == BROADCAST_ONE + PACK_THREE + BROADCAST_ONE   # the owner keeps its values


def test_report_line_names_the_parts_the_bytes_per_rank_and_the_collectives():
    _, _, report = compile_adam(Topology.grid(2, 1, rank=0), **ONE_BUCKET)
    record = report.record("pto")
    adam = {"linear_0.w_0": 2 * 8192 + 8, "linear_0.b_0": 2 * 128 + 8, "linear_1.w_0": 2 * 1280 + 8,
            "linear_1.b_0": 2 * 40 + 8}
    assert record.details["state_bytes_per_rank"] == [adam["linear_0.w_0"], sum(adam.values()) - adam["linear_0.w_0"]]
    assert record.details["parameter_bytes_per_rank"] == [8192, 40 + 1280 + 128]
    assert record.details["collective"] == "broadcast_"
    assert record.summary == ("4 updates in 2 parts by size (rank 0: 1 (8.0 KiB), rank 1: 3 (1.4 KiB)); this rank "
                              "keeps 1 and 16.0 KiB of 18.9 KiB optimizer state; 2 broadcast_ from the owners; "
                              "gradients: all_reduce kept (gloo has no reduce_scatter): every rank uses its part")
    assert "pto" in report.table()


def test_gpu_reduce_scatters_each_bucket_to_the_owners_padding_each_owner_run():
    main, _, report = compile_adam(Topology.grid(2, 1, rank=1, device="gpu"), fuse_grad_size_in_TFLOPS=2,
                                   last_comm_group_size_MB=0)
    names = [op.name() for op in main.global_block().ops]
    assert "pd_op.all_reduce_" not in names and names.count("pd_op.reduce_scatter") == 2
    # bucket 0 = linear_1.b_0, linear_1.w_0 (both rank 1's): rank 0's run is 330 zeros;
    # bucket 1 = linear_0.b_0 (rank 1), linear_0.w_0 (rank 0): rank 1's 32 floats padded to 2048
    pack = ["full", "builtin.combine", "concat", "reduce_scatter(ring=0)", "full", "scale_"]
    reshape = ["full_int_array", "reshape"]
    bucket_0 = ["full"] + reshape * 2 + pack + ["full_int_array", "full", "split", "builtin.split"] + reshape * 2
    bucket_1 = reshape * 2 + ["full"] + pack + ["full_int_array", "full_int_array", "slice"] + reshape
    assert sequence(main, "pto") == bucket_0 + bucket_1 + BROADCAST_ONE + PACK_THREE + BROADCAST_ONE
    assert updated(main) == ["linear_0.b_0", "linear_1.b_0", "linear_1.w_0"]
    assert report.record("pto").details["gradient_communication"] == "reduce_scatter to the owners (one per bucket)"


def test_gpu_rank_that_owns_nothing_only_reduce_scatters_and_receives():
    main, _, _ = compile_adam(Topology.grid(32, 4, rank=9, device="gpu"))
    names = [op.name() for op in main.global_block().ops]
    assert "pd_op.adam_" not in names and "pd_op.all_reduce_" not in names
    assert names.count("pd_op.reduce_scatter") >= 1 and names.count("pd_op.broadcast_") == 4


def test_gpu_refuses_a_global_norm_clip_that_would_need_every_gradient():
    with pytest.raises(CompileError, match="partial squared norms"):
        compile_adam(Topology.grid(2, 1, rank=0, device="gpu"), grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))


def test_cpu_global_norm_clip_reads_every_reduced_gradient():
    main, _, _ = compile_adam(Topology.grid(2, 1, rank=0), grad_clip=paddle.nn.ClipGradByGlobalNorm(1.0))
    norms = [op for op in main.global_block().ops if op.name() == "pd_op.squared_l2_norm"]
    assert len(norms) == 4 and updated(main) == ["linear_0.w_0"]


def test_sharding_stage_1_over_the_world_is_pto():
    s = strategy(sharding=True, sharding_configs={"sharding_degree": 2, "segment_broadcast_MB": 0})
    paddle.enable_static()
    main, _, built = compiled_program(s, Topology.grid(2, 1, rank=0), optimizer=paddle.optimizer.Adam(0.01))
    assert "pto" in built.report.applied and updated(main) == ["linear_0.w_0"]
    assert built.report.record("pto").details["exchange_buckets"] == 4      # segment_broadcast_MB 0: one each


@pytest.mark.parametrize("configs, words", [
    ({"stage": 2, "sharding_degree": 2}, "stage 1"),
    ({"sharding_degree": 4}, "sharding_degree: 2"),
    ({"sharding_degree": 2, "dp_degree": 2}, "hybrid sharding"),
    ({"sharding_degree": 2, "optimize_offload": True}, "optimize_offload: false"),
    ({"sharding_degree": 2, "gradient_merge_acc_step": 4}, "gradient_merge"),
])
def test_sharding_refuses_other_stages_and_hybrid_degrees(configs, words):
    s = DistributedStrategy()
    s.sharding = True
    s.sharding_configs = configs
    with pytest.raises(StrategyConflictError, match=words):
        s.validate(Topology.grid(2, 1))


def test_gpu_with_topk_keeps_the_top_k_all_gathers_and_reduce_scatters_the_bucketed_rest():
    main, _, report = compile_adam(Topology.grid(2, 1, rank=1, device="gpu"), topk=True,
                                   topk_configs={"density": 0.1, "min_numel": 100})
    names = [op.name() for op in main.global_block().ops]
    assert report.applied.index("topk") < report.applied.index("pto")
    assert names.count("pd_op.all_gather") == 4            # values and indices of the two weights
    assert names.count("pd_op.reduce_scatter") == 1        # the two biases' bucket
    assert updated(main) == ["linear_0.b_0", "linear_1.b_0", "linear_1.w_0"]
