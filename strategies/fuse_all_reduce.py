"""fuse_all_reduce_ops: all-reduce gradients in buckets instead of one by one.

Every collective has a fixed cost (about 1 ms on gloo, launch latency on NCCL), so gradients
travel in buckets. The rule (`plan_buckets`), on gradients in ready order (backward
produces the last layer's gradients first):

1. Tail: if `last_comm_group_size_MB` > 0, the longest run of last-ready gradients whose
   bytes sum to at most that many MiB (at least the very last gradient) is packed on its
   own, so the all-reduce that nothing can overlap with is short.
2. Packing, separately for the head and the tail: walk the gradients in ready order, one
   open bucket per dtype (a bucket holds one dtype). A gradient closes its dtype's open bucket
   first if adding it would exceed `fuse_grad_size_in_MB` MiB, or if the bucket already holds
   `int(fuse_grad_size_in_TFLOPS)` gradients (Fleet's name for the count limit; 0 = none).
   `fuse_grad_size_in_MB: 0` gives one bucket per gradient; a gradient larger than the limit
   gets a bucket of its own.
3. Buckets are issued in the order their last gradient becomes ready.
Gradients that a sparse exchange sends instead (`topk`) are left out of the plan.
"""
from fleetlite.compile import gradient_buckets
from fleetlite.compile.report import human_bytes
from fleetlite.compile.pass_contract import Pass, PassResult, Phase

MiB = 1 << 20


def plan_buckets(sizes, dtypes, size_limit, count_limit, tail_bytes):
    """Buckets (lists of gradient indices) for gradients given in ready order; see the module doc."""
    order = list(range(len(sizes)))
    tail = []
    if tail_bytes > 0 and order:
        total = 0
        while order and (not tail or total + sizes[order[-1]] <= tail_bytes):
            total += sizes[order[-1]]
            tail.insert(0, order.pop())
    buckets = _pack(order, sizes, dtypes, size_limit, count_limit)
    buckets += _pack(tail, sizes, dtypes, size_limit, count_limit)
    return sorted(buckets, key=lambda bucket: bucket[-1])


def _pack(indices, sizes, dtypes, size_limit, count_limit):
    closed, open_by_dtype = [], {}
    for i in indices:
        current = open_by_dtype.get(dtypes[i])
        if current and (sum(sizes[j] for j in current) + sizes[i] > size_limit
                        or (count_limit and len(current) >= count_limit)):
            closed.append(current)
            current = None
        if current is None:
            current = open_by_dtype[dtypes[i]] = []
        current.append(i)
    return closed + list(open_by_dtype.values())


class FuseAllReduce(Pass):
    name = "fuse_all_reduce_ops"
    phase = Phase.COMM_LAYOUT
    requires = ("data_parallel",)
    reads = ("fuse_all_reduce_ops", "fuse_grad_size_in_MB", "fuse_grad_size_in_TFLOPS",
             "last_comm_group_size_MB")

    def apply(self, context):
        grads = context.gradients
        dense = [i for i in range(len(grads)) if i not in context.exchanged]
        plan = plan_buckets([grads[i].nbytes for i in dense], [grads[i].dtype for i in dense],
                            self.strategy.fuse_grad_size_in_MB * MiB,
                            int(self.strategy.fuse_grad_size_in_TFLOPS),
                            self.strategy.last_comm_group_size_MB * MiB)
        plan = [[dense[i] for i in members] for members in plan]
        if plan == [bucket.members for bucket in context.buckets]:
            return PassResult(f"unchanged: the plan keeps {len(plan)} buckets of one gradient",
                              {"buckets": [b.describe(grads) for b in context.buckets]})
        for bucket in context.buckets:
            gradient_buckets.take_back(context, bucket)
        context.buckets = []
        for index, members in enumerate(plan):
            bucket = gradient_buckets.Bucket(index, members, grads[members[0]].dtype,
                                             sum(grads[i].nbytes for i in members))
            gradient_buckets.emit(context, bucket)
            context.buckets.append(bucket)
        sizes = ", ".join(human_bytes(b.nbytes) for b in context.buckets)
        return PassResult(f"{len(dense)} gradients in {len(plan)} bucket{'s' * (len(plan) != 1)} ({sizes})",
                          {"buckets": [b.describe(grads) for b in context.buckets]})
