"""Fleet's eager loop with paddle.nn.SyncBatchNorm and with fleet.distributed_scaler (docs/dygraph.md).

One fleetrun job of 2 ranks runs workers/eager_norm_scaler_worker.py (rank r feeds rows r::2);
each rank trains beside a plain-Paddle reference on the full batch in one process:
- SyncBatchNorm (after convert_sync_batchnorm) trains on CPU over fleetlite's process group like
  BatchNorm2D on the full batch: losses, parameters and running statistics, eval output to 1e-5;
  the unconverted net misses it (the control);
- AMP with distributed_scaler trains like one process; an inf on one rank only makes every rank
  skip that step, with equal parameters and equal, lowered loss scales; without the vote the
  ranks part (the control); the literal CPU script (bfloat16 auto_cast) trains in fp32 at parity.
"""
import json
import re

import paddle
import pytest

import fleetlite as fleet
from fleetlite import api
from fleetlite.errors import FleetliteError
from fleetlite.runtime import eager_sync_batch_norm
from fleetlite.runtime.eager_sync_batch_norm import ProcessGroupSyncBatchNorm
from fleetlite.topology.topology import Topology
from support import models
from support.accelerator_scaler import grad_scaler_as_on_a_gpu
from support.eager_parity import assert_ranks_train_like_the_reference
from support.multiprocess import fleetrun
from workers import eager_norm_scaler_worker as worker

WORKER = worker.__file__
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("eager_norm_scaler")
    run = fleetrun(["--nproc_per_node", "2", "--log_dir", str(out / "log"), WORKER, str(out)], cwd=out, timeout=150)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [json.loads((out / f"result.{rank}.json").read_text()) for rank in range(2)]


def test_sync_batch_norm_trains_on_cpu_like_batch_norm_over_the_full_batch(ranks):
    results = [rank["sync_batch_norm"] for rank in ranks]
    assert results[0]["norm_class"] == "ProcessGroupSyncBatchNorm"
    assert_ranks_train_like_the_reference(results, TOLERANCE)
    assert results[0]["state_names"] == results[0]["reference_state_names"]   # state_dict keys unchanged
    assert {"norm._mean", "norm._variance"} <= set(results[0]["state_names"])  # running statistics compared


def test_without_it_per_shard_statistics_miss_the_full_batch(ranks):
    assert min(rank["per_shard"]["param_diff"] for rank in ranks) > 100 * TOLERANCE


def test_amp_with_distributed_scaler_trains_like_one_process(ranks):
    results = [rank["amp"] for rank in ranks]
    assert_ranks_train_like_the_reference(results, TOLERANCE)
    assert [rank["scale"] for rank in results] == [results[0]["reference_scale"]] * 2 == [4096.0] * 2


@pytest.mark.parametrize("where", ["input", "gradient"])
def test_an_inf_on_one_rank_makes_every_rank_skip_that_step(ranks, where):
    results = [rank[f"inf_in_{where}"] for rank in ranks]
    for result in results:
        assert result["moved"] == [True, False, True]            # step 1 skipped, the others trained
        assert result["scales"] == [1024.0, 512.0, 512.0]        # lowered once, alike
    assert results[0]["digests"] == results[1]["digests"]        # equal parameters after every step


def test_without_the_vote_the_rank_with_the_inf_skips_alone(ranks):
    first, last = (rank["inf_in_gradient_without_vote"] for rank in ranks)
    assert first["moved"][1] and not last["moved"][1]
    assert first["scales"][1] != last["scales"][1] and first["digests"][1] != last["digests"][1]


def test_the_cpu_script_asking_for_bfloat16_trains_in_fp32_at_parity(ranks):
    results = [rank["bf16_script"] for rank in ranks]
    assert_ranks_train_like_the_reference(results, TOLERANCE)
    for result in results:      # Paddle 3.3.1 switches eager AMP off on CPU places, bf16 support or not
        assert (result["scaler_enabled"], result["output_dtype"]) == (False, "paddle.float32")


@pytest.fixture()
def one_rank(monkeypatch):
    """fleet.init of a one-rank job (undone after the test)."""
    monkeypatch.setattr(api, "_job", None)
    monkeypatch.setattr(api, "_optimizer", None)
    fleet.init(is_collective=True)


def normalised_input_net():
    """Batch norm on the input itself (no gradient) and one without scale and bias."""
    return paddle.nn.Sequential(paddle.nn.BatchNorm1D(64), paddle.nn.Linear(64, 16),
                                paddle.nn.BatchNorm1D(16, weight_attr=False, bias_attr=False), paddle.nn.ReLU(),
                                paddle.nn.Linear(16, 10))


@pytest.mark.parametrize("make_model", [models.ConvBn, normalised_input_net])
def test_on_one_rank_sync_batch_norm_trains_like_batch_norm_and_keeps_its_parameters(one_rank, make_model):
    x, y = models.digits(16)
    trained = []
    for convert in (False, True):
        with paddle.utils.unique_name.guard():
            paddle.seed(5)
            model = make_model()
            if convert:
                converted = paddle.nn.SyncBatchNorm.convert_sync_batchnorm(model)
                parameters = [id(p) for p in converted.parameters()]
                model = fleet.distributed_model(converted)
                assert {type(layer) for layer in model.sublayers() if "Norm" in type(layer).__name__} == {
                    ProcessGroupSyncBatchNorm}
                assert [id(p) for p in model.parameters()] == parameters
            worker.train(model, worker.momentum(model), x, y, 2)
            trained.append(worker.state(model))
    assert worker.gap(trained[1], trained[0]) <= TOLERANCE


def test_on_a_gpu_paddles_own_sync_batch_norm_stays():
    with paddle.utils.unique_name.guard():
        model = paddle.nn.SyncBatchNorm.convert_sync_batchnorm(models.ConvBn())
    assert type(eager_sync_batch_norm.swap(model, Topology.grid(2, device="gpu")).norm) is paddle.nn.SyncBatchNorm


def test_distributed_scaler_takes_a_grad_scaler_only(one_rank):
    scaler = grad_scaler_as_on_a_gpu()
    assert fleet.distributed_scaler(scaler) is scaler
    with pytest.raises(FleetliteError, match=re.escape(
            "fleet.distributed_scaler takes a paddle.amp.GradScaler, got a builtins.float: pass the scaler "
            "you call scaler.scale(loss) on")):
        fleet.distributed_scaler(1024.0)
