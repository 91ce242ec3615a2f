"""localsgd and adaptive_localsgd: no gradient all-reduce; the parameters are averaged after the
update on Fleet's schedule (docs/knobs/localsgd.md, docs/knobs/adaptive_localsgd.md).

Parity: one fleetrun job of 2 ranks runs workers/localsgd_worker.py (rank r feeds rows r::2 of
each step); rank 0 also runs the oracle, 2 copies of Paddle's plain program averaged on the steps
Fleet's rule picks (support/local_sgd.py). Every step's losses and parameters of each rank must
equal its copy's to 1e-5; the ranks agree right after a sync and differ between syncs. The
adaptive k the program holds after each step must equal Fleet's formula in plain Python on the
program's own losses. Structure and refusals run in this process.
"""
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import paddle
import pytest

from fleetlite import CompileError, DistributedStrategy, StrategyConflictError, Topology
from fleetlite.compile import program_edit
from support import in_process, local_sgd
from support.multiprocess import clean_environment
from workers import localsgd_worker

WORKER = Path(__file__).resolve().parents[1] / "workers" / "localsgd_worker.py"
TOLERANCE, AGREE = 1e-5, 1e-6
CPU_2 = Topology.grid(2)
LOCALSGD = {"localsgd": True, "localsgd_configs": {"k_steps": 4, "begin_step": 3}}
ADAPTIVE = {"adaptive_localsgd": True, "adaptive_localsgd_configs": {"init_k_steps": 3}}


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("localsgd")
    run = subprocess.run([sys.executable, "-m", "fleetlite.cli", "run", "--nproc_per_node", "2",
                          "--log_dir", str(out / "log"), str(WORKER), str(out)],
                         cwd=out, env=clean_environment(), capture_output=True, text=True, timeout=150)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return [json.loads((out / f"result.{rank}.json").read_text()) for rank in range(2)]


@pytest.mark.parametrize("case", localsgd_worker.CASES)
def test_two_ranks_through_fleetrun_equal_the_one_process_simulation_of_n_copies(ranks, case):
    results, oracle = [result[case] for result in ranks], ranks[0][case]["oracle"]
    for rank, result in enumerate(results):
        assert case in result["applied"] and "data_parallel" not in result["applied"]
        np.testing.assert_allclose(result["losses"], [losses[rank] for losses in oracle["losses"]], rtol=0,
                                   atol=TOLERANCE, err_msg=f"rank {rank}")
        for step, (params, copies) in enumerate(zip(result["params"], oracle["params"]), start=1):
            np.testing.assert_allclose(params, copies[rank], rtol=0, atol=TOLERANCE, err_msg=f"rank {rank} step {step}")
    assert np.abs(np.array(results[0]["params"][-1]) - results[0]["params"][0]).max() > 0.01, "barely trained"


@pytest.mark.parametrize("case", localsgd_worker.CASES)
def test_ranks_agree_right_after_a_sync_and_differ_between_syncs(ranks, case):
    syncs = ranks[0][case]["oracle"]["syncs"]
    assert 2 <= sum(syncs) < len(syncs) - 2, f"the schedule {syncs} shows neither local steps nor syncs"
    for step, synced in enumerate(syncs):
        gap = np.abs(np.array(ranks[0][case]["params"][step]) - ranks[1][case]["params"][step]).max()
        if synced:
            assert gap <= AGREE, f"step {step + 1}: a sync left the ranks {gap} apart"
        else:
            assert gap > 1e-3, f"step {step + 1}: the ranks agree ({gap}) without a sync: gradients crossed ranks?"


def test_localsgd_syncs_on_fleets_steps(ranks):
    syncs = ranks[0]["localsgd"]["oracle"]["syncs"]          # k_steps 3, begin_step 2
    assert [step for step, synced in enumerate(syncs, start=1) if synced] == [1, 2, 5, 8]


def test_adaptive_k_follows_fleets_formula_on_the_programs_losses(ranks):
    configs = localsgd_worker.CASES["adaptive_localsgd"][1]["adaptive_localsgd_configs"]
    schedule = local_sgd.FleetSchedule(1, configs["init_k_steps"], adaptive=True)
    losses = zip(*(result["adaptive_localsgd"]["losses"] for result in ranks))
    expected_k, syncs = [], []
    for step, step_losses in enumerate(losses, start=1):
        syncs.append(schedule.sync(step, local_sgd.mean_loss(step_losses), localsgd_worker.LR))
        expected_k.append(schedule.k)
    for result in ranks:
        assert result["adaptive_localsgd"]["k"] == expected_k
    assert syncs == ranks[0]["adaptive_localsgd"]["oracle"]["syncs"]
    assert syncs[:5] == [True, False, False, False, True]    # steps 1 and 1 + init_k_steps
    assert len(set(expected_k)) > 1, f"k never changed ({expected_k}): the formula went untested"


def test_fleets_formula_shrinks_k_as_the_loss_falls_and_grows_it_as_the_learning_rate_decays():
    schedule = local_sgd.FleetSchedule(1, 4, adaptive=True)
    assert schedule.sync(1, 2.0, 0.1)                         # loss_0 2.0, lr_0 0.1
    assert [schedule.sync(step, 2.0, 0.1) for step in (2, 3, 4, 5)] == [False, False, False, True]
    assert schedule.k == 2                                    # ceil(sqrt(1 * 1 * 4))
    assert [schedule.sync(step, 0.5, 0.1) for step in (6, 7)] == [False, True]
    assert schedule.k == 1                                    # ceil(sqrt(0.25 * 4))
    assert schedule.sync(8, 2.0, 0.001)
    assert schedule.k == 16                                   # ceil(sqrt(100 * 4)) = 20, clamped


def compiled(fields, make_optimizer=lambda: paddle.optimizer.Momentum(0.1, momentum=0.9), topology=CPU_2):
    main, _, built = in_process.compile_only(in_process.strategy(**fields), topology, make_optimizer)
    return main, built.report


@pytest.mark.parametrize("fields", [LOCALSGD, ADAPTIVE], ids=["localsgd", "adaptive_localsgd"])
def test_the_program_has_no_gradient_all_reduce_and_one_conditional_parameter_average(fields):
    main, report = compiled(fields)
    name = next(iter(fields))
    everywhere = list(program_edit.walk(main.global_block()))
    collectives = [op for op in everywhere if op.name().startswith("pd_op.all_reduce")]
    assert all(program_edit.provenance(op) == name for op in collectives)
    branch = [op for op in main.global_block().ops if op.name() == "pd_op.if"]
    assert len(branch) == 1 and program_edit.provenance(branch[0]) == name
    inside = [op.name() for block in branch[0].blocks() for op in program_edit.walk(block)]
    assert inside.count("pd_op.all_reduce_") == 1                       # every float32 difference in one buffer
    assert inside.count("pd_op.all_reduce") == (1 if name == "adaptive_localsgd" else 0)   # the loss
    ops = [op.name() for op in main.global_block().ops]
    assert ops.index("pd_op.if") > max(i for i, op in enumerate(ops) if op == "pd_op.momentum_")   # after the update
    snapshots = sorted(v.name for v in main.list_vars() if v.persistable and v.name.endswith("@SNAPSHOT"))
    assert snapshots == ["linear_0.b_0@SNAPSHOT", "linear_0.w_0@SNAPSHOT", "linear_1.b_0@SNAPSHOT",
                         "linear_1.w_0@SNAPSHOT"]
    assert report.record("data_parallel").status == "skipped"
    assert report.record("fuse_all_reduce_ops").status == "skipped"
    assert report.record(name).details["bytes_per_sync"] == 4 * (64 * 32 + 32 + 32 * 10 + 10)


def test_one_rank_skips_local_sgd_with_a_reason():
    _, report = compiled(LOCALSGD, topology=Topology.grid(1))
    assert report.record("localsgd").reason == "one rank: there is nothing to average"


@pytest.mark.parametrize("fields", [LOCALSGD, ADAPTIVE], ids=["localsgd", "adaptive_localsgd"])
def test_another_optimizer_than_sgd_or_momentum_is_an_error_naming_the_fix(fields):
    with pytest.raises(CompileError) as info:
        compiled(fields, lambda: paddle.optimizer.Adam(0.01))
    name = next(iter(fields))
    assert (f"{name} works with the SGD or Momentum optimizer only, and this one is Adam; train with "
            f"paddle.optimizer.SGD(...) or paddle.optimizer.Momentum(...), or turn {name} off") in str(info.value)


CONFLICTS = {"gradient_merge": "Fleet's LocalSGD wraps only AMP", "dgc": "dgc compresses the gradient all-reduce",
             "topk": "top-k compresses the gradient exchange", "pto": "pto updates 1/N of the parameters",
             "lars": "never LARS", "lamb": "never LAMB"}


@pytest.mark.parametrize("knob, other, words", [
    ("localsgd", "adaptive_localsgd", "both set the local SGD period"),
    *((knob, other, words) for knob in ("localsgd", "adaptive_localsgd") for other, words in CONFLICTS.items())])
def test_fleets_conflicts_are_named_errors_at_validate(knob, other, words):
    s = DistributedStrategy()
    setattr(s, knob, True)
    setattr(s, other, True)
    with pytest.raises(StrategyConflictError) as info:
        s.validate()
    message = str(info.value)
    assert f"'{knob}'" in message and f"'{other}'" in message and "cannot be used together" in message
    assert words in message
