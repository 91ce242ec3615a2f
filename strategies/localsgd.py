"""localsgd: train locally, average the parameters every k steps (Lin et al., 2018), Fleet's `localsgd` knob.

No gradient crosses ranks: data_parallel is skipped under local SGD (and with it every pass
that shapes the gradient all-reduce), so each rank's SGD or Momentum update reads its own
gradient and the optimizer state (Momentum's velocity) stays local. Paddle 3's raw-program Fleet
wrapper still all-reduces the gradients every step under LocalSGD; fleetlite follows the
algorithm.

The pass (UPDATE_REWRITE, after the update) counts the runs in a persistable step counter
(1 on the first run) and, after the update, averages the parameters when Fleet's rule says so:

  sync  <=>  step <= begin_step  or  step - last_sync == k_steps      (last_sync starts at begin_step)

The average is Fleet's: with a persistable snapshot s of each parameter p (the last average),
p = s - mean over ranks(s - p), all differences of one dtype in one all-reduce on ring 0, then
s = p and last_sync = step. The branch is one `pd_op.if` that yields the new parameters and
snapshots (the old ones when it is not taken); they are written back after it, since Paddle
3.3.1 does not order in-place writes inside a branch (see gradient_merge). The step is read
through `paddle.increment`, which hands back the counter's own (persistable) value: the result
of `_C_ops.increment_` Paddle's in-place pass treats as a temporary, and a later `where` wrote
into it, i.e. into the counter (measured: the counter stopped at 2). The snapshot starts
at zeros: the mean does not depend on it (it cancels), and the first sync (step 1, as
begin_step >= 1) sets it to the averaged parameters, identical on every rank from then on.

Fleet applies LocalSGD to SGD and Momentum only and skips it silently for another optimizer;
fleetlite refuses another one by name. Its white list lets only AMP inside LocalSGD: the other
update and communication rewrites are named conflicts (see CONFLICTS).
"""
import math

import paddle
from paddle.pir.core import create_persistable_value

from fleetlite.compile import gradient_buckets, program_edit
from fleetlite.compile.report import human_bytes
from fleetlite.compile.pass_contract import Pass, PassResult, Phase, inner_optimizer

SNAPSHOT_SUFFIX = "@SNAPSHOT"
UPDATES = ("pd_op.sgd_", "pd_op.momentum_")
CONFLICTS = {
    "gradient_merge": "Fleet's LocalSGD wraps only AMP, and gradient merge does not wrap it; merge steps with a "
                      "larger k_steps instead",
    "dgc": "dgc compresses the gradient all-reduce, which local SGD removes",
    "topk": "top-k compresses the gradient exchange, which local SGD removes",
    "pto": "pto updates 1/N of the parameters per rank from the reduced gradients, which local SGD does not reduce",
}


def checked_optimizer(optimizer, knob):
    """The inner SGD or Momentum whose update runs locally; another one is refused by name."""
    return inner_optimizer(optimizer, knob, (paddle.optimizer.SGD, paddle.optimizer.Momentum),
                           "paddle.optimizer.SGD(...) or paddle.optimizer.Momentum(...)", lambda _: {})


class ParameterAverage:
    """The persistable state and ops of Fleet's conditional parameter average, built at the end
    of the program; `build(due, extra)` is the branch (see the module doc)."""

    def __init__(self, context, knob):
        self.context, self.knob, self.world = context, knob, context.topology.world_size
        self.params = [g.param for g in context.gradients]
        self.snapshots = [self.persistable(p.dtype, p.shape, p.name + SNAPSHOT_SUFFIX, 0.0) for p in self.params]
        self.counter = self.persistable("int64", [1], unique_name(f"{knob}_step"), 0)
        self.step = paddle.increment(self.counter)    # the counter's own value, not increment_'s result (see above)

    @staticmethod
    def persistable(dtype, shape, name, value):
        """State kept across runs, `value` everywhere from the startup program on."""
        return create_persistable_value(dtype, shape, name, initializer=paddle.nn.initializer.Constant(value))

    def build(self, due, on_sync=lambda: [], unchanged=()):
        """Average when `due`; `on_sync()` builds more values to yield on a sync (their old values,
        `unchanged`, otherwise). Writes back parameters and snapshots; returns the extra values."""
        count = len(self.params)
        outputs = paddle.static.nn.cond(due, lambda: self._averaged() * 2 + list(on_sync()),
                                        lambda: [*self.params, *self.snapshots, *unchanged])
        for new, old in zip(outputs[:count] + outputs[count:2 * count], self.params + self.snapshots):
            paddle.assign(new, output=old)
        return outputs[2 * count:]

    def _averaged(self):
        averaged = [None] * len(self.params)
        for dtype in dict.fromkeys(p.dtype for p in self.params):
            members = [i for i, p in enumerate(self.params) if p.dtype == dtype]
            moved = [paddle.reshape(paddle.subtract(self.snapshots[i], self.params[i]), [-1]) for i in members]
            summed = paddle._C_ops.all_reduce_(paddle.concat(moved) if len(moved) > 1 else moved[0], 0,
                                               gradient_buckets.SUM)
            mean = paddle.scale(summed, 1.0 / self.world)
            parts = paddle.split(mean, [math.prod(self.params[i].shape) for i in members]) if len(moved) > 1 else [mean]
            for i, part in zip(members, parts):
                averaged[i] = paddle.subtract(self.snapshots[i], paddle.reshape(part, self.params[i].shape))
        return averaged

    @property
    def nbytes(self):
        return sum(program_edit.nbytes(p) for p in self.params)


def learning_rate(block):
    """The learning rate the (SGD or Momentum) update reads."""
    op = next(op for op in block.ops if op.name() in UPDATES)
    return op.operand_source(op.get_input_names().index("learning_rate"))


def unique_name(prefix):
    return paddle.utils.unique_name.generate(prefix)


def at_most(value, bound):
    return paddle.less_equal(value, paddle.full([1], bound, "int64"))


def equals(value, other):
    return paddle.equal(value, other if not isinstance(other, int) else paddle.full([1], other, "int64"))


class ParameterAveragingPass(Pass):
    """What localsgd and adaptive_localsgd share: they rewrite the update to average the parameters
    now and then, which one rank has no use for."""
    decides_without_program = True
    phase = Phase.UPDATE_REWRITE

    def applicable(self, topology, program):
        return "one rank: there is nothing to average" if topology.world_size == 1 else None


class LocalSgd(ParameterAveragingPass):
    name = "localsgd"
    conflicts = {**CONFLICTS, "adaptive_localsgd": "both set the local SGD period (a fixed or an adaptive k)"}
    reads = ("localsgd", "localsgd_configs.k_steps", "localsgd_configs.begin_step")

    def apply(self, context):
        checked_optimizer(context.optimizer, self.name)
        configs = self.strategy.localsgd_configs
        with program_edit.inserting(context.program, self.name, role=program_edit.OPTIMIZE):
            average = ParameterAverage(context, self.name)
            last = average.persistable("int64", [1], unique_name("localsgd_last_sync"), configs.begin_step)
            due = paddle.logical_or(at_most(average.step, configs.begin_step),
                                    equals(paddle.subtract(average.step, last), configs.k_steps))
            average.build(due)
            paddle.assign(paddle.where(due, average.step, last), output=last)
        return PassResult(f"{len(average.params)} parameters averaged after the update on steps <= "
                          f"{configs.begin_step}, then every {configs.k_steps} ({human_bytes(average.nbytes)} per "
                          f"sync, {human_bytes(average.nbytes / configs.k_steps)} per step)",
                          {"k_steps": configs.k_steps, "begin_step": configs.begin_step,
                           "bytes_per_sync": average.nbytes})
