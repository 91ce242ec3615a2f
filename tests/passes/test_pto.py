"""pto: the sharded optimizer update trains like one process, holds 1/N of the optimizer state,
checkpoints to one directory any world size resumes from, and builds the exact program.

One job per world size runs every configuration of workers/pto_worker.py (optimizers with
weight decay, global-norm clipping, an LR schedule, gradient merge, merged Adam, round-robin
parts, one parameter larger than the rest together — the MLP's first weight — and fewer
parameters than ranks), against one process on the full batch.
"""
import json
from pathlib import Path

import numpy as np
import pytest

from support.multiprocess import run_job
from workers.pto_worker import CONFIGS

WORKER = Path(__file__).resolve().parents[1] / "workers" / "pto_worker.py"
TOLERANCE = 1e-5
WORLDS = (2, 4)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """{world: [each rank's results]}, and 1 for the one-process oracle."""
    checkpoint = tmp_path_factory.mktemp("pto") / "checkpoint"
    runs = {2: run_job(WORKER, 2, args=[2, checkpoint], timeout=240)}
    runs[1] = run_job(WORKER, 1, args=[2, checkpoint], timeout=240)
    runs[4] = run_job(WORKER, 4, 2, args=[4, checkpoint], timeout=300)
    return runs


@pytest.mark.parametrize("config", CONFIGS)
@pytest.mark.parametrize("world", WORLDS)
def test_pto_trains_like_one_process_on_the_full_batch(results, world, config):
    expected = results[1][0][config]
    for rank, result in enumerate(results[world]):
        got = result[config]
        assert "pto" in got["applied"], got["applied"]
        for param, values in expected["params"].items():
            np.testing.assert_allclose(got["params"][param], values, rtol=0, atol=TOLERANCE,
                                       err_msg=f"rank {rank} of {world}, parameter {param}")
    mean_loss = np.mean([result[config]["losses"] for result in results[world]], axis=0)
    np.testing.assert_allclose(mean_loss, expected["losses"], rtol=0, atol=TOLERANCE)


@pytest.mark.parametrize("world", WORLDS)
def test_each_rank_holds_at_most_its_share_of_the_optimizer_state(results, world):
    """Measured from each rank's scope: <= 1/N of the unsharded state + the largest parameter's."""
    for config in ("adam", "momentum", "adamw_clip", "adam_fewer_parameters_than_ranks"):
        oracle = results[1][0][config]
        per_param = {p: sum(oracle["held"][n] for n in names) for p, names in oracle["accumulators"].items()}
        unsharded, largest = sum(per_param.values()), max(per_param.values())
        names = {n for names in oracle["accumulators"].values() for n in names}
        held = [sum(b for n, b in result[config]["held"].items() if n in names) for result in results[world]]
        assert sum(held) == unsharded, (config, held, unsharded)       # every part held exactly once
        assert max(held) <= unsharded / world + largest, (config, held, unsharded, largest)
        assert held == results[world][0][config]["pto"]["state_bytes_per_rank"]


def test_fewer_parameters_than_ranks_leaves_ranks_without_state(results):
    held = [result["adam_fewer_parameters_than_ranks"]["pto"]["state_bytes_per_rank"] for result in results[4]]
    assert sorted(held[0]).count(0) == 2


def test_a_checkpoint_saved_at_world_2_resumes_identically_at_world_2_and_at_world_1(results):
    continued = [rank["continued"] for rank in results[2]]
    assert continued[0]["params"] == continued[1]["params"]
    for resumed in [rank["resumed"] for rank in results[2]] + [results[1][0]["resumed"]]:
        for param, values in continued[0]["params"].items():
            np.testing.assert_allclose(resumed["params"][param], values, rtol=0, atol=TOLERANCE, err_msg=param)
    world_2_losses = np.mean([c["losses"] for c in continued], axis=0)
    np.testing.assert_allclose(np.mean([rank["resumed"]["losses"] for rank in results[2]], axis=0),
                               world_2_losses, rtol=0, atol=TOLERANCE)
    np.testing.assert_allclose(results[1][0]["resumed"]["losses"], world_2_losses, rtol=0, atol=TOLERANCE)
    assert {f for f in continued[0]["files"] if "moment" in f} == {
        f"{p}_moment{i}_0" for p in continued[0]["params"] for i in (1, 2)}   # every part, in one directory
