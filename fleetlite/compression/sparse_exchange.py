"""What the sparse gradient exchanges (strategies/topk_exchange.py, strategies/dgc.py) build the same way.

- `gather_pairs`: every rank's selected (values, indices) all-gathered on a ring, in rank order.
- `gather_and_scatter_add`: every rank's selected (values, indices) all-gathered on a ring (ring 0
  for the world) and added by index into a dense tensor (`scatter_add`). Each rank adds the
  gathered pairs in the same (rank) order, so all ranks hold bit-identical sums; indices travel
  as int32.
- `selection`: which MSTopK the program gets for its device.
- `take_from_buckets`: the taken gradients leave data_parallel's buckets; the others stay dense.
- `scaled`: the sum times the job's gradient scale (1/N with the default `avg`), as buckets do.
- `step_counter`: a persistable step index for schedules that branch on the step (`pd_op.if`).
- `require_program_order`: collectives inside a branch stay in the same order on every rank only
  when the program runs in program order (FLAGS_new_executor_sequential_run): Paddle's
  multi-threaded executor orders the top level's collectives among themselves but not against
  those inside a branch, and gloo aborted on mismatched sizes (measured). A pass that branches
  sets `context.runtime_flags[IN_ORDER]`; a user who turned sequential execution off is refused.
"""
import paddle
from paddle.pir.core import create_persistable_value

from fleetlite.compile import gradient_buckets
from fleetlite.compile.pass_contract import IN_ORDER  # noqa: F401 (the passes' name for it)
from fleetlite.errors import StrategyConflictError
from fleetlite.strategy.requested_fields import requested

INDEX_BYTES = 4    # int32 indices on the wire


def selection(context):
    """MSTopK's implementation for the program's device, not the building machine's: the compiled
    kernel is CPU code, so a program built for GPUs (on a CPU machine too, e.g. by `explain`)
    takes the Paddle-op composition."""
    return "auto" if context.topology.device == "cpu" else "ops"


def take_from_buckets(context, taken):
    """Take the gradients at indices `taken` out of data_parallel's buckets (before any layout
    pass regrouped them) and mark them exchanged; every other gradient gets its bucket back."""
    for bucket in context.buckets:
        gradient_buckets.take_back(context, bucket)
    context.buckets = []
    context.exchanged = set(taken)
    for index, grad in enumerate(context.gradients):
        if index not in context.exchanged:
            bucket = gradient_buckets.Bucket(len(context.buckets), [index], grad.dtype, grad.nbytes)
            gradient_buckets.emit(context, bucket)
            context.buckets.append(bucket)


def scaled(context, summed):
    """`summed` scaled in place by the job's gradient scale (none with scale_strategy sum)."""
    scale = context.gradient_scale
    return summed if scale is None else paddle._C_ops.scale_(summed, scale, 0.0, True)


def gather_and_scatter_add(values, indices, numel, ring, ranks, wire_dtype=None):
    """(sum over the `ranks` ranks of `ring` of their (values, indices) as a dense [numel] tensor,
    unscaled; the values as this rank put them on the wire). `wire_dtype` (e.g. float16) casts the
    values for the all-gather and back. A ring of one rank gathers nothing."""
    gathered, positions, wire = gather_pairs(values, indices, ring, ranks, wire_dtype)
    return scatter_add(gathered, positions, numel), wire


def scatter_add(values, positions, numel):
    """A dense [numel] tensor: zeros plus each value at its int32 position, in the order given."""
    return paddle.scatter_nd_add(paddle.zeros([numel], values.dtype), paddle.reshape(positions, [-1, 1]), values)


def gather_pairs(values, indices, ring, ranks, wire_dtype=None):
    """(every rank's values in rank order, back in `values`' dtype; their int32 indices; the values
    as this rank put them on the wire), all-gathered over the `ranks` ranks of `ring`."""
    wire = values if wire_dtype is None else paddle.cast(values, wire_dtype)
    gathered, positions = wire, indices if indices.dtype == paddle.int32 else paddle.cast(indices, "int32")
    if ranks > 1:
        gathered = paddle._C_ops.all_gather(gathered, ring, ranks)
        positions = paddle._C_ops.all_gather(positions, ring, ranks)
    if wire_dtype is not None:
        gathered = paddle.cast(gathered, values.dtype)
    return gathered, positions, wire


def step_counter(context, gradients, name):
    """A float32 step index (0 on the first run), from a persistable counter incremented right
    before the first of `gradients` (GradientSync) is produced, once per run."""
    first = min((grad.grad.get_defining_op() for grad in gradients), key=lambda op: context.block.ops.index(op))
    with context.edit():
        counter = create_persistable_value("int64", [1], paddle.utils.unique_name.generate(name),
                                           initializer=paddle.nn.initializer.Constant(0))
    with context.edit(before=first):
        return paddle.cast(paddle._C_ops.increment_(counter, 1.0), "float32") - 1.0


def require_program_order(strategy, branching, fix):
    """Refuse `build_strategy.enable_sequential_execution: false` for a schedule that branches;
    `branching` names what puts collectives inside a branch, `fix` how else to avoid it."""
    if requested(strategy, "build_strategy.enable_sequential_execution") \
            and not strategy.build_strategy.enable_sequential_execution:
        raise StrategyConflictError(
            f"{branching} puts collectives inside a branch, which only program order keeps in the same order on "
            f"every rank", field="build_strategy.enable_sequential_execution", value=False,
            fix=f"leave build_strategy.enable_sequential_execution unset or true, or {fix}")
