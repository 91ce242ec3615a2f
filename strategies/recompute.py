"""recompute: the backward recomputes the forward between checkpoints instead of keeping it, Fleet's `recompute` knob.

Fleet's RecomputeOptimizer keeps the checkpoint activations and, for each segment of forward
ops up to a checkpoint, re-runs the segment just before the backward needs it. fleetlite builds
the same rewrite on the program after backward: each segment's ops are cloned in front of the
first backward op that reads one of their results, and every backward read of a result is
pointed at its clone, so the forward's results die once the forward has used them (Paddle's
executor frees a tensor after its last reader) and only the checkpoints live through to the
backward. Segments, as in Fleet: from the first forward op to the first checkpoint, then from
each checkpoint to the next; what follows the last checkpoint is kept, since its backward comes
first. Inside a segment only what the backward reads is recomputed, and some results are kept
rather than recomputed: those of an op with no inputs (data, parameters, constants), of a random
op (dropout draws a new mask when re-run) and of an in-place op (re-running it would write into
what it read).

Checkpoints (recompute_configs.checkpoints) are given in one of two forms:
- the PIR values themselves, set after building the forward: `{"checkpoints": [h1, h3]}`; the
  strategy stores each as a token naming its op (fleetlite.strategy.checkpoint_values), found
  again here by fleetlite.compile.checkpoint_names;
- by name: the output of the layer whose parameters are `<name>.*` (`"linear_3"`), which is what
  a YAML file can say; a name no layer has is an error naming it.
Marks work too, the idiom of Fleet's dygraph scripts and of fleet.train_step: the ops built inside
`paddle.distributed.fleet.utils.recompute(layer, x)` carry `fwd_recompute_id`, and each marked
call is a segment (recomputed from its inputs). In a static program, build the layers outside
the call: Paddle marks the ops by their positions in the block, which a parameter created inside
the call shifts.

The program must run in program order (FLAGS_new_executor_sequential_run, what Fleet's
`enable_sequential_execution` became, which Fleet turns on with recompute): Paddle's default
executor starts an op as soon as its inputs exist, so it would re-run the segments right after
the forward, and memory would not fall (measured). The pass sets the flag; a strategy that turns
sequential execution off is refused.

Offload (enable_offload) moves checkpoints to host memory; on CPU they are there already, so it
is refused rather than ignored (on GPUs it is not implemented: refused too). So are enable_tuning
and refined_ops_patterns. Fleet's LocalSGD wraps only AMP: recompute with it is a conflict.
"""
from fleetlite.compile import checkpoint_names, program_edit
from fleetlite.compression.sparse_exchange import IN_ORDER
from fleetlite.errors import CompileError, StrategyConflictError
from fleetlite.strategy.requested_fields import requested
from fleetlite.compile.pass_contract import Pass, PassResult, Phase

RECOMPUTE_MARK = "fwd_recompute_id"    # set by paddle.distributed.fleet.utils.recompute in static mode
RANDOM_OPS = ("pd_op.dropout", "pd_op.uniform", "pd_op.gaussian", "pd_op.randint", "pd_op.bernoulli",
              "pd_op.randperm", "pd_op.multinomial", "pd_op.seed", "pd_op.fused_dropout_add")


def kept(op):
    """Whether `op`'s results are kept rather than recomputed (see the module docstring)."""
    return op.num_operands() == 0 or op.name() in RANDOM_OPS or op.name().endswith("_")


class Recompute(Pass):
    name = "recompute"
    phase = Phase.BACKWARD_REWRITE
    before = ("gradient_merge",)
    conflicts = {
        "localsgd": "Fleet's LocalSGD wraps only AMP, never recompute",
        "adaptive_localsgd": "Fleet's adaptive LocalSGD wraps only AMP, never recompute",
    }
    reads = ("recompute", "recompute_configs.checkpoints", "recompute_configs.enable_offload",
             "recompute_configs.checkpoint_shape", "recompute_configs.enable_tuning",
             "recompute_configs.refined_ops_patterns")

    @staticmethod
    def check_strategy(strategy, topology):
        configs = strategy.recompute_configs
        if strategy.recompute and configs.enable_offload:
            on_gpu = topology is not None and topology.device != "cpu"
            why = ("fleetlite does not implement offload on GPUs yet" if on_gpu else
                   "on CPU the checkpoints are in host memory already: there is nothing to offload to")
            raise StrategyConflictError(f"recompute_configs.enable_offload moves checkpoints from the GPU to host "
                                        f"memory, and {why}", field="recompute_configs.enable_offload", value=True,
                                        fix="set recompute_configs.enable_offload: false (and drop checkpoint_shape)")
        if strategy.recompute and requested(strategy, "build_strategy.enable_sequential_execution") \
                and not strategy.build_strategy.enable_sequential_execution:
            raise StrategyConflictError(
                "recompute needs the program to run in program order, or the executor re-runs each segment as soon as "
                "the forward has made its inputs and memory does not fall", field="build_strategy.enable_sequential_execution",
                value=False, fix="leave build_strategy.enable_sequential_execution unset or true, or turn recompute off")
        if strategy.recompute and (configs.enable_tuning or len(configs.refined_ops_patterns)):
            field = "enable_tuning" if configs.enable_tuning else "refined_ops_patterns"
            raise StrategyConflictError(f"recompute_configs.{field} is not implemented: fleetlite recomputes every "
                                        f"segment between the checkpoints you name", field=f"recompute_configs.{field}",
                                        fix=f"remove recompute_configs.{field}")

    def apply(self, context):
        forward, backward = split_at_backward(list(context.block.ops))
        checkpoints = self.strategy.recompute_configs.checkpoints
        if checkpoints:
            segments = segments_between(forward, checkpoint_names.resolve(checkpoints, forward))
        else:
            segments = marked_segments(forward)
        if not segments:
            raise CompileError("recompute has nothing to recompute: recompute_configs.checkpoints is empty and no op "
                               "was built inside paddle.distributed.fleet.utils.recompute(...); name checkpoints (the "
                               "values, or layer names) or mark segments, or turn recompute off")
        described = [d for d in (self._recompute(context, s, backward) for s in segments) if d["recomputed"]]
        context.runtime_flags[IN_ORDER] = True
        counts = [len(d["recomputed"]) for d in described]
        how_many = f"{len(described)} segment" + ("s" if len(described) != 1 else "")
        return PassResult(f"{how_many}, {sum(counts)} forward ops recomputed in backward "
                          f"({', '.join(map(str, counts))}); ops run in program order", {"segments": described})

    def _recompute(self, context, segment, backward):
        """Clone the ops of `segment` the backward reads (directly or through each other) in front of
        the first backward reader; point the backward's reads at the clones."""
        needed = needed_by_backward(segment, backward)
        described = {"forward_ops": sum(1 for op in segment if op.num_operands()),
                     "recomputed": [op.name() for op in needed]}
        if not needed:
            return described
        readers = [user for op in needed for result in op.results() for user in result.all_used_ops()
                   if user in backward]
        position = {op.id(): i for i, op in enumerate(context.block.ops)}
        first = min(readers, key=lambda op: position[op.id()])
        with context.edit(before=first):
            mapping = program_edit.clone_ops(needed, program_edit.BACKWARD)
        for op in needed:
            for result in op.results():
                result.replace_grad_users_with(mapping.look_up(result), backward)
        return {**described, "before": first.name()}


def split_at_backward(ops):
    """(the forward's ops, the set of backward ops). Paddle's backward starts at its first op: the
    first with the backward role that no pass built (a forward pass such as amp gives its casts
    that role too, so the role alone does not tell)."""
    start = next(i for i, op in enumerate(ops)
                 if op.op_role == program_edit.BACKWARD and program_edit.provenance(op) is None)
    return ops[:start], {op for op in ops[start:] if op.op_role == program_edit.BACKWARD}


def needed_by_backward(segment, backward):
    """The ops of `segment` (program order) whose results the backward reads, directly or through
    other ops of the segment; ops whose results are kept (kept()) end the chain."""
    recomputable = [op for op in segment if not kept(op)]
    needed, wanted = [], set()
    for op in reversed(recomputable):
        read_by_backward = any(user in backward for result in op.results() for user in result.all_used_ops())
        if not (read_by_backward or any(program_edit.key(r) in wanted for r in op.results())):
            continue
        needed.append(op)
        wanted.update(program_edit.key(source) for source in op.operands_source())
    return needed[::-1]


def segments_between(forward, checkpoints):
    """Fleet's segments: forward ops up to the first checkpoint's producer, then after each
    checkpoint's producer up to the next one's; producers of checkpoints are kept."""
    position = {op.id(): i for i, op in enumerate(forward)}
    producers = sorted({position[value.get_defining_op().id()] for value in checkpoints})
    segments, start = [], 0
    for end in producers:
        segments.append(forward[start:end])
        start = end + 1
    return [segment for segment in segments if segment]


def marked_segments(forward):
    """One segment per paddle.distributed.fleet.utils.recompute call (its ops share a mark)."""
    segments = {}
    for op in forward:
        if op.has_attr(RECOMPUTE_MARK):
            segments.setdefault(op.attrs()[RECOMPUTE_MARK], []).append(op)
    return list(segments.values())
