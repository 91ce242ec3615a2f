"""Paddle's own ways of reading a trained program's state work on fleetlite's compiled program
at world 2 through fleetrun, for several strategies (launcher_scripts/save_compiled_programs.py):
listing the persistable values by name (the copy-free buckets once left unnamed ones there),
finding them in the scope, `program.state_dict()`, `paddle.static.save/load`,
`paddle.static.save_inference_model`, `fleet.save_persistables` + `fleet.load_model`.
"""
import json
import subprocess
import sys

import pytest

from support.multiprocess import SCRIPTS, clean_environment

STRATEGIES = ("default", "gradient_merge", "pto", "topk")
PARAMETERS = {"linear_0.w_0", "linear_0.b_0", "linear_1.w_0", "linear_1.b_0"}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    folder = tmp_path_factory.mktemp("save_compiled")
    run = subprocess.run([sys.executable, "-m", "fleetlite.launcher", "--nproc_per_node", "2", "--job_id", "saving",
                          f"{SCRIPTS}/save_compiled_programs.py", str(folder / "out")],
                         cwd=folder, env=clean_environment(), capture_output=True, text=True, timeout=150)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [json.loads((folder / "out" / f"result.{rank}.json").read_text()) for rank in (0, 1)]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_every_persistable_value_is_named_and_in_the_scope(ranks, strategy):
    for rank in ranks:
        assert rank[strategy]["problems"] == []
        assert PARAMETERS <= set(rank[strategy]["names"]) and PARAMETERS <= set(rank[strategy]["state_dict"])


def test_the_copy_free_buckets_gradients_are_named_like_paddles(ranks):
    assert {f"{name}@GRAD" for name in PARAMETERS} <= set(ranks[0]["default"]["names"])


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_paddles_save_and_load_and_fleets_restore_the_trained_parameters(ranks, strategy):
    for rank in ranks:
        assert rank[strategy]["static_load_restores"] and rank[strategy]["fleet_load_restores"]
    assert ranks[0][strategy]["inference"] == ranks[1][strategy]["inference"]


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_fleets_checkpoint_holds_training_state_only(ranks, strategy):
    files = ranks[0][strategy]["fleet_files"]
    assert PARAMETERS <= set(files) and "learning_rate_0" in files
    assert not [name for name in files if name.endswith("@GRAD") or name.startswith("fleetlite_bucket_buffer")]
