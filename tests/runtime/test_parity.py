"""Oracle tests: N real processes over gloo train exactly like one process on the full batch.

Every strategy below runs on 2 ranks (one node) and on 4 ranks (2 nodes x 2, so hierarchical
all-reduce runs its intra/inter stages through the gloo lowering), for the digits MLP and a
small conv net with batch norm. Per step, the mean of the ranks' losses must equal the
one-process loss, and every rank's final parameters must equal the one-process parameters,
to 1e-5. Ranks start from different seeds: only the startup broadcast makes them agree.
Each job runs all strategies in one process per rank (see workers/parity_worker.py).
"""
import json
from pathlib import Path

import numpy as np
import pytest

from support.multiprocess import run_with_oracles
from support.models import MODELS

WORKER = Path(__file__).resolve().parents[1] / "workers" / "parity_worker.py"
LAST_BUCKET_OFF = {"last_comm_group_size_MB": 0}
STRATEGIES = {
    "plain": {"fuse_all_reduce_ops": False},
    "bucket_per_gradient": {"fuse_grad_size_in_MB": 0},
    "fused_16MB": {"fuse_grad_size_in_MB": 16},
    "one_bucket": {"fuse_grad_size_in_MB": 1024, "fuse_grad_size_in_TFLOPS": 0, **LAST_BUCKET_OFF},
    "two_per_bucket": {"fuse_grad_size_in_TFLOPS": 2, **LAST_BUCKET_OFF},
    "two_rings": {"nccl_comm_num": 2, "fuse_grad_size_in_TFLOPS": 2, **LAST_BUCKET_OFF},
    "hierarchical": {"use_hierarchical_allreduce": True, "fuse_all_reduce_ops": False},
    "hierarchical_two_rings_fused": {"use_hierarchical_allreduce": True, "nccl_comm_num": 2,
                                     "fuse_grad_size_in_TFLOPS": 2, **LAST_BUCKET_OFF},
}
WRONG_SCALE = {"sum_not_mean": {"gradient_scale_configs": {"scale_strategy": "sum"}}}
JOBS = {2: 1, 4: 2}   # world size: nodes
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def results():
    """{world: (one-process results, [results of each rank])}, each job run once."""
    strategies = json.dumps({**STRATEGIES, **WRONG_SCALE})
    # all four jobs side by side, done before pytest-timeout's 300 s
    return run_with_oracles(WORKER, JOBS, lambda world: [world, strategies], timeout=280)


@pytest.mark.parametrize("model", MODELS)
@pytest.mark.parametrize("name", STRATEGIES)
@pytest.mark.parametrize("world", JOBS)
def test_n_ranks_train_like_one_process_on_the_full_batch(results, world, name, model):
    oracle, ranks = results[world]
    expected = oracle[f"{model}/{name}"]
    for rank, result in enumerate(ranks):
        got = result[f"{model}/{name}"]
        for param, values in expected["params"].items():
            np.testing.assert_allclose(got["params"][param], values, rtol=0, atol=TOLERANCE,
                                       err_msg=f"rank {rank} of {world}, parameter {param}")
    mean_loss = np.mean([result[f"{model}/{name}"]["losses"] for result in ranks], axis=0)
    np.testing.assert_allclose(mean_loss, expected["losses"], rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("world", JOBS)
def test_the_requested_passes_really_ran(results, world):
    ran = {name: results[world][1][0][f"mlp/{name}"] for name in STRATEGIES}
    assert ran["two_per_bucket"]["buckets"] == 2 and ran["one_bucket"]["buckets"] == 1
    assert ran["bucket_per_gradient"]["buckets"] == 4
    assert "nccl_comm_num" in ran["two_rings"]["applied"]
    hierarchical = ran["hierarchical_two_rings_fused"]
    if world == 4:
        assert {"use_hierarchical_allreduce", "gloo_lowering"} <= set(hierarchical["applied"])
    else:
        assert hierarchical["skipped"]["use_hierarchical_allreduce"].startswith("the intra group is the whole world")


@pytest.mark.parametrize("world", JOBS)
def test_the_oracle_notices_a_wrong_gradient_scale(results, world):
    """Summing without dividing by N must not pass for parity (the comparison has teeth)."""
    oracle, ranks = results[world]
    expected, got = oracle["mlp/sum_not_mean"], ranks[0]["mlp/sum_not_mean"]
    gap = max(np.abs(np.array(got["params"][p]) - np.array(v)).max() for p, v in expected["params"].items())
    assert gap > 100 * TOLERANCE
