"""AMP: the casts the forward pass inserts (bfloat16 builds on CPU; float16 with the CPU recipe
of notes/paddle3_cpu_facts.md §3), the loss-scaling ops after the gradient all-reduce, the
configuration errors, and real training on 2 gloo ranks against one process on the full batch,
with an overflow on one rank that every rank must skip.

The CPU wheel has no float16 matmul/conv/relu/add kernels (not even to build their backward),
so the float16 recipe black-lists them and white-lists pool2d; the loss-scaling ops run in
float32 either way.
"""
import json
import os
import re

import numpy as np
import paddle
import pytest

import fleetlite
from fleetlite import CompileError, DistributedStrategy, StrategyConflictError, Topology, cli, fp16_guard
from fleetlite.compile import compiler, mixed_precision, program_edit
from fleetlite.runtime import training_program
from support.isolated import isolated, run as isolated_run
from support.models import backward_program
from support import in_process
from support.models import Mlp, compiled_program

CPU_2, GPU_32 = Topology.grid(2), Topology.grid(32, 4, rank=9, device="gpu")
RECIPE = {"custom_black_list": ["matmul", "conv2d", "relu", "elementwise_add", "flatten"],
          "custom_white_list": ["pool2d"], "init_loss_scaling": 1024.0, "incr_every_n_steps": 2}
OVERFLOW = {"custom_black_list": ["matmul", "relu", "elementwise_add"], "init_loss_scaling": 1024.0,
            "decr_every_n_nan_or_inf": 1, "decr_ratio": 0.5}
POISONED_RANK, POISONED_STEP = 1, 2
UNSCALE = ["builtin.combine", "check_finite_and_unscale_", "builtin.split"]
AGREE = ["cast", "all_reduce_(ring=0, max)", "cast"]
UPDATE = ["full", "builtin.combine", "update_loss_scaling_", "builtin.split"]


@pytest.fixture(autouse=True)
def cpu_with_bfloat16(monkeypatch):
    """The structure tests compile bfloat16 CPU programs and run none: they stand for a CPU with
    AVX512-BF16, so they check the rewrite on any CPU. (The isolated training tests run in a child,
    on the real CPU.)"""
    monkeypatch.setattr(mixed_precision, "cpu_has_bfloat16", lambda: True)


def amp_strategy(**configs):
    strategy = DistributedStrategy()
    strategy.amp = True
    strategy.amp_configs = configs
    return strategy


def compile_amp(topology=CPU_2, model="mlp", **configs):
    main, _, built = compiled_program(amp_strategy(**configs), topology, model)
    return main, built.report


def guarded_mlp(strategy, topology):
    """The digits MLP with its first layer built under fp16_guard; (main, startup, loss, report)."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [8, 64], "float32")
        y = paddle.static.data("y", [8, 1], "int64")
        with fp16_guard():
            hidden = paddle.nn.functional.relu(paddle.nn.Linear(64, 32)(x))
        loss = paddle.nn.functional.cross_entropy(paddle.nn.Linear(32, 10)(hidden), y)
        report = training_program.build(loss, paddle.optimizer.SGD(0.1), strategy, topology, startup).report
    return main, startup, loss, report


def classifier(strategy, reduction="mean", no_grad_input=False, prelu=False):
    """The digits MLP on reshaped input with cross_entropy(logits, y, reduction).mean() as its loss,
    compiled for CPU_2; with no_grad_input, the reshaped input is in minimize's no_grad_set; with
    prelu, a PReLU reads the reshaped input first."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.utils.unique_name.guard(), paddle.static.program_guard(main, startup):
        x = paddle.static.data("x", [8, 8, 8], "float32")
        y = paddle.static.data("y", [8, 1], "int64")
        flat = paddle.reshape(x, [8, 64])
        features = paddle.nn.PReLU()(flat) if prelu else flat
        loss = paddle.nn.functional.cross_entropy(Mlp()(features), y, reduction=reduction).mean()
        built = training_program.build(loss, paddle.optimizer.SGD(0.1), strategy, CPU_2, startup,
                                       no_grad_set=[flat] if no_grad_input else None)
    return main, built.report


def created(main, pass_name):
    names = []
    for op in program_edit.created_by(main.global_block(), pass_name):
        name = op.name().replace("pd_op.", "")
        if op.has_attr("reduce_type"):
            name += f"(ring={op.attrs()['ring_id']}, {['sum', 'max'][op.attrs()['reduce_type']]})"
        names.append(name)
    return names


def dtypes(main, op_name, result=0):
    return [str(op.result(result).dtype).replace("paddle.", "") for op in main.global_block().ops if op.name() == op_name]


# --- structure ---------------------------------------------------------------------------
def test_bfloat16_o1_runs_matmuls_low_keeps_the_loss_float32_and_scales_nothing():
    main, report = compile_amp(dtype="bfloat16")
    assert created(main, "amp") == ["cast"] * 6        # x, w0 in; out back; h, w1 in; out back
    assert dtypes(main, "pd_op.matmul") == ["bfloat16", "bfloat16"]
    assert dtypes(main, "pd_op.matmul_grad", result=1) == ["bfloat16", "bfloat16"]   # backward follows the casts
    assert dtypes(main, "pd_op.relu") == dtypes(main, "pd_op.cross_entropy_with_softmax") == ["float32"]
    assert {b["dtype"] for b in report.buckets} == {"float32"}               # master gradients cross ranks
    assert report.record("amp").summary == "O1 bfloat16: 2 ops in bfloat16, 6 casts"
    assert report.record("amp_loss_scaling").reason == "bfloat16 keeps float32's exponent range: the loss is not scaled"


def test_float16_scales_the_loss_and_unscales_after_the_all_reduce_with_ranks_agreeing():
    main, report = compile_amp(CPU_2, "convbn", **RECIPE)
    assert created(main, "amp") == ["data"] * 3 + ["cast", "cast", "multiply"]   # scale + step counters
    assert dtypes(main, "pd_op.pool2d") == ["float16"] and dtypes(main, "pd_op.conv2d") == ["float32"]
    assert created(main, "amp_loss_scaling") == UNSCALE + AGREE + UPDATE
    ops = main.global_block().ops
    names = [op.name() for op in ops]
    last_sum = max(i for i, op in enumerate(ops) if op.name() == "pd_op.all_reduce_" and op.attrs()["reduce_type"] == 0)
    assert last_sum < names.index("pd_op.check_finite_and_unscale_")
    assert names.index("pd_op.update_loss_scaling_") < names.index("pd_op.sgd_")
    scaled = next(op for op in ops if op.name() == "pd_op.multiply" and program_edit.provenance(op) == "amp")
    assert scaled.operand_source(1).name == report.record("amp").details["loss_scaling"] == "loss_scaling_0"


@pytest.mark.skipif(paddle.is_compiled_with_cuda(), reason="a GPU build can build float16 backward ops")
def test_a_float16_gpu_program_is_not_built_on_a_cpu_build_of_paddle():
    _, report = compile_amp(GPU_32, "convbn", **RECIPE)
    assert report.record("amp").reason.startswith("this Paddle build has no GPU kernels")
    assert report.record("amp_loss_scaling").reason.startswith("needs amp, which was skipped")


CPU_RECIPE = (r"the CPU recipe of docs/knobs/amp.md: custom_black_list: \[matmul, conv2d, relu, elementwise_add, "
              r"flatten\], custom_white_list: \[pool2d\]")


@pytest.mark.parametrize("configs, field", [({}, "amp_configs.dtype"),
                                            ({"use_pure_fp16": True, "use_fp16_guard": False}, "amp_configs.use_pure_fp16")],
                         ids=["O1 default lists", "O2"])
def test_float16_with_matmul_low_on_cpu_is_refused_at_validate_naming_the_cpu_recipe(configs, field):
    """It passed validate, then compile failed building backward (matmul_grad has no float16 CPU kernel)."""
    message = (f"^{field} asks for float16 matmul ops on CPU, and Paddle's CPU build has no float16 matmul kernel "
               f"\\(compile would fail building backward\\); keep the compute ops in float32 with {CPU_RECIPE}; "
               f"or amp: false$")
    with pytest.raises(StrategyConflictError, match=message) as refused:
        amp_strategy(**configs).validate(CPU_2)             # what fleet.init and distributed_optimizer run
    assert refused.value.field == field
    amp_strategy(**configs).validate(GPU_32)
    amp_strategy(**RECIPE).validate(CPU_2)


@pytest.mark.parametrize("model, configs, ops", [
    ("convbn", {"custom_black_list": ["matmul"]}, "conv2d"),                      # the recipe without conv2d
    ("mlp", {"custom_black_list": ["matmul", "relu"], "custom_white_list": ["add"]}, "add"),
], ids=["conv2d white", "add white"])
def test_float16_ops_without_a_cpu_kernel_are_refused_before_backward(model, configs, ops):
    with pytest.raises(CompileError, match=f"^in pass amp: amp runs {ops} in float16 on CPU, and Paddle's CPU build has no "
                                           f"float16 kernel for them \\(backward could not be built\\): keep them "
                                           f"in float32 with amp_configs.custom_black_list \\({CPU_RECIPE}\\), "
                                           f"or amp: false$"):
        compile_amp(model=model, **configs)


def test_guarded_float16_matmuls_on_cpu_are_refused_at_compile():
    """O2 with the guard: which ops run low is known only once the program is built."""
    amp_strategy(use_pure_fp16=True).validate(CPU_2)
    with pytest.raises(CompileError, match=r"^in pass amp: amp runs add, matmul, relu in float16 on CPU"):
        guarded_mlp(amp_strategy(use_pure_fp16=True), CPU_2)


def test_one_rank_skips_the_agreement_but_not_the_scaling():
    main, _ = compile_amp(Topology.grid(1), "convbn", **RECIPE)
    assert created(main, "amp_loss_scaling") == UNSCALE + UPDATE


def test_static_loss_scaling_only_unscales():
    main, report = compile_amp(use_dynamic_loss_scaling=False, **OVERFLOW)
    assert created(main, "amp") == ["data", "multiply"]
    assert created(main, "amp_loss_scaling") == UNSCALE + AGREE
    assert report.record("amp_loss_scaling").summary.startswith("4 gradients unscaled (static scale)")


def test_o2_runs_every_op_low_but_the_black_list_in_legacy_or_pir_names_and_the_loss():
    main, report = compile_amp(dtype="bfloat16", use_pure_fp16=True, use_fp16_guard=False,
                               custom_black_list=["softmax_with_cross_entropy"])
    assert set(dtypes(main, "pd_op.add")) == set(dtypes(main, "pd_op.relu")) == {"bfloat16"}
    assert dtypes(main, "pd_op.cross_entropy_with_softmax") == dtypes(main, "pd_op.mean") == ["float32"]
    assert report.record("amp").details["level"] == "O2"


@pytest.mark.parametrize("reduction", ["mean", "none"])
def test_o2_keeps_the_loss_computation_float32_and_backward_builds(reduction):
    """A classifier's cross_entropy(...).mean() under use_pure_bf16 without the guard: Paddle has no
    bfloat16 cross_entropy_with_softmax_grad on CPU, and the fetched loss keeps its dtype."""
    main, _ = classifier(amp_strategy(use_pure_bf16=True, use_fp16_guard=False), reduction=reduction)
    for name in ("cross_entropy_with_softmax", "mean", "mean_grad", "cross_entropy_with_softmax_grad"):
        assert set(dtypes(main, f"pd_op.{name}")) == {"float32"}, name
    assert dtypes(main, "pd_op.matmul") == dtypes(main, "pd_op.matmul_grad", result=1) == ["bfloat16"] * 2


@pytest.mark.parametrize("configs", [{"dtype": "bfloat16"}, {"use_pure_bf16": True, "use_fp16_guard": False}],
                         ids=["O1", "O2"])
def test_on_cpu_every_bfloat16_matmul_is_asked_for_both_gradients(configs):
    """oneDNN's bfloat16 matmul_grad writes both gradients unchecked (SIGSEGV on a missing one):
    the first layer's input batch needs none, so the rewrite asks for it."""
    main, report = compile_amp(**configs)
    grads = [op for op in main.global_block().ops if op.name() == "pd_op.matmul_grad"]
    assert len(grads) == 2 and all(result.initialized() for op in grads for result in op.results())
    assert report.record("amp").details["operands_asked_for_gradients"] == 1      # the input batch
    main, report = compile_amp(GPU_32, dtype="bfloat16")                                  # cuBLAS checks: nothing asked
    assert "operands_asked_for_gradients" not in report.record("amp").details
    assert not all(result.initialized() for op in main.global_block().ops if op.name() == "pd_op.matmul_grad"
                   for result in op.results())


def test_on_cpu_a_bfloat16_prelu_on_the_input_batch_is_asked_for_both_gradients():
    main, report = classifier(amp_strategy(use_pure_bf16=True, use_fp16_guard=False), prelu=True)
    (grad,) = [op for op in main.global_block().ops if op.name() == "pd_op.prelu_grad"]
    assert str(grad.result(0).dtype) == "paddle.bfloat16" and all(r.initialized() for r in grad.results())
    assert report.record("amp").details["operands_asked_for_gradients"] == 1      # the reshaped batch


def test_a_bfloat16_matmul_whose_operand_is_kept_out_of_backward_is_refused_on_cpu():
    with pytest.raises(CompileError, match=r"1 bfloat16 matmul_grad op\(s\) lack a gradient output .* oneDNN "
                                           r"bfloat16 gradient kernel .*\(amp_configs.custom_black_list"):
        classifier(amp_strategy(use_pure_bf16=True, use_fp16_guard=False), no_grad_input=True)


def test_o2_with_the_fp16_guard_runs_only_the_guarded_ops_low():
    main, _, _, _ = guarded_mlp(amp_strategy(use_pure_bf16=True), CPU_2)
    assert dtypes(main, "pd_op.matmul") == ["bfloat16", "float32"]
    assert dtypes(main, "pd_op.relu") == ["bfloat16"]


def test_o2_with_the_fp16_guard_and_no_guarded_op_is_an_error():
    with pytest.raises(CompileError, match=r"use_fp16_guard is on but no op was built under "
                                           r"fleetlite.fp16_guard\(\)"):
        compile_amp(dtype="bfloat16", use_pure_fp16=True)


def test_black_varnames_and_in_place_ops_stay_float32():
    main, _ = compile_amp(dtype="bfloat16", custom_black_varnames=["linear_0.w_0"])
    assert dtypes(main, "pd_op.matmul") == ["float32", "bfloat16"]
    main, _ = compile_amp(model="convbn", dtype="bfloat16", custom_white_list=["batch_norm"])
    assert dtypes(main, "pd_op.batch_norm_") == ["float32"]      # a cast operand would take its running stats


@pytest.mark.parametrize("configs, message", [
    ({"custom_white_list": ["elementwise_add"], "custom_black_list": ["add"]},
     "amp_configs lists add as both white"),
    ({"use_pure_fp16": True, "use_pure_bf16": True}, "use_pure_fp16 and use_pure_bf16 ask for two O2 dtypes"),
])
def test_contradictory_configs_are_errors(configs, message):
    with pytest.raises(StrategyConflictError, match=message):
        amp_strategy(**configs).validate(CPU_2)


NO_AVX512_BF16 = (r"asks for bfloat16 ops on CPU, and Paddle's CPU bfloat16 kernels \(oneDNN\) need AVX512-BF16, "
                  r"which this CPU lacks; train in float32 \(amp: false\), or on a CPU with AVX512-BF16$")


@pytest.mark.parametrize("configs, field", [
    ({"dtype": "bfloat16"}, "amp_configs.dtype"),
    ({"use_pure_bf16": True, "use_fp16_guard": False}, "amp_configs.use_pure_bf16"),
    ({"use_pure_bf16": True}, "amp_configs.use_pure_bf16"),
], ids=["O1", "O2", "O2 guarded"])
def test_bfloat16_on_a_cpu_without_avx512_bf16_is_refused_at_compile_not_at_the_first_run(monkeypatch, configs, field):
    """On such a CPU the program builds and its first exe.run dies in oneDNN (RuntimeError: std::exception)."""
    monkeypatch.setattr(mixed_precision, "cpu_has_bfloat16", lambda: False)
    with pytest.raises(StrategyConflictError, match=f"^{field} {NO_AVX512_BF16}") as refused:
        guarded_mlp(amp_strategy(**configs), CPU_2)
    assert refused.value.field == field
    main, _, _, report = guarded_mlp(amp_strategy(**configs), GPU_32)     # GPU programs do not run on this CPU
    assert report.record("amp").details["dtype"] == "bfloat16" and "bfloat16" in dtypes(main, "pd_op.matmul")


def test_explain_only_warns_about_bfloat16_for_a_cpu_job_on_a_cpu_without_avx512_bf16(monkeypatch, capsys, tmp_path):
    """The explained job may run on CPUs with AVX512-BF16: `fleetlite explain` warns in one line and
    prints the bfloat16 report; compiling to train here still refuses (the test above)."""
    monkeypatch.setattr(mixed_precision, "cpu_has_bfloat16", lambda: False)
    strategy = tmp_path / "bf16.yaml"
    amp_strategy(use_pure_bf16=True, use_fp16_guard=False).save(strategy)
    assert cli.main(["explain", "--strategy", str(strategy), "--json"]) == 0
    out, err = capsys.readouterr()
    (line,) = [line for line in err.splitlines() if "fleetlite" in line]
    assert re.match(f"fleetlite: warning: amp_configs.use_pure_bf16 {NO_AVX512_BF16[:-1]} \\(this machine only "
                    f"explains the job; it refuses to train it\\)$", line), line
    assert json.loads(out)["records"][0]["details"]["dtype"] == "bfloat16"
    with pytest.raises(StrategyConflictError, match=NO_AVX512_BF16):     # the warning ends with explain
        guarded_mlp(amp_strategy(use_pure_bf16=True, use_fp16_guard=False), CPU_2)
    assert cli.main(["strategy", "validate", str(strategy)]) == 0


def _explained_bfloat16_init(environ):
    """In the child: fleet.init under fleetrun --explain's environment, on a CPU without AVX512-BF16."""
    import contextlib
    import io
    os.environ.update(environ)
    mixed_precision.cpu_has_bfloat16 = lambda: False
    paddle.enable_static()
    stderr = io.StringIO()
    with contextlib.redirect_stderr(stderr):
        fleetlite.init(is_collective=True, strategy=amp_strategy(use_pure_bf16=True, use_fp16_guard=False))
        fleetlite.distributed_optimizer(paddle.optimizer.SGD(0.1))
    assert stderr.getvalue().count("fleetlite: warning: amp_configs.use_pure_bf16 asks for bfloat16") == 1, stderr.getvalue()


def test_fleetrun_explain_only_warns_about_bfloat16_on_this_cpu():
    environ = {"FLEETLITE_EXPLAIN_ONLY": "1", "PADDLE_TRAINER_ID": "0", "PADDLE_TRAINERS_NUM": "2",
               "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:6170,127.0.0.1:6171", "PADDLE_CURRENT_ENDPOINT": "127.0.0.1:6170"}
    isolated_run(_explained_bfloat16_init, [environ], timeout=120)


def test_optimizer_state_in_float16_is_refused_not_ignored():
    with pytest.raises(StrategyConflictError, match="use_optimizer_fp16 is not implemented"):
        amp_strategy(dtype="bfloat16", use_optimizer_fp16=True).validate()


def test_a_program_that_already_has_backward_cannot_be_cast():
    main, _, params_grads = backward_program()
    _, report = compiler.compile(main, params_grads, amp_strategy(dtype="bfloat16"), CPU_2)
    assert report.record("amp").reason == compiler.BACKWARD_EXISTS
    assert report.record("amp_loss_scaling").reason.startswith("needs amp, which was skipped")


# --- real training on 2 ranks ---------------------------------------------------------------
NUMERICS_SCENARIOS = {
    "recipe": {"model": "convbn", "strategy": {"amp": True, "amp_configs": RECIPE}, "optimizer": "momentum",
               "batch_norm_over": "shard"},
    "overflow": {"model": "mlp", "strategy": {"amp": True, "amp_configs": OVERFLOW}, "optimizer": "sgd",
                 "batch_norm_over": "shard", "poison": [POISONED_RANK, POISONED_STEP]},
    # Adam would still move the parameters with zeroed gradients (its moments carry on) unless
    # the overflow flag reaches adam_ as skip_update
    "overflow_adam": {"model": "mlp", "strategy": {"amp": True, "amp_configs": OVERFLOW}, "optimizer": "adam",
                      "batch_norm_over": "shard", "poison": [POISONED_RANK, POISONED_STEP]},
}
RUNNING_STATISTICS = ("batch_norm2d_0.w_1", "batch_norm2d_0.w_2")   # per-shard, updated once per shard


@pytest.fixture(scope="module")
def trained(numerics):
    return numerics


def test_float16_recipe_on_2_ranks_trains_like_one_process_on_the_full_batch(trained):
    oracle, ranks = trained
    expected = oracle["recipe"]
    assert {"amp", "amp_loss_scaling"} <= set(ranks[0]["recipe"]["applied"])
    for rank in ranks:
        got = rank["recipe"]
        for param, values in expected["params"][-1].items():
            if param not in RUNNING_STATISTICS:
                np.testing.assert_allclose(got["params"][-1][param], values, rtol=0, atol=1e-5, err_msg=param)
        assert got["scales"] == expected["scales"] == [1024.0, 2048.0, 2048.0, 4096.0]   # x2 every 2 finite steps
    mean_loss = np.mean([rank["recipe"]["losses"] for rank in ranks], axis=0)
    np.testing.assert_allclose(mean_loss, expected["losses"], rtol=0, atol=1e-5)


@pytest.mark.parametrize("scenario", ["overflow", "overflow_adam"])
def test_an_overflow_on_one_rank_is_skipped_by_every_rank(trained, scenario):
    oracle, ranks = trained
    for rank in ranks:
        run = rank[scenario]
        before, at = run["params"][POISONED_STEP - 1], run["params"][POISONED_STEP]
        assert before == at                                             # the step was skipped
        assert run["params"][POISONED_STEP + 1] != at                   # and training went on
        assert run["scales"] == [1024.0, 1024.0, 512.0, 512.0]         # x decr_ratio at the overflow
        assert run["params"] == ranks[0][scenario]["params"]            # ranks stay identical
    for param, values in oracle[scenario]["params"][-1].items():
        np.testing.assert_allclose(ranks[0][scenario]["params"][-1][param], values, rtol=0, atol=1e-5)


# --- bfloat16 training, where the CPU has AVX512-BF16 (in a child: a native crash fails one test) ---
# bfloat16 keeps 8 bits of mantissa: each op rounds to a relative 2^-8 (0.4 %). Over 4 SGD steps of
# the digits models that leaves the losses within 0.03 and the parameters within 0.005 of float32
# (a wrong gradient, or a step that did not happen, moves them by more than 0.05).
BF16_LOSS_ATOL, BF16_PARAM_ATOL = 0.03, 5e-3
BF16_RUNS = {"mlp O1": ("mlp", {"dtype": "bfloat16"}),
             "mlp O2": ("mlp", {"use_pure_bf16": True, "use_fp16_guard": False}),
             "convbn O1": ("convbn", {"dtype": "bfloat16"})}


@pytest.mark.skipif(not paddle.base.core.supports_bfloat16(),
                    reason="this CPU has no AVX512-BF16: Paddle's bfloat16 kernels are oneDNN-only and fail here")
@pytest.mark.parametrize("run", sorted(BF16_RUNS))
@isolated(timeout=180)
def test_bfloat16_trains_like_float32_within_bfloat16_rounding(run):
    model, configs = BF16_RUNS[run]
    sgd = lambda: paddle.optimizer.SGD(0.1)        # noqa: E731
    fp32_losses, fp32_params, _ = in_process.train(DistributedStrategy(), sgd, rows=16, steps=4, model=model)
    losses, params, report = in_process.train(amp_strategy(**configs), sgd, rows=16, steps=4, model=model)
    assert report.record("amp").details["dtype"] == "bfloat16" and report.record("amp").details["low_ops"]
    # each step reads other digits, so the losses need not fall in 4 steps (float32's on the MLP do
    # not: 2.44, 2.27, 2.20, 2.46); float32 is the oracle, and its parameters move by > 0.03
    assert np.all(np.isfinite(losses))
    np.testing.assert_allclose(losses, fp32_losses, rtol=0, atol=BF16_LOSS_ATOL)
    for name, values in fp32_params.items():
        if name not in RUNNING_STATISTICS:
            np.testing.assert_allclose(params[name], values, rtol=0, atol=BF16_PARAM_ATOL, err_msg=name)
