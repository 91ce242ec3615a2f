"""build_strategy.fuse_all_optimizer_ops: one multi-tensor optimizer op instead of one per parameter.

Paddle 3 has no PIR pass for it (Fleet's fuse_adam/sgd/momentum_op_pass are legacy-IR only),
so fleetlite rewrites the update itself once `apply_gradients` has built it: the `adam_` ops
that can share one kernel launch — same beta1/beta2/epsilon constants, same flags, no master
weight and no AMP skip flag (`merged_adam_` takes neither) — become one `merged_adam_` per
group, which updates every parameter of the group in one op (it runs on CPU as well as GPU).
Parameters, moments and beta powers are the same persistable variables, updated in place, so
the result equals the per-parameter update up to float rounding.

Momentum and SGD have no multi-tensor kernel that runs here: `merged_momentum_` rejects the
in-place parameter outputs of a static PIR program in Paddle 3.3.1 ("Input(Param) and
Output(ParamOut) must be the same Tensors", measured), and there is no merged SGD. AdamW's
decoupled weight decay has no merged kernel either. Such updates are reported as skipped.
"""
import collections

import paddle

from fleetlite.compile import program_edit
from fleetlite.compile.pass_contract import Pass, PassResult, Phase

ADAM = "pd_op.adam_"
UPDATE_OPS = ("pd_op.sgd_", "pd_op.momentum_", "pd_op.adam_", "pd_op.adamw_", "pd_op.lamb_")
PER_PARAMETER = ("param", "grad", "learning_rate", "moment1", "moment2", "beta1_pow", "beta2_pow")
CONSTANTS = ("beta1", "beta2", "epsilon")
FLAGS = ("multi_precision", "use_global_beta_pow", "amsgrad")


class FuseAllOptimizerOps(Pass):
    name = "build_strategy.fuse_all_optimizer_ops"
    phase = Phase.UPDATE_REWRITE
    before = ("gradient_merge_update",)
    reads = ("build_strategy.fuse_all_optimizer_ops",)

    def applicable(self, topology, program):
        updates = [op for op in program.global_block().ops if op.name() in UPDATE_OPS]
        groups = mergeable_groups(updates)
        if any(len(group) > 1 for group in groups.values()):
            return None
        kinds = collections.Counter(op.name().replace("pd_op.", "") for op in updates)
        found = ", ".join(f"{count} {kind}" for kind, count in sorted(kinds.items())) or "no update ops"
        if kinds.keys() - {"adam_"}:
            return f"no multi-tensor kernel runs here for this update ({found}): only Adam has one (merged_adam_)"
        return f"nothing to merge ({found}: no two share beta1, beta2, epsilon and flags without AMP's skip flag)"

    def apply(self, context):
        updates = [op for op in context.block.ops if op.name() in UPDATE_OPS]
        groups = [group for group in mergeable_groups(updates).values() if len(group) > 1]
        for group in groups:
            _merge(context, group)
        merged = sum(len(group) for group in groups)
        left = len(updates) - merged
        return PassResult(f"{merged} adam_ -> {len(groups)} merged_adam_"
                          + (f"; {left} update ops left per parameter" if left else ""),
                          {"merged": merged, "merged_ops": len(groups), "left_per_parameter": left})


def mergeable_groups(updates):
    """{key: [adam_ ops]}: adam_ ops that one merged_adam_ can replace share a key."""
    groups = collections.defaultdict(list)
    for op in updates:
        key = _merge_key(op) if op.name() == ADAM else None
        if key is not None:
            groups[key].append(op)
    return groups


def _merge_key(op):
    names = op.get_input_names()
    if any(op.operand_source(names.index(n)).initialized() for n in ("master_param", "skip_update", "moment2_max")):
        return None
    constants = []
    for name in CONSTANTS:
        producer = op.operand_source(names.index(name)).get_defining_op()
        if producer is None or producer.name() != "pd_op.full":
            return None
        constants.append(producer.attrs()["value"])
    attrs = op.attrs()
    return (str(op.operand_source(0).dtype), *constants, *(attrs[flag] for flag in FLAGS))


def _merge(context, group):
    """Replace `group` (adam_ ops) by one merged_adam_ after the last of them."""
    names = group[0].get_input_names()
    inputs = {name: [op.operand_source(names.index(name)) for op in group] for name in PER_PARAMETER}
    beta1, beta2, epsilon = (group[0].operand_source(names.index(n)).get_defining_op().attrs()["value"]
                             for n in CONSTANTS)
    attrs = group[0].attrs()
    with context.edit(after=group[-1]):
        paddle._C_ops.merged_adam_(inputs["param"], inputs["grad"], inputs["learning_rate"], inputs["moment1"],
                                   inputs["moment2"], None, inputs["beta1_pow"], inputs["beta2_pow"], None,
                                   beta1, beta2, epsilon, attrs["multi_precision"], attrs["use_global_beta_pow"],
                                   attrs["amsgrad"])
    constants = {producer.id(): producer for producer in
                 (op.operand_source(names.index(n)).get_defining_op() for op in group for n in CONSTANTS)}
    for op in group:   # later readers of an updated parameter (pto's exchange) read the parameter itself:
        op.result(0).replace_all_uses_with(op.operand_source(0))   # merged_adam_'s outputs are typed 0-size in PIR
    program_edit.remove_ops(context.block, group)
    program_edit.remove_ops(context.block, [op for op in constants.values() if op.result(0).use_empty()])
