"""copy_free_buckets: on CPU, sync multi-gradient buckets without copying them.

Always on for CPU programs (it is how fleetlite makes buckets there, not a knob): after the
gloo lowering, every bucket that gradient_buckets.emit left in its plain form (concat ->
all_reduce_ on ring 0 -> scale_ -> split) becomes pack -> all_reduce_ -> alias on a persistable
buffer (fleetlite.compile.bucket_views): from the second step on, backward writes each gradient into
its slot, the bucket costs one collective and no copy, and the 1/N scale rides on the pack.
The GPU program keeps its own path (NCCL, concat/split around the collective).

A bucket stays on the copying path, with the reason in the report, when
- a layout pass rewrote its collective (fp16_allreduce's casts, a hierarchical or subgroup
  emulation): its sum is not an all_reduce_ of the packed buffer;
- a member is read by something the bucket does not wait for (the raw value becomes the
  reduced slot), is
  gradient merge's copy of its accumulator (it runs inside the update branch), is defined
  inside a branch, or has a dtype the kernels do not handle;
- the kernels cannot be built here (no C++ compiler): then every bucket, and the report says so
  once.
Single-gradient buckets are already reduced in place, without a copy.
Under execution_strategy.num_iteration_per_run > 1 the gradients are not kept between steps
(Paddle 3.3's N-step plan crashes on them, fleetlite.paddle_compat.steps_plan): the buckets are
still one collective each, and the pack copies each gradient in (the report says so).
"""
import math

import paddle

from fleetlite.compile import bucket_views, gradient_buckets, program_edit
from fleetlite.compile.pass_contract import Pass, PassResult, Phase
from fleetlite.strategies.gradient_merge import GradientMerge

COPY_FREE = "copy-free"
NOT_KEPT = ("Paddle's N-step plan (execution_strategy.num_iteration_per_run) cannot run "
            "with the gradients kept as persistable variables")


class CopyFreeBuckets(Pass):
    name = "copy_free_buckets"
    phase = Phase.LOWERING
    after = ("gloo_lowering",)
    requires = ("data_parallel",)

    def enabled(self):
        return True

    def applicable(self, topology, program):
        if topology.device != "cpu":
            return f"{topology.backend} keeps its concat/split buckets around the collective"
        error = bucket_views.load_error()
        if error is not None:
            return f"the bucket kernels cannot be built here ({error}): buckets copy through concat/split"
        return None

    def apply(self, context):
        reasons = {}
        for bucket in context.buckets:
            if len(bucket.members) == 1:
                continue
            plan = _plain_bucket(context, bucket)
            if isinstance(plan, str):
                bucket.path = f"{gradient_buckets.CONCAT_SPLIT}: {plan}"
                reasons[bucket.index] = plan
                continue
            _make_copy_free(context, bucket, *plan)
            bucket.path = COPY_FREE
        multi = [b for b in context.buckets if len(b.members) > 1]
        if not multi:
            return PassResult("no bucket holds several gradients: each is reduced on its own, without packing")
        free = [b.index for b in multi if b.path == COPY_FREE]
        summary = f"{len(free)} of {len(multi)} multi-gradient buckets copy-free"
        if free and not _keeps_gradients(context):
            summary += f" (the pack copies every gradient in at each step: {NOT_KEPT})"
        if reasons:
            summary += "; " + "; ".join(f"bucket {index} copies: {why}" for index, why in reasons.items())
        return PassResult(summary, {"copy_free": free, "copying": reasons})


def _plain_bucket(context, bucket):
    """(collective, scale) if `bucket` is still emit()'s plain form, else why it is not."""
    tagged = [op for op in program_edit.walk(context.block)
              if program_edit.int_attr(op, program_edit.BUCKET) == bucket.index]
    if len(tagged) != 1 or tagged[0].id() != bucket.collective_id:    # else emit()'s ops are all there
        return "a layout pass rewrote its collective"
    collective = tagged[0]
    if collective.attrs()["ring_id"] != 0 or collective.attrs()["reduce_type"] != gradient_buckets.SUM:
        return "its collective is not a sum on ring 0"
    top_level = {op.id() for op in context.block.ops}
    upstream = _ancestors(collective)
    for grad in (context.gradients[i] for i in bucket.members):
        why = _member_refusal(grad, top_level, upstream)
        if why:
            return why
    scales = [op for op in bucket.ops if op.name() == "pd_op.scale_"]
    scale = scales[0].operand_source(1).get_defining_op().attrs()["value"] if scales else 1.0
    return collective, scale


def _member_refusal(grad, top_level, upstream):
    """Why `grad` cannot become a view of its slot, or None (`top_level`: ids of the block's own
    ops; `upstream`: ids of the ops the bucket's collective depends on)."""
    producer = grad.grad.get_defining_op()
    if program_edit.provenance(producer) == GradientMerge.name:
        return "its gradients are gradient merge's copies, which run inside the update branch"
    if producer.id() not in top_level:
        return f"the gradient of {grad.name} is made inside a branch"
    if grad.dtype not in bucket_views.DTYPES:
        return f"the gradient of {grad.name} is {grad.dtype} (the kernels take {', '.join(bucket_views.DTYPES)})"
    # Once packed, the raw value is the slot, summed in place: a reader the executor could run
    # after the pack would see the sum. Readers the bucket waits for (sync batch norm's input
    # gradient reads its scale gradient, and feeds the conv gradients packed with it) are safe.
    if any(user.id() not in upstream for user in grad.grad.all_used_ops()):
        return f"the gradient of {grad.name} is read by more than the bucket"
    return None


def _ancestors(op):
    """Ids of the ops `op` depends on, directly or not."""
    seen, pending = set(), [op]
    while pending:
        for source in pending.pop().operands_source():
            producer = source.get_defining_op()
            if producer is not None and producer.id() not in seen:
                seen.add(producer.id())
                pending.append(producer)
    return seen


def _keeps_gradients(context):
    """Whether the bucket's gradients can be kept between steps (see bucket_views.keep_in_scope)."""
    return bucket_views.can_keep_gradients(context.strategy.execution_strategy.num_iteration_per_run)


def _make_copy_free(context, bucket, collective, scale):
    grads = [context.gradients[i] for i in bucket.members]
    numel = sum(math.prod(g.grad.shape) for g in grads)
    kept = _keeps_gradients(context)
    with context.edit():
        buffer = bucket_views.new_buffer(bucket.dtype, numel)
        names = [bucket_views.new_gradient_variable(g.grad, g.name) for g in grads] if kept else []
    with context.edit(before=collective) as created:
        for grad, name in zip(grads, names):
            bucket_views.keep_in_scope(grad.grad, name)
        packed = bucket_views.pack([g.grad for g in grads], buffer, scale)
        reduced = paddle._C_ops.all_reduce_(packed, 0, gradient_buckets.SUM)
        views = bucket_views.alias(reduced, [g.grad for g in grads])
    next(op for op in created if op.name() == "pd_op.all_reduce_").set_int_attr(program_edit.BUCKET, bucket.index)
    for grad, old, view in zip(grads, bucket.outputs, views):
        if grad.synced.is_same(old):
            grad.synced = view
        old.replace_all_uses_with(view)
    program_edit.remove_ops(context.block, bucket.ops)
    bucket.ops, bucket.outputs = created, views
