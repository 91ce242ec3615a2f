"""fleet.train_step trains eager models through the compiled program, and Fleet's eager loop
trains data parallel through fleet.distributed_model (docs/dygraph.md).

Parity: one fleetrun job of 2 ranks (rank r feeds rows r::2) and one of 1 process run every
case of workers/dygraph_worker.py; each rank trains beside a plain-Paddle eager reference on the
full batch from rank 0's initial values, and the mean of the ranks' losses, every rank's eager
parameters and buffers (batch-norm statistics included) and its eager eval output must equal the
reference to 1e-5. Resume: 3 steps, paddle.save of model and optimizer, load into fresh objects,
3 steps equals 6 uninterrupted steps. The eager-loop cases (loss.backward(); opt.step()) are
held to the same reference. Most refusals run in this process (one rank).
"""
import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest

import fleetlite as fleet
from fleetlite import api
from fleetlite.topology.env_contract import EXPLAIN_ONLY
from fleetlite.errors import DygraphError, ScriptDone
from fleetlite.runtime import eager_data_parallel
from support.eager_parity import assert_ranks_train_like_the_reference
from support.multiprocess import clean_environment
from support import models
from workers import dygraph_worker

WORKER = Path(__file__).resolve().parents[1] / "workers" / "dygraph_worker.py"
TOLERANCE = 1e-5
WORLDS = (1, 2)


@pytest.fixture(scope="module")
def jobs(tmp_path_factory):
    """{world: [each rank's result]} of one fleetrun job per world size."""
    results = {}
    for world in WORLDS:
        out = tmp_path_factory.mktemp(f"dygraph{world}")
        run = subprocess.run([sys.executable, "-m", "fleetlite.cli", "run", "--nproc_per_node", str(world),
                              "--log_dir", str(out / "log"), str(WORKER), str(out)],
                             cwd=out, env=clean_environment(), capture_output=True, text=True, timeout=200)
        assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
        results[world] = [json.loads((out / f"result.{rank}.json").read_text()) for rank in range(world)]
    return results


@pytest.mark.parametrize("case", dygraph_worker.CASES)
@pytest.mark.parametrize("world", WORLDS)
def test_train_step_trains_like_eager_paddle_on_the_full_batch(jobs, world, case):
    assert_ranks_train_like_the_reference([result[case] for result in jobs[world]], TOLERANCE)


def test_the_batch_norm_statistics_are_part_of_the_compared_state(jobs):
    names = jobs[2][0]["convbn_sync_batch_norm"]["state_names"]
    assert "norm._mean" in names and "norm._variance" in names


@pytest.mark.parametrize("world", WORLDS)
def test_resuming_from_paddle_save_equals_training_straight_through(jobs, world):
    for rank, result in enumerate(jobs[world]):
        resumed = result["resume"]
        np.testing.assert_allclose(resumed["losses"], resumed["straight_losses"], rtol=0, atol=TOLERANCE)
        assert resumed["param_diff"] <= TOLERANCE, f"rank {rank}"
        assert result["dynamic_mode"] is True


@pytest.mark.parametrize("case", dygraph_worker.COMPRESSED)
def test_compressed_exchanges_train_through_train_step_and_the_ranks_agree(jobs, case):
    ranks = [result[case] for result in jobs[2]]
    assert case in ranks[0]["applied"]
    assert np.mean([rank["losses"][-1] for rank in ranks]) < np.mean([rank["losses"][0] for rank in ranks]) - 0.1
    assert len({rank["digest"] for rank in ranks}) == 1, "the ranks' eager models differ"


def test_the_eager_loop_reduces_in_buckets_of_the_strategys_fusion_size(jobs):
    assert jobs[2][0]["eager_loop"]["comm_buffer_size"] == 32 * 1024 * 1024
    for result in jobs[2]:
        assert result["other_fusion_size"] == (
            "fleet.distributed_model built paddle.DataParallel with fuse_grad_size_in_MB=32 (fleet.init's strategy) "
            "but the optimizer's strategy has 0: pass the strategy to fleet.init(strategy=...) so both use it")
    assert jobs[1][0]["eager_loop"]["comm_buffer_size"] is None        # one rank: the model itself


def test_an_eager_step_on_a_model_nothing_wraps_is_refused_on_two_ranks(jobs):
    for result in jobs[2]:
        assert re.fullmatch(
            r"opt.step\(\) on 2 ranks would train unsynchronised copies: the value of linear_[01]\.[wb]_0 differs "
            r"between the ranks; wrap the model before training with model = fleet.distributed_model\(model\) "
            r"\(or paddle.DataParallel\(model\)\) and call the wrapper, or train with step = "
            r"fleet.train_step\(model, loss_fn, opt\) \(docs/dygraph.md\)", result["unwrapped_eager_step"])
    assert jobs[1][0]["unwrapped_eager_step"] is None          # one rank: nothing to synchronise


@pytest.fixture()
def one_rank(monkeypatch):
    """An Mlp and 8 digits, after fleet.init of a one-rank job (undone after the test)."""
    monkeypatch.setattr(api, "_job", None)
    monkeypatch.setattr(api, "_optimizer", None)
    fleet.init(is_collective=True)
    paddle.seed(1)
    model = fleet.distributed_model(models.Mlp())
    x, y = models.digits(8)
    return model, x, y


def test_a_batch_of_another_size_runs_and_another_feature_shape_is_refused(one_rank):
    model, x, y = one_rank
    step = fleet.train_step(model, dygraph_worker.loss_fn, paddle.optimizer.SGD(0.1, parameters=model.parameters()))
    step(x, y)
    assert np.isfinite(float(step(x[:3], y[:3])))                 # a short last batch: same program
    with pytest.raises(DygraphError, match=r"compiled for inputs \[batch, 64\] float32, \[batch, 1\] int64 and got "
                                           r"\[batch, 32\] float32, \[batch, 1\] int64: only the batch dimension"):
        step(x[:, :32], y)


def test_recompute_through_train_step_recomputes_the_marked_segment_and_trains_exactly_as_without(one_rank):
    _, x, y = one_rank
    trained = []
    for on in (False, True):
        paddle.seed(1)
        model = dygraph_worker.RecomputedMlp()
        strategy = fleet.DistributedStrategy()
        strategy.recompute = on
        optimizer = fleet.distributed_optimizer(paddle.optimizer.SGD(0.1, parameters=model.parameters()), strategy)
        step = fleet.train_step(model, dygraph_worker.loss_fn, optimizer)
        trained.append([float(step(x, y)) for _ in range(3)])
    record = optimizer.compile_report.record("recompute")
    assert record.details["segments"][0]["recomputed"] == ["pd_op.matmul", "pd_op.add", "pd_op.relu"]
    assert trained[0] == trained[1]


def test_parameter_groups_are_refused(one_rank):
    model, x, y = one_rank
    groups = [{"params": model.hidden.parameters(), "learning_rate": 0.1}, {"params": model.out.parameters()}]
    with pytest.raises(DygraphError, match="does not support parameter groups"):
        fleet.train_step(model, dygraph_worker.loss_fn, paddle.optimizer.SGD(0.1, parameters=groups))


def test_a_loss_that_is_not_a_scalar_is_refused(one_rank):
    model, x, y = one_rank
    def per_sample_loss(model, x, y):
        return paddle.nn.functional.cross_entropy(model(x), y, reduction="none")
    step = fleet.train_step(model, per_sample_loss, paddle.optimizer.SGD(0.1, parameters=model.parameters()))
    with pytest.raises(DygraphError, match=r"must return one scalar loss; it returned values of shape \[-1, 1\]"):
        step(x, y)


def test_static_mode_is_refused(one_rank):
    model, x, y = one_rank
    step = fleet.train_step(model, dygraph_worker.loss_fn, paddle.optimizer.SGD(0.1, parameters=model.parameters()))
    paddle.enable_static()
    with pytest.raises(DygraphError, match="runs dygraph scripts: call it in dynamic mode"):
        step(x, y)


def test_the_eager_loop_refuses_a_knob_that_needs_the_compiler(one_rank):
    model, x, y = one_rank
    strategy = fleet.DistributedStrategy()
    strategy.gradient_merge = True
    optimizer = fleet.distributed_optimizer(paddle.optimizer.SGD(0.1, parameters=model.parameters()), strategy)
    dygraph_worker.loss_fn(model, paddle.to_tensor(x), paddle.to_tensor(y)).backward()
    with pytest.raises(DygraphError, match=r"^strategy.gradient_merge needs fleetlite's compiler, which the eager "
                                           r"loop \(loss.backward\(\); opt.step\(\)\) does not run: train with "
                                           r"step = fleet.train_step\(model, loss_fn, opt\)"):
        optimizer.step()


def test_set_state_dict_after_the_first_step_is_what_trains_next(one_rank):
    model, x, y = one_rank
    initial = {name: value.numpy() for name, value in model.state_dict().items()}
    step = fleet.train_step(model, dygraph_worker.loss_fn, paddle.optimizer.SGD(0.1, parameters=model.parameters()))
    first = float(step(x, y))
    assert float(step(x, y)) < first
    model.set_state_dict(initial)
    assert float(step(x, y)) == first


def test_an_optimizer_without_parameters_is_refused(one_rank):
    model, x, y = one_rank
    optimizer = paddle.optimizer.SGD(0.1, parameters=model.parameters())
    optimizer._parameter_list = []
    with pytest.raises(DygraphError, match=r"^fleet.train_step needs an optimizer built with parameters=model.parameters\(\)$"):
        fleet.train_step(model, dygraph_worker.loss_fn, optimizer)


def test_explain_says_what_the_eager_loop_does_and_ends_the_script(one_rank, monkeypatch, capsys):
    model, x, y = one_rank
    monkeypatch.setenv(EXPLAIN_ONLY, "1")
    optimizer = fleet.distributed_optimizer(paddle.optimizer.SGD(0.1, parameters=model.parameters()))
    dygraph_worker.loss_fn(model, paddle.to_tensor(x), paddle.to_tensor(y)).backward()
    with pytest.raises(ScriptDone):       # the worker's bootstrap turns it into exit status 0
        optimizer.step()
    assert capsys.readouterr().out == eager_data_parallel.EXPLAINED + "\n"
