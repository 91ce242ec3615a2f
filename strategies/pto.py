"""pto, parallel tensor operations (and Fleet's `sharding`, stage 1): each rank updates 1/N of the
parameters, then shares them.

After the gradient all-reduce every rank holds the same reduced gradients and would run the
same optimizer update. This pass splits the parameters into N parts (`plan_partition`:
`size` gives the next largest parameter to the rank with the fewest bytes so far,
`round_robin` gives parameter i, in gradient-ready order, to rank i mod N), keeps only the
update ops of this rank's part, removes the other parts' optimizer state (its `pd_op.data`
ops in main, its initialisation in the startup program: the executor never creates those
variables, so optimizer memory per rank is about 1/N), and then brings every parameter to every
rank: per bucket of at most `allgather_bucket_MB` MiB of one owner's parameters, a `broadcast_`
from that owner on ring 0 (in place on the parameter when the bucket holds one; packed with one
concat and unpacked with one split otherwise).

Why broadcast and not all_gather: all_gather needs the same shape from every rank, and the
parts are whole parameters of unequal sizes, so it would need every part padded to the
largest and packed and unpacked on every rank; broadcast sends each part as it is, with no
copy for a single parameter (benchmarks/pto/pto.py measures both).

The gradient communication is left as it is: every rank keeps all reduced gradients, so a
global-norm clip computes the norm over all of them exactly as one process does, and AMP's
overflow flag is agreed (MAX over ring 0) before any owner updates. On GPU a reduce-scatter to
the owners would halve the gradient traffic, but then the global norm needs an all-reduce of
partial squared norms and AMP's check a reduced flag over the parts; fleetlite does not build
that program, and the report says the all-reduce stays.

With gradient merge, the exchange runs inside its conditional branch, with the update (the
pass hands its ops to gradient_merge_update through `context.update_only`); with
fuse_all_optimizer_ops, merged_adam_ merges the owned Adam updates.
"""
import math
import paddle

from fleetlite.compile import gradient_buckets, program_edit
from fleetlite.compile.report import human_bytes
from fleetlite.errors import CompileError, StrategyConflictError
from fleetlite.compile.pass_contract import Pass, PassResult, Phase, read_field
from fleetlite.strategies.fuse_optimizer import UPDATE_OPS

MiB = 1 << 20
NOT_STATE = ("param", "grad", "learning_rate", "skip_update")


def plan_partition(sizes, world, how):
    """The owning rank of each parameter (sizes in bytes, gradient-ready order)."""
    if how == "round_robin":
        return [i % world for i in range(len(sizes))]
    owners, load = [0] * len(sizes), [0] * world
    for i in sorted(range(len(sizes)), key=lambda i: (-sizes[i], i)):
        rank = min(range(world), key=lambda r: (load[r], r))
        owners[i] = rank
        load[rank] += sizes[i]
    return owners


def plan_exchange(owners, sizes, bucket_bytes):
    """[(owner, [parameter indices])]: one broadcast each, owners in rank order, each bucket
    at most `bucket_bytes` (a larger parameter alone; 0: one parameter per bucket)."""
    buckets = []
    for owner in sorted(set(owners)):
        current, total = [], 0
        for i in (i for i, o in enumerate(owners) if o == owner):
            if current and total + sizes[i] > bucket_bytes:
                buckets.append((owner, current))
                current, total = [], 0
            current.append(i)
            total += sizes[i]
        buckets.append((owner, current))
    return buckets


def sharding_degree_check(strategy, topology):
    """Fleet's sharding maps to pto only as stage 1 over the whole world."""
    if not strategy.sharding:
        return
    configs = strategy.sharding_configs
    if configs.stage != 1:
        raise StrategyConflictError(
            f"sharding_configs.stage = {configs.stage}: fleetlite shards optimizer state only (stage 1); "
            f"stage 2 (gradients) and 3 (parameters) are not implemented", field="sharding_configs.stage",
            value=configs.stage, fix="set sharding_configs.stage: 1")
    for name in ("mp_degree", "pp_degree", "dp_degree"):
        if getattr(configs, name) != 1:
            raise StrategyConflictError(
                f"sharding_configs.{name} = {getattr(configs, name)}: hybrid sharding is not data parallel",
                field=f"sharding_configs.{name}", value=getattr(configs, name),
                fix=f"set sharding_configs.{name}: 1 and shard over the whole world")
    for name in ("hybrid_dp", "optimize_offload", "optimize_cast", "pp_allreduce_in_optimize"):
        if getattr(configs, name):
            raise StrategyConflictError(f"sharding_configs.{name} is not implemented by fleetlite's stage-1 sharding",
                                        field=f"sharding_configs.{name}", value=True,
                                        fix=f"set sharding_configs.{name}: false")
    if configs.sharding_segment_strategy != "segment_broadcast_MB":
        raise StrategyConflictError(
            f"sharding_configs.sharding_segment_strategy = {configs.sharding_segment_strategy!r}: fleetlite buckets "
            f"the parameter exchange by size only", field="sharding_configs.sharding_segment_strategy",
            value=configs.sharding_segment_strategy,
            fix="set sharding_segment_strategy: segment_broadcast_MB and size the buckets with segment_broadcast_MB")
    if configs.gradient_merge_acc_step != 1:
        raise StrategyConflictError(
            f"sharding_configs.gradient_merge_acc_step = {configs.gradient_merge_acc_step}: use the gradient_merge "
            f"knob", field="sharding_configs.gradient_merge_acc_step", value=configs.gradient_merge_acc_step,
            fix="set gradient_merge: true and gradient_merge_configs.k_steps instead")
    if topology is not None and configs.sharding_degree != topology.world_size:
        raise StrategyConflictError(
            f"sharding_configs.sharding_degree = {configs.sharding_degree} but the job has {topology.world_size} "
            f"ranks: fleetlite shards over the whole world (no hybrid degrees)",
            field="sharding_configs.sharding_degree", value=configs.sharding_degree,
            fix=f"set sharding_configs.sharding_degree: {topology.world_size}")


class Pto(Pass):
    check_strategy = staticmethod(sharding_degree_check)
    name = "pto"
    decides_without_program = True
    knobs = ("pto", "sharding")
    phase = Phase.UPDATE_REWRITE
    before = ("build_strategy.fuse_all_optimizer_ops", "gradient_merge_update")
    reads = ("pto", "pto_configs.partition", "pto_configs.allgather_bucket_MB", "sharding",
             "sharding_configs.sharding_degree", "sharding_configs.stage", "sharding_configs.segment_broadcast_MB",
             "sharding_configs.sharding_segment_strategy")

    def applicable(self, topology, program):
        if topology.world_size == 1:
            return "one rank: it updates every parameter itself"
        return None

    def config(self):
        used = ("pto_configs.partition", "pto_configs.allgather_bucket_MB") if self.strategy.pto else \
            ("sharding_configs.sharding_degree", "sharding_configs.stage", "sharding_configs.segment_broadcast_MB")
        return {name: read_field(self.strategy, name) for name in used}

    def _settings(self):
        """(partition, bucket bytes): pto_configs, or Fleet's sharding segment size."""
        if self.strategy.pto:
            return self.strategy.pto_configs.partition, int(self.strategy.pto_configs.allgather_bucket_MB * MiB)
        return "size", int(self.strategy.sharding_configs.segment_broadcast_MB * MiB)

    def apply(self, context):
        block, rank, world = context.block, context.topology.rank, context.topology.world_size
        updates = [op for op in block.ops if op.name() in UPDATE_OPS]
        if not updates:
            raise CompileError("pto needs the optimizer's per-parameter update ops (sgd_, momentum_, adam_, adamw_, "
                               "lamb_), and this program has none")
        params = [_operand(op, "param") for op in updates]
        sizes = [program_edit.nbytes(p) for p in params]
        how, bucket_bytes = self._settings()
        owners = plan_partition(sizes, world, how)
        names = [_name(p) for p in params]
        state = {name: [_name(v) for v in _state(op)] for name, op in zip(names, updates)}
        state_bytes = {name: sum(program_edit.nbytes(v) for v in _state(op)) for name, op in zip(names, updates)}
        others = [op for op, owner in zip(updates, owners) if owner != rank]
        dropped = [value for op in others for value in state[_name(_operand(op, "param"))]]
        updated = {program_edit.key(p): op.result(0) for op, p, owner in zip(updates, params, owners) if owner == rank}
        program_edit.remove_ops(block, others)
        removed = remove_dead_ops(block)
        uninitialised = remove_startup_state(paddle.static.default_startup_program(), set(dropped))
        owner_of = {program_edit.key(p): o for p, o in zip(params, owners)}
        if context.topology.device == "gpu":
            gradient_communication = reduce_scatter_to_owners(context, owner_of)
        else:
            gradient_communication = "all_reduce kept (gloo has no reduce_scatter): every rank uses its part"
        buckets = plan_exchange(owners, sizes, bucket_bytes)
        with context.edit() as created:
            for owner, members in buckets:
                _exchange(rank, owner, [params[i] for i in members],
                          [updated.get(program_edit.key(params[i])) for i in members])
        context.update_only.extend(created)
        per_rank = [sum(state_bytes[n] for n, o in zip(names, owners) if o == r) for r in range(world)]
        param_bytes = [sum(s for s, o in zip(sizes, owners) if o == r) for r in range(world)]
        details = {"partition": how, "owners": dict(zip(names, owners)), "parameter_bytes_per_rank": param_bytes,
                   "state_bytes_per_rank": per_rank, "state_bytes_unsharded": sum(per_rank),
                   "collective": "broadcast_", "exchange_buckets": len(buckets),
                   "gradient_communication": gradient_communication,
                   "state_owners": {v: o for n, o in zip(names, owners) for v in state[n]},
                   "dead_ops_removed": removed, "startup_inits_removed": uninitialised}
        summary = (f"{len(updates)} updates in {world} parts by {how} ({_parts(owners, param_bytes)}); this rank keeps "
                   f"{len(updates) - len(others)} and {human_bytes(per_rank[rank])} of {human_bytes(sum(per_rank))} "
                   f"optimizer state; {len(buckets)} broadcast_ from the owners; gradients: {gradient_communication}")
        return PassResult(summary, details)


def _parts(owners, param_bytes):
    """Each rank's parameter count and bytes; for more than 4 ranks, the range."""
    if len(param_bytes) <= 4:
        return ", ".join(f"rank {r}: {owners.count(r)} ({human_bytes(b)})" for r, b in enumerate(param_bytes))
    return f"{human_bytes(min(param_bytes))} to {human_bytes(max(param_bytes))} of parameters per rank"


def reduce_scatter_to_owners(context, owner_of):
    """GPU: each bucket's world all-reduce becomes one reduce_scatter whose chunk r holds the
    bucket's gradients that rank r owns (each owner's run padded to the longest), so a rank
    receives only the sums it updates. Returns the report's line."""
    rank = context.topology.rank
    for grad in context.gradients:
        readers = [] if owner_of[program_edit.key(grad.param)] == rank else list(grad.synced.all_used_ops())
        if readers:
            raise CompileError(
                f"on GPU pto reduce-scatters each gradient to its owner, but {readers[0].name()} still reads the "
                f"reduced gradient of {grad.name} on rank {rank}, which does not own it (global-norm clipping and "
                f"AMP's overflow check read every gradient; they would need an all-reduce of partial squared norms "
                f"and flags, which fleetlite does not build): drop the global-norm clip or AMP, or turn pto off")
    for bucket in context.buckets:
        collectives = [op for op in bucket.ops if program_edit.int_attr(op, "ring_id") is not None]
        if [op.name() for op in collectives] not in (["pd_op.all_reduce_"], ["pd_op.all_reduce"]) \
                or not context.rings[bucket.ring].is_world:
            raise CompileError(f"on GPU pto replaces each bucket's world all-reduce by a reduce-scatter, but bucket "
                               f"{bucket.index} travels as {', '.join(op.name() for op in collectives)} on ring "
                               f"{bucket.ring} (hierarchical_allreduce or fp16_allreduce): turn that knob or pto off")
        _scatter_bucket(context, bucket, owner_of)
    return "reduce_scatter to the owners (one per bucket)"


def _scatter_bucket(context, bucket, owner_of):
    rank, world = context.topology.rank, context.topology.world_size
    grads = [context.gradients[i] for i in bucket.members]
    runs = [[g for g in grads if owner_of[program_edit.key(g.param)] == r] for r in range(world)]
    lengths = [sum(math.prod(g.grad.shape) for g in run) for run in runs]
    longest = max(lengths)
    last = max((g.grad.get_defining_op() for g in grads), key=gradient_buckets.position_in(context.block))
    with context.edit(after=last) as created:
        pieces = []
        for run, length in zip(runs, lengths):
            pieces += [paddle.reshape(g.grad, [-1]) for g in run]
            if length < longest:
                pieces.append(paddle.zeros([longest - length], grads[0].grad.dtype))
        chunk = paddle._C_ops.reduce_scatter(paddle.concat(pieces), bucket.ring, world)
        if context.gradient_scale is not None:
            chunk = paddle._C_ops.scale_(chunk, context.gradient_scale, 0.0, True)
        mine = runs[rank]
        if mine:
            if lengths[rank] < longest:
                chunk = paddle.slice(chunk, [0], [0], [lengths[rank]])
            parts = paddle.split(chunk, [math.prod(g.grad.shape) for g in mine]) if len(mine) > 1 else [chunk]
            reduced = [paddle.reshape(part, g.grad.shape) for part, g in zip(parts, mine)]
    for grad, value in zip(mine, reduced if mine else []):
        grad.synced.replace_all_uses_with(value)
        grad.synced = value
    for grad in grads:
        if owner_of[program_edit.key(grad.param)] != rank:
            grad.synced = None          # this rank neither receives nor updates it
    program_edit.remove_ops(context.block, bucket.ops)
    next(op for op in created if op.name() == "pd_op.reduce_scatter").set_int_attr(program_edit.BUCKET, bucket.index)
    bucket.ops = created


def _operand(op, name):
    return op.operand_source(op.get_input_names().index(name))


def _name(value):
    """The persistable name of a parameter or state value (its builtin.parameter / pd_op.data op)."""
    producer = value.get_defining_op()
    attrs = producer.attrs()
    return attrs.get("parameter_name") or attrs["name"]


def _state(op):
    """The optimizer state values an update op reads and writes (moments, beta powers, master weight)."""
    values = []
    for index, name in enumerate(op.get_input_names()):
        value = op.operand_source(index)
        if name in NOT_STATE or not value.initialized():
            continue
        producer = value.get_defining_op()
        if producer is not None and producer.name() == "pd_op.data":
            values.append(value)
    return values


def remove_dead_ops(block):
    """Remove the update-side ops nothing reads any more (the dropped parts' clipping, weight
    decay, state and constants); in-place and result-less ops are kept. Returns how many."""
    removed = 0
    while True:
        dead = [op for op in block.ops if op.op_role == program_edit.OPTIMIZE and op.num_results() > 0
                and not op.name().endswith("_") and op.num_regions() == 0
                and all(result.use_empty() for result in op.results())]
        if not dead:
            return removed
        program_edit.remove_ops(block, dead)
        removed += len(dead)


def remove_startup_state(startup, names):
    """Remove the startup program's initialisation of the variables `names`; returns how many."""
    block = startup.global_block()
    setters = [op for op in block.ops if op.name() == "builtin.shadow_output"
               and op.attrs().get("output_name") in names]
    producers = [op.operand_source(0).get_defining_op() for op in setters]
    program_edit.remove_ops(block, setters)
    program_edit.remove_ops(block, [op for op in producers if all(r.use_empty() for r in op.results())])
    return len(setters)


def _exchange(rank, owner, params, updated):
    """Broadcast `params` from `owner`: the owner sends its updated values, the others
    receive into their parameters."""
    sources = [u if rank == owner else p for p, u in zip(params, updated)]
    if len(params) == 1:
        paddle._C_ops.broadcast_(sources[0], 0, owner)
        return
    packed = paddle.concat([paddle.reshape(v, [-1]) for v in sources])
    received = paddle._C_ops.broadcast_(packed, 0, owner)
    if rank == owner:
        return
    parts = paddle.split(received, [math.prod(p.shape) for p in params])
    for param, part in zip(params, parts):
        paddle.assign(paddle.reshape(part, param.shape), output=param)
