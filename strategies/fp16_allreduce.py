"""fp16_allreduce: send float32 gradients over the wire as float16, half the bytes.

Each float32 bucket is cast to float16 right before its collective and back to float32 right
after, so the collective (and, later in the layout, its hierarchical stages) moves float16; the
1/N scale and the optimizer stay in float32. Every gradient is rounded to float16 once before
the sum, and the sum once after it, so values beyond float16's range become inf (with AMP,
loss scaling then skips the step and lowers the scale) and tiny ones flush to zero.

On GPU the all-reduce runs in float16 on NCCL. gloo returns inf for a float16 sum, so on CPU
the gloo lowering widens that sum to float32 around the same casts: the results are rounded as
on GPU, but no bytes are saved.
"""
import paddle

from fleetlite.compile import gradient_buckets, program_edit
from fleetlite.compile.report import human_bytes
from fleetlite.compile.pass_contract import Pass, PassResult, Phase

COLLECTIVES = ("pd_op.all_reduce", "pd_op.all_reduce_")


class Fp16AllReduce(Pass):
    name = "fp16_allreduce"
    phase = Phase.COMM_LAYOUT
    after = ("fuse_all_reduce_ops", "nccl_comm_num")
    before = ("use_hierarchical_allreduce",)
    requires = ("data_parallel",)
    reads = ("fp16_allreduce",)

    def apply(self, context):
        narrowed = []
        for op in list(context.block.ops):
            bucket = program_edit.int_attr(op, program_edit.BUCKET)
            if bucket is None or op.name() not in COLLECTIVES or op.operand_source(0).dtype != paddle.float32:
                continue
            with context.edit(before=op) as created:
                wire = paddle.cast(op.operand_source(0), "float16")
                summed = paddle._C_ops.all_reduce_(wire, program_edit.int_attr(op, "ring_id"), gradient_buckets.SUM)
                widened = paddle.cast(summed, "float32")
            next(c for c in created if c.name() == "pd_op.all_reduce_").set_int_attr(program_edit.BUCKET, bucket)
            gradient_buckets.replace_collective(context, op, widened)
            narrowed.append(context.buckets[bucket])
        for bucket in narrowed:
            bucket.dtype, bucket.nbytes = "float16", bucket.nbytes // 2
        per_step = human_bytes(sum(b.nbytes for b in narrowed))
        if context.topology.device == "cpu":
            summary = (f"{len(narrowed)} buckets rounded through float16 as on GPU; on gloo the sum runs in "
                       f"float32: no bytes saved")
        else:
            summary = f"{len(narrowed)} buckets cross ranks in float16 ({per_step} per step, half of float32)"
        return PassResult(summary, {"buckets": [b.index for b in narrowed], "wire_dtype": "float16"})
