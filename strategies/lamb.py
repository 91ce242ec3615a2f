"""lamb: layer-wise adaptive moments (You et al., 2019) for Adam training, Fleet's `lamb` knob.

Fleet's LambOptimizer trains with `paddle.optimizer.Lamb` built from the inner Adam: its learning
rate, beta1, beta2, epsilon and grad_clip, lamb_configs.lamb_weight_decay, and an exclusion
function that is true for a parameter whose name ends with an entry of exclude_from_weight_decay
(Lamb's default always_adapt=False: an excluded parameter gets neither weight decay nor the trust
ratio, i.e. an Adam step). fleetlite builds the same update as a rewrite: once the inner Adam's
`apply_gradients` has built its update on the all-reduced gradients, each `adam_` op becomes a
`lamb_` op (CPU kernel in Paddle 3.3.1) on the same parameter, gradient, learning rate, moments
and beta powers, so the optimizer state keeps Adam's names, and AMP's skip flag (the adam_ op's
skip_update) carries over. Adam's unused moment2_max (amsgrad's) stays, as in Adam itself.

Another inner optimizer is an error naming the fix (Fleet warns and trains without LAMB). So are
what Fleet's Lamb would silently drop or cannot build: an Adam `weight_decay` (LAMB's decay is
lamb_weight_decay), amsgrad, multi_precision, and betas given as tensors.
"""
import paddle

from fleetlite.compile import program_edit
from fleetlite.errors import CompileError
from fleetlite.compile.pass_contract import Pass, PassResult, Phase, inner_optimizer

ADAM_UPDATE = "pd_op.adam_"


def excluded_from_decay(param_name, suffixes):
    """Fleet's rule (the exclusion function its LambOptimizer builds): a parameter whose name ends
    with any of `suffixes` gets weight decay 0, hence no trust ratio (always_adapt is False)."""
    return any(param_name.endswith(suffix) for suffix in suffixes)


def checked_adam(optimizer):
    """The inner Adam LAMB replaces the update of; anything else is refused by name."""
    return inner_optimizer(
        optimizer, "lamb", paddle.optimizer.Adam, "paddle.optimizer.Adam(learning_rate, beta1, beta2, epsilon)",
        lambda adam: {"weight_decay (LAMB decays by lamb_configs.lamb_weight_decay)": adam.regularization is not None,
                      "amsgrad=True": adam._amsgrad,
                      "multi_precision=True": adam._multi_precision,
                      "beta1 or beta2 given as a tensor": not all(isinstance(beta, (int, float))
                                                                   for beta in (adam._beta1, adam._beta2))},
        other=" (lars is the Momentum counterpart)")


class Lamb(Pass):
    name = "lamb"
    phase = Phase.UPDATE_REWRITE
    before = ("pto", "gradient_merge_update", "build_strategy.fuse_all_optimizer_ops")
    conflicts = {
        "dgc": "dgc rewrites a Momentum update and LAMB an Adam update; an optimizer is one or the other",
        "localsgd": "Fleet's LocalSGD wraps only AMP, never LAMB (and needs SGD or Momentum)",
        "adaptive_localsgd": "Fleet's adaptive LocalSGD wraps only AMP, never LAMB (and needs SGD or Momentum)",
    }
    reads = ("lamb", "lamb_configs.lamb_weight_decay", "lamb_configs.exclude_from_weight_decay")

    def apply(self, context):
        adam = checked_adam(context.optimizer)
        configs = self.strategy.lamb_configs
        names = {program_edit.key(g.param): g.name for g in context.gradients}
        updates = [op for op in context.block.ops if op.name() == ADAM_UPDATE]
        if not updates:
            raise CompileError("lamb found no adam_ update to rewrite; lamb needs paddle.optimizer.Adam")
        decays, excluded = {}, []
        for op in updates:
            operand = dict(zip(op.get_input_names(), op.operands_source()))
            name = names[program_edit.key(operand["param"])]
            if excluded_from_decay(name, configs.exclude_from_weight_decay):
                excluded.append(name)
            decays[name] = 0.0 if name in excluded else configs.lamb_weight_decay
            with program_edit.inserting(context.program, self.name, after=op, role=program_edit.OPTIMIZE):
                skip = operand["skip_update"]
                results = paddle._C_ops.lamb_(
                    operand["param"], operand["grad"], operand["learning_rate"], operand["moment1"],
                    operand["moment2"], operand["beta1_pow"], operand["beta2_pow"], None,
                    skip if skip.initialized() else None, decays[name], adam._beta1, adam._beta2, adam._epsilon,
                    False, False)
            for old, new in zip([op.result(i) for i in (0, 1, 2, 4, 5)], results):
                old.replace_all_uses_with(new)
            program_edit.remove_ops(context.block, [op])
        return PassResult(f"{len(updates)} adam_ -> lamb_ (weight decay {configs.lamb_weight_decay:g}; "
                          f"{len(excluded)} excluded: no decay, no trust ratio)",
                          {"weight_decay": decays, "excluded": sorted(excluded)})
