"""The search space, as data: which strategy fields the tuner varies, over which values, and
where a field can matter at all.

A knob that cannot change anything on the job's machines (NCCL rings on gloo, hierarchical
all-reduce on one host, float16 wire format on gloo, which sums in float32) is left out rather
than timed: its trials would only measure noise. A new knob is one `Knob(...)` line.
"""
from dataclasses import dataclass
from typing import Callable, Optional, Tuple


@dataclass(frozen=True)
class JobShape:
    """What the applicability rules need to know about the job."""
    device: str          # "cpu" or "gpu"
    world_size: int
    node_count: int


@dataclass(frozen=True)
class Knob:
    field: str                                   # a strategy field, dotted for *_configs
    values: Tuple[object, ...]                   # tried in this order
    unless: Callable[[JobShape], Optional[str]] = lambda job: None   # why it cannot matter here


def _needs_gpu(job):
    return None if job.device == "gpu" else "gloo runs every ring on one communicator and sums float16 in float32"


def _needs_several_nodes(job):
    return None if job.node_count > 1 else "one node: there is no inter-node stage to split off"


KNOBS = (
    Knob("fuse_grad_size_in_MB", (1, 2, 4, 8, 16, 32, 64)),
    Knob("nccl_comm_num", (1, 2, 4), _needs_gpu),
    Knob("use_hierarchical_allreduce", (False, True), _needs_several_nodes),
    Knob("fp16_allreduce", (False, True), _needs_gpu),
)


def searched_knobs(job, knobs=KNOBS):
    """(knobs to search, [(field, why skipped)]) for this job."""
    kept, skipped = [], []
    for knob in knobs:
        reason = knob.unless(job)
        if reason:
            skipped.append((knob.field, reason))
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
