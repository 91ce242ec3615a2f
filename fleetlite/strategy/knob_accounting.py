"""Which knobs the user set that no compile pass reads, and what becomes of them.

The schema accepts every Fleet knob so Fleet strategy files load unchanged, but fleetlite does
not implement them all. A knob set to a non-default value that no registered pass reads never
vanishes: where it legitimately needs no work here (NO_WORK) the compile report lists it as
skipped with the reason (`strict: true` makes that an error); any other is an error at
validate() naming it and what to do (`refuse_unimplemented`), so a job never trains without
something its strategy asked for.
"""
from fleetlite.errors import CompileError, StrategyConflictError

# Not compile knobs: other parts of fleetlite read them (the hybrid degrees: fleet.init's check
# and fleet.get_hybrid_communicate_group).
ELSEWHERE = ("strict", "split_data", "data_configs",
             *(f"hybrid_configs.{axis}_degree" for axis in ("dp", "mp", "pp", "sharding", "sep", "cp", "ep",
                                                            "moe_sharding", "cp_sharding")))

# Knobs that legitimately need no work in fleetlite's collective static programs.
NO_WORK = {
    "find_unused_parameters": "not needed: in a static program an unused parameter simply has no gradient",
    "without_graph_optimization": "Fleet's raw-program switch; fleetlite always rewrites the program itself",
    "calc_comm_same_stream": "accepted for compatibility; stream placement is left to Paddle",
    "execution_strategy": "no Paddle 3 equivalent: its executor keeps no per-iteration scope to drop (it frees each "
                          "tensor after its last reader) and runs no per-device threads to hold at a barrier",
    "build_strategy": "an option of the legacy ParallelExecutor; Paddle 3's executor has no equivalent",
    "fuse_grad_merge": "fleetlite keeps one accumulator per gradient and packs buckets once per k steps, when they "
                       "are communicated; fused accumulators would need coalesce_tensor views, which do not see "
                       "an in-place all-reduce on CPU",
    "fuse_grad_size_in_num": "it sizes fuse_grad_merge's groups, which fleetlite does not build (see fuse_grad_merge)",
    "hybrid": "it configures the groups of hybrid parallelism's other axes (model, pipeline, sharding, ...), "
              "which are one rank each in fleetlite's dp-only topology",
}
NOT_IMPLEMENTED = "fleetlite does not implement it"
# What to do instead, for the knobs a Fleet strategy file is likeliest to carry; any other
# unimplemented knob gets DEFAULT_FIX.
FIXES = {
    "a_sync": "parameter-server training is not supported (fleetlite is collective only): remove a_sync and "
              "a_sync_configs",
    "pipeline": "pipeline parallelism is not data parallel: remove pipeline_configs",
    "tensor_parallel": "tensor parallelism is not data parallel: remove tensor_parallel_configs",
    "qat": "quantisation-aware training is not implemented: remove qat_configs",
    "sharding": "fleetlite's sharding is stage 1 over all ranks (sharding_degree, stage, segment_broadcast_MB): "
                "leave the other sharding_configs fields at their defaults, or use pto",
}
DEFAULT_FIX = "remove it (leave it at its default)"

def _unclaimed_groups(strategy, claimed):
    """{knob: [set fields]} for set fields outside `claimed` (dotted field names read by passes),
    grouped by knob (`x_configs.*` under `x`)."""
    groups = {}
    for field in strategy.non_default():
        if field in claimed or field in ELSEWHERE or field.split(".")[0] in ELSEWHERE:
            continue
        top = field.split(".")[0]
        knob = top[: -len("_configs")] if top.endswith("_configs") else top
        groups.setdefault(knob, []).append(field)
    return groups


def refuse_unimplemented(strategy, claimed):
    """Raise StrategyConflictError for the first set knob that no pass reads and that is not one
    of NO_WORK: it names the knob, the fields set and what to do."""
    for knob, fields in _unclaimed_groups(strategy, claimed).items():
        if knob not in NO_WORK:
            raise StrategyConflictError(f"{knob}: {NOT_IMPLEMENTED} (set: {', '.join(fields)})", field=fields[0],
                                        fix=FIXES.get(knob, DEFAULT_FIX))


def unclaimed_knobs(strategy, claimed):
    """[(knob, reason)] for the set knobs no pass reads that need no work here (NO_WORK); any
    other unclaimed knob is refused at validate() (refuse_unimplemented)."""
    return [(knob, f"{NO_WORK[knob]} (set: {', '.join(fields)})")
            for knob, fields in _unclaimed_groups(strategy, claimed).items() if knob in NO_WORK]


def unclaimed_under_strict(strategy, claimed):
    """unclaimed_knobs(strategy, claimed); under `strict` the first of them is an error instead."""
    unclaimed = unclaimed_knobs(strategy, claimed)
    if strategy.strict and unclaimed:
        knob, reason = unclaimed[0]
        raise CompileError(f"strict: {knob} was requested but {reason}; remove it or set strict: false")
    return unclaimed
