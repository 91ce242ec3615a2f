"""lars: layer-wise adaptive rate scaling (You et al., 2017) for Momentum training, Fleet's `lars` knob.

Fleet's LarsOptimizer trains with `paddle.incubate.optimizer.LarsMomentumOptimizer` built from
the inner Momentum (its learning rate, momentum, regularization and grad_clip) and lars_configs.
fleetlite builds the same update as a rewrite: once the inner Momentum's `apply_gradients` has
built its update on the all-reduced gradients, each `momentum_` op becomes a `lars_momentum_`
op (it has a CPU kernel in Paddle 3.3.1) on the same parameter, gradient, velocity and learning
rate, so the optimizer state keeps Momentum's names (checkpoints and fleet.train_step see it as
before). Per parameter p with gradient g, velocity v, learning rate lr and the op's weight
decay wd (lars_weight_decay, or 0 for a parameter whose name contains an entry of
exclude_from_weight_decay: the op's substring rule):

  local_lr = lr * lars_coeff * |p| / (|g| + wd * |p| + epsilon)   when wd > 0 and |p|, |g| > 0, else lr
  v = mu * v + local_lr * (g + wd * p);   p = p - v

so a parameter with weight decay 0 gets plain Momentum (lr inside v, which equals Momentum's step
for a constant learning rate). A regularizer Momentum builds as ops before its update (L1Decay, a
parameter's own) stays, as in LarsMomentumOptimizer; Momentum's L2 `weight_decay`, which it folds
into its op, is refused: Fleet's LarsMomentumOptimizer never receives it (Momentum keeps it off its
`regularization`) and trains without it, silently.

Another inner optimizer is an error naming the fix (Fleet warns and trains without LARS). So are
what LarsMomentumOptimizer cannot build: Nesterov momentum (Fleet drops it) and multi_precision.
"""
import paddle

from fleetlite.compile import program_edit
from fleetlite.errors import StrategyConflictError
from fleetlite.compile.pass_contract import Pass, PassResult, Phase, inner_optimizer

MOMENTUM_UPDATE = "pd_op.momentum_"
L2_DECAY = "l2_decay"


def excluded_from_decay(param_name, patterns):
    """Fleet's rule (the lars_momentum op's Python side): a parameter whose name contains any of
    `patterns` gets weight decay 0, hence no trust ratio."""
    return any(pattern in param_name for pattern in patterns)


def checked_momentum(optimizer):
    """The inner Momentum LARS replaces the update of; anything else is refused by name."""
    return inner_optimizer(
        optimizer, "lars", paddle.optimizer.Momentum, "paddle.optimizer.Momentum(learning_rate, momentum=...)",
        lambda momentum: {"use_nesterov=True (LARS momentum has no Nesterov form)": momentum._use_nesterov,
                          "multi_precision=True": momentum._multi_precision},
        other=" (lamb is the Adam counterpart)")


class Lars(Pass):
    name = "lars"
    phase = Phase.UPDATE_REWRITE
    after = ("pto",)
    before = ("gradient_merge_update", "build_strategy.fuse_all_optimizer_ops")
    conflicts = {
        "dgc": "both rewrite the Momentum update (dgc into its sparse exchange); Fleet chains neither into the other",
        "lamb": "LARS rewrites a Momentum update and LAMB an Adam update; an optimizer is one or the other",
        "localsgd": "Fleet's LocalSGD wraps only AMP, never LARS",
        "adaptive_localsgd": "Fleet's adaptive LocalSGD wraps only AMP, never LARS",
    }
    reads = ("lars", "lars_configs.lars_coeff", "lars_configs.lars_weight_decay", "lars_configs.epsilon",
             "lars_configs.exclude_from_weight_decay")

    def apply(self, context):
        checked_momentum(context.optimizer)
        configs = self.strategy.lars_configs
        names = {program_edit.key(g.param): g.name for g in context.gradients}
        updates = [op for op in context.block.ops if op.name() == MOMENTUM_UPDATE]   # pto left this rank's part
        decays, excluded = {}, []
        for op in updates:
            operand = dict(zip(op.get_input_names(), op.operands_source()))
            name = names[program_edit.key(operand["param"])]
            if op.attrs()["regularization_method"] == L2_DECAY:
                raise StrategyConflictError(
                    f"lars does not build Momentum's L2 weight_decay (on {name}): Fleet's LARS drops it silently",
                    field="lars", value=True, fix="decay by lars_configs.lars_weight_decay and leave weight_decay "
                                                  "out of paddle.optimizer.Momentum(...)")
            if excluded_from_decay(name, configs.exclude_from_weight_decay):
                excluded.append(name)
            decays[name] = 0.0 if name in excluded else configs.lars_weight_decay
            self._rewrite(context, op, operand, decays[name])
        return PassResult(f"{len(updates)} momentum_ -> lars_momentum_ (lars_coeff {configs.lars_coeff:g}, weight "
                          f"decay {configs.lars_weight_decay:g}; {len(excluded)} excluded: plain momentum)",
                          {"weight_decay": decays, "excluded": sorted(excluded)})

    def _rewrite(self, context, op, operand, decay):
        attrs, configs = op.attrs(), self.strategy.lars_configs
        with program_edit.inserting(context.program, self.name, after=op, role=program_edit.OPTIMIZE):
            params, velocities, _ = paddle._C_ops.lars_momentum_(
                [operand["param"]], [operand["grad"]], [operand["velocity"]], [operand["learning_rate"]], None,
                attrs["mu"], configs.lars_coeff, [decay], configs.epsilon, False, attrs["rescale_grad"])
        op.result(0).replace_all_uses_with(params[0])
        op.result(1).replace_all_uses_with(velocities[0])
        program_edit.remove_ops(context.block, [op])
