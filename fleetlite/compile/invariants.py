"""What must hold of a program after every pass, so a broken rewrite fails at the pass that
broke it instead of as wrong numbers many steps later.

- nothing is read before it is written (an op inserted at the wrong point reads garbage);
- every collective names a ring some pass registered;
- every trainable gradient reaches the optimizer summed over the world exactly once and
  scaled once (found by walking back from the value the optimizer reads to the gradient:
  each path must multiply the group sizes of its sums to the world size). Only paths of
  floating-point values count: indices, masks and conditions place values, they are not summed
  (a top-k exchange selects by them). A sum is an all-reduce or reduce-scatter, or a
  scatter-add (pd_op.scatter_nd_add, or the top-k bucket scatter, which also scales) of values
  all-gathered over a ring (sparse exchange: each rank's pairs, added by index, sum over that
  ring's group); an all-gather alone only concatenates. Through a
  `pd_op.if`, every branch's yielded value must pass;
- on CPU, from the lowering on, the program only uses what gloo runs correctly (`check_gloo`);
- every persistable value has a name (`check_persistables_named`): Paddle's save, load and
  `state_dict()`, and user code listing `[v.name for v in program.list_vars() if v.persistable]`,
  read the scope by it, and an unnamed one makes them raise.
"""
import math

import paddle

from fleetlite.compile import group_collectives, program_edit
from fleetlite.errors import CompileError
from fleetlite.compile.pass_contract import Phase

SUMMING = ("pd_op.all_reduce", "pd_op.all_reduce_", "pd_op.reduce_scatter",
           *(f"custom_op.{name}" for name in (group_collectives.ALL_REDUCE, group_collectives.REDUCE_SCATTER)))
GATHERING = ("pd_op.all_gather", f"custom_op.{group_collectives.ALL_GATHER}")
SCATTER_ADD = "pd_op.scatter_nd_add"
SCALING = ("pd_op.scale", "pd_op.scale_")
PACK, ALIAS = "custom_op.fleetlite_bucket_pack_", "custom_op.fleetlite_bucket_alias_"   # fleetlite.compile.bucket_views
TOPK_SCATTER = "custom_op.fleetlite_topk_bucket_scatter_"   # fleetlite.compression.mstopk_kernel.scatter_bucket
SUM, AVG = 0, 4   # reduce_types: the one that sums (max/min/prod do not), the one gloo rejects


def check_all(context, phase):
    """Everything that must hold after a pass of `phase` ran."""
    check_defined_before_use(context.block)
    check_rings_registered(context)
    check_gradients_reduced_once(context)
    check_persistables_named(context.block)
    if context.topology.device == "cpu" and phase >= Phase.LOWERING:
        check_gloo(context.block)


def check_defined_before_use(block):
    position = {op.id(): i for i, op in enumerate(block.ops)}
    for i, op in enumerate(block.ops):
        for source in op.operands_source():
            producer = source.get_defining_op()
            if producer is not None and position.get(producer.id(), -1) >= i:
                raise CompileError(f"{op.name()} (op {i}) reads a value that {producer.name()} "
                                   f"(op {position[producer.id()]}) only writes later")


def check_persistables_named(block):
    for i, op in enumerate(program_edit.walk(block)):
        for result in op.results():
            if result.initialized() and result.persistable and not result.has_name:
                raise CompileError(f"{op.name()} (op {i}) makes a persistable value without a name: Paddle's "
                                   f"save/load and list_vars() users need one; create it with "
                                   f"create_persistable_value or name it with set_persistable_value")


def check_rings_registered(context):
    for op in program_edit.walk(context.block):
        for attr in ("ring_id", program_edit.EMULATES):
            ring = program_edit.int_attr(op, attr)
            if ring is not None and ring not in context.rings:
                raise CompileError(f"{op.name()} uses ring {ring}, which no pass registered")


def check_gradients_reduced_once(context):
    world = context.topology.world_size if context.reduced else 1
    scale = context.gradient_scale if context.reduced and context.gradient_scale is not None else 1.0
    for grad in context.gradients:
        if grad.synced is None:      # this rank does not receive it (pto's reduce-scatter to the owners)
            continue
        paths = _paths(grad.synced, grad.grad, context.rings, {})
        if not paths:
            raise CompileError(f"the optimizer would read a value that does not derive from the gradient of {grad.name}")
        for summed_over, scaled_by in paths:
            if summed_over != world:
                raise CompileError(f"the gradient of {grad.name} is summed over {summed_over} ranks on its way to "
                                   f"the optimizer, expected {world} (the world, exactly once)")
            if not math.isclose(scaled_by, scale, rel_tol=1e-6):
                raise CompileError(f"the gradient of {grad.name} is scaled by {scaled_by:g}, expected {scale:g}")


def _paths(value, target, rings, memo):
    """{(ranks summed, scale)} over the paths from `target` to `value` through fleetlite's ops."""
    if value.is_same(target):
        return {(1, 1.0)}
    if program_edit.key(value) in memo:
        return memo[program_edit.key(value)]
    memo[program_edit.key(value)] = set()
    op = value.get_defining_op()
    found = set()
    if op is not None and program_edit.provenance(op) is not None:
        summed, scaled = _effect(op, rings)
        for source in _value_sources(op, value):
            if source.get_defining_op() is not None or source.is_same(target):
                found |= {(n * summed, s * scaled) for n, s in _paths(source, target, rings, memo)}
    memo[program_edit.key(value)] = found
    return found


def _value_sources(op, result):
    """The floating-point values `result` of `op` is computed from (a branch op: what each branch yields)."""
    if op.name() == "pd_op.if":
        sources = [block.ops[-1].operand_source(result.index()) for block in op.blocks()]
    elif op.name() == ALIAS:       # its outputs are slots of the reduced buffer; the gradients only place them
        sources = [op.operand_source(0)]
    elif op.name() == TOPK_SCATTER:    # it overwrites the gradients with the sum of the gathered values
        sources = [op.operand_source(1)]
    else:
        sources = op.operands_source()
    return [source for source in sources if source.initialized() and _is_float(source)]


def _is_float(value):
    """Floating point, or a list of values (builtin.combine: its members are checked on the way)."""
    if not value.is_dense_tensor_type():
        return True
    return value.dtype in (paddle.float16, paddle.bfloat16, paddle.float32, paddle.float64)


def _effect(op, rings):
    """(how many ranks' values the op sums together, the factor it scales by)."""
    if op.name() in SUMMING and op.attrs().get("reduce_type", SUM) == SUM:
        ring = program_edit.int_attr(op, program_edit.EMULATES, program_edit.int_attr(op, "ring_id"))
        return rings[ring].group_size, 1.0
    if op.name() in (SCATTER_ADD, TOPK_SCATTER):
        ring = _gathered_over(op.operand_source(2 if op.name() == SCATTER_ADD else 1))
        scale = op.attrs()["scale"] if op.name() == TOPK_SCATTER else 1.0
        return (1, scale) if ring is None else (rings[ring].group_size, scale)
    if op.name() in SCALING:
        return 1, op.operand_source(1).get_defining_op().attrs()["value"]
    if op.name() == PACK:
        return 1, op.attrs()["scale"]
    return 1, 1.0


# Ops that move or convert an all-gather's rows without adding anything; split and concat pick a
# subgroup's rows out of a world all-gather (the gloo lowering of an all-gather in a subgroup).
ROW_MOVES = ("pd_op.cast", "pd_op.reshape", "pd_op.split_with_num", "builtin.split", "builtin.combine",
             "pd_op.concat")


def _gathered_over(value):
    """The ring of the all_gather `value` comes from through ROW_MOVES (and all-gathers that only
    place rows, program_edit.PLACES), or None."""
    op = value.get_defining_op()
    while op is not None and (op.name() in ROW_MOVES or (op.name() in GATHERING and op.has_attr(program_edit.PLACES))):
        op = op.operand_source(0).get_defining_op()
    if op is None or op.name() not in GATHERING:
        return None
    return program_edit.int_attr(op, program_edit.EMULATES, program_edit.int_attr(op, "ring_id"))


def check_gloo(block):
    """Reject what gloo would get silently wrong or cannot run (each measured on Paddle 3.3.1)."""
    for op in program_edit.walk(block):
        name, ring = op.name(), program_edit.int_attr(op, "ring_id")
        if ring not in (None, 0):
            raise CompileError(f"{name} uses ring {ring} on CPU: Paddle's CPU collective kernels ignore the "
                               f"ring id and silently run on the communicator attached to the process; lower it "
                               f"to ring 0 or to fleetlite's sub-group op (gloo_lowering)")
        if name in ("pd_op.all_reduce", "pd_op.all_reduce_"):
            if op.attrs()["reduce_type"] == AVG:
                raise CompileError(f"{name} with reduce_type AVG: gloo has no AVG reduce; sum, then scale")
            if op.attrs()["reduce_type"] == SUM and op.operand_source(0).dtype == paddle.float16:
                raise CompileError(f"{name} sums float16: gloo returns inf for it; cast to float32 around it")
        if name in ("pd_op.reduce_scatter", "pd_op.all_to_all"):
            raise CompileError(f"{name} has no CPU kernel; lower it to all_reduce + slice")
        if name == "pd_op.coalesce_tensor":
            raise CompileError("coalesce_tensor: its views do not see an in-place all-reduce on CPU "
                               "(ranks diverge); pack with concat and unpack with split")


def check_optimizer_reads_synced(block, gradients):
    """After apply_gradients: each optimizer op's gradient derives from its parameter's reduced
    gradient, and from gradients only through reduced ones.

    What the optimizer adds between the reduce and the update (gradient clipping, weight decay)
    may read any reduced gradient — a global-norm clip reads all of them — and the parameters;
    a path to a raw gradient that no reduction crosses (a norm of this rank's own gradients)
    would make the ranks update differently, so it is an error naming both parameters.
    """
    position = {op.id(): i for i, op in enumerate(block.ops)}
    reduced = {program_edit.key(g.synced) for g in gradients}
    raw = {program_edit.key(g.grad): g for g in gradients}
    floor = min((position[g.grad.get_defining_op().id()] for g in gradients), default=0)
    unreduced_source = _UnreducedSource(reduced, raw, position, floor)
    for op in block.ops:
        names = _input_names(op)
        if "param" not in names or "grad" not in names:
            continue
        param = op.operand_source(names.index("param"))
        grad = next((g for g in gradients if g.param.is_same(param)), None)
        if grad is None:
            continue
        read = op.operand_source(names.index("grad"))
        leaked = unreduced_source(read)
        if leaked is not None:
            whose = "the gradient" if leaked is grad else f"the gradient of {leaked.name}"
            raise CompileError(f"the optimizer update of {grad.name} reads {whose} before it is reduced")
        if not _derives_from(read, grad.synced, position, floor, {}):
            raise CompileError(f"{op.name()} for {grad.name} does not read the reduced gradient")


def _input_names(op):
    """The named inputs of a pd_op (some, such as pd_op.assert, declare none)."""
    if not op.name().startswith("pd_op."):
        return ()
    try:
        return op.get_input_names()
    except ValueError:
        return ()


class _UnreducedSource:
    """value -> the GradientSync whose raw gradient it reads without a reduction between, or None."""

    def __init__(self, reduced, raw, position, floor):
        self.reduced, self.raw, self.position, self.floor = reduced, raw, position, floor
        self.memo = {}

    def __call__(self, value):
        value_key = program_edit.key(value)
        if value_key in self.reduced:
            return None
        if value_key in self.raw:
            return self.raw[value_key]
        op = value.get_defining_op()
        if op is None or self.position[op.id()] < self.floor:
            return None
        if op.id() not in self.memo:
            self.memo[op.id()] = None
            sources = (self(source) for source in op.operands_source())
            self.memo[op.id()] = next((found for found in sources if found is not None), None)
        return self.memo[op.id()]


def _derives_from(value, target, position, floor, memo):
    """True if some path leads from `target` to `value` (only ops from `floor` on are walked)."""
    if value.is_same(target):
        return True
    op = value.get_defining_op()
    if op is None or position[op.id()] < floor:
        return False
    if op.id() not in memo:
        memo[op.id()] = False
        memo[op.id()] = any(_derives_from(source, target, position, floor, memo) for source in op.operands_source())
    return memo[op.id()]
