"""sync_batch_norm: batch norm over the global batch. The rewrite replaces batch_norm_ and its
gradient with plain ops around one all-reduce each way; 2 real ranks then train exactly like one
process whose batch norm sees the whole batch (losses, parameters and running statistics to
1e-5), which plain data parallelism does not (the control).
"""

import numpy as np
import pytest

from fleetlite import DistributedStrategy, Topology
from fleetlite.compile import program_edit
from support.models import compiled_program

TOLERANCE = 1e-5


def compile_sync_bn(topology, model="convbn"):
    strategy = DistributedStrategy()
    strategy.sync_batch_norm = True
    main, _, built = compiled_program(strategy, topology, model)
    return main, built.report


@pytest.mark.parametrize("device", ["cpu", "gpu"])
def test_batch_norm_and_its_gradient_become_plain_ops_around_one_all_reduce_each_way(device):
    main, report = compile_sync_bn(Topology.grid(2, device=device))
    names = [op.name() for op in main.global_block().ops]
    assert "pd_op.batch_norm_" not in names and "pd_op.batch_norm_grad" not in names
    mine = program_edit.created_by(main.global_block(), "sync_batch_norm")
    sums = [op for op in mine if op.name() == "pd_op.all_reduce_"]
    assert [(op.attrs()["ring_id"], op.attrs()["reduce_type"]) for op in sums] == [(0, 0), (0, 0)]
    assert sums[0].operand_source(0).shape == [2 * 4 + 1]      # per channel sum and sum of squares, and the count
    assert sums[1].operand_source(0).shape == [2 * 4]          # per channel sums of dy and dy * x^
    assert names.index("pd_op.all_reduce_") < names.index("pd_op.relu") < names.index("pd_op.relu_grad")
    assert [op.name() for op in mine].count("pd_op.assign_out_") == 2    # running mean and variance, in place
    assert report.record("sync_batch_norm").summary == "1 batch norms use global statistics (2 all-reduces each on ring 0)"


def test_the_scale_and_bias_gradients_are_this_ranks_sums_reduced_once_by_data_parallel():
    main, report = compile_sync_bn(Topology.grid(2))
    bucket = report.buckets[0]["gradients"]
    assert {"batch_norm2d_0.w_0", "batch_norm2d_0.b_0"} <= set(bucket)
    reductions = [op for op in main.global_block().ops if op.name() == "pd_op.all_reduce_"
                  and program_edit.provenance(op) != "sync_batch_norm"]
    assert len(reductions) == 1     # one fused bucket: the invariants saw every gradient reduced once


@pytest.mark.parametrize("topology, model, reason", [
    (Topology.grid(1), "convbn", "one rank: its batch is the global batch"),
    (Topology.grid(2), "mlp", "the program has no batch_norm in training mode"),
])
def test_nothing_to_synchronise_is_reported(topology, model, reason):
    _, report = compile_sync_bn(topology, model)
    assert report.record("sync_batch_norm").reason == reason


NUMERICS_SCENARIOS = {name: {"model": "convbn", "strategy": {"sync_batch_norm": sync}, "optimizer": "momentum",
                             "batch_norm_over": "global"} for name, sync in (("synced", True), ("per_shard", False))}


@pytest.fixture(scope="module")
def trained(numerics):
    return numerics


def largest_gap(oracle, ranks, name):
    return max(np.abs(np.array(rank[name]["params"][step][param]) - np.array(values)).max()
               for rank in ranks for step, snapshot in enumerate(oracle[name]["params"])
               for param, values in snapshot.items())


def test_two_ranks_train_like_one_process_with_batch_norm_over_the_full_batch(trained):
    oracle, ranks = trained
    assert "sync_batch_norm" in ranks[0]["synced"]["applied"]
    assert {"batch_norm2d_0.w_1", "batch_norm2d_0.w_2"} <= set(oracle["synced"]["params"][-1])   # running stats
    assert largest_gap(oracle, ranks, "synced") < TOLERANCE
    mean_loss = np.mean([rank["synced"]["losses"] for rank in ranks], axis=0)
    np.testing.assert_allclose(mean_loss, oracle["synced"]["losses"], rtol=0, atol=TOLERANCE)


def test_without_it_per_shard_statistics_miss_the_full_batch_oracle(trained):
    oracle, ranks = trained
    assert largest_gap(oracle, ranks, "per_shard") > 100 * TOLERANCE
