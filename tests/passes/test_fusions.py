"""Fusions: fuse_all_optimizer_ops (Adam -> merged_adam_, checked against per-parameter adam_),
the build_strategy op fusions (Paddle's PIR passes on CUDA builds, reported as skipped
elsewhere), and scale_gradient, which folds data_parallel's per-gradient 1/N into one scale of
the loss gradient. N processes == one process for each of them, alone and paired with every
other knob, is tested in test_knob_pairs.py.
"""
import numpy as np
import paddle
import pytest

from fleetlite import Topology
from fleetlite.compile import program_edit
from fleetlite.strategies.build_strategy_fusions import NO_CPU_KERNELS
from support.in_process import compile_only, strategy, train

CPU_2, GPU_32 = Topology.grid(2), Topology.grid(32, 4, rank=9, device="gpu")
FUSE_OPTIMIZER = "build_strategy.fuse_all_optimizer_ops"


def fused_optimizer(**fields):
    return strategy(build_strategy={"fuse_all_optimizer_ops": True}, **fields)


def adam():
    return paddle.optimizer.Adam(0.01)


# --- fuse_all_optimizer_ops ---------------------------------------------------------------
def test_adam_updates_become_one_merged_adam_and_the_report_counts_them():
    main, _, built = compile_only(fused_optimizer(), CPU_2, adam)
    names = [op.name() for op in main.global_block().ops]
    assert names.count("pd_op.merged_adam_") == 1 and "pd_op.adam_" not in names
    record = built.report.record(FUSE_OPTIMIZER)
    assert record.summary == "4 adam_ -> 1 merged_adam_"
    assert record.ops_removed.count("pd_op.adam_") == 4 and record.ops_added.count("pd_op.merged_adam_") == 1
    merged = next(op for op in main.global_block().ops if op.name() == "pd_op.merged_adam_")
    assert program_edit.provenance(merged) == FUSE_OPTIMIZER


def test_merged_adam_trains_like_one_adam_per_parameter():
    losses, params, _ = train(fused_optimizer(), adam, rows=8, steps=6)
    expected_losses, expected_params, _ = train(strategy(), adam, rows=8, steps=6)
    for name, values in expected_params.items():
        np.testing.assert_allclose(params[name], values, rtol=0, atol=1e-6, err_msg=name)
    np.testing.assert_allclose(losses, expected_losses, rtol=0, atol=1e-6)


@pytest.mark.parametrize("optimizer, found", [(lambda: paddle.optimizer.Momentum(0.1, momentum=0.9), "4 momentum_"),
                                              (lambda: paddle.optimizer.SGD(0.1), "4 sgd_")])
def test_momentum_and_sgd_have_no_multi_tensor_kernel_and_are_reported_as_skipped(optimizer, found):
    main, _, built = compile_only(fused_optimizer(), CPU_2, optimizer)
    assert built.report.record(FUSE_OPTIMIZER).reason == (
        f"no multi-tensor kernel runs here for this update ({found}): only Adam has one (merged_adam_)")


# --- build_strategy op fusions ------------------------------------------------------------------
OP_FUSIONS = {"fuse_bn_act_ops": True, "fuse_elewise_add_act_ops": True, "fuse_gemm_epilogue": True}


def test_op_fusions_are_skipped_on_cpu_where_the_fused_kernels_do_not_exist():
    _, _, built = compile_only(strategy(build_strategy=OP_FUSIONS), CPU_2)
    assert built.report.record("op_fusion").reason == NO_CPU_KERNELS


def test_op_fusions_for_gpus_need_a_cuda_build_of_paddle():
    _, _, built = compile_only(strategy(build_strategy=OP_FUSIONS), GPU_32)
    assert built.report.record("op_fusion").reason == ("this Paddle build has no CUDA kernels: install "
                                                       "paddlepaddle-gpu to fuse")


def test_on_a_cuda_build_the_pir_passes_run_and_legacy_only_fusions_are_named(monkeypatch):
    monkeypatch.setattr(paddle, "is_compiled_with_cuda", lambda: True)
    _, _, built = compile_only(strategy(build_strategy=OP_FUSIONS), GPU_32)
    record = built.report.record("op_fusion")
    assert record.status == "applied"
    assert record.summary == ("fuse_gemm_epilogue: fused_gemm_epilogue_pass; "
                              "no PIR pass for fuse_elewise_add_act_ops, fuse_bn_act_ops")


def test_a_fusion_knob_left_at_its_default_is_not_acted_on():
    _, _, built = compile_only(strategy(), GPU_32)
    assert built.report.record("op_fusion").status == "off"     # fuse_bn_add_act_ops defaults to true


def test_only_legacy_fusions_on_a_cuda_build_are_reported_as_skipped(monkeypatch):
    monkeypatch.setattr(paddle, "is_compiled_with_cuda", lambda: True)
    _, _, built = compile_only(strategy(build_strategy={"fuse_bn_act_ops": True}), GPU_32)
    assert built.report.record("op_fusion").reason == "Paddle 3 has no PIR pass for fuse_bn_act_ops (legacy IR only)"


# --- scale_gradient -------------------------------------------------------------------------------
SCALE_GRADIENT = {"gradient_scale_configs": {"scale_gradient": True, "scale_strategy": "avg"}}


def test_scale_gradient_scales_the_loss_gradient_once_instead_of_every_reduced_gradient():
    main, _, built = compile_only(strategy(fuse_all_reduce_ops=False, **SCALE_GRADIENT), CPU_2)
    block = main.global_block()
    assert [op.name() for op in program_edit.created_by(block, "data_parallel")] == []
    created = program_edit.created_by(block, "gradient_scale_configs.scale_gradient")
    names = [op.name() for op in created]
    assert names.count("pd_op.all_reduce_") == 4 and "pd_op.scale_" not in names
    scale = next(op for op in created if op.name() == "pd_op.scale")
    assert scale.operand_source(0).get_defining_op().name() == "pd_op.full_like"
    assert scale.operand_source(1).get_defining_op().attrs()["value"] == pytest.approx(0.5)
    assert built.report.record("gradient_scale_configs.scale_gradient").summary.startswith(
        "1/2 applied to the loss gradient instead of to 4 gradients after the sum")


def test_scale_gradient_has_nothing_to_move_when_gradients_are_summed():
    fields = {"gradient_scale_configs": {"scale_gradient": True, "scale_strategy": "sum"}}
    _, _, built = compile_only(strategy(**fields), CPU_2)
    assert built.report.record("gradient_scale_configs.scale_gradient").reason == (
        "scale_strategy is 'sum': there is no 1/N to move to the loss gradient")
