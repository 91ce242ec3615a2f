"""fp16_allreduce: the GPU program sends float16 buckets; on CPU the same casts run with the sum
widened to float32 for gloo, and 2 real ranks reduce exactly the float16 sum of their
float16-rounded gradients.

The oracle for the numbers: each bucket that reaches the optimizer must equal, bit for bit,
float16(float16(g0) + float16(g1)) / 2 computed in numpy from the buckets the two ranks sent
(the sum of two float16 values is exact in float32, so widening changes nothing but the
bytes). Against one float32 process on the full batch the parameters then differ by the
rounding only: each step rounds every gradient twice by at most 2^-11 relative, so 4 SGD steps
at learning rate 0.1 on gradients below 0.3 move a parameter by at most
4 * 0.1 * 0.3 * 2^-10 ~= 1.2e-4; the test allows 2e-4 and requires a visible difference.
"""

import numpy as np
import pytest

from fleetlite import DistributedStrategy, Topology
from fleetlite.compile import invariants, program_edit
from support.models import compiled_program

GPU_32, CPU_2 = Topology.grid(32, 4, rank=9, device="gpu"), Topology.grid(2)
TWO_BUCKETS = {"fuse_grad_size_in_TFLOPS": 2, "last_comm_group_size_MB": 0}
ROUNDING_BOUND = 2e-4


def compile_fp16(topology, **fields):
    strategy = DistributedStrategy()
    strategy.fp16_allreduce = True
    for name, value in {**TWO_BUCKETS, **fields}.items():
        setattr(strategy, name, value)
    main, _, built = compiled_program(strategy, topology)
    return main, built.report


def collectives(main):
    """(op, ring, dtype of what it moves) for every collective, in program order."""
    return [(op.name().replace("pd_op.", ""), op.attrs()["ring_id"], str(op.operand_source(0).dtype).split(".")[-1])
            for op in main.global_block().ops if op.has_attr("ring_id")]


def test_on_gpu_each_bucket_crosses_ranks_in_float16_and_is_scaled_in_float32():
    main, report = compile_fp16(GPU_32)
    assert collectives(main) == [("all_reduce_", 0, "float16")] * 2
    ops = main.global_block().ops
    for index, op in enumerate(ops):
        if op.name() == "pd_op.all_reduce_":
            assert [o.name() for o in ops[index - 1:index + 4]] == ["pd_op.cast", "pd_op.all_reduce_", "pd_op.cast",
                                                                    "pd_op.full", "pd_op.scale_"]
            assert ops[index + 1].result(0).dtype == ops[index + 3].result(0).dtype      # float32 after
    assert [(b["dtype"], b["bytes"]) for b in report.buckets] == [("float16", 660), ("float16", 4160)]
    assert report.record("fp16_allreduce").summary == "2 buckets cross ranks in float16 (4.7 KiB per step, half of float32)"


def test_on_gpu_hierarchical_stages_carry_float16_too():
    main, _ = compile_fp16(GPU_32, use_hierarchical_allreduce=True)
    assert {dtype for _, _, dtype in collectives(main)} == {"float16"}
    assert [name for name, _, _ in collectives(main)][:3] == ["reduce_scatter", "all_reduce_", "all_gather"]


def test_on_cpu_the_float16_sum_is_widened_for_gloo_and_the_report_says_no_bytes_are_saved():
    main, report = compile_fp16(CPU_2)
    assert collectives(main) == [("all_reduce_", 0, "float32")] * 2
    invariants.check_gloo(main.global_block())
    casts = [str(op.result(0).dtype).split(".")[-1] for op in main.global_block().ops if op.name() == "pd_op.cast"
             and program_edit.provenance(op) in ("fp16_allreduce", "gloo_lowering")]
    assert casts == ["float16", "float32", "float16", "float32"] * 2        # rounded as on GPU, summed in float32
    assert report.record("fp16_allreduce").summary.endswith("on gloo the sum runs in float32: no bytes saved")


NUMERICS_SCENARIOS = {"fp16_wire": {"model": "mlp", "strategy": {"fp16_allreduce": True, "fuse_all_reduce_ops": False},
                                    "optimizer": "sgd", "batch_norm_over": "shard"}}


@pytest.fixture(scope="module")
def trained(numerics):
    oracle, ranks = numerics
    return oracle["fp16_wire"], [rank["fp16_wire"] for rank in ranks]


def float16_sum(*buckets):
    """What the CPU program computes: each bucket rounded to float16, summed in float32, rounded again."""
    widened = [np.asarray(b, np.float32).astype(np.float16).astype(np.float32) for b in buckets]
    return np.sum(widened, axis=0, dtype=np.float32).astype(np.float16).astype(np.float32)


def test_two_ranks_reduce_exactly_the_float16_sum_of_float16_gradients(trained):
    _, ranks = trained
    for step in range(len(ranks[0]["losses"])):
        for bucket, (name,) in enumerate(ranks[0]["buckets"]):
            expected = float16_sum(*(rank["local"][step][bucket] for rank in ranks)) / 2
            unrounded = np.sum([rank["local"][step][bucket] for rank in ranks], axis=0, dtype=np.float32) / 2
            for rank in ranks:
                got = np.asarray(rank["synced"][step][name], np.float32)
                np.testing.assert_array_equal(got, expected, err_msg=f"step {step}, {name}")
            assert not np.array_equal(expected, unrounded)                 # the rounding is really there


def test_parameters_stay_within_float16_rounding_of_one_float32_process(trained):
    oracle, ranks = trained
    gap = max(np.abs(np.array(rank["params"][-1][name]) - np.array(values)).max()
              for rank in ranks for name, values in oracle["params"][-1].items())
    assert 1e-6 < gap < ROUNDING_BOUND
