"""use_hierarchical_allreduce: two-level all-reduce for jobs on several nodes.

Each bucket's world all-reduce becomes three stages, so only 1/L of the bytes crosses nodes:
1. reduce-scatter inside the intra group (L ranks of one node): rank j of the group gets
   chunk j of the group's sum;
2. all-reduce of that chunk across nodes, among the ranks with the same position j;
3. all-gather inside the intra group, so every rank has the whole sum.
L is `hierarchical_allreduce_inter_nranks`, or the ranks per node when it is 1 (Fleet's
meaning of the field). Buffers whose length is not a multiple of L are zero-padded for the
stages and trimmed after. For each flat ring k the pass registers one intra and one inter
ring, so this composes with `nccl_comm_num`.
"""
import math

import paddle

from fleetlite import gradient_buckets, program_edit
from fleetlite.errors import StrategyConflictError
from fleetlite.ring_table import INTER, INTRA
from fleetlite.strategies.base import Pass, PassResult, Phase
from fleetlite.strategy import register_check


def intra_size(strategy, topology):
    configured = strategy.hierarchical_allreduce_inter_nranks
    return topology.local_size if configured == 1 else configured


@register_check
def check_intra_groups(strategy, topology):
    if topology is not None and strategy.use_hierarchical_allreduce:
        check_node_groups(strategy, topology, "use_hierarchical_allreduce")


def check_node_groups(strategy, topology, knob):
    """The intra groups of a two-level exchange (`knob`) must tile the world and stay inside nodes."""
    size, world, per_node = intra_size(strategy, topology), topology.world_size, topology.local_size
    field = "hierarchical_allreduce_inter_nranks"
    if not topology.is_uniform:
        raise StrategyConflictError(
            f"{knob} needs the same number of ranks on every node, numbered node by "
            f"node; this job has {world} ranks but {topology.node_count} nodes x {per_node} local ranks",
            field=knob, value=True, fix="start as many ranks on every node")
    if world % size:
        raise StrategyConflictError(
            f"{field} = {size} does not divide the world size {world} ({world} % {size} = {world % size})",
            field=field, value=size, fix=f"use a divisor of {world}, or 1 for the ranks per node ({per_node})")
    if per_node % size:
        raise StrategyConflictError(
            f"{field} = {size} does not divide the {per_node} ranks per node ({per_node} % {size} = "
            f"{per_node % size}): an intra group would span two nodes",
            field=field, value=size, fix=f"use a divisor of {per_node}, or 1 for the ranks per node")


class HierarchicalAllReduce(Pass):
    name = "use_hierarchical_allreduce"
    decides_without_program = True
    phase = Phase.COMM_LAYOUT
    after = ("fuse_all_reduce_ops", "nccl_comm_num")
    requires = ("data_parallel",)
    reads = ("use_hierarchical_allreduce", "hierarchical_allreduce_inter_nranks")

    def applicable(self, topology, program):
        size = intra_size(self.strategy, topology)
        if size == topology.world_size:
            return f"the intra group is the whole world ({size} ranks): the flat all-reduce is already intra-node"
        if size == 1:
            return "one rank per intra group: the flat all-reduce is already the inter-node one"
        return None

    def apply(self, context):
        size, world = intra_size(self.strategy, context.topology), context.topology.world_size
        intra_groups = [range(start, start + size) for start in range(0, world, size)]
        inter_groups = [range(position, world, size) for position in range(size)]
        levels = {}
        for op in list(context.block.ops):
            bucket = program_edit.int_attr(op, program_edit.BUCKET)
            if bucket is None:
                continue
            flat_ring = program_edit.int_attr(op, "ring_id")
            if flat_ring not in levels:
                levels[flat_ring] = (context.rings.add(INTRA, intra_groups),
                                     context.rings.add(INTER, inter_groups))
            intra, inter = levels[flat_ring]
            gradient_buckets.replace_collective(context, op, self._two_level(context, op, bucket, intra, inter, size))
            context.buckets[bucket].ring = intra
        intra_rings = ", ".join(str(intra) for intra, _ in levels.values())
        inter_rings = ", ".join(str(inter) for _, inter in levels.values())
        return PassResult(
            f"{len(context.buckets)} buckets: reduce-scatter in groups of {size} (intra rings {intra_rings}), "
            f"all-reduce across {world // size} nodes (inter rings {inter_rings}), all-gather",
            {"intra_size": size, "rings": {flat: {"intra": a, "inter": b} for flat, (a, b) in levels.items()}})

    @staticmethod
    def _two_level(context, op, bucket, intra, inter, size):
        source = op.operand_source(0)
        shape = list(source.shape)
        numel = math.prod(shape)
        pad = -numel % size
        with context.edit(before=op) as created:
            flat = source if len(shape) == 1 else paddle.reshape(source, [-1])
            if pad:
                flat = paddle.concat([flat, paddle.zeros([pad], source.dtype)])
            chunk = paddle._C_ops.reduce_scatter(flat, intra, size)
            chunk = paddle._C_ops.all_reduce_(chunk, inter, gradient_buckets.SUM)
            whole = paddle._C_ops.all_gather(chunk, intra, size)
            if pad:
                whole = paddle.slice(whole, [0], [0], [numel])
            result = whole if len(shape) == 1 else paddle.reshape(whole, shape)
        for created_op in created:
            if program_edit.int_attr(created_op, "ring_id") is not None:
                created_op.set_int_attr(program_edit.BUCKET, bucket)
        return result
