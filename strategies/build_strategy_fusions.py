"""build_strategy op fusions: Paddle 3's PIR fusion passes where the device has the fused kernels.

What each knob becomes in Paddle 3.3.1:
- fuse_bn_add_act_ops -> Paddle's bn_add_act pass (batch_norm + add + relu and its gradient,
  float16 NHWC inputs only, as in Paddle's own dy2static pipeline);
- fuse_gemm_epilogue -> fused_gemm_epilogue_pass (matmul + bias (+ relu/gelu), forward and
  backward, cuBLASLt);
- fuse_dot_product_attention -> fused_dot_product_attention_pass (cuDNN attention);
- fuse_elewise_add_act_ops, fuse_bn_act_ops, fuse_relu_depthwise_conv, fuse_resunit,
  enable_auto_fusion, fused_attention, fused_feedforward: their passes exist only for the
  legacy IR; nothing fuses them in a PIR program.
The fused kernels are CUDA-only, and on CPU these passes leave an fp32 program unchanged
(measured), so on CPU, or with a Paddle build without CUDA, the knobs are reported as skipped.

The passes run after `apply_gradients` (UPDATE_REWRITE), on the whole program. A fusion that
replaces a backward op also replaces the gradient values it produced; each gradient is found
again through the op that reads it (a collective or the optimizer), which the fusion rewired.
"""
import paddle

from fleetlite import program_edit
from fleetlite.requested_fields import requested
from fleetlite.strategies.base import Pass, PassResult, Phase, read_field


BN_ADD_ACT = "fused_bn_add_act_pass"      # registered only behind apply_bn_add_act_pass()
PIR_PASSES = {
    "build_strategy.fuse_bn_add_act_ops": BN_ADD_ACT,
    "build_strategy.fuse_gemm_epilogue": "fused_gemm_epilogue_pass",
    "build_strategy.fuse_dot_product_attention": "fused_dot_product_attention_pass",
}
LEGACY_ONLY = ("build_strategy.fuse_elewise_add_act_ops", "build_strategy.fuse_bn_act_ops",
               "build_strategy.fuse_relu_depthwise_conv", "build_strategy.fuse_resunit",
               "build_strategy.enable_auto_fusion", "build_strategy.fused_attention",
               "build_strategy.fused_feedforward")
NO_CPU_KERNELS = ("the fused kernels are CUDA-only in Paddle 3.3.1, and its PIR fusion passes leave a CPU "
                  "program unchanged")


class OpFusion(Pass):
    name = "op_fusion"
    decides_without_program = True
    phase = Phase.UPDATE_REWRITE
    before = ("gradient_merge_update",)
    reads = (*PIR_PASSES, *LEGACY_ONLY)

    def requested_fields(self):
        return [field for field in self.reads
                if requested(self.strategy, field) and read_field(self.strategy, field)]

    def enabled(self):
        return bool(self.requested_fields())

    def applicable(self, topology, program):
        fields = self.requested_fields()
        if topology.device != "gpu":
            return NO_CPU_KERNELS
        if not paddle.is_compiled_with_cuda():
            return "this Paddle build has no CUDA kernels: install paddlepaddle-gpu to fuse"
        if not any(field in PIR_PASSES for field in fields):
            return f"Paddle 3 has no PIR pass for {', '.join(_short(f) for f in fields)} (legacy IR only)"
        return None

    def apply(self, context):
        fields = self.requested_fields()
        readers = _gradient_readers(context)
        before = {op.id() for op in program_edit.walk(context.block)}
        for field in fields:
            if field in PIR_PASSES:
                run_pir_pass(context.program, PIR_PASSES[field])
        for op in program_edit.walk(context.block):
            if op.id() not in before:
                op.set_str_attr(program_edit.PROVENANCE, context.current_pass)
        _rebind_gradients(context, readers)
        ran = [f"{_short(f)}: {PIR_PASSES[f]}" for f in fields if f in PIR_PASSES]
        legacy = [_short(f) for f in fields if f not in PIR_PASSES]
        return PassResult("; ".join(ran) + (f"; no PIR pass for {', '.join(legacy)}" if legacy else ""),
                          {"ran": ran, "no_pir_pass": legacy})


def run_pir_pass(program, name):
    if name == BN_ADD_ACT:
        paddle.base.libpaddle.pir.apply_bn_add_act_pass(program)
        return
    manager = paddle.pir.PassManager()
    manager.add_pass(name, {})
    manager.run(program)


def _short(dotted):
    return dotted.split(".", 1)[1]


def _gradient_readers(context):
    """For each gradient, one (op, operand index) that reads it: fusions rewire readers, not GradientSync."""
    readers = []
    for grad in context.gradients:
        reader = next(iter(grad.grad.all_used_ops()), None)
        index = None if reader is None else next(i for i, operand in enumerate(reader.operands())
                                                 if operand.source().is_same(grad.grad))
        readers.append((reader, index))
    return readers


def _rebind_gradients(context, readers):
    for grad, (reader, index) in zip(context.gradients, readers):
        if reader is None:
            continue
        replacement = reader.operand_source(index)
        if grad.synced is not None and grad.synced.is_same(grad.grad):
            grad.synced = replacement
        grad.grad = replacement
