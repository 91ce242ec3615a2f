"""amp: automatic mixed precision, with dynamic loss scaling that every rank agrees on.

One knob, two passes:

`amp` (FORWARD_REWRITE: before backward exists) runs forward ops in the low dtype
(`amp_configs.dtype`, or bfloat16 with use_pure_bf16); `fleetlite.compile.mixed_precision` inserts the
casts, so backward differentiates them and parameters stay the float32 master copy.
- O1 (default): white-list ops run low, black-list ops stay float32, any other op runs low only
  if all its float inputs already are (Paddle's O1 promotion). The lists are Paddle's
  (`paddle.amp.amp_lists`) plus custom_white_list / custom_black_list, in legacy or PIR names.
- O2 (use_pure_fp16 / use_pure_bf16): every op runs low but the black list; with
  use_fp16_guard, only ops built under `fleetlite.fp16_guard()` (Paddle 3's own
  fp16_guard leaves no mark on PIR ops).
- Always float32: ops that read a value named in custom_black_varnames, in-place ops (a cast
  operand would receive the write: batch_norm_ would stop updating its running statistics), and
  the loss computation (`loss_computation`: the ops after the last one that reads a parameter,
  e.g. cross_entropy and mean), so the loss the user fetches keeps its dtype and its gradient
  starts in float32 (Paddle has no bfloat16 cross_entropy_with_softmax_grad on CPU).
- float16 on CPU: Paddle's CPU build has float16 kernels for few ops (pool2d, cast, ...) and
  cannot build the backward of the others; refused when matmul stays low (validate: every model
  has one), and any other low op without a float16 CPU kernel is refused before backward, both
  naming the CPU recipe of docs/knobs/amp.md.
- bfloat16 on CPU: refused where the CPU has no AVX512-BF16 (Paddle's bfloat16 CPU kernels are
  oneDNN's and need it: the program would build, then die at its first run; explaining the job
  only warns, as it may run on other CPUs); elsewhere every low
  matmul (and prelu) is asked for all its gradients (mixed_precision explains the oneDNN crash
  this avoids), and compile refuses a program whose backward still lacks one.
With float16, the pass creates the loss scale (persistable, init_loss_scaling) and backward
differentiates loss x scale, so small gradients do not flush to zero in float16. bfloat16 has
float32's exponent range and is not scaled (as in Paddle).

`amp_loss_scaling` (REDUCED_REWRITE: after the gradients are all-reduced, before the update):
check_finite_and_unscale_ divides the reduced gradients by the scale and flags inf/nan; the
flag is MAX-reduced over ring 0, so all ranks decide alike even if a communication pass ever
left ranks with different sums; with dynamic scaling, update_loss_scaling_ zeroes the gradients
of an overflowing step and moves the scale (x incr_ratio after incr_every_n_steps finite steps,
x decr_ratio after decr_every_n_nan_or_inf overflowing ones). Scaled gradients are what cross
ranks (as in Fleet), so a float16 wire (fp16_allreduce) carries them without underflow; except
the gradients `topk` takes: it unscales them itself before selecting (context.unscaled), so they
are not unscaled again here, their local overflow flags join the check before the agreement,
and what must wait for the agreed flag (topk's residual updates) is built right after it. A
zeroed gradient leaves SGD parameters unchanged; optimizers with state still apply it (Paddle's
static AMP does the same for all but the Adam family).
"""
import collections
from dataclasses import dataclass
from typing import Any, Optional

import paddle

from fleetlite.compile import mixed_precision
from fleetlite.errors import CompileError, StrategyConflictError
from fleetlite.compile.pass_contract import Pass, PassResult, Phase

MAX = 1   # all_reduce reduce_type

# Fleet scripts name ops by their legacy (ProgramDesc) names; PIR names some differently.
LEGACY_NAMES = {
    "matmul_v2": "matmul", "mul": "matmul", "elementwise_add": "add", "elementwise_sub": "subtract",
    "elementwise_mul": "multiply", "elementwise_div": "divide", "elementwise_max": "maximum",
    "elementwise_min": "minimum", "softmax_with_cross_entropy": "cross_entropy_with_softmax",
    "reduce_sum": "sum", "reduce_mean": "mean", "reduce_prod": "prod", "lookup_table_v2": "embedding",
    "lookup_table": "embedding",
}


def pir_name(name):
    name = name.split(".", 1)[-1]
    return LEGACY_NAMES.get(name, name)


def low_dtype(configs):
    return "bfloat16" if configs.use_pure_bf16 else configs.dtype


def level(configs):
    return "O2" if configs.use_pure_fp16 or configs.use_pure_bf16 else "O1"


def scales_loss(configs):
    """float16 needs loss scaling (bfloat16 does not), unless it is fixed at 1."""
    return low_dtype(configs) == "float16" and (configs.use_dynamic_loss_scaling or configs.init_loss_scaling != 1)


def op_lists(configs):
    """(white, black) PIR op names: Paddle's lists for the dtype and level, then the custom ones."""
    dtype, amp_level = low_dtype(configs), level(configs)
    custom_white = {pir_name(n) for n in configs.custom_white_list}
    custom_black = {pir_name(n) for n in configs.custom_black_list}
    white = {pir_name(n) for n in paddle.amp.amp_lists.white_list()[dtype][amp_level]}
    black = {pir_name(n) for n in paddle.amp.amp_lists.black_list()[dtype][amp_level]}
    return (white - custom_black) | custom_white, (black - custom_white) | custom_black


def check_amp_configs(strategy, topology):
    if not strategy.amp:
        return
    configs = strategy.amp_configs
    if configs.use_optimizer_fp16:
        raise StrategyConflictError("amp_configs.use_optimizer_fp16 is not implemented: optimizer state stays "
                                    "float32 next to the float32 master parameters",
                                    field="amp_configs.use_optimizer_fp16", value=True, fix="set it to false")
    if configs.use_pure_fp16 and configs.use_pure_bf16:
        raise StrategyConflictError("amp_configs.use_pure_fp16 and use_pure_bf16 ask for two O2 dtypes",
                                    field="amp_configs.use_pure_bf16", value=True,
                                    fix="keep one; amp_configs.dtype picks the dtype of use_pure_fp16")
    both = sorted({pir_name(n) for n in configs.custom_white_list} & {pir_name(n) for n in configs.custom_black_list})
    if both:
        raise StrategyConflictError(f"amp_configs lists {', '.join(both)} as both white (low precision) "
                                    f"and black (float32)", field="amp_configs.custom_black_list",
                                    fix="list each op in one of custom_white_list, custom_black_list")
    if topology is not None and topology.device == "cpu" and low_dtype(configs) == "float16":
        _refuse_float16_matmul_on_cpu(configs)
    if topology is not None and on_onednn(low_dtype(configs), topology) and not mixed_precision.cpu_has_bfloat16():
        field = "amp_configs.use_pure_bf16" if configs.use_pure_bf16 else "amp_configs.dtype"
        mixed_precision.lacks_on_this_cpu(StrategyConflictError(
            f"{field} asks for bfloat16 ops on CPU, and Paddle's CPU bfloat16 kernels (oneDNN) need AVX512-BF16, "
            f"which this CPU lacks", field=field, fix="train in float32 (amp: false), or on a CPU with AVX512-BF16"))


CPU_RECIPE = ("the CPU recipe of docs/knobs/amp.md: custom_black_list: [matmul, conv2d, relu, elementwise_add, "
              "flatten], custom_white_list: [pool2d]")
# Every model's Linear layers (a classifier's head at least) are matmuls: what the lists leave low
# of it is refused before a program exists; other ops are checked on the program (Amp.apply).
EVERY_MODEL_RUNS = "matmul"


def _refuse_float16_matmul_on_cpu(configs):
    """float16 on CPU with matmul left low: Paddle's CPU build has no float16 matmul kernel, so
    compile would fail building backward. Refused where bfloat16 without AVX512-BF16 is."""
    white, black = op_lists(configs)
    guarded = level(configs) == "O2" and configs.use_fp16_guard     # which ops run low: known at compile
    runs_low = EVERY_MODEL_RUNS in white if level(configs) == "O1" else EVERY_MODEL_RUNS not in black and not guarded
    if runs_low and mixed_precision.without_cpu_float16([EVERY_MODEL_RUNS]):
        field = "amp_configs.use_pure_fp16" if configs.use_pure_fp16 else "amp_configs.dtype"
        raise StrategyConflictError(
            f"{field} asks for float16 matmul ops on CPU, and Paddle's CPU build has no float16 matmul kernel "
            f"(compile would fail building backward)", field=field,
            fix=f"keep the compute ops in float32 with {CPU_RECIPE}; or amp: false")


@dataclass
class LossScaling:
    """The persistable state of loss scaling, created before backward, updated after the reduce."""
    scale: Any                      # float32 [1]
    good_steps: Optional[Any]       # int32 [1], dynamic scaling only
    bad_steps: Optional[Any]


class Amp(Pass):
    check_strategy = staticmethod(check_amp_configs)
    name = "amp"
    phase = Phase.FORWARD_REWRITE
    reads = ("amp", "amp_configs.dtype", "amp_configs.use_pure_fp16", "amp_configs.use_pure_bf16",
             "amp_configs.use_fp16_guard", "amp_configs.custom_white_list", "amp_configs.custom_black_list",
             "amp_configs.custom_black_varnames", "amp_configs.init_loss_scaling",
             "amp_configs.use_dynamic_loss_scaling", "amp_configs.use_optimizer_fp16")

    def applicable(self, topology, program):
        if topology.device == "gpu" and low_dtype(self.strategy.amp_configs) == "float16" \
                and not paddle.is_compiled_with_cuda():
            return ("this Paddle build has no GPU kernels, and Paddle refuses to build the backward of float16 "
                    "ops it has no kernel for: compile the GPU program on a GPU build")
        return None

    def apply(self, context):
        configs = self.strategy.amp_configs
        dtype, amp_level = low_dtype(configs), level(configs)
        ops = list(context.block.ops)
        low_ops, casts = mixed_precision.cast_forward(context, ops, getattr(paddle, dtype),
                                                      self._precision_rule(configs, ops, context.loss))
        if dtype == "float16" and context.topology.device == "cpu":
            no_kernel = mixed_precision.without_cpu_float16({mixed_precision.name_of(op) for op in low_ops})
            if no_kernel:
                raise CompileError(f"amp runs {', '.join(no_kernel)} in float16 on CPU, and Paddle's CPU build has "
                                   f"no float16 kernel for them (backward could not be built): keep them in "
                                   f"float32 with amp_configs.custom_black_list ({CPU_RECIPE}), or amp: false")
        details = {"dtype": dtype, "level": amp_level, "casts": casts,
                   "low_ops": dict(collections.Counter(mixed_precision.name_of(op) for op in low_ops))}
        if on_onednn(dtype, context.topology):
            details["operands_asked_for_gradients"] = mixed_precision.ask_for_every_gradient(low_ops)
        summary = f"{amp_level} {dtype}: {len(low_ops)} ops in {dtype}, {casts} casts"
        if scales_loss(configs):
            context.loss_scaling = self._scale_loss(context, configs)
            details["loss_scaling"] = context.loss_scaling.scale.name
            summary += f"; backward differentiates loss x {context.loss_scaling.scale.name} (init {configs.init_loss_scaling:g})"
        return PassResult(summary, details)

    def check_backward(self, context):
        dtype = low_dtype(self.strategy.amp_configs)
        if not on_onednn(dtype, context.topology):
            return
        missing = mixed_precision.missing_gradients(context.block, getattr(paddle, dtype))
        if missing:
            names = ", ".join(sorted({op.name().replace("pd_op.", "") for op in missing}))
            raise CompileError(
                f"{len(missing)} bfloat16 {names} op(s) lack a gradient output (an operand in no_grad_set?): "
                f"Paddle 3.3.1's oneDNN bfloat16 gradient kernel writes through it and crashes the process "
                f"(SIGSEGV); keep those ops in float32 (amp_configs.custom_black_list, or custom_black_varnames "
                f"with their inputs), or leave their operands out of no_grad_set")

    @staticmethod
    def _precision_rule(configs, ops, loss):
        """runs_low(op, is_low) for mixed_precision.cast_forward: the rules of the module doc."""
        amp_level = level(configs)
        white, black = op_lists(configs)
        guarded = amp_level == "O2" and configs.use_fp16_guard
        if guarded and not any(op.has_attr(mixed_precision.FP16_GUARD) for op in ops):
            raise CompileError("use_fp16_guard is on but no op was built under fleetlite.fp16_guard() "
                               "(Paddle 3's paddle.static.amp.fp16_guard leaves no mark on PIR ops); wrap the ops "
                               "to run in low precision, or set amp_configs.use_fp16_guard: false")
        black_values, loss_ops = set(configs.custom_black_varnames), loss_computation(loss)

        def runs_low(op, is_low):
            name = mixed_precision.name_of(op)
            if (name in black or name.endswith("_") or op.id() in loss_ops
                    or (guarded and not op.has_attr(mixed_precision.FP16_GUARD)) or _reads_named(op, black_values)):
                return False
            if name in white or amp_level == "O2":
                return True
            return all(is_low(source) for source in mixed_precision.float_operands(op))

        return runs_low

    @staticmethod
    def _scale_loss(context, configs):
        constant = paddle.nn.initializer.Constant
        with context.edit():
            scale = paddle.pir.core.create_persistable_value(
                "float32", [1], paddle.utils.unique_name.generate("loss_scaling"),
                initializer=constant(configs.init_loss_scaling))
            steps = [paddle.pir.core.create_persistable_value(
                "int32", [1], paddle.utils.unique_name.generate(name), initializer=constant(0))
                for name in ("num_good_steps", "num_bad_steps")] if configs.use_dynamic_loss_scaling else [None, None]
        with context.edit(after=context.loss.get_defining_op()):
            context.loss = paddle.multiply(context.loss, scale)
        return LossScaling(scale, *steps)


class AmpLossScaling(Pass):
    name = "amp_loss_scaling"
    knobs = ("amp",)
    phase = Phase.REDUCED_REWRITE
    requires = ("amp",)
    reads = ("amp_configs.incr_every_n_steps", "amp_configs.decr_every_n_nan_or_inf", "amp_configs.incr_ratio",
             "amp_configs.decr_ratio", "amp_configs.use_dynamic_loss_scaling")

    def applicable(self, topology, program):
        configs = self.strategy.amp_configs
        if low_dtype(configs) == "bfloat16":
            return "bfloat16 keeps float32's exponent range: the loss is not scaled"
        if not scales_loss(configs):
            return "static loss scaling of 1: there is nothing to unscale"
        return None

    def apply(self, context):
        configs, state = self.strategy.amp_configs, context.loss_scaling
        gradients = context.gradients
        checked = [g for i, g in enumerate(gradients) if i not in context.unscaled]
        with context.edit():
            found_inf = None
            if checked:
                unscaled, found_inf = paddle._C_ops.check_finite_and_unscale_([g.synced for g in checked], state.scale)
                for grad, value in zip(checked, unscaled):
                    grad.synced = value
            for flag in context.unscaled.values():    # gradients a pass unscaled itself (topk, before selecting)
                found_inf = flag if found_inf is None else paddle.logical_or(found_inf, flag)
            if context.topology.world_size > 1:
                flag = paddle._C_ops.all_reduce_(paddle.cast(found_inf, "int32"), 0, MAX)
                found_inf = paddle.cast(flag, "bool")
            if configs.use_dynamic_loss_scaling:
                zeroed, _, _, _ = paddle._C_ops.update_loss_scaling_(
                    [g.synced for g in gradients], found_inf, state.scale, state.good_steps, state.bad_steps,
                    configs.incr_every_n_steps, configs.decr_every_n_nan_or_inf, configs.incr_ratio,
                    configs.decr_ratio, False)
                for grad, value in zip(gradients, zeroed):
                    grad.synced = value
            for build in context.after_overflow_agreed:
                build(found_inf)
        context.found_inf = found_inf
        agreed = "; the overflow flag is MAX-reduced on ring 0" if context.topology.world_size > 1 else ""
        if context.unscaled:
            agreed += f" ({len(context.unscaled)} unscaled before their top-k selection, their flags joined)"
        if not configs.use_dynamic_loss_scaling:
            return PassResult(f"{len(gradients)} gradients unscaled (static scale){agreed}",
                              {"gradients": len(gradients)})
        return PassResult(
            f"{len(gradients)} gradients unscaled and checked{agreed}; an overflow zeroes the step and scales by "
            f"{configs.decr_ratio:g} after {configs.decr_every_n_nan_or_inf}, x{configs.incr_ratio:g} after "
            f"{configs.incr_every_n_steps} finite steps", {"gradients": len(gradients)})


def on_onednn(dtype, topology):
    """Whether the low ops run on Paddle's oneDNN kernels: bfloat16 on CPU."""
    return dtype == "bfloat16" and topology.device == "cpu"


def loss_computation(loss):
    """Ids of the ops that turn the model's output into the loss: the op that computes `loss` and,
    walking back from it, every op up to (not including) the ones that read a parameter."""
    last = loss.get_defining_op()
    found, todo = {last.id()}, [source.get_defining_op() for source in last.operands_source()]
    while todo:
        op = todo.pop()
        if op is None or op.id() in found or _reads_parameter(op):
            continue
        found.add(op.id())
        todo += [source.get_defining_op() for source in op.operands_source()]
    return found


def _reads_parameter(op):
    return any(source.get_defining_op() is not None and source.get_defining_op().name() == "builtin.parameter"
               for source in op.operands_source())


def _reads_named(op, names):
    return bool(names) and any(source.has_name and source.name in names for source in op.operands_source())
