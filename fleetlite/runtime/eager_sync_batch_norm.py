"""`paddle.nn.SyncBatchNorm` in Fleet's eager loop on CPU, over fleetlite's process group.

Paddle 3.3.1's CPU build has no `sync_batch_norm` kernel: a model after
`SyncBatchNorm.convert_sync_batchnorm(model)` fails at its first training forward with
"(NotFound) The kernel 'sync_batch_norm' is not registered". `fleet.distributed_model` gives each
such layer the forward of `ProcessGroupSyncBatchNorm` instead (a class swap: the layer keeps
its own parameters, buffers, hooks and state_dict keys, and the optimizer already holds them).
In training it computes the global batch's statistics with `compile/global_batch_norm` (the
arithmetic of the static `sync_batch_norm` pass): one all-reduce of [sum, sum of squares,
count] per channel in forward and one of the two gradient sums in backward, on the default
process group that paddle.DataParallel also uses. In eval it is plain batch_norm on the running
statistics. On a GPU, Paddle's own kernel stays (and on a Paddle past version_gate's bound).
"""
import paddle
import paddle.distributed as dist
from paddle.autograd import PyLayer

from fleetlite.compile import global_batch_norm
from fleetlite.paddle_compat import version_gate
from fleetlite.runtime import process_group
from fleetlite.runtime.collective_waits import waiting_in


def swap(model, topology):
    """`model` with every paddle.nn.SyncBatchNorm in it (itself included) trained over the process
    group, on a CPU job (while Paddle has no CPU kernel for it); the model itself either way."""
    if topology.device == "cpu" and version_gate.needed("no CPU sync_batch_norm kernel"):
        for layer in [model, *model.sublayers()]:
            if type(layer) is paddle.nn.SyncBatchNorm:
                layer.__class__ = ProcessGroupSyncBatchNorm
    return model


def _sum_over_ranks(tensor, activity):
    if process_group.is_up():
        with waiting_in(activity):
            dist.all_reduce(tensor)
    return tensor


class _GlobalBatchNorm(PyLayer):
    """y = x^ * scale + bias with x^ normalised by the global batch's statistics; its backward
    reduces the two sums dx needs. Returns (y, batch mean, batch variance)."""

    @staticmethod
    def forward(ctx, x, scale, bias, epsilon, data_format):
        layout = global_batch_norm.ChannelLayout(x.shape, data_format)
        summed = _sum_over_ranks(global_batch_norm.local_sums(x, layout), "SyncBatchNorm forward")
        stats = global_batch_norm.statistics(summed, layout, epsilon)
        normalised = global_batch_norm.normalise(x, stats, layout)
        ctx.layout, ctx.stats = layout, stats
        ctx.differentiable = [not value.stop_gradient for value in (x, scale, bias)]
        ctx.save_for_backward(normalised, scale)
        ctx.mark_non_differentiable(stats.mean, stats.variance)
        return global_batch_norm.affine(normalised, scale, bias, layout), stats.mean, stats.variance

    @staticmethod
    def backward(ctx, out_grad, *_):
        """(dx, dscale, dbias), None for an input that takes no gradient (Paddle requires it).
        Whether x takes one is the same on every rank, so they all skip the all-reduce alike."""
        normalised, scale = ctx.saved_tensor()
        bias_grad, scale_grad = global_batch_norm.local_gradient_sums(out_grad, normalised, ctx.layout)
        x_grad = None
        if ctx.differentiable[0]:
            summed = _sum_over_ranks(paddle.concat([bias_grad, scale_grad]), "SyncBatchNorm backward")
            x_grad = global_batch_norm.input_gradient(out_grad, normalised, summed, scale, ctx.stats, ctx.layout)
        return tuple(grad if wanted else None
                     for grad, wanted in zip((x_grad, scale_grad, bias_grad), ctx.differentiable))


class ProcessGroupSyncBatchNorm(paddle.nn.SyncBatchNorm):
    """A SyncBatchNorm whose statistics are summed over fleetlite's process group (see above)."""

    def forward(self, x):
        self._check_data_format()
        if not self.training:
            return paddle.nn.functional.batch_norm(x, self._mean, self._variance, self.weight, self.bias,
                                                   training=False, epsilon=self._epsilon,
                                                   data_format=self._data_format)
        out, mean, variance = _GlobalBatchNorm.apply(x, self.weight, self.bias, self._epsilon, self._data_format)
        with paddle.no_grad():
            for running, batch in ((self._mean, mean), (self._variance, variance)):
                paddle.assign(global_batch_norm.moving_average(running, batch, self._momentum), output=running)
        return out
