"""gloo_lowering: make the native ring layout runnable on CPU, with the same math.

On CPU a process has exactly one static communicator: every collective runs on the first
ring registered, whatever its ring_id, silently (measured on Paddle 3.3.1). So the layout
passes describe the real multi-ring / multi-level algorithm, and this pass rewrites each
collective onto ring 0 without changing what it computes:
- a ring with the same members as the world -> the same op on ring 0;
- a sum over a subgroup -> a masked sum on ring 0: each rank places its data in its group's
  slot of a zero buffer G times as long, the world sum of that buffer holds every group's
  sum side by side, and the rank keeps its group's slot (exact: the other terms are zeros);
- reduce_scatter (no CPU kernel) -> that sum, then the rank's own chunk;
- an all-gather inside a subgroup -> a world all-gather, keeping the group members' rows;
- an fp16 sum -> cast to fp32 around it (gloo's fp16 SUM returns inf).
The hierarchical algorithm therefore runs, and is checked against one process, on CPU; the
compiler's guard then rejects any ring other than 0 left in the program.
"""
import collections
import math

import paddle

from fleetlite import gradient_buckets, program_edit
from fleetlite.errors import CompileError
from fleetlite.strategies.base import Pass, PassResult, Phase

ALL_REDUCE = ("pd_op.all_reduce", "pd_op.all_reduce_")


class GlooLowering(Pass):
    name = "gloo_lowering"
    decides_without_program = True
    phase = Phase.LOWERING

    def enabled(self):
        return True

    def applicable(self, topology, program):
        if topology.device != "cpu":
            return f"{topology.backend} runs the native ring layout"
        return None

    def apply(self, context):
        changes = collections.Counter()
        for op in list(program_edit.walk(context.block)):   # an `if`'s branches included
            ring_id = program_edit.int_attr(op, "ring_id")
            if ring_id is None:
                continue
            if ring_id not in context.rings:
                raise CompileError(f"{op.name()} uses ring {ring_id}, which no pass registered")
            ring = context.rings[ring_id]
            if ring.is_world and op.name() not in ("pd_op.reduce_scatter",) and not _is_fp16_sum(op):
                if ring_id:
                    op.set_int_attr("ring_id", 0)
                    changes[f"{op.name()} world ring -> ring 0"] += 1
                continue
            lowered = self._emulate(context, op, ring)
            gradient_buckets.replace_collective(context, op, lowered)
            changes[f"{op.name()} on {ring.kind} ring -> ring-0 emulation"] += 1
        if not changes:
            return PassResult("nothing to lower: every collective is already on ring 0")
        summary = "; ".join(f"{count} x {change}" for change, count in changes.items())
        return PassResult(summary, {"changes": dict(changes)})

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
        bucket = program_edit.int_attr(op, program_edit.BUCKET)
        for created_op in created:
            if program_edit.int_attr(created_op, "ring_id") is not None:
                created_op.set_int_attr(program_edit.EMULATES, ring.ring_id)
                if bucket is not None:
                    created_op.set_int_attr(program_edit.BUCKET, bucket)
        return result


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
