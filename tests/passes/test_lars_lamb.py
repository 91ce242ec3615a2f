"""lars and lamb: the inner Momentum's update becomes lars_momentum_, the inner Adam's lamb_, with
Fleet's settings and exclusion rules (docs/knobs/lars.md, docs/knobs/lamb.md).

Parity: one fleetrun job of 2 ranks runs workers/meta_optimizer_worker.py (rank r feeds rows
r::2); each rank trains beside Paddle's own program with the optimizer Fleet builds
(LarsMomentumOptimizer, Lamb) on the full batch, and every rank's parameters and the mean of the
ranks' losses must equal it to 1e-5. fleet.train_step's parity is in
tests/runtime/test_dygraph_train_step.py (cases "lars" and "lamb"). Structure and refusals run in
this process (one rank).
"""
from pathlib import Path

import numpy as np
import paddle
import pytest

from fleetlite import CompileError, DistributedStrategy, StrategyConflictError, Topology
from support import in_process
from support.meta_optimizers import fleet_optimizer
from support.rank_results import assert_ranks_equal_the_reference, run_through_fleetrun
from workers import meta_optimizer_worker

WORKER = Path(__file__).resolve().parents[1] / "workers" / "meta_optimizer_worker.py"
TOLERANCE = 1e-5
CPU_2 = Topology.grid(2)


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    return run_through_fleetrun(WORKER, tmp_path_factory.mktemp("meta_optimizers"))


@pytest.mark.parametrize("case", meta_optimizer_worker.CASES)
def test_two_ranks_through_fleetrun_equal_fleets_optimizer_on_the_full_batch(ranks, case):
    assert_ranks_equal_the_reference([result[case] for result in ranks], TOLERANCE, case)


def test_each_update_is_rewritten_with_the_exclusion_rule_of_its_optimizer(ranks):
    lars, lamb = ranks[0]["lars"], ranks[0]["lamb"]
    assert lars["update_ops"] == ["pd_op.lars_momentum_"] * 4 and lamb["update_ops"] == ["pd_op.lamb_"] * 4
    assert lars["details"]["excluded"] == ["linear_0.b_0", "linear_1.b_0"]     # substring "b_0"
    assert lamb["details"]["excluded"] == ["linear_1.b_0"]                     # suffix "linear_1.b_0"


def compiled(fields, make_optimizer, topology=CPU_2):
    main, _, built = in_process.compile_only(in_process.strategy(**fields), topology, make_optimizer)
    return main, built.report


def update_attrs(main, op_name):
    return [op.attrs() for op in main.global_block().ops if op.name() == op_name]


def test_lars_matches_by_substring_and_passes_fleets_settings_to_the_op():
    main, report = compiled({"lars": True, "lars_configs": {"lars_coeff": 0.02, "lars_weight_decay": 0.003,
                                                             "epsilon": 1e-4, "exclude_from_weight_decay": ["ear_1"]}},
                            lambda: paddle.optimizer.Momentum(0.1, momentum=0.8, rescale_grad=0.5))
    assert update_attrs(main, "pd_op.momentum_") == []
    attrs = update_attrs(main, "pd_op.lars_momentum_")
    decays = report.record("lars").details["weight_decay"]
    assert decays == pytest.approx({"linear_0.w_0": 0.003, "linear_0.b_0": 0.003, "linear_1.w_0": 0.0,
                                    "linear_1.b_0": 0.0})
    assert sorted(w for a in attrs for w in a["lars_weight_decay"]) == pytest.approx(sorted(decays.values()))
    for a in attrs:
        assert (a["mu"], a["lars_coeff"], a["epsilon"], a["rescale_grad"]) == pytest.approx((0.8, 0.02, 1e-4, 0.5))
    assert report.record("lars").summary == ("4 momentum_ -> lars_momentum_ (lars_coeff 0.02, weight decay 0.003; "
                                             "2 excluded: plain momentum)")


def test_lamb_matches_by_suffix_and_takes_adams_betas_and_epsilon():
    main, report = compiled({"lamb": True, "lamb_configs": {"lamb_weight_decay": 0.05,
                                                        "exclude_from_weight_decay": ["0.b_0", "ear_1"]}},
                       lambda: paddle.optimizer.Adam(0.01, beta1=0.8, beta2=0.95, epsilon=1e-7))
    assert update_attrs(main, "pd_op.adam_") == []
    attrs = update_attrs(main, "pd_op.lamb_")
    decays = report.record("lamb").details["weight_decay"]
    assert decays == pytest.approx({"linear_0.w_0": 0.05, "linear_0.b_0": 0.0, "linear_1.w_0": 0.05,
                                    "linear_1.b_0": 0.05})                   # "ear_1" is no suffix
    assert sorted(a["weight_decay"] for a in attrs) == pytest.approx(sorted(decays.values()))
    for a in attrs:
        assert (a["beta1"], a["beta2"], a["epsilon"], a["always_adapt"]) == pytest.approx((0.8, 0.95, 1e-7, False))


@pytest.mark.parametrize("fields, make_optimizer, message", [
    ({"lars": True}, lambda: paddle.optimizer.Adam(0.01),
     "lars works with the Momentum optimizer only, and this one is Adam; train with paddle.optimizer.Momentum"),
    ({"lars": True}, lambda: paddle.optimizer.Momentum(0.1, use_nesterov=True),
     "lars does not build Momentum with use_nesterov=True"),
    ({"lars": True}, lambda: paddle.optimizer.Momentum(0.1, weight_decay=0.01),
     "weight_decay (on linear_0.b_0): Fleet's LARS drops it silently; decay by lars_configs.lars_weight_decay and "
     "leave weight_decay out of paddle.optimizer.Momentum(...)"),
    ({"lamb": True}, lambda: paddle.optimizer.Momentum(0.1),
     "lamb works with the Adam optimizer only, and this one is Momentum; train with paddle.optimizer.Adam"),
    ({"lamb": True}, lambda: paddle.optimizer.AdamW(0.01),
     "lamb works with the Adam optimizer only, and this one is AdamW"),
    ({"lamb": True}, lambda: paddle.optimizer.Adam(0.01, weight_decay=0.01),
     "lamb does not build Adam with weight_decay (LAMB decays by lamb_configs.lamb_weight_decay)"),
    ({"lamb": True}, lambda: paddle.optimizer.Adam(0.01, amsgrad=True), "lamb does not build Adam with amsgrad=True"),
])
def test_another_optimizer_or_an_option_fleet_would_drop_is_an_error_naming_the_fix(fields, make_optimizer,
                                                                                       message):
    with pytest.raises(CompileError) as info:
        compiled(fields, make_optimizer)
    assert message in str(info.value)


@pytest.mark.parametrize("fields, words", [
    ({"lars": True, "lamb": True}, "'lars' and 'lamb' cannot be used together"),
    ({"lars": True, "dgc": True}, "'lars' and 'dgc' cannot be used together: both rewrite the Momentum update"),
    ({"lamb": True, "dgc": True}, "'lamb' and 'dgc' cannot be used together"),
])
def test_fleets_conflicts_are_named_errors_at_validate(fields, words):
    s = DistributedStrategy()
    for field, value in fields.items():
        setattr(s, field, value)
    with pytest.raises(StrategyConflictError, match=words):
        s.validate()


def test_one_rank_trains_exactly_like_fleets_optimizer_in_paddle():
    """Without communication the rewrite is the whole difference: exact, not just close."""
    for case, (make_inner, fields) in meta_optimizer_worker.CASES.items():
        losses, params, _ = in_process.train(in_process.strategy(**fields), make_inner, 16, 3)
        reference, reference_params, _ = in_process.train(
            DistributedStrategy(), lambda: fleet_optimizer(make_inner(), fields), 16, 3)
        assert losses == reference, case
        for name, value in params.items():
            np.testing.assert_array_equal(value, reference_params[name], err_msg=f"{case}: {name}")
