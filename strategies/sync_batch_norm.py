"""sync_batch_norm: batch-norm statistics over the global batch (all ranks), not each shard.

With small per-rank batches, per-shard statistics are noisy and the model trains differently
from one process on the whole batch. This pass rewrites every training-mode `batch_norm_` and
its `batch_norm_grad` (it runs after backward, so both exist) into plain ops around two
all-reduces on ring 0, one per direction:

- forward: per channel, the local sum, sum of squares and element count are packed and summed
  over ranks in one all-reduce; mean = S1/n, var = S2/n - mean^2 (biased, as batch_norm), the
  output is normalised with them, and the running mean and variance are updated in place with
  the op's momentum, from the global statistics (identical on every rank);
- backward: with x^ = (x - mean) / std and the output gradient dy, the input gradient needs
  the global sums of dy and dy * x^ (one more all-reduce):
      dx = scale / std * (dy - sum(dy) / n - x^ * sum(dy * x^) / n)
  while the scale and bias gradients stay this rank's sums of dy * x^ and dy, which
  data_parallel then averages like any gradient.
The counts travel with the sums, so ranks may hold batches of different sizes. The cost is two
small collectives per batch-norm layer per step (about 1 ms each on gloo); NCCL runs the same
program on GPUs.
"""
from dataclasses import dataclass
from typing import Any

import paddle

from fleetlite.compile import gradient_buckets, program_edit
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
            stats = self._forward(context, forward)
            if gradient is not None:
                self._backward(context, gradient, stats)
            program_edit.remove_ops(context.block, [forward])
        return PassResult(f"{len(layers)} batch norms use global statistics (2 all-reduces each on ring 0)",
                          {"layers": len(layers)})

    @staticmethod
    def _forward(context, op):
        x, running_mean, running_var, scale, bias = op.operands_source()
        attrs = op.attrs()
        layout = _Layout(x, attrs["data_format"])
        with context.edit(before=op):
            count = paddle.reshape(paddle.cast(paddle.numel(x) // layout.channels, "float32"), [1])
            local = paddle.concat([paddle.sum(x, layout.axes), paddle.sum(x * x, layout.axes), count])
            total, squares, n = paddle.split(paddle._C_ops.all_reduce_(local, 0, gradient_buckets.SUM),
                                             [layout.channels, layout.channels, 1])
            mean = total / n
            variance = squares / n - mean * mean
            inverse_std = paddle.rsqrt(variance + attrs["epsilon"])
            normalised = (x - layout.per_channel(mean)) * layout.per_channel(inverse_std)
            out = normalised * layout.per_channel(scale) + layout.per_channel(bias)
            momentum = attrs["momentum"]
            new_mean = paddle.assign(running_mean * momentum + mean * (1 - momentum), output=running_mean)
            new_var = paddle.assign(running_var * momentum + variance * (1 - momentum), output=running_var)
        for old, new in zip(op.results()[:3], (out, new_mean, new_var)):
            _rewire(old, new, keep=BACKWARD)
        return _Statistics(layout, n, inverse_std, normalised, scale)

    @staticmethod
    def _backward(context, op, stats):
        layout, out_grad = stats.layout, _input(op, "out_grad")
        with context.edit(before=op):
            bias_grad = paddle.sum(out_grad, layout.axes)
            scale_grad = paddle.sum(out_grad * stats.normalised, layout.axes)
            summed = paddle._C_ops.all_reduce_(paddle.concat([bias_grad, scale_grad]), 0, gradient_buckets.SUM)
            mean_grad, mean_projection = paddle.split(summed / stats.n, 2)
            x_grad = layout.per_channel(stats.scale * stats.inverse_std) * (
                out_grad - layout.per_channel(mean_grad) - stats.normalised * layout.per_channel(mean_projection))
        for old, new in zip(op.results(), (x_grad, scale_grad, bias_grad)):
            for grad in context.gradients:
                if grad.grad.is_same(old):
                    grad.grad = grad.synced = new
            _rewire(old, new)
        program_edit.remove_ops(context.block, [op])


class _Layout:
    """Where the channels are in a batch-norm input, and how to broadcast per-channel values."""

    def __init__(self, x, data_format):
        rank = len(x.shape)
        self.channel = 1 if data_format.startswith("NC") else rank - 1
        self.channels = x.shape[self.channel]
        self.axes = [axis for axis in range(rank) if axis != self.channel]
        self.broadcast = [self.channels if axis == self.channel else 1 for axis in range(rank)]

    def per_channel(self, value):
        return paddle.reshape(value, self.broadcast)


@dataclass
class _Statistics:
    """What the backward rewrite reuses from the forward one (pir.Values, per channel or like x)."""
    layout: _Layout
    n: Any                  # global element count per channel, [1]
    inverse_std: Any
    normalised: Any         # x^
    scale: Any


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
