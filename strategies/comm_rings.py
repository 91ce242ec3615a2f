"""nccl_comm_num: spread the gradient buckets over several communication rings.

With n rings, bucket i is issued on ring i mod n, so consecutive buckets can be in flight on
different NCCL communicators (and streams) at once. Rings 0..n-1 all span the whole world;
ring 0 is the default process group and rings 1..n-1 are created by the API on GPUs. On gloo
the lowering runs rings 1..n-1 on world communicators of their own (gloo_lowering; ring 0 where
the sub-group op cannot be built); the executor still issues them one at a time.
"""
from fleetlite.compile import program_edit
from fleetlite.compile.pass_contract import Pass, PassResult, Phase


class CommRings(Pass):
    name = "nccl_comm_num"
    phase = Phase.COMM_LAYOUT
    after = ("fuse_all_reduce_ops",)
    requires = ("data_parallel",)
    reads = ("nccl_comm_num",)

    def enabled(self):
        return self.strategy.nccl_comm_num > 1

    def apply(self, context):
        rings = [0] + [context.rings.add_world() for _ in range(1, self.strategy.nccl_comm_num)]
        for op in context.block.ops:
            bucket = program_edit.int_attr(op, program_edit.BUCKET)
            if bucket is not None:
                ring = rings[bucket % len(rings)]
                op.set_int_attr("ring_id", ring)
                context.buckets[bucket].ring = ring
        per_ring = {ring: sum(1 for b in context.buckets if b.ring == ring) for ring in rings}
        spread = ", ".join(f"ring {ring}: {count}" for ring, count in per_ring.items())
        return PassResult(f"{len(context.buckets)} buckets round-robin over {len(rings)} rings ({spread})",
                          {"rings": rings, "buckets_per_ring": per_ring})
