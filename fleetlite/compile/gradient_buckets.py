"""Gradient buckets: the unit in which gradients are summed across ranks.

A bucket is one all-reduce. Passes that decide *which* gradients travel together
(data_parallel: one bucket per gradient; fuse_all_reduce_ops: size/count buckets) build the
same op pattern here, so passes that change *how* a bucket travels (rings, hierarchical,
gloo lowering) find one shape: the collective tagged `fleetlite_bucket = index`.

Copies are kept to the minimum the executor allows, because on small CPU machines they cost
more than gloo's ~1 ms per collective: a single gradient is reduced and scaled in place (no
concat, no split; out of place only if something else reads the raw gradient); several are
packed once (`concat` of flattened views), reduced and scaled in place, and unpacked once
(`split`). No write-back `assign`, and never `coalesce_tensor`, whose views do not see an
in-place all-reduce (measured: ranks diverge).
"""
import math
from dataclasses import dataclass, field
from typing import List

import paddle

from fleetlite.compile import program_edit

SUM = 0   # reduce_type of all_reduce; gloo has no AVG, so averaging is sum then scale
IN_PLACE, OUT_OF_PLACE, CONCAT_SPLIT = "in place", "out of place", "concat/split"   # Bucket.path


@dataclass
class Bucket:
    index: int
    members: List[int]             # indices into CompileContext.gradients, in ready order
    dtype: str
    nbytes: int
    ring: int = 0
    ops: List = field(default_factory=list, repr=False)   # the ops emit() created
    outputs: List = field(default_factory=list, repr=False)   # the values emit() handed on, per member
    collective_id: int = -1        # id of the collective emit() built (a layout pass may replace it)
    path: str = CONCAT_SPLIT       # how the bytes travel (copy_free_buckets makes it copy-free on CPU)

    def describe(self, gradients):
        return {"bucket": self.index, "dtype": self.dtype, "bytes": self.nbytes, "ring": self.ring,
                "path": self.path, "gradients": [gradients[i].name for i in self.members]}


def emit(context, bucket):
    """Sum the bucket's gradients over ring `bucket.ring`, scale, and hand them to the optimizer.

    The ops go right after the producer of the bucket's last-ready gradient, so program order
    follows readiness: the first buckets are issued while backward is still running.
    """
    grads = [context.gradients[i] for i in bucket.members]
    last = max((g.grad.get_defining_op() for g in grads), key=position_in(context.block))
    with context.edit(after=last) as created:
        if len(grads) == 1:
            gradient = grads[0].grad
            bucket.path = IN_PLACE if gradient.use_empty() else OUT_OF_PLACE
            reduce = paddle._C_ops.all_reduce_ if gradient.use_empty() else paddle._C_ops.all_reduce
            reduced = reduce(gradient, bucket.ring, SUM)
        else:
            packed = paddle.concat([paddle.reshape(g.grad, [-1]) for g in grads])
            reduced = paddle._C_ops.all_reduce_(packed, bucket.ring, SUM)
        if context.gradient_scale is not None:
            reduced = paddle._C_ops.scale_(reduced, context.gradient_scale, 0.0, True)
        if len(grads) == 1:
            outputs = [reduced]
        else:
            parts = paddle.split(reduced, [math.prod(g.grad.shape) for g in grads])
            outputs = [paddle.reshape(part, g.grad.shape) for part, g in zip(parts, grads)]
    collective = next(op for op in created if op.name() in ("pd_op.all_reduce", "pd_op.all_reduce_"))
    collective.set_int_attr(program_edit.BUCKET, bucket.index)
    bucket.collective_id = collective.id()
    for grad, output in zip(grads, outputs):
        grad.synced = output
    bucket.ops, bucket.outputs = created, outputs


def take_back(context, bucket):
    """Remove what emit() built for `bucket` (before any layout pass changed it); its
    gradients go back to unreduced."""
    program_edit.remove_ops(context.block, bucket.ops)
    for i in bucket.members:
        context.gradients[i].synced = context.gradients[i].grad
    bucket.ops, bucket.outputs = [], []


def replace_collective(context, op, value):
    """Make everything that read `op`'s result (ops and gradients on their way to the
    optimizer) read `value` instead, then remove `op`."""
    old = op.result(0)
    for grad in context.gradients:
        if grad.synced.is_same(old):
            grad.synced = value
    old.replace_all_uses_with(value)
    program_edit.remove_ops(context.block, [op])


def position_in(block):
    """A key function: an op's index in `block`."""
    index = {op.id(): i for i, op in enumerate(block.ops)}
    return lambda op: index[op.id()]
