"""What the data side needs from the running job: its rank and world, its data settings, one
seed shared by every rank, and two small eager collectives (sums and sizes) run between
executor runs.

Defaults come from `fleet.init` when it ran (else from the environment fleetrun sets), so a
sampler built with explicit `num_replicas`/`rank`/`seed` touches no process and no network:
that is how the tests build every rank's sampler in one process.
"""
import os
import sys

import numpy as np

from fleetlite.topology.env_contract import NODE_SECRET, read_topology
from fleetlite.proto import strategy_pb2


def _fleet_job():
    """(topology, strategy or None) from `fleet.init`, or None when it has not run."""
    api = sys.modules.get("fleetlite.api")
    return getattr(api, "_job", None)


def topology():
    job = _fleet_job()
    return job[0] if job else read_topology(os.environ)


def node_secret():
    """The secret fleetrun gave the ranks of this node for this job ("" when fleetrun did not
    start this process)."""
    return os.environ.get(NODE_SECRET, "")


def replicas_and_rank(num_replicas, rank):
    """Paddle's defaults: the job's world size and this process's rank."""
    if num_replicas is None or rank is None:
        here = topology()
        num_replicas = here.world_size if num_replicas is None else num_replicas
        rank = here.rank if rank is None else rank
    return int(num_replicas), int(rank)


def data_config(strategy=None):
    """The `data_configs` section of `strategy`, else of fleet.init's strategy, else the defaults."""
    if strategy is None:
        job = _fleet_job()
        strategy = job[1] if job else None
    if strategy is None:
        return strategy_pb2.DataConfig()
    return strategy._proto.data_configs


def shared_seed(seed):
    """The seed every rank uses: the strategy's `data_configs.seed` when `seed` is None, else
    rank 0's `seed` (broadcast when a process group is up), so shards never overlap even when
    each rank passed its own seed (a pid, a clock)."""
    if seed is None:
        return int(data_config().seed)
    if not _group_is_up():
        return int(seed)
    return int(_eager_collective("broadcast", np.array([seed], dtype="int64"))[0])


def all_reduce_sums(values):
    """Element-wise sums of `values` over every rank, as float64 (an N-rank evaluation then
    gives the 1-rank metric: sum correct predictions and counts, divide once). Every rank must
    call it; between executor runs, never inside one. Without a process group: the values."""
    array = np.asarray(values, dtype="float64")
    if not _group_is_up():
        return array.copy()
    return _eager_collective("all_reduce", array)


def gather_sizes(local_size):
    """Every rank's `local_size`, in rank order (one all-reduce of a one-hot vector)."""
    here = topology()
    sizes = np.zeros(here.world_size, dtype="float64")
    sizes[here.rank] = local_size
    return [int(s) for s in all_reduce_sums(sizes)]


def _group_is_up():
    """Whether a process group is up; a rendezvous fleet.init deferred (static mode) happens now."""
    process_group = sys.modules.get("fleetlite.runtime.process_group")
    if process_group is None:
        return False
    process_group.connect("fleetlite.data's job-wide values (the shared seed, metric sums)")
    return process_group.is_up()


def _eager_collective(name, array):
    import paddle
    import paddle.distributed as dist

    static = not paddle.in_dynamic_mode()
    if static:
        paddle.disable_static()
    try:
        tensor = paddle.to_tensor(array)
        if name == "broadcast":
            dist.broadcast(tensor, 0)
        else:
            dist.all_reduce(tensor)
        return tensor.numpy()
    finally:
        if static:
            paddle.enable_static()
