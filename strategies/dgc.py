"""dgc: Deep Gradient Compression (Lin et al., ICLR'18) for Momentum training, Fleet's `dgc` knob.

DGC takes every float32/float64 gradient of at least MIN_NUMEL elements (16,384, Fleet's
threshold); the others go dense, through data_parallel's buckets (and fuse_all_reduce_ops) and the
ordinary Momentum update. Per taken gradient g (n elements) of parameter p, with the optimizer's
momentum m and learning rate lr, each rank keeps two persistable tensors u and v (zeros at start):

  before rampup_begin_step (dense):       G = all_reduce(g) / N;  u = m * u + G;  p -= lr * u
  from rampup_begin_step on (sparse):     u = m * u + g                 (momentum correction)
                                          v = v + u                     (accumulation)
                                          values, indices = MSTopK(v, k)
                                          E = scatter_add(all_gather(values, int32 indices)) / N
                                          u[indices] = v[indices] = 0   (momentum factor masking)
                                          p -= lr * E                   (the momentum is inside u)

The dense phase is exactly the Momentum update (u is its velocity), so the switch carries the
momentum over. The sparse phase's exchange is the top-k pass's (fleetlite.compression.sparse_exchange); the
selection is `fleetlite.compression.topk_select.mstopk`: a threshold found on a strided sample of |v| (DGC's sampled
threshold), one masked pass, then a trim to exactly k, so every rank sends exactly k pairs (an
all-gather needs the same count from every rank), the exact top-k up to ties.

Schedule (Fleet's dgc_configs): from rampup_begin_step, sparsity[j] holds while
floor((step - rampup_begin_step) * S / rampup_step) == j (S entries, each lasting rampup_step / S
steps), the last entry afterwards; k = ceil((1 - sparsity) * n). An empty list is Fleet's default
[0.999]. A persistable step counter drives one chain of `pd_op.if` per gradient (one branch per
distinct k, plus the dense one), so the program runs in program order (see sparse_exchange). With
rampup_begin_step 0 and one sparsity there is no branch and no counter.

The update: the `dgc_update` pass (UPDATE_REWRITE) replaces each taken parameter's `momentum_`
op by `sgd_` on the exchange's output (in the dense phase that output is u, so the step is
Momentum's), and drops the Momentum velocity it no longer reads (u takes its place).

Where this differs from Fleet's DGCMomentumOptimizer: k rounds up (Fleet truncates, so it can
send nothing); sparsity 0 is allowed (everything is sent, and factor masking then empties u every
step: the update is SGD on the averaged gradient, where Fleet's kernel refuses a ratio of 1); u is
its own variable, not the Momentum velocity's (Fleet shares one); DGC's local gradient clipping,
Nesterov momentum and weight decay inside the update are not built (refused, not ignored).
"""
import math

import paddle
from paddle.pir.core import create_persistable_value

from fleetlite.compile import gradient_buckets, program_edit
from fleetlite.compression import sparse_exchange, topk_select as topk
from fleetlite.compile.report import human_bytes
from fleetlite.errors import CompileError
from fleetlite.compression.sparse_exchange import INDEX_BYTES, IN_ORDER
from fleetlite.compile.pass_contract import Pass, PassResult, Phase, inner_optimizer
from fleetlite.strategies.pto import remove_startup_state
from fleetlite.strategies.topk_exchange import TAKEN_DTYPES, fraction_sent

MIN_NUMEL = 16384                 # Fleet's DGC takes parameters of at least this many elements
DEFAULT_SPARSITY = (0.999,)       # Fleet's default when dgc_configs.sparsity is empty
MOMENTUM_SUFFIX = "@GRAD@DGC_U"   # u: this rank's momentum (the velocity in the dense phase)
ACCUMULATED_SUFFIX = "@GRAD@DGC_V"   # v: what this rank has not sent yet
MOMENTUM_UPDATE = "pd_op.momentum_"


def phases(configs):
    """[(first step, sparsity)] in step order; sparsity None is the dense phase."""
    sparsity = list(configs.sparsity) or list(DEFAULT_SPARSITY)
    begin, ramp, count = configs.rampup_begin_step, configs.rampup_step, len(sparsity)
    found = [(0, None)] if begin > 0 else []
    for stage, value in enumerate(sparsity):
        start = begin + -(-stage * ramp // count)
        if found and found[-1][0] == start:   # the stage before lasts no step
            found.pop()
        found.append((start, value))
    return found


def sent(sparsity, numel):
    """k = ceil((1 - sparsity) * numel), at least 1; 1 - sparsity rounded to 9 places first, so that
    a sparsity of 0.99 sends 1% and not 1.0000000000000009% (one element more)."""
    return fraction_sent(round(1.0 - sparsity, 9), numel)


def sent_per_phase(configs, numel):
    """[(first step, k)] for a gradient of `numel` elements (k None: dense), phases of equal k merged."""
    merged = []
    for start, sparsity in phases(configs):
        k = None if sparsity is None else sent(sparsity, numel)
        if not merged or merged[-1][1] != k:
            merged.append((start, k))
    return merged


def check_dgc_configs(strategy, topology):
    if strategy.dgc and len(phases(strategy.dgc_configs)) > 1:
        sparse_exchange.require_program_order(strategy, "dgc's schedule (rampup_begin_step > 0 or several sparsities)",
                                              "set dgc_configs.rampup_begin_step: 0 and one sparsity")


class Dgc(Pass):
    check_strategy = staticmethod(check_dgc_configs)
    name = "dgc"
    phase = Phase.COMMUNICATION
    after = ("data_parallel", "gradient_scale_configs.scale_gradient")
    requires = ("data_parallel",)
    conflicts = {
        "amp": "u and v carry gradients across steps; with loss scaling they would mix steps of different scales "
               "and keep an overflowing step's inf (Fleet refuses this pair too)",
        "fp16_allreduce": "dgc sends its values in the gradient's dtype; float16 values on the wire are built for "
                          "topk only",
        "topk": "both replace the dense gradient all-reduce with a sparse exchange",
        "use_hierarchical_allreduce": "the DGC exchange is a one-level all-gather on the world ring",
        "gradient_merge": "dgc's momentum and schedule advance once per run, while gradient_merge exchanges and "
                          "updates once every k_steps runs; that program is not built",
        "pto": "pto (Fleet's sharding) shards the optimizer update that dgc rewrites; that program is not built",
    }
    reads = ("dgc", "dgc_configs.rampup_begin_step", "dgc_configs.rampup_step", "dgc_configs.sparsity")

    def apply(self, context):
        configs = self.strategy.dgc_configs
        taken = [i for i, g in enumerate(context.gradients)
                 if g.dtype in TAKEN_DTYPES and math.prod(g.grad.shape) >= MIN_NUMEL]
        if not taken:
            return PassResult(f"no float gradient has {MIN_NUMEL} elements: all go dense, the optimizer's update "
                              f"unchanged", {"gradients": []})
        momentum = momentum_of(context.optimizer)
        sparse_exchange.take_from_buckets(context, taken)
        step = None
        if len(phases(configs)) > 1:
            step = sparse_exchange.step_counter(context, [context.gradients[i] for i in taken], "dgc_step")
            context.runtime_flags[IN_ORDER] = True
        exchange = _Exchange(context, momentum, step)
        rows = [exchange.emit(context.gradients[i], sent_per_phase(configs, math.prod(context.gradients[i].grad.shape)))
                for i in taken]
        return self._result(context, configs, rows)

    @staticmethod
    def _result(context, configs, rows):
        dense_bytes = sum(context.gradients[i].nbytes for b in context.buckets for i in b.members)
        taken_bytes = sum(row["dense_bytes"] for row in rows)
        total = sum(row["numel"] for row in rows)
        stages = []
        for start, sparsity in phases(configs):
            if sparsity is None:
                stages.append({"from_step": start, "dense": True, "bytes_per_step": taken_bytes + dense_bytes})
                continue
            count = sum(sent(sparsity, row["numel"]) for row in rows)
            wire = sum(sent(sparsity, row["numel"]) * (row["value_bytes"] + INDEX_BYTES) for row in rows)
            stages.append({"from_step": start, "sparsity": sparsity, "density": count / total,
                           "sparse_bytes_per_step": wire, "bytes_per_step": wire + dense_bytes})
        last = stages[-1]
        schedule = ", then ".join(
            f"dense until step {stages[i + 1]['from_step']}" if stage.get("dense") else
            f"sparsity {stage['sparsity']:g} from step {stage['from_step']}" for i, stage in enumerate(stages))
        summary = (f"{len(rows)} gradients by DGC ({schedule}; finally density {last['density']:.4g}: "
                   f"{human_bytes(last['sparse_bytes_per_step'])} per rank per step instead of "
                   f"{human_bytes(taken_bytes)}), momentum correction and factor masking; {len(context.buckets)} "
                   f"dense ({human_bytes(dense_bytes)})")
        return PassResult(summary, {"gradients": rows, "stages": stages, "achieved_density": last["density"],
                                    "sparse_bytes_per_step": last["sparse_bytes_per_step"],
                                    "dense_bytes_per_step": dense_bytes, "bytes_per_step": last["bytes_per_step"]})


def momentum_of(optimizer):
    """The momentum of the Momentum optimizer dgc works with; anything else is refused by name."""
    return inner_optimizer(
        optimizer, "dgc", paddle.optimizer.Momentum, "paddle.optimizer.Momentum(learning_rate, momentum=...)",
        lambda momentum: {
            "use_nesterov=True": momentum._use_nesterov,
            "a grad_clip (DGC's per-rank gradient clipping is not built; a clip in the optimizer would clip "
            "the exchanged update)": momentum._grad_clip is not None,
            "weight_decay": bool(momentum._regularization_method) or momentum.regularization is not None},
    )._momentum


class _Exchange:
    """Builds one gradient's DGC exchange and its schedule (see the module doc)."""

    def __init__(self, context, momentum, step):
        self.context, self.momentum, self.step = context, momentum, step
        self.world = context.topology.world_size

    def emit(self, grad, pieces):
        shape, numel = list(grad.grad.shape), math.prod(grad.grad.shape)
        with self.context.edit():
            state = [create_persistable_value(grad.grad.dtype, [numel], grad.name + suffix,
                                              initializer=paddle.nn.initializer.Constant(0.0))
                     for suffix in (MOMENTUM_SUFFIX, ACCUMULATED_SUFFIX)]
        with self.context.edit(after=grad.grad.get_defining_op()):
            flat = grad.grad if len(shape) == 1 else paddle.reshape(grad.grad, [-1])
            update, *written = self._phase(pieces, flat, *state, grad.name)
            for new, old in zip(written, state):
                paddle.assign(new, output=old)
            grad.synced = update if len(shape) == 1 else paddle.reshape(update, shape)
        value_bytes = grad.grad.element_size()
        return {"gradient": grad.name, "numel": numel, "value_bytes": value_bytes, "dense_bytes": grad.nbytes,
                "k": [k for _, k in pieces if k is not None]}

    def _phase(self, pieces, flat, u, v, name):
        """[update, new u, new v] of the phase the step is in: a chain of branches on the step."""
        (_, k), rest = pieces[0], pieces[1:]
        build = (lambda: self._dense(flat, u, v)) if k is None else (lambda: self._sparse(flat, u, v, k, name))
        if not rest:
            return build()
        return paddle.static.nn.cond(self.step < float(rest[0][0]), build,
                                     lambda: self._phase(rest, flat, u, v, name))

    def _dense(self, flat, u, v):
        reduced = sparse_exchange.scaled(self.context, paddle._C_ops.all_reduce(flat, 0, gradient_buckets.SUM))
        velocity = paddle.add(paddle.scale(u, self.momentum), reduced)
        return [velocity, velocity, v]

    def _sparse(self, flat, u, v, k, name):
        corrected = paddle.add(paddle.scale(u, self.momentum), flat)
        accumulated = paddle.add(v, corrected)
        values, indices = topk.mstopk(accumulated, k, name=f"the accumulated gradient of {name}",
                                      implementation=sparse_exchange.selection(self.context))
        summed, _ = sparse_exchange.gather_and_scatter_add(values, indices, flat.shape[0], 0, self.world)
        cleared = paddle.zeros_like(values)
        return [sparse_exchange.scaled(self.context, summed), paddle.scatter(corrected, indices, cleared),
                paddle.scatter(accumulated, indices, cleared)]


class DgcUpdate(Pass):
    """dgc's second half: the taken parameters' Momentum update becomes SGD on the exchange's output."""
    name = "dgc_update"
    knobs = ("dgc",)
    phase = Phase.UPDATE_REWRITE
    requires = ("dgc",)
    reads = ("dgc",)

    def apply(self, context):
        taken = [context.gradients[i] for i in sorted(context.exchanged)]
        updates = {program_edit.key(op.operand_source(0)): op for op in context.block.ops
                   if op.name() == MOMENTUM_UPDATE}
        velocities = []
        for grad in taken:
            op = updates.get(program_edit.key(grad.param))
            _check_plain_update(op, grad)
            names = op.get_input_names()
            lr = op.operand_source(names.index("learning_rate"))
            with program_edit.inserting(context.program, self.name, after=op, role=program_edit.OPTIMIZE):
                paddle._C_ops.sgd_(grad.param, lr, grad.synced, None, False)
            velocity = op.operand_source(names.index("velocity"))
            op.result(0).replace_all_uses_with(grad.param)
            program_edit.remove_ops(context.block, [op])
            if velocity.use_empty():
                velocities.append(velocity.get_defining_op())
        dropped = [op.attrs()["name"] for op in velocities]
        program_edit.remove_ops(context.block, velocities)
        remove_startup_state(paddle.static.default_startup_program(), set(dropped))
        return PassResult(f"{len(taken)} momentum_ -> sgd_ on the DGC exchange; {len(dropped)} Momentum velocities "
                          f"dropped (dgc's u replaces them)", {"rewritten": [g.name for g in taken],
                                                              "velocities_dropped": dropped})


def _check_plain_update(op, grad):
    """The update dgc replaces must be Momentum's plain step on the exchanged gradient."""
    if op is None:
        raise CompileError(f"dgc found no momentum_ update of {grad.name}; dgc needs paddle.optimizer.Momentum")
    attrs = op.attrs()
    extras = [what for what, present in (("weight decay (a regularizer on the parameter)",
                                          bool(attrs["regularization_method"])),
                                         ("rescale_grad", attrs["rescale_grad"] != 1.0),
                                         ("multi_precision", attrs["multi_precision"])) if present]
    reads = op.operand_source(op.get_input_names().index("grad"))
    if not reads.is_same(grad.synced):
        extras.append("an op between the exchange and the update (a regularizer on the parameter?)")
    if extras:
        raise CompileError(f"dgc does not build the Momentum update of {grad.name} with {', '.join(extras)}; "
                           f"leave them out for the parameters dgc takes (>= {MIN_NUMEL} elements)")
