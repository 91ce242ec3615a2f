"""topk: send only the largest elements of each large gradient, keep the rest for later steps.

An alternative to data_parallel's all-reduce for the gradients it takes: every float32/float64
gradient with at least `topk_configs.min_numel` elements. Per taken gradient g (n elements,
k = ceil(density * n)), right where backward produces it:

    acc      = g + residual                    (residual: persistable, zeros in the startup program)
    v, i     = MSTopK(acc, k)                  (fleetlite.topk: k signed values, their int64 indices)
    V, I     = all_gather(v), all_gather(int32(i))      on ring 0: W*k pairs, rank order
    reduced  = scatter_nd_add(zeros(n), I, V) * 1/W    (sums the ranks' contributions by index)
    residual = acc with the sent entries zeroed         (error feedback: nothing is ever lost)

Without error feedback there is no residual (the unsent part is dropped). With fp16_allreduce the
values travel as float16 (the indices stay int32) and the residual keeps what float16 rounding
lost. Every rank adds the gathered pairs in the same order, so all ranks hold bit-identical
gradients. The other gradients go dense, through data_parallel's buckets (and
fuse_all_reduce_ops, which packs only them).

Warm-up (`warmup_steps` > 0): a persistable step counter (incremented once per step) drives one
`pd_op.if` per gradient. While step < warmup_steps the exchange is a dense all-reduce of acc masked
to its largest fraction d(step) = density ** (step / warmup_steps), a geometric ramp from 1 (all
of acc) down to density, with the threshold estimated on MSTopK's sample, the unsent part kept in
the residual as above; from step warmup_steps on, the top-k exchange. Both branches return the
reduced gradient and the new residual, which is written back after the branch (Paddle 3.3.1 does
not order in-place writes inside a branch reliably; see gradient_merge). With warm-up the program
runs in program order (fleetlite.sparse_exchange says why).
"""
import math

import paddle
from paddle.pir.core import create_persistable_value

from fleetlite import gradient_buckets, program_edit, sparse_exchange, topk
from fleetlite.compile_report import human_bytes
from fleetlite.errors import StrategyConflictError
from fleetlite.sparse_exchange import INDEX_BYTES, IN_ORDER
from fleetlite.strategies.base import Pass, PassResult, Phase
from fleetlite.strategy import register_check

RESIDUAL_SUFFIX = "@GRAD@TOPK_RESIDUAL"
TAKEN_DTYPES = ("float32", "float64")


def fraction_sent(density, numel):
    """k for a gradient of `numel` elements: at least one element, at most all."""
    return min(numel, max(1, math.ceil(density * numel)))


@register_check
def check_topk_configs(strategy, topology):
    if not strategy.topk:
        return
    configs = strategy.topk_configs
    if configs.hierarchical:
        raise StrategyConflictError("topk_configs.hierarchical (intra-node reduce-scatter, top-k, inter-node "
                                    "all-gather) is not implemented yet", field="topk_configs.hierarchical",
                                    value=True, fix="set it to false for the one-level top-k exchange")
    if configs.warmup_steps:
        sparse_exchange.require_program_order(strategy, "topk_configs.warmup_steps", "set topk_configs.warmup_steps: 0")
    if configs.warmup_steps and strategy.gradient_merge:
        raise StrategyConflictError(
            "topk_configs.warmup_steps counts steps, but with gradient_merge the exchange runs once every "
            "k_steps micro-steps", field="topk_configs.warmup_steps", value=configs.warmup_steps,
            fix="set topk_configs.warmup_steps: 0 with gradient_merge (the merged gradient is compressed)")


class TopkExchange(Pass):
    name = "topk"
    phase = Phase.COMMUNICATION
    after = ("data_parallel", "gradient_scale_configs.scale_gradient")
    requires = ("data_parallel",)
    conflicts = {
        "amp": "top-k keeps a residual across steps; with loss scaling it would mix steps of different "
               "scales and keep an overflowing step's inf, so selection after unscaling is needed first "
               "(not implemented yet)",
        "use_hierarchical_allreduce": "the top-k exchange is a one-level all-gather on the world ring; "
                                      "two-level top-k (topk_configs.hierarchical) is not implemented yet",
    }
    reads = ("topk", "topk_configs.density", "topk_configs.warmup_steps", "topk_configs.bisection_iterations",
             "topk_configs.error_feedback", "topk_configs.hierarchical", "topk_configs.min_numel")

    def apply(self, context):
        configs = self.strategy.topk_configs
        taken = [i for i, g in enumerate(context.gradients)
                 if g.dtype in TAKEN_DTYPES and math.prod(g.grad.shape) >= configs.min_numel]
        if not taken:
            return PassResult(f"no float gradient has {configs.min_numel} elements (min_numel): all go dense",
                              {"gradients": []})
        sparse_exchange.take_from_buckets(context, taken)
        step = None
        if configs.warmup_steps:
            step = sparse_exchange.step_counter(context, [context.gradients[i] for i in taken], "topk_step")
            context.runtime_flags[IN_ORDER] = True
        exchange = _Exchange(context, configs, self.strategy.fp16_allreduce, step)
        rows = [exchange.emit(context.gradients[i]) for i in taken]
        return self._result(context, configs, rows)

    @staticmethod
    def _result(context, configs, rows):
        sent = sum(row["k"] for row in rows)
        total = sum(row["numel"] for row in rows)
        sparse_bytes = sum(row["wire_bytes"] for row in rows)
        dense_bytes = sum(context.gradients[i].nbytes for b in context.buckets for i in b.members)
        taken_dense_bytes = sum(row["dense_bytes"] for row in rows)
        feedback = "error feedback" if configs.error_feedback else "no error feedback"
        warmup = f", {configs.warmup_steps} warm-up steps ramping from dense" if configs.warmup_steps else ""
        summary = (f"{len(rows)} gradients as top-k (density {sent / total:.4g}: {sent} of {total} elements; "
                   f"{human_bytes(sparse_bytes)} per rank per step instead of {human_bytes(taken_dense_bytes)}), "
                   f"{feedback}{warmup}; {len(context.buckets)} dense ({human_bytes(dense_bytes)})")
        return PassResult(summary, {"gradients": rows, "achieved_density": sent / total,
                                    "sparse_bytes_per_step": sparse_bytes, "dense_bytes_per_step": dense_bytes,
                                    "bytes_per_step": sparse_bytes + dense_bytes})


class _Exchange:
    """Builds one gradient's top-k exchange (see the module doc)."""

    def __init__(self, context, configs, fp16_wire, step):
        self.context, self.configs, self.fp16_wire, self.step = context, configs, fp16_wire, step
        self.world = context.topology.world_size

    def emit(self, grad):
        shape, numel = list(grad.grad.shape), math.prod(grad.grad.shape)
        k = fraction_sent(self.configs.density, numel)
        residual = None
        if self.configs.error_feedback:
            with self.context.edit():
                residual = create_persistable_value(grad.grad.dtype, shape, grad.name + RESIDUAL_SUFFIX,
                                                    initializer=paddle.nn.initializer.Constant(0.0))
        with self.context.edit(after=grad.grad.get_defining_op()):
            acc = grad.grad if residual is None else paddle.add(grad.grad, residual)
            flat = acc if len(shape) == 1 else paddle.reshape(acc, [-1])
            if self.step is None:
                outputs = self._sparse(flat, numel, k, grad.name)
            else:
                warm = self.step < float(self.configs.warmup_steps)
                outputs = paddle.static.nn.cond(warm, lambda: self._dense(flat, numel, k),
                                                lambda: self._sparse(flat, numel, k, grad.name))
            reduced = outputs[0]
            if residual is not None:
                unsent = outputs[1]
                paddle.assign(unsent if len(shape) == 1 else paddle.reshape(unsent, shape), output=residual)
            grad.synced = reduced if len(shape) == 1 else paddle.reshape(reduced, shape)
        value_bytes = 2 if self.fp16_wire else grad.grad.element_size()
        return {"gradient": grad.name, "numel": numel, "k": k, "wire_bytes": k * (value_bytes + INDEX_BYTES),
                "dense_bytes": grad.nbytes}

    def _sparse(self, flat, numel, k, name):
        values, indices = topk.mstopk(flat, k, self.configs.bisection_iterations, name=f"the gradient of {name}")
        summed, wire = sparse_exchange.gather_and_scatter_add(values, indices, numel, self.world,
                                                              "float16" if self.fp16_wire else None)
        if not self.configs.error_feedback:
            return [self._scaled(summed)]
        sent = paddle.cast(wire, flat.dtype) if self.fp16_wire else values
        return [self._scaled(summed), paddle.scatter(flat, indices, values - sent, overwrite=True)]

    def _dense(self, flat, numel, k):
        """Warm-up: an all-reduce of acc masked to its largest fraction d(step) (module doc)."""
        density = self.configs.density
        stride = topk.sample_stride(numel, k)
        sampled = -(-numel // stride)
        fraction = paddle.exp(self.step * (math.log(density) / self.configs.warmup_steps))
        target = paddle.cast(paddle.ceil(fraction * sampled), "int64")
        threshold = topk.sampled_threshold(flat, stride, target, self.configs.bisection_iterations)
        kept = paddle.abs(flat) >= threshold
        zeros = paddle.zeros_like(flat)
        summed = paddle._C_ops.all_reduce(paddle.where(kept, flat, zeros), 0, gradient_buckets.SUM)
        if not self.configs.error_feedback:
            return [self._scaled(summed)]
        return [self._scaled(summed), paddle.where(kept, zeros, flat)]

    def _scaled(self, summed):
        return sparse_exchange.scaled(self.context, summed)
