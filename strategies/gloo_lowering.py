"""gloo_lowering: make the native ring layout runnable on CPU, with the same math.

Paddle's CPU collective kernels ignore `ring_id`: every static collective of a process runs on
the one communicator attached to its CPU device context (measured on Paddle 3.3.1). The layout
passes describe the real multi-ring / multi-level algorithm; this pass makes each ring real:
- ring 0 (the world) stays Paddle's own op;
- any other ring (an intra-node or inter-node group, an extra world ring of nccl_comm_num)
  becomes fleetlite's compiled sub-group op (fleetlite.compile.group_collectives) on this rank's
  group's own gloo communicator, so only the group's bytes move, and only between its ranks;
  reduce_scatter (no CPU kernel) is the group's sum, then this member's chunk; an fp16 sum is
  widened to fp32 around it (gloo's fp16 SUM returns inf). The report lists the communicators
  (key, members) in ring order; fleetlite.runtime.subgroups creates them before the first run.
Where the sub-group ops cannot be built (no C++ compiler), every ring is emulated on ring 0
with the same math, and the report says so:
- a ring with the same members as the world -> the same op on ring 0;
- a sum over a subgroup -> a masked sum on ring 0: each rank places its data in its group's
  slot of a zero buffer G times as long, the world sum of that buffer holds every group's
  sum side by side, and the rank keeps its group's slot (exact: the other terms are zeros);
- reduce_scatter -> that sum, then the rank's own chunk;
- an all-gather inside a subgroup -> a world all-gather, keeping the group members' rows.
Either way the compiler's guard then rejects any native op left on a ring other than 0.
"""
import collections
import math

import paddle

from fleetlite.compile import gradient_buckets, group_collectives, program_edit
from fleetlite.errors import CompileError
from fleetlite.compile.pass_contract import Pass, PassResult, Phase

ALL_REDUCE = ("pd_op.all_reduce", "pd_op.all_reduce_")


class GlooLowering(Pass):
    name = "gloo_lowering"
    decides_without_program = True
    always_on = True
    phase = Phase.LOWERING

    def applicable(self, topology, program):
        if topology.device != "cpu":
            return f"{topology.backend} runs the native ring layout"
        return None

    def apply(self, context):
        unavailable = group_collectives.load_error() if context.topology.world_size > 1 else None
        changes, communicators = collections.Counter(), {}
        for op in list(program_edit.walk(context.block)):   # an `if`'s branches included
            ring_id = program_edit.int_attr(op, "ring_id")
            if ring_id is None:
                continue
            if ring_id not in context.rings:
                raise CompileError(f"{op.name()} uses ring {ring_id}, which no pass registered")
            ring = context.rings[ring_id]
            native = op.name() != "pd_op.reduce_scatter" and not _is_fp16_sum(op)   # runs as it is on ring 0
            if ring_id == 0 and native:
                continue
            if ring_id != 0 and unavailable is None:
                key, members = self._communicator(context, ring)
                communicators[ring_id] = (key, list(members))
                lowered = _on_group(context, op, ring, key, len(members))
                change = f"{op.name()} on {ring.kind} ring -> its own gloo group"
            elif ring.is_world and native:
                op.set_int_attr("ring_id", 0)
                changes[f"{op.name()} world ring -> ring 0"] += 1
                continue
            else:
                lowered = self._emulate(context, op, ring)
                change = f"{op.name()} on {ring.kind} ring -> ring-0 emulation"
            gradient_buckets.replace_collective(context, op, lowered)
            changes[change] += 1
        if not changes:
            return PassResult("nothing to lower: every collective is already on ring 0")
        summary = "; ".join(f"{count} x {change}" for change, count in changes.items())
        if unavailable is not None:
            summary += f" (no sub-group communicators: {unavailable})"
        details = {"changes": dict(changes),
                   "communicators": [communicators[ring] for ring in sorted(communicators)]}
        return PassResult(summary, details)

    @staticmethod
    def _communicator(context, ring):
        """(key, members) of this rank's group of `ring`; rings over the same groups (nccl_comm_num
        copies; ring 0 is the world's first) get communicators of their own."""
        _, members = ring.group_of(context.topology.rank)
        channel = sum(1 for other in context.rings if other.ring_id < ring.ring_id and other.groups == ring.groups)
        return group_collectives.comm_key(channel, members), members

    def _emulate(self, context, op, ring):
        rank = context.topology.rank
        source = op.operand_source(0)
        with context.edit(before=op) as created:
            if op.name() in ALL_REDUCE:
                if op.attrs()["reduce_type"] != gradient_buckets.SUM:
                    raise CompileError(f"{op.name()} with reduce_type {op.attrs()['reduce_type']} on "
                                       f"{ring.kind} ring {ring.ring_id} has no exact ring-0 emulation")
                result = _shaped(_group_sum(source, ring, rank), source.shape)
            elif op.name() == "pd_op.reduce_scatter":
                result = _own_chunk(_group_sum(source, ring, rank), source, ring, rank)
            elif op.name() == "pd_op.all_gather":
                result = _group_gather(source, ring, rank, context.topology.world_size)
            else:
                raise CompileError(f"no gloo lowering for {op.name()} on {ring.kind} ring {ring.ring_id}")
        for created_op in created:
            if program_edit.int_attr(created_op, "ring_id") is not None:
                _carry_marks(op, created_op, ring)
        return result


def _on_group(context, op, ring, key, size):
    """`op` on this rank's group of `ring`, through its own communicator `key`."""
    source = op.operand_source(0)
    if op.name() in ALL_REDUCE and op.attrs()["reduce_type"] != gradient_buckets.SUM:
        raise CompileError(f"{op.name()} with reduce_type {op.attrs()['reduce_type']} on {ring.kind} "
                           f"ring {ring.ring_id}: the gloo sub-group op only sums")
    widen = source.dtype == paddle.float16 and op.name() != "pd_op.all_gather"   # a sum: fp32 on the wire
    with context.edit(before=op) as created:
        data = paddle.cast(source, "float32") if widen else source
        if op.name() in ALL_REDUCE:
            result = group_collectives.all_reduce(data, key, size)
        elif op.name() == "pd_op.reduce_scatter":
            result = group_collectives.reduce_scatter(data, key, size)
        elif op.name() == "pd_op.all_gather":
            result = group_collectives.all_gather(data, key, size)
        else:
            raise CompileError(f"no gloo sub-group lowering for {op.name()} on {ring.kind} ring {ring.ring_id}")
        result = paddle.cast(result, "float16") if widen else result
    for created_op in created:
        if created_op.name() in group_collectives.OP_NAMES:
            _carry_marks(op, created_op, ring)
    return result


def _carry_marks(op, created_op, ring):
    """What the checks and the report read off a collective, onto the op that now runs it: the ring
    it stands for, and `op`'s bucket and PLACES marks."""
    created_op.set_int_attr(program_edit.EMULATES, ring.ring_id)
    for mark in (program_edit.BUCKET, program_edit.PLACES):
        if op.has_attr(mark):
            created_op.set_int_attr(mark, program_edit.int_attr(op, mark))


def _is_fp16_sum(op):
    return (op.name() in ALL_REDUCE and op.attrs()["reduce_type"] == gradient_buckets.SUM
            and op.operand_source(0).dtype == paddle.float16)


def _flat(value):
    return value if len(value.shape) == 1 else paddle.reshape(value, [-1])


def _shaped(flat, shape):
    return flat if len(shape) == 1 else paddle.reshape(flat, list(shape))


def _sum_on_ring0(flat, fresh):
    """Sum over the world on ring 0; in place only on a buffer nothing else reads (`fresh`)."""
    if flat.dtype == paddle.float16:
        widened = paddle._C_ops.all_reduce_(paddle.cast(flat, "float32"), 0, gradient_buckets.SUM)
        return paddle.cast(widened, "float16")
    reduce = paddle._C_ops.all_reduce_ if fresh else paddle._C_ops.all_reduce
    return reduce(flat, 0, gradient_buckets.SUM)


def _group_sum(source, ring, rank):
    """The flattened sum of `source` over the ranks of this rank's group in `ring`."""
    flat = _flat(source)
    if ring.is_world:
        return _sum_on_ring0(flat, fresh=False)
    numel = math.prod(source.shape)
    group, _ = ring.group_of(rank)
    pieces = [flat]
    if group:
        pieces.insert(0, paddle.zeros([group * numel], source.dtype))
    if group < len(ring.groups) - 1:
        pieces.append(paddle.zeros([(len(ring.groups) - 1 - group) * numel], source.dtype))
    summed = _sum_on_ring0(paddle.concat(pieces), fresh=True)
    return paddle.slice(summed, [0], [group * numel], [(group + 1) * numel])


def _own_chunk(group_sum, source, ring, rank):
    """reduce_scatter's output: this rank's 1/S of the group sum, split along axis 0."""
    _, members = ring.group_of(rank)
    position, size = members.index(rank), len(members)
    chunk = math.prod(source.shape) // size
    mine = paddle.slice(group_sum, [0], [position * chunk], [(position + 1) * chunk])
    return _shaped(mine, [source.shape[0] // size] + list(source.shape[1:]))


def _group_gather(source, ring, rank, world):
    """all_gather over this rank's group: gather from the world, keep the members' rows."""
    _, members = ring.group_of(rank)
    gathered = paddle._C_ops.all_gather(source, 0, world)
    rows = paddle.split(paddle.reshape(gathered, [world, -1]), world)   # split and concat have
    kept = paddle.concat([rows[member] for member in members])           # fp16 CPU kernels; gather has none
    return paddle.reshape(kept, [len(members) * source.shape[0]] + list(source.shape[1:]))
