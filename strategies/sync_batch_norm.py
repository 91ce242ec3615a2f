"""sync_batch_norm: batch-norm statistics over the global batch (all ranks), not each shard.

With small per-rank batches, per-shard statistics are noisy and the model trains differently
from one process on the whole batch. This pass rewrites every training-mode `batch_norm_` and
its `batch_norm_grad` (it runs after backward, so both exist) into plain ops around two
all-reduces on ring 0, one per direction, with the arithmetic of `compile/global_batch_norm`
(the global batch's sums, statistics and input gradient); the running mean and variance are
updated in place with the op's momentum, from the global statistics (identical on every rank).
The scale and bias gradients stay this rank's sums, which data_parallel then averages like any
gradient. The cost is two small collectives per batch-norm layer per step (about 1 ms each on
gloo); NCCL runs the same program on GPUs.
"""
import paddle

from fleetlite.compile import global_batch_norm, gradient_buckets, program_edit
from fleetlite.compile.pass_contract import Pass, PassResult, Phase

FORWARD, BACKWARD = "pd_op.batch_norm_", "pd_op.batch_norm_grad"


def _trains(op):
    attrs = op.attrs()
    return op.name() == FORWARD and not attrs["is_test"] and not attrs["use_global_stats"]


class SyncBatchNorm(Pass):
    name = "sync_batch_norm"
    phase = Phase.BACKWARD_REWRITE
    before = ("gradient_merge",)
    reads = ("sync_batch_norm",)

    def applicable(self, topology, program):
        if topology.world_size == 1:
            return "one rank: its batch is the global batch"
        if not any(_trains(op) for op in program.global_block().ops):
            return "the program has no batch_norm in training mode"
        return None

    def apply(self, context):
        layers = [op for op in context.block.ops if _trains(op)]
        for forward in layers:
            gradient = next((op for op in context.block.ops if op.name() == BACKWARD
                             and _input(op, "saved_mean").is_same(forward.result(3))), None)
            statistics = self._forward(context, forward)
            if gradient is not None:
                self._backward(context, gradient, statistics)
            program_edit.remove_ops(context.block, [forward])
        return PassResult(f"{len(layers)} batch norms use global statistics (2 all-reduces each on ring 0)",
                          {"layers": len(layers)})

    @staticmethod
    def _forward(context, op):
        x, running_mean, running_var, scale, bias = op.operands_source()
        attrs = op.attrs()
        layout = global_batch_norm.ChannelLayout(x.shape, attrs["data_format"])
        with context.edit(before=op):
            summed = paddle._C_ops.all_reduce_(global_batch_norm.local_sums(x, layout), 0, gradient_buckets.SUM)
            stats = global_batch_norm.statistics(summed, layout, attrs["epsilon"])
            normalised = global_batch_norm.normalise(x, stats, layout)
            out = global_batch_norm.affine(normalised, scale, bias, layout)
            new_mean, new_var = (paddle.assign(global_batch_norm.moving_average(running, batch, attrs["momentum"]),
                                               output=running)
                                 for running, batch in ((running_mean, stats.mean), (running_var, stats.variance)))
        for old, new in zip(op.results()[:3], (out, new_mean, new_var)):
            _rewire(old, new, keep=BACKWARD)
        return layout, stats, normalised, scale

    @staticmethod
    def _backward(context, op, forward):
        layout, stats, normalised, scale = forward
        out_grad = _input(op, "out_grad")
        with context.edit(before=op):
            bias_grad, scale_grad = global_batch_norm.local_gradient_sums(out_grad, normalised, layout)
            summed = paddle._C_ops.all_reduce_(paddle.concat([bias_grad, scale_grad]), 0, gradient_buckets.SUM)
            x_grad = global_batch_norm.input_gradient(out_grad, normalised, summed, scale, stats, layout)
        for old, new in zip(op.results(), (x_grad, scale_grad, bias_grad)):
            for grad in context.gradients:
                if grad.grad.is_same(old):
                    grad.grad = grad.synced = new
            _rewire(old, new)
        program_edit.remove_ops(context.block, [op])


def _input(op, name):
    return op.operand_source(op.get_input_names().index(name))


def _rewire(old, new, keep=None):
    """Point every reader of `old` at `new`, except ops named `keep` (removed with it)."""
    if not old.initialized():
        return
    for user in list(old.all_used_ops()):
        if user.name() == keep:
            continue
        for operand in user.operands():
            if operand.source().is_same(old):
                operand.set_source(new)
