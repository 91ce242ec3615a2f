"""gradient_scale_configs.scale_gradient: divide the loss gradient by N instead of every gradient.

With `scale_strategy: avg`, data_parallel sums each gradient over N ranks and then scales it by
1/N: one more pass over every gradient byte per step. The loss gradient is where backward
starts (ones shaped like the loss); scaling it by 1/N scales every gradient by 1/N, so the sum
over ranks is already the mean. This pass re-emits the buckets without their scale ops and
puts one scalar `scale` on the loss gradient. Summing pre-scaled values rounds differently
from scaling the sum, within float32 rounding.
"""
import paddle

from fleetlite import gradient_buckets
from fleetlite.compile_report import human_bytes
from fleetlite.errors import CompileError
from fleetlite.strategies.base import Pass, PassResult, Phase


class ScaleGradient(Pass):
    name = "gradient_scale_configs.scale_gradient"
    decides_without_program = True
    phase = Phase.COMMUNICATION
    requires = ("data_parallel",)
    reads = ("gradient_scale_configs.scale_gradient",)

    def enabled(self):
        return bool(self.strategy.gradient_scale_configs.scale_gradient)

    def applicable(self, topology, program):
        strategy = self.strategy.gradient_scale_configs.scale_strategy
        if strategy != "avg":
            return f"scale_strategy is '{strategy}': there is no 1/N to move to the loss gradient"
        return None

    def apply(self, context):
        world = context.topology.world_size
        for bucket in context.buckets:
            gradient_buckets.take_back(context, bucket)
        context.gradient_scale = None
        for bucket in context.buckets:
            gradient_buckets.emit(context, bucket)
        scale_loss_gradient(context, 1.0 / world)
        total = sum(g.nbytes for g in context.gradients)
        return PassResult(f"1/{world} applied to the loss gradient instead of to {len(context.gradients)} gradients "
                          f"after the sum ({human_bytes(total)} not rescaled per step)",
                          {"scale": 1.0 / world, "bytes_not_rescaled": total})


def scale_loss_gradient(context, factor):
    """Scale the value backward starts from (`full_like(loss, 1)`) by `factor`, for every reader."""
    seed_op = next((op for op in context.block.ops if op.name() == "pd_op.full_like"
                    and context.loss is not None and op.operand_source(0).is_same(context.loss)), None)
    if seed_op is None:
        raise CompileError("cannot find the loss gradient (full_like of the loss) that backward starts from")
    seed = seed_op.result(0)
    readers = list(seed.all_used_ops())
    with context.edit(after=seed_op):
        scaled = paddle.scale(seed, factor)
    for reader in readers:
        for operand in reader.operands():
            if operand.source().is_same(seed):
                operand.set_source(scaled)
