"""Batch norm over the global batch, as sums that one all-reduce per direction completes.

Shared by the `sync_batch_norm` pass (static programs: the values are pir.Values) and the eager
loop's SyncBatchNorm (`runtime/eager_sync_batch_norm.py`: eager Tensors); the arithmetic is the
same Paddle calls in both, only the all-reduce between the steps differs.

- forward: per channel, this rank's sum, sum of squares and element count (`local_sums`) are
  summed over ranks; `statistics` turns the totals into the mean, the biased variance (as
  batch_norm) and 1/std;
- backward: with x^ = (x - mean) / std and the output gradient dy, the input gradient needs the
  global sums of dy and dy * x^ (`local_gradient_sums`, summed over ranks):
      dx = scale / std * (dy - sum(dy) / n - x^ * sum(dy * x^) / n)
  while the scale and bias gradients stay this rank's sums of dy * x^ and dy, which data
  parallelism then averages like any gradient.
The counts travel with the sums, so ranks may hold batches of different sizes.
"""
from dataclasses import dataclass
from typing import Any

import paddle


class ChannelLayout:
    """Where the channels are in a batch-norm input, and how to broadcast per-channel values."""

    def __init__(self, shape, data_format):
        rank = len(shape)
        self.channel = 1 if data_format.startswith("NC") else rank - 1
        self.channels = shape[self.channel]
        self.axes = [axis for axis in range(rank) if axis != self.channel]
        self.broadcast = [self.channels if axis == self.channel else 1 for axis in range(rank)]

    def per_channel(self, value):
        return paddle.reshape(value, self.broadcast)


@dataclass
class Statistics:
    """The global statistics of one batch-norm input (per channel, except `n`: shape [1])."""
    mean: Any
    variance: Any
    inverse_std: Any
    n: Any


def local_sums(x, layout):
    """[sum(x), sum(x * x), count] of this rank, per channel: 2 * channels + 1 values."""
    count = paddle.reshape(paddle.cast(paddle.numel(x) // layout.channels, "float32"), [1])
    return paddle.concat([paddle.sum(x, layout.axes), paddle.sum(x * x, layout.axes), count])


def statistics(summed, layout, epsilon):
    """The Statistics of `local_sums` summed over every rank."""
    total, squares, n = paddle.split(summed, [layout.channels, layout.channels, 1])
    mean = total / n
    variance = squares / n - mean * mean
    return Statistics(mean, variance, paddle.rsqrt(variance + epsilon), n)


def normalise(x, stats, layout):
    """x^ = (x - mean) / std."""
    return (x - layout.per_channel(stats.mean)) * layout.per_channel(stats.inverse_std)


def affine(normalised, scale, bias, layout):
    """The batch norm's output: x^ * scale + bias."""
    return normalised * layout.per_channel(scale) + layout.per_channel(bias)


def moving_average(running, batch_value, momentum):
    """The next running mean or variance (batch_norm's rule, `momentum` weighs the old value)."""
    return running * momentum + batch_value * (1 - momentum)


def local_gradient_sums(out_grad, normalised, layout):
    """(sum(dy), sum(dy * x^)) of this rank, per channel: the bias and scale gradients."""
    return paddle.sum(out_grad, layout.axes), paddle.sum(out_grad * normalised, layout.axes)


def input_gradient(out_grad, normalised, summed_gradients, scale, stats, layout):
    """dx from the concatenated `local_gradient_sums` summed over every rank."""
    mean_grad, mean_projection = paddle.split(summed_gradients / stats.n, 2)
    return layout.per_channel(scale * stats.inverse_std) * (
        out_grad - layout.per_channel(mean_grad) - normalised * layout.per_channel(mean_projection))
