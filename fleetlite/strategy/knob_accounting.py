"""Which knobs the user set that no compile pass reads, and what became of them.

The schema accepts every Fleet knob so Fleet strategy files load unchanged, but fleetlite
implements them one pass at a time. A knob set to a non-default value that no registered
pass reads must not vanish: the compile report lists it as skipped with the reason (and
`strict: true` makes that an error). A knob that would be skipped still cannot be combined with
one it contradicts: that pair is an error at validate(), so a file never reads as "ok" while
asking for two things that cannot both hold.
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
    "a_sync": "parameter-server only; collective training ignores it",
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
NOT_YET = "no fleetlite pass implements it yet"

# Pairs of knobs that contradict each other, where at least one has no fleetlite pass (pairs of
# implemented passes declare theirs in `Pass.conflicts`).
CONFLICTING_KNOBS = {
    ("localsgd", "adaptive_localsgd"): "both set the local SGD period (a fixed or an adaptive k)",
    ("lars", "lamb"): "LARS rewrites a Momentum update and LAMB an Adam update; an optimizer is one or the other",
}


def check_conflicting_knobs(strategy):
    """Raise StrategyConflictError for the first pair of CONFLICTING_KNOBS that are both on."""
    for (first, second), reason in CONFLICTING_KNOBS.items():
        if getattr(strategy, first) and getattr(strategy, second):
            raise StrategyConflictError(f"'{first}' and '{second}' cannot be used together: {reason}",
                                        field=second, value=True, fix=f"turn '{first}' or '{second}' off")


def unclaimed_knobs(strategy, claimed):
    """[(knob, reason)] for set knobs outside `claimed` (dotted field names read by passes)."""
    groups = {}
    for field in strategy.non_default():
        if field in claimed or field in ELSEWHERE or field.split(".")[0] in ELSEWHERE:
            continue
        top = field.split(".")[0]
        knob = top[: -len("_configs")] if top.endswith("_configs") else top
        groups.setdefault(knob, []).append(field)
    return [(knob, f"{NO_WORK.get(knob, NOT_YET)} (set: {', '.join(fields)})")
            for knob, fields in groups.items()]


def unclaimed_under_strict(strategy, claimed):
    """unclaimed_knobs(strategy, claimed); under `strict` the first of them is an error instead."""
    unclaimed = unclaimed_knobs(strategy, claimed)
    if strategy.strict and unclaimed:
        knob, reason = unclaimed[0]
        raise CompileError(f"strict: {knob} was requested but {reason}; remove it or set strict: false")
    return unclaimed
