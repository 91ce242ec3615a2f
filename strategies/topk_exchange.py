"""topk: send only the largest elements of each large gradient, keep the rest for later steps.

An alternative to data_parallel's all-reduce for the gradients it takes: every float32/float64
gradient with at least `topk_configs.min_numel` elements. One by one (on GPUs; hierarchical, with
warm-up or loss scaling; without the compiled kernels), per taken gradient g (n elements,
k = ceil(density * n)), right where backward produces it:

    acc      = flatten(g) + residual           (residual: persistable, zeros in the startup program)
    v, i     = MSTopK(acc, k)                  (fleetlite.compression.topk_select: k signed values, their int64 indices)
    V, I     = all_gather(v), all_gather(int32(i))      on ring 0: W*k pairs, rank order
    reduced  = scatter_nd_add(zeros(n), I, V) * 1/W    (sums the ranks' contributions by index)
    residual = acc with the sent entries zeroed         (error feedback: nothing is ever lost)

On CPU (the compiled kernels loaded; one level, no warm-up, no loss scaling; with error feedback
not under Paddle 3.3's N-step plan, fleetlite.paddle_compat.steps_plan) the taken gradients
go in buckets instead (fuse_all_reduce's plan: by dtype, in ready order, up to
fuse_grad_size_in_MB), each exchanged by three ops right after its last gradient is ready:

    V, I, residuals  = bucket_select(gradients, residuals)   one op: per gradient, residual += g in
                       place and its own k = ceil(density * n) largest of the sum (MSTopK), the sent
                       entries zeroed in the residual; V, I: all of them back to back, I int32
                       offsets in the bucket (the gradients laid end to end)
    V, I             = all_gather(V), all_gather(I)           one exchange for the bucket, on ring 0
    gradients        = bucket_scatter(gradients, V, I) * 1/W  in place: zeros, plus the pairs in rank order

The selection is each gradient's own top-k (Fleet's density of each gradient, the same pairs and
the same sums as one by one), only fused: no flattened copy, no fresh accumulator, no dense zeros
tensor, no scatter copy of the residual and no write-back, and two collectives per bucket instead of
per gradient. The scatter overwrites the gradient's own memory, so a bucket takes only gradients
made at the top level that nothing else reads (gradient merge's copies qualify: the update branch
moves the bucket's ops with them); any other goes one by one, and the report says which path ran
and why.
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
runs in program order (fleetlite.compression.sparse_exchange says why).

Hierarchical (`topk_configs.hierarchical`; Shi et al.'s two-level exchange): with L ranks per node
group (`hierarchical_allreduce_inter_nranks`, or the ranks per node when it is 1, as for
use_hierarchical_allreduce) and M = W / L groups, rank j of its group (L ranks on ring `intra`;
the j-th ranks of all groups form ring `inter`, so each position j has its own cross-node ring):

    share    = reduce_scatter(flatten(g) zero-padded to L*s, intra)    share j (s elements) of the node's sum
    acc      = share + residual                 (residual: s elements, this rank's share of the node's unsent sum)
    v, i     = MSTopK(acc, k)                   k = ceil(density * s)
    V, I     = all_gather(v), all_gather(int32(i)) on inter: M*k pairs, node order
    V', I'   = all_gather(V), all_gather(I + j*s)    on intra: every member's M*k pairs, at its share's place
    reduced  = scatter_nd_add(zeros(L*s), I', V') * 1/W, trimmed to n
    residual = acc with the sent entries zeroed

Only the k pairs per rank cross nodes; inside the node the members hand each other the pairs they
received instead of their dense shares (L*M*k pairs, not L*s elements). Each member's pairs land
on its own share's elements only, so that all-gather moves values and sums nothing (it is marked
program_edit.PLACES for the invariant that counts the ranks each gradient is summed over), and
every element gets the same additions, in the same order, as when each member summed its share
and the node all-gathered the dense shares. With warm-up the node's all-gather stays dense (the
branch's two sides must hand over the same shape). On CPU, where the compiled ops load (and with
neither warm-up nor loss scaling), the taken gradients go in the one-level exchange's buckets and
each bucket is exchanged once (`_Exchange.emit_node_bucket`): the gradients' padded rows side by
side (member j's chunk holds share j of each), one reduce-scatter in the node, one bucket
selection of every share (its own k, the residual in place), the pairs' all-gathers across nodes
and in the node, one scatter of the node's pairs into a fresh buffer (scaled), cut back into the
gradients: the same pairs and the same sums, five collectives per bucket instead of per gradient
(a gradient that cannot join a bucket is a bucket of one). A group of one rank skips its level
(one node: no pairs cross; one rank per node: the one-level exchange). Error feedback holds over
the job: W x (sum of the reduced gradients) + every rank's residual put back at its share's place
== the sum of every rank's gradients. Warm-up's dense branch all-reduces the masked share on
`inter`. On GPU these are the real collectives on their rings. On CPU gloo has one communicator per process (ring 0),
and gloo_lowering rewrites them, inside branches too, into exact ring-0 equivalents: the
reduce-scatter is a world sum of a buffer where each group fills its own slot (the others add
zeros) and each rank keeps its share; an all-gather on `inter` or `intra` is a world all-gather
keeping the group members' rows, in member order. Every rank of a group thus adds the same values
in the same order, and all ranks end bit-identical.

With AMP's loss scaling (float16) the selection runs on unscaled values: acc = g / scale +
residual, so the residual never mixes steps of different scales. An overflow is expected there:
a rank whose acc holds inf/NaN selects from acc with them zeroed (MSTopK's finiteness check holds)
and hands its flag to amp_loss_scaling (context.unscaled), which joins it into the flag all ranks
agree on (MAX on ring 0) instead of unscaling that gradient again. The residual is written only
after the agreement (context.after_overflow_agreed): on a step where any rank overflowed it keeps
its old value, and update_loss_scaling_ zeroes the reduced gradients.
"""
import math
from dataclasses import dataclass
from typing import Optional

import paddle
from paddle.pir.core import create_persistable_value

from fleetlite.compile import gradient_buckets, program_edit
from fleetlite.compression import mstopk_kernel, sparse_exchange, topk_select as topk
from fleetlite.compile.report import human_bytes
from fleetlite.errors import StrategyConflictError
from fleetlite.compile.ring_table import INTER, INTRA
from fleetlite.compression.sparse_exchange import INDEX_BYTES, IN_ORDER
from fleetlite.compile.pass_contract import Pass, PassResult, Phase
from fleetlite.paddle_compat import steps_plan
from fleetlite.strategies.fuse_all_reduce import MiB, plan_buckets
from fleetlite.strategies.hierarchical_allreduce import check_node_groups, intra_size

RESIDUAL_SUFFIX = "@GRAD@TOPK_RESIDUAL"
TAKEN_DTYPES = ("float32", "float64")


def fraction_sent(density, numel):
    """k for a gradient of `numel` elements: at least one element, at most all."""
    return min(numel, max(1, math.ceil(density * numel)))


def check_topk_configs(strategy, topology):
    if not strategy.topk:
        return
    configs = strategy.topk_configs
    if configs.hierarchical and topology is not None:
        check_node_groups(strategy, topology, "topk_configs.hierarchical")
    if configs.warmup_steps:
        sparse_exchange.require_program_order(strategy, "topk_configs.warmup_steps", "set topk_configs.warmup_steps: 0")
    if configs.warmup_steps and strategy.gradient_merge:
        raise StrategyConflictError(
            "topk_configs.warmup_steps counts steps, but with gradient_merge the exchange runs once every "
            "k_steps micro-steps", field="topk_configs.warmup_steps", value=configs.warmup_steps,
            fix="set topk_configs.warmup_steps: 0 with gradient_merge (the merged gradient is compressed)")


@dataclass(frozen=True)
class Levels:
    """Where hierarchical top-k exchanges: `size` ranks per node group summed on `intra` (reduce-scatter,
    all-gather), the `nodes` ranks of one position across groups on `inter` (the sparse all-gather).
    A level of one rank has no ring (None); a level that is the whole world is ring 0."""
    size: int
    nodes: int
    intra: Optional[int]
    inter: Optional[int]

    @classmethod
    def register(cls, strategy, topology, rings):
        size = intra_size(strategy, topology)
        world = topology.world_size
        nodes = world // size
        intra = None if size == 1 else 0 if nodes == 1 else rings.add(
            INTRA, [range(start, start + size) for start in range(0, world, size)])
        inter = None if nodes == 1 else 0 if size == 1 else rings.add(
            INTER, [range(position, world, size) for position in range(size)])
        return cls(size, nodes, intra, inter)


class TopkExchange(Pass):
    check_strategy = staticmethod(check_topk_configs)
    name = "topk"
    phase = Phase.COMMUNICATION
    after = ("data_parallel", "gradient_scale_configs.scale_gradient")
    requires = ("data_parallel",)
    reads = ("topk", "topk_configs.density", "topk_configs.warmup_steps", "topk_configs.bisection_iterations",
             "topk_configs.error_feedback", "topk_configs.hierarchical", "topk_configs.min_numel",
             "hierarchical_allreduce_inter_nranks")

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
        levels = Levels.register(self.strategy, context.topology, context.rings) if configs.hierarchical else None
        exchange = _Exchange(context, configs, self.strategy.fp16_allreduce, step, levels)
        refusal = bucket_refusal(context, configs)
        buckets, refusal = ([], refusal) if refusal else self._buckets(context, taken)
        rows = {}
        for number, bucket in enumerate(buckets):
            if levels is None or levels.size == 1:
                emitted = _BucketExchange(context, configs, self.strategy.fp16_allreduce).emit(bucket)
            else:
                emitted = exchange.emit_node_bucket(bucket, _last_made(context, bucket))
            for i, row in zip(bucket, emitted):
                rows[i] = {**row, "bucket": number}
        rows.update((i, exchange.emit(i)) for i in taken if i not in rows)
        return self._result(context, configs, [rows[i] for i in taken], levels, len(buckets), refusal)

    def _buckets(self, context, taken):
        """(buckets of the taken gradients that may go in one, as fuse_all_reduce plans them; why the
        others cannot, or None)."""
        fits = [i for i in taken if _in_a_bucket(context, context.gradients[i])]
        plan = plan_buckets([context.gradients[i].nbytes for i in fits], [context.gradients[i].dtype for i in fits],
                            self.strategy.fuse_grad_size_in_MB * MiB, 0, 0)
        why = None if len(fits) == len(taken) else "gradients made inside a branch or read by more than the exchange"
        return [[fits[j] for j in bucket] for bucket in plan], why

    @staticmethod
    def _result(context, configs, rows, levels, buckets, refusal):
        sent = sum(row["sent"] for row in rows)
        total = sum(row["numel"] for row in rows)
        sparse_bytes = sum(row["wire_bytes"] for row in rows)
        intra_bytes = sum(row.get("intra_bytes", 0) for row in rows)
        dense_bytes = sum(context.gradients[i].nbytes for b in context.buckets for i in b.members)
        taken_dense_bytes = sum(row["dense_bytes"] for row in rows)
        feedback = "error feedback" if configs.error_feedback else "no error feedback"
        warmup = f", {configs.warmup_steps} warm-up steps ramping from dense" if configs.warmup_steps else ""
        selected = f"density {sent / total:.4g}: {sent} of {total} elements"
        if levels is None:
            layout = f" in {buckets} buckets, one selection and one exchange each" if buckets else ""
            how = (f"{len(rows)} gradients as top-k{layout} ({selected}; {human_bytes(sparse_bytes)} per rank per "
                   f"step instead of {human_bytes(taken_dense_bytes)})")
        else:
            layout = f" in {buckets} buckets" if buckets else ""
            how = (f"{len(rows)} gradients as hierarchical top-k{layout} ({levels.nodes} nodes x {levels.size} ranks; "
                   f"{selected} per node; between nodes {human_bytes(sparse_bytes)} per rank per step instead of "
                   f"{human_bytes(taken_dense_bytes)}, inside the node {human_bytes(intra_bytes)})")
        if refusal and context.topology.device == "cpu":    # on GPUs one by one is the design, not a fallback
            how += f", {'the others' if buckets else 'each'} one by one ({refusal})"
        details = {"gradients": rows, "buckets": buckets, "one_by_one": refusal, "achieved_density": sent / total,
                   "sparse_bytes_per_step": sparse_bytes, "dense_bytes_per_step": dense_bytes,
                   "bytes_per_step": sparse_bytes + intra_bytes + dense_bytes}
        if levels is not None:
            details.update({"hierarchical": {"ranks_per_node": levels.size, "nodes": levels.nodes,
                                             "intra_ring": levels.intra, "inter_ring": levels.inter},
                            "inter_node_bytes_per_step": sparse_bytes, "intra_node_bytes_per_step": intra_bytes})
        return PassResult(f"{how}, {feedback}{warmup}; {len(context.buckets)} dense ({human_bytes(dense_bytes)})",
                          details)


def bucket_refusal(context, configs):
    """Why the compiled selection and scatter ops cannot exchange the taken gradients (in buckets,
    or hierarchical one by one), or None."""
    if context.topology.device != "cpu":
        return "the bucket kernels are CPU code"
    if configs.warmup_steps:
        return "warm-up branches per gradient"
    if context.loss_scaling is not None:
        return "loss scaling unscales and checks each gradient"
    if configs.error_feedback and not steps_plan.custom_ops_read_named_persistables(
            context.strategy.execution_strategy.num_iteration_per_run):
        return "Paddle's N-step plan (execution_strategy.num_iteration_per_run) cannot feed the residuals to its op"
    error = mstopk_kernel.load_error()
    return f"the bucket kernels cannot be built here ({error})" if error else None


def _residuals(context, configs, grads, sizes):
    """With error feedback, each gradient's residual (`sizes` elements, zeros at the start; persistable,
    named after the gradient); None without."""
    if not configs.error_feedback:
        return None
    with context.edit():
        return [create_persistable_value(g.grad.dtype, [size], g.name + RESIDUAL_SUFFIX,
                                         initializer=paddle.nn.initializer.Constant(0.0))
                for g, size in zip(grads, sizes)]


def _last_made(context, members):
    """The op that makes the last of the gradients `members` (a bucket's exchange goes right after it)."""
    return max((context.gradients[i].grad.get_defining_op() for i in members),
               key=gradient_buckets.position_in(context.block))


def _in_a_bucket(context, grad):
    """Whether the bucket ops may read `grad` and then overwrite it with its reduced value: made at the
    top level (the ops go right after it) and read by nothing else."""
    producer = grad.grad.get_defining_op()
    return producer.id() in {op.id() for op in context.block.ops} and not grad.grad.all_used_ops()


def _kernel_pairs(configs, fp16_wire, tensors, ks, names, residuals, ring, ranks):
    """Every rank's top-k pairs of `tensors` on `ring` (`ranks` ranks), each tensor's ks[i] largest
    chosen by one compiled op (with `residuals`: error feedback in place, see mstopk_select.cc),
    int32 offsets into the tensors laid end to end."""
    strides, targets = zip(*(topk.sampling(math.prod(t.shape), k) for t, k in zip(tensors, ks)))
    values, indices = mstopk_kernel.select_bucket(tensors, ks, list(strides), list(targets),
                                                  configs.bisection_iterations, names, residuals, fp16_wire)[:2]
    gathered, positions, _ = sparse_exchange.gather_pairs(values, indices, ring, ranks,
                                                          "float16" if fp16_wire else None)
    return gathered, positions


def _scale_factor(context):
    """The job's gradient scale as the scatter op's factor (1 with scale_strategy sum)."""
    return 1.0 if context.gradient_scale is None else context.gradient_scale


class _BucketExchange:
    """Builds one bucket's exchange: each gradient's top-k in one op, one all-gather of the bucket's pairs,
    and one op that overwrites each gradient with its reduced value (see the module doc)."""

    def __init__(self, context, configs, fp16_wire):
        self.context, self.configs, self.fp16_wire = context, configs, fp16_wire

    def emit(self, members):
        context, configs = self.context, self.configs
        grads = [context.gradients[i] for i in members]
        numels = [math.prod(g.grad.shape) for g in grads]
        ks = [fraction_sent(configs.density, n) for n in numels]
        residuals = _residuals(context, configs, grads, numels)
        world = context.topology.world_size
        with context.edit(after=_last_made(context, members)):
            gathered, positions = _kernel_pairs(configs, self.fp16_wire, [g.grad for g in grads], ks,
                                                [g.name for g in grads], residuals, 0, world)
            for grad, reduced in zip(grads, mstopk_kernel.scatter_bucket([g.grad for g in grads], gathered,
                                                                         positions, _scale_factor(context))):
                grad.synced = reduced
        value_bytes = 2 if self.fp16_wire else grads[0].grad.element_size()
        return [{"gradient": g.name, "numel": n, "k": k, "sent": k, "dense_bytes": g.nbytes,
                 "wire_bytes": k * (value_bytes + INDEX_BYTES) if world > 1 else 0}
                for g, n, k in zip(grads, numels, ks)]


class _Exchange:
    """Builds one gradient's top-k exchange, one level or hierarchical (see the module doc)."""

    def __init__(self, context, configs, fp16_wire, step, levels):
        self.context, self.configs, self.fp16_wire, self.step, self.levels = context, configs, fp16_wire, step, levels
        # the ring and ranks of the sparse exchange: the world, or one position's ranks across nodes
        self.ring, self.ranks = (0, context.topology.world_size) if levels is None else (levels.inter, levels.nodes)
        # hierarchical on CPU with the compiled ops: a gradient that cannot join a bucket goes as a
        # bucket of one (emit_node_bucket); otherwise (GPUs, warm-up, loss scaling) Paddle's ops
        self.kernels = levels is not None and bucket_refusal(context, configs) is None

    def emit(self, index):
        grad = self.context.gradients[index]
        if self.kernels:        # a gradient that cannot join a bucket: a bucket of one
            return self.emit_node_bucket([index], grad.grad.get_defining_op())[0]
        numel = math.prod(grad.grad.shape)
        size = 1 if self.levels is None else self.levels.size
        part = -(-numel // size)          # this rank's share: all of it, or 1/size of the padded gradient
        k = fraction_sent(self.configs.density, part)
        residual = (_residuals(self.context, self.configs, [grad], [part]) or [None])[0]
        # the node's sum from its members' pairs, not its dense shares (module doc); not with warm-up
        node_pairs = size > 1 and self.step is None
        with self.context.edit(after=grad.grad.get_defining_op()):
            flat = self._flat(grad, numel, part * size)
            if size > 1:
                flat = paddle._C_ops.reduce_scatter(flat, self.levels.intra, size)
            reduced = self._exchanged_by_ops(flat, residual, part, k, index, grad.name, node_pairs)
            self._synced(grad, reduced, numel, part * size)
        return self._row(grad, numel, part, k, size, node_pairs)

    def emit_node_bucket(self, members, after):
        """Hierarchical top-k of the gradients `members` on CPU's compiled ops, right after `after`: one
        reduce-scatter in the node of the gradients' padded rows laid side by side (member j's chunk
        holds share j of each), one selection of every gradient's share (its own k, error feedback in
        place), the pairs across nodes and then in the node, one scatter into the node's buffer, cut
        back into the gradients. The same pairs and sums as gradient by gradient; 5 collectives per
        bucket instead of per gradient."""
        context, size = self.context, self.levels.size
        grads = [context.gradients[i] for i in members]
        numels = [math.prod(g.grad.shape) for g in grads]
        parts = [-(-n // size) for n in numels]
        ks = [fraction_sent(self.configs.density, part) for part in parts]
        residuals = _residuals(context, self.configs, grads, parts)
        share = sum(parts)
        with context.edit(after=after):
            rows = [self._flat(g, n, part * size) for g, n, part in zip(grads, numels, parts)]
            if len(rows) > 1:
                rows = [paddle.reshape(paddle.concat([paddle.reshape(row, [size, part])
                                                      for row, part in zip(rows, parts)], axis=1), [-1])]
            if size > 1:
                rows = [paddle._C_ops.reduce_scatter(rows[0], self.levels.intra, size)]
            shares = paddle.split(rows[0], parts) if len(parts) > 1 else rows
            gathered, positions = _kernel_pairs(self.configs, self.fp16_wire, shares, ks, [g.name for g in grads],
                                                residuals, self.ring, self.ranks)
            if size > 1:       # (with one rank per node the pairs are already the whole gradients')
                gathered, positions = self._placed_in_node(gathered, positions, share)
            node = paddle.empty([share * size], grads[0].grad.dtype)
            node = mstopk_kernel.scatter_bucket([node], gathered, positions, _scale_factor(context))[0]
            pieces = [node] if len(parts) == 1 else [
                paddle.reshape(piece, [-1]) for piece in paddle.split(paddle.reshape(node, [size, share]), parts, axis=1)]
            for grad, numel, part, piece in zip(grads, numels, parts, pieces):
                self._synced(grad, piece, numel, part * size)
        return [self._row(g, n, part, k, size, size > 1) for g, n, part, k in zip(grads, numels, parts, ks)]

    @staticmethod
    def _flat(grad, numel, padded):
        """The gradient as one row, zero-padded to `padded` elements."""
        flat = grad.grad if len(grad.grad.shape) == 1 else paddle.reshape(grad.grad, [-1])
        if padded > numel:
            flat = paddle.concat([flat, paddle.zeros([padded - numel], flat.dtype)])
        return flat

    @staticmethod
    def _synced(grad, reduced, numel, padded):
        """Hand the optimizer `reduced` (one row of `padded` elements) trimmed and in the gradient's shape."""
        if padded > numel:
            reduced = paddle.slice(reduced, [0], [0], [numel])
        shape = list(grad.grad.shape)
        grad.synced = reduced if len(shape) == 1 else paddle.reshape(reduced, shape)

    def _exchanged_by_ops(self, flat, residual, part, k, index, name, node_pairs):
        """This rank's reduced gradient (hierarchical: the node's, padded) by Paddle's ops, warm-up's
        branch and loss scaling's unscale and overflow flag included; writes the residual."""
        if self.context.loss_scaling is not None:
            flat = paddle.multiply(flat, paddle.reciprocal(self.context.loss_scaling.scale))
        acc = flat if residual is None else paddle.add(flat, residual)
        if self.context.loss_scaling is not None:
            acc = self._finite_or_zeros(acc, index)
        if self.step is None:
            outputs = self._sparse(acc, part, k, name, node_pairs)
        else:
            warm = self.step < float(self.configs.warmup_steps)
            outputs = paddle.static.nn.cond(warm, lambda: self._dense(acc, part, k),
                                            lambda: self._sparse(acc, part, k, name))
        if residual is not None:
            self._keep(residual, outputs[1])
        if self.levels is not None and self.levels.size > 1 and not node_pairs:
            return paddle._C_ops.all_gather(outputs[0], self.levels.intra, self.levels.size)
        return outputs[0]

    def _row(self, grad, numel, part, k, size, node_pairs):
        value_bytes = 2 if self.fp16_wire else grad.grad.element_size()
        row = {"gradient": grad.name, "numel": numel, "k": k, "sent": k * size,
               "wire_bytes": k * (value_bytes + INDEX_BYTES) if self.ranks > 1 else 0, "dense_bytes": grad.nbytes}
        if size > 1:   # a ring reduce-scatter sends (size - 1) shares per rank, the node's all-gather (size - 1)
            # shares too (warm-up) or the (size - 1) other members' pairs from across nodes
            gathered = (self.ranks * k * (grad.grad.element_size() + INDEX_BYTES) if node_pairs
                        else part * grad.grad.element_size())
            row["intra_bytes"] = (size - 1) * (part * grad.grad.element_size() + gathered)
        return row

    def _finite_or_zeros(self, acc, index):
        """With loss scaling an overflow is expected: flag it for AMP's agreement (context.unscaled)
        and select from acc with its inf/NaN zeroed, so the selection's finiteness check holds (the
        step is dropped anyway)."""
        finite = paddle.isfinite(acc)
        self.context.unscaled[index] = paddle.reshape(paddle.logical_not(paddle.all(finite)), [1])
        return paddle.where(finite, acc, paddle.zeros_like(acc))

    def _keep(self, residual, unsent):
        """Write the residual; with loss scaling only once every rank agreed the step is finite."""
        if self.context.loss_scaling is None:
            paddle.assign(unsent, output=residual)
            return
        self.context.after_overflow_agreed.append(
            lambda found_inf: paddle.assign(paddle.where(paddle.expand(found_inf, residual.shape), residual, unsent),
                                            output=residual))

    def _sparse(self, flat, numel, k, name, node_pairs=False):
        """[the sum of the exchanged pairs (this share's, or with `node_pairs` the whole node's gradient),
        scaled; with error feedback the unsent part of `flat`]."""
        values, indices = topk.mstopk(flat, k, self.configs.bisection_iterations, name=f"the gradient of {name}",
                                      implementation=sparse_exchange.selection(self.context))
        gathered, positions, wire = sparse_exchange.gather_pairs(values, indices, self.ring, self.ranks,
                                                                 "float16" if self.fp16_wire else None)
        if node_pairs:
            gathered, positions = self._placed_in_node(gathered, positions, numel)
        summed = sparse_exchange.scatter_add(gathered, positions, numel * (self.levels.size if node_pairs else 1))
        if not self.configs.error_feedback:
            return [self._scaled(summed)]
        sent = paddle.cast(wire, flat.dtype) if self.fp16_wire else values
        return [self._scaled(summed), paddle.scatter(flat, indices, values - sent, overwrite=True)]

    def _placed_in_node(self, gathered, positions, share):
        """Every member's pairs from across nodes, their positions moved to their share's place in the
        node's gradient: all-gathered in the node, they land on elements no other member's touch, so
        the all-gather moves values and sums nothing (program_edit.PLACES)."""
        offset = (self.context.topology.rank % self.levels.size) * share
        positions = paddle.add(positions, paddle.full([1], offset, "int32"))
        placed = []
        for part in (gathered, positions):
            part = paddle._C_ops.all_gather(part, self.levels.intra, self.levels.size)
            part.get_defining_op().set_int_attr(program_edit.PLACES, 1)
            placed.append(part)
        return placed

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
        summed = paddle.where(kept, flat, zeros)
        if self.ranks > 1:
            summed = paddle._C_ops.all_reduce(summed, self.ring, gradient_buckets.SUM)
        if not self.configs.error_feedback:
            return [self._scaled(summed)]
        return [self._scaled(summed), paddle.where(kept, zeros, flat)]

    def _scaled(self, summed):
        return sparse_exchange.scaled(self.context, summed)
