"""data_parallel: sum every gradient over all ranks and scale it by 1/N before the optimizer.

Always on (it is what makes the program data parallel), except under local SGD (localsgd,
adaptive_localsgd), which averages parameters instead: then it is skipped, and with it every
pass that shapes the gradient all-reduce. Each gradient becomes its own
bucket — `all_reduce` on ring 0, then `scale_` by 1/world (gloo has no AVG reduce, and the
scale keeps the update equal to one process on the full batch). Layout passes regroup and
reroute these buckets; this pass only decides that every trainable gradient crosses ranks
exactly once.
"""
from fleetlite.compile import gradient_buckets
from fleetlite.compile.pass_contract import Pass, PassResult, Phase


class DataParallel(Pass):
    name = "data_parallel"
    decides_without_program = True
    always_on = True
    phase = Phase.COMMUNICATION
    reads = ("gradient_scale_configs.scale_strategy",)

    def applicable(self, topology, program):
        if topology.world_size == 1:
            return "one rank: there is nothing to reduce"
        if self.strategy.localsgd or self.strategy.adaptive_localsgd:
            return "local SGD keeps the gradients on their rank and averages the parameters instead"
        return None

    def apply(self, context):
        world = context.topology.world_size
        if self.strategy.gradient_scale_configs.scale_strategy == "avg":
            context.gradient_scale = 1.0 / world
        for index, grad in enumerate(context.gradients):
            bucket = gradient_buckets.Bucket(index, [index], grad.dtype, grad.nbytes)
            gradient_buckets.emit(context, bucket)
            context.buckets.append(bucket)
        context.reduced = True
        scaled = f", scaled by 1/{world}" if context.gradient_scale is not None else ", not scaled"
        return PassResult(f"{len(context.gradients)} gradients all-reduced on ring 0{scaled}",
                          {"gradients": len(context.gradients), "scale": context.gradient_scale})
