"""gradient_merge: the program it builds (accumulators, one conditional branch holding all the
communication and the update, zeroing last) and what it computes: k micro-steps of batch b
train exactly like one step of batch k*b, alone and with AMP, in one process. That N ranks with
gradient merge equal one process with it (alone, with fusion, AMP, and every other knob) is
tested in test_knob_pairs.py; together the two give N ranks x k micro-steps == one step of the
whole batch.
"""
import numpy as np
import paddle
import pytest

from fleetlite import Topology
from fleetlite.compile import program_edit
from fleetlite.strategies.gradient_merge import ACCUMULATOR_SUFFIX
from support.isolated import isolated
from support.in_process import compile_only, strategy, train

CPU_4 = Topology.grid(4, 2, rank=3)
PARAMETERS = ["linear_0.b_0", "linear_0.w_0", "linear_1.b_0", "linear_1.w_0"]
COLLECTIVES = ("pd_op.all_reduce", "pd_op.all_reduce_", "pd_op.all_gather")


def momentum():
    return paddle.optimizer.Momentum(0.1, momentum=0.9)


def merge(k_steps, avg=True, **fields):
    return strategy(gradient_merge=True, gradient_merge_configs={"k_steps": k_steps, "avg": avg}, **fields)


def test_gradients_are_added_into_persistable_accumulators_where_backward_produces_them():
    main, startup, built = compile_only(merge(4), CPU_4)
    ops = main.global_block().ops
    accumulators = {op.attrs()["name"]: op for op in ops if op.name() == "pd_op.data"
                    and op.attrs()["name"].endswith(ACCUMULATOR_SUFFIX)}
    assert sorted(accumulators) == [name + ACCUMULATOR_SUFFIX for name in PARAMETERS]
    assert all(op.attrs()["persistable"] == [True] for op in accumulators.values())
    adds = [i for i, op in enumerate(ops) if op.name() == "pd_op.add_"
            and program_edit.provenance(op) == "gradient_merge"]
    assert len(adds) == 4
    assert all(ops[i - 1].name().endswith("_grad") for i in adds)
    initialised = {op.attrs()["output_name"]: op.operand_source(0).get_defining_op()
                   for op in startup.global_block().ops if op.name() == "builtin.shadow_output"}
    for name in accumulators:
        assert initialised[name].name() == "pd_op.full" and initialised[name].attrs()["value"] == 0


def test_communication_and_update_run_inside_one_branch_that_ends_by_zeroing_the_accumulators():
    main, _, built = compile_only(merge(4), CPU_4)
    block = main.global_block()
    outside = [op.name() for op in block.ops]
    assert outside[-1] == "pd_op.if"
    assert not set(outside) & {*COLLECTIVES, "pd_op.sgd_"}
    branch = next(iter(block.ops[-1].blocks()))
    inside = [op.name() for op in branch.ops]
    assert inside.count("pd_op.sgd_") == 4 and inside.count("pd_op.all_reduce_") == 1   # one fused bucket
    last_update = max(i for i, name in enumerate(inside) if name == "pd_op.sgd_")
    zeroing = [op for op in branch.ops if op.name() == "pd_op.assign_out_"]
    assert len(zeroing) == 4 and all(inside.index("pd_op.assign_out_") > last_update for _ in zeroing)
    accumulated = {op.result(0).id for op in program_edit.created_by(block, "gradient_merge")
                   if op.name() == "pd_op.add_"}
    assert {op.operand_source(1).id for op in zeroing} == accumulated
    moved = [op for op in branch.ops if program_edit.provenance(op) != "gradient_merge_update"]
    update = built.report.record("gradient_merge_update")
    assert update.summary.startswith(f"{len(moved)} ops (communication and update) run once every 4 steps")


def test_the_branch_is_taken_when_the_step_counter_reaches_a_multiple_of_k():
    main, _, _ = compile_only(merge(4), CPU_4)
    ops = main.global_block().ops
    names = [op.name() for op in ops]
    assert names[-6:] == ["pd_op.increment_", "pd_op.full", "pd_op.remainder", "pd_op.full", "pd_op.equal",
                          "pd_op.if"]
    assert ops[-5].attrs()["value"] == 4
    assert ops[-1].operand_source(0).is_same(ops[-2].result(0))


def test_k_steps_1_is_reported_as_skipped():
    _, _, built = compile_only(merge(1), CPU_4)
    assert built.report.record("gradient_merge").reason == "k_steps = 1: every step already communicates and updates"
    assert built.report.record("gradient_merge_update").reason.startswith("needs gradient_merge, which was skipped")


def assert_same_training(merged, whole, k_steps, atol=1e-6):
    merged_losses, merged_params, _ = merged
    whole_losses, whole_params, _ = whole
    for name, values in whole_params.items():
        np.testing.assert_allclose(merged_params[name], values, rtol=0, atol=atol, err_msg=name)
    micro_step_means = np.mean(np.reshape(merged_losses, (-1, k_steps)), axis=1)
    np.testing.assert_allclose(micro_step_means, whole_losses, rtol=0, atol=atol)


@pytest.mark.parametrize("k_steps", [2, 4])
def test_k_micro_steps_of_b_train_like_one_step_of_k_times_b(k_steps):
    merged = train(merge(k_steps), momentum, rows=4, steps=3 * k_steps)
    whole = train(strategy(), momentum, rows=4 * k_steps, steps=3)
    assert_same_training(merged, whole, k_steps)


def test_without_avg_the_sum_is_applied_like_a_k_times_larger_learning_rate():
    merged = train(merge(2, avg=False), lambda: paddle.optimizer.SGD(0.05), rows=8, steps=6)
    whole = train(strategy(), lambda: paddle.optimizer.SGD(0.1), rows=16, steps=3)
    assert_same_training(merged, whole, 2)


@isolated(timeout=180)    # AMP kernels run in this process
def test_with_amp_the_loss_scale_and_the_update_follow_the_merged_steps():
    recipe = {"custom_black_list": ["matmul", "relu", "elementwise_add"], "init_loss_scaling": 1024.0,
              "incr_every_n_steps": 2}
    merged = train(merge(2, amp=True, amp_configs=recipe), momentum, rows=8, steps=8)
    whole = train(strategy(amp=True, amp_configs=recipe), momentum, rows=16, steps=4)
    assert {"amp_loss_scaling", "gradient_merge_update"} <= set(merged[2].applied)
    assert_same_training(merged, whole, 2)
