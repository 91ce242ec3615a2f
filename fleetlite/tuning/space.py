"""The search space, as data: which strategy fields the tuner varies, over which values, and
where a field can matter at all.

A knob that cannot change anything on the job's machines (NCCL rings on gloo, hierarchical
all-reduce on one host, float16 wire format on gloo, which sums in float32) is left out rather
than timed: its trials would only measure noise. Knobs that trade accuracy for speed (top-k
density) are tuned only when the starting strategy already uses that exchange. A new knob is one
`Knob(...)` line.
"""
from dataclasses import dataclass, replace
from typing import Callable, FrozenSet, Optional, Tuple


@dataclass(frozen=True)
class JobShape:
    """What the applicability rules need to know about the job."""
    device: str          # "cpu" or "gpu"
    world_size: int
    node_count: int
    switched_on: FrozenSet[str] = frozenset()   # the boolean fields the starting strategy turns on


@dataclass(frozen=True)
class Knob:
    field: str                                   # a strategy field, dotted for *_configs
    values: Tuple[object, ...]                   # tried in this order
    unless: Callable[[JobShape], Optional[str]] = lambda job: None   # why it cannot matter here
    cpu_values: Optional[Tuple[object, ...]] = None   # tried instead on CPU jobs, where they differ


def _needs_gpu(job):
    return None if job.device == "gpu" else "gloo runs every ring on one communicator and sums float16 in float32"


def _needs_several_nodes(job):
    return None if job.node_count > 1 else "one node: there is no inter-node stage to split off"


def _needs_several_ranks(job):
    return None if job.world_size > 1 else "one rank: there is no optimizer update to share out"


def _needs_on(field):
    """A knob of a lossy exchange: tuned only where the user chose that exchange."""
    def unless(job):
        return None if field in job.switched_on else (f"the starting strategy does not turn on {field} "
                                                      f"(the tuner never switches a lossy exchange on)")
    return unless


KNOBS = (
    # On CPU the buckets are copy-free (a bucket costs one collective and no copy), so fewer, larger
    # ones win (docs/performance.md (a)); on GPU the concat/split copies are cheap and overlap matters.
    Knob("fuse_grad_size_in_MB", (1, 2, 4, 8, 16, 32, 64), cpu_values=(4, 16, 32, 64, 128)),
    Knob("nccl_comm_num", (1, 2, 4), _needs_gpu),
    Knob("use_hierarchical_allreduce", (False, True), _needs_several_nodes),
    Knob("fp16_allreduce", (False, True), _needs_gpu),
    Knob("pto", (False, True), _needs_several_ranks),
    Knob("topk_configs.density", (0.001, 0.01, 0.05), _needs_on("topk")),
)


def searched_knobs(job, knobs=KNOBS):
    """(knobs to search, [(field, why skipped)]) for this job."""
    kept, skipped = [], []
    for knob in knobs:
        reason = knob.unless(job)
        if reason:
            skipped.append((knob.field, reason))
        elif job.device == "cpu" and knob.cpu_values is not None:
            kept.append(replace(knob, values=knob.cpu_values))
        else:
            kept.append(knob)
    return tuple(kept), skipped


def nested_fields(config):
    """{"a.b": 1} style (field, value) pairs as the nested mapping schema.update takes."""
    tree = {}
    for field, value in config:
        *sections, leaf = field.split(".")
        node = tree
        for section in sections:
            node = node.setdefault(section, {})
        node[leaf] = value
    return tree
