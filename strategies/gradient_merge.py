"""gradient_merge: accumulate k micro-steps' gradients, then communicate and update once.

Each executor run is one micro-step. Two passes, one knob:

`gradient_merge` (BACKWARD_REWRITE) adds every gradient into a persistable accumulator (zeros
in the startup program) right where backward produces it, and hands the communication passes
a copy of the accumulated sum: times 1/k_steps with `avg`, as is without. The copy is what the
all-reduce (or the bucket's concat) reads, so nothing downstream ever writes into the
accumulator in place.

`gradient_merge_update` (UPDATE_REWRITE, once `apply_gradients` has built the update) moves
everything that depends on the accumulated sums — those copies, the collectives, AMP's
unscale, the optimizer — into the true branch of one `pd_op.if` at the end of the program,
taken when a persistable step counter reaches a multiple of k_steps; the branch ends by
zeroing the accumulators. Ops a pass lists in `context.update_only` (pto's parameter exchange,
which a rank that owns nothing runs without reading any gradient) move with them. The counter
is the same on every rank, so every rank takes the branch on the same run and the collectives inside it always meet.

Why a copy and a branch-final zero: inside an `if` branch Paddle 3.3.1's executor does not
order an in-place write to an outer value after reads of another value that aliases the same
buffer (measured: an in-place scale of the accumulator inside the branch raced with the
zeroing and the parameters came out wrong, nondeterministically; reading the accumulator by
value and zeroing it last is ordered correctly).
"""
import paddle
from paddle.pir.core import create_persistable_value

from fleetlite import program_edit
from fleetlite.compile_report import human_bytes
from fleetlite.strategies.base import Pass, PassResult, Phase

ACCUMULATOR_SUFFIX = "@GRAD@MERGED"


class GradientMerge(Pass):
    name = "gradient_merge"
    decides_without_program = True
    phase = Phase.BACKWARD_REWRITE
    reads = ("gradient_merge", "gradient_merge_configs.k_steps", "gradient_merge_configs.avg")

    def applicable(self, topology, program):
        if self.strategy.gradient_merge_configs.k_steps == 1:
            return "k_steps = 1: every step already communicates and updates"
        return None

    def apply(self, context):
        k_steps = self.strategy.gradient_merge_configs.k_steps
        avg = self.strategy.gradient_merge_configs.avg
        for grad in context.gradients:
            with context.edit():
                accumulator = create_persistable_value(grad.grad.dtype, grad.grad.shape,
                                                       grad.name + ACCUMULATOR_SUFFIX,
                                                       initializer=paddle.nn.initializer.Constant(0.0))
            with context.edit(after=grad.grad.get_defining_op()):
                summed = paddle._C_ops.add_(accumulator, grad.grad)
                merged = paddle.scale(summed, 1.0 / k_steps) if avg else paddle.assign(summed)
            grad.grad = grad.synced = merged
        total = sum(g.nbytes for g in context.gradients)
        how = f"x 1/{k_steps}" if avg else "summed"
        return PassResult(f"{len(context.gradients)} gradients accumulated over {k_steps} micro-steps ({how}); "
                          f"accumulators {human_bytes(total)}",
                          {"k_steps": k_steps, "avg": avg, "accumulator_bytes": total})


class GradientMergeUpdate(Pass):
    name = "gradient_merge_update"
    phase = Phase.UPDATE_REWRITE
    requires = ("gradient_merge",)
    reads = ("gradient_merge_configs.k_steps",)

    def enabled(self):
        return bool(self.strategy.gradient_merge)

    def apply(self, context):
        k_steps = self.strategy.gradient_merge_configs.k_steps
        accumulated = [op.result(0) for op in program_edit.created_by(context.block, GradientMerge.name)
                       if op.name() == "pd_op.add_"]
        conditional = downstream_ops(context.block, accumulated, context.update_only)
        with context.edit():
            counter = create_persistable_value("int64", [1], paddle.utils.unique_name.generate("gradient_merge_step"),
                                               initializer=paddle.nn.initializer.Constant(0))
        with context.edit():
            step = paddle._C_ops.increment_(counter, 1.0)
            due = paddle.equal(paddle.remainder(step, paddle.full([1], k_steps, "int64")),
                               paddle.full([1], 0, "int64"))
            branch = paddle.static.nn.control_flow.build_if_op(due)
            with branch.true_block():
                for summed in accumulated:
                    paddle.assign(paddle.zeros(summed.shape, summed.dtype), output=summed)
        first_zeroing = branch.true_block().ops[0]
        for op in conditional:
            op.move_before(first_zeroing)
        return PassResult(f"{len(conditional)} ops (communication and update) run once every {k_steps} steps "
                          f"inside pd_op.if, which then zeroes the {len(accumulated)} accumulators",
                          {"conditional_ops": len(conditional), "k_steps": k_steps})


def downstream_ops(block, values, extra=()):
    """The ops of `block` that read `values`, directly or through other such ops, plus `extra`
    (ops that belong to the update without reading it, e.g. pto's parameter exchange) and their
    readers, in program order."""
    found = set()
    pending = [op for value in values for op in value.all_used_ops()] + list(extra)
    while pending:
        op = pending.pop()
        if op.id() in found:
            continue
        found.add(op.id())
        for result in op.results():
            pending.extend(result.all_used_ops())
    return [op for op in block.ops if op.id() in found]
