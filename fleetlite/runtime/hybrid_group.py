"""`fleet.get_hybrid_communicate_group()`: Paddle's HybridCommunicateGroup for the dp-only topology.

Scripts written for Paddle's hybrid API (PaddleNLP's trainers) ask it for ranks, sizes and
groups of each axis. fleetlite trains data parallel only (strategy.hybrid_degrees refuses any
other degree above 1), so the data axis is the whole job, on the process group fleet.init brought
up, and every other axis (model, pipeline, sharding, sequence, context) is a group of this rank
alone: rank 0 of 1, whose collectives Paddle skips (a group of one rank has no peer to meet).
"""
from paddle.distributed.communication.group import Group

from fleetlite.runtime import process_group

DATA_PARALLEL = 0   # Paddle's ParallelMode.DATA_PARALLEL, what get_parallel_mode() returns here


class HybridCommunicateGroup:
    """The method names and meanings of Paddle's class, for a job with every degree but data 1."""

    def __init__(self, topology):
        self.nranks, self.global_rank = topology.world_size, topology.rank
        if topology.world_size > 1:
            process_group.connect("fleet.get_hybrid_communicate_group")
            self._data_group = process_group.world_group()
        else:
            self._data_group = _alone(topology.rank, "data")
        self._alone = {axis: _alone(topology.rank, axis) for axis in ("model", "pipe", "sharding", "sep", "context")}

    def get_parallel_mode(self):
        return DATA_PARALLEL

    def get_global_rank(self):
        return self.global_rank

    # data: the whole job
    def get_data_parallel_rank(self):
        return self.global_rank

    def get_data_parallel_world_size(self):
        return self.nranks

    def get_data_parallel_group(self):
        return self._data_group

    def get_data_parallel_group_src_rank(self):
        return 0

    def get_check_parallel_group(self, sharding=False):
        """The group that agrees on found-inf and global norms: the whole job."""
        return self._data_group

    # every other axis: this rank alone
    def get_model_parallel_rank(self):
        return 0

    def get_model_parallel_world_size(self):
        return 1

    def get_model_parallel_group(self):
        return self._alone["model"]

    def get_model_parallel_group_src_rank(self):
        return self.global_rank

    def get_stage_id(self):
        return 0

    def get_pipe_parallel_world_size(self):
        return 1

    def get_pipe_parallel_group(self):
        return self._alone["pipe"]

    def get_sharding_parallel_rank(self):
        return 0

    def get_sharding_parallel_world_size(self):
        return 1

    def get_sharding_parallel_group(self):
        return self._alone["sharding"]

    def get_sharding_parallel_group_src_rank(self):
        return self.global_rank

    def get_sep_parallel_rank(self):
        return 0

    def get_sep_parallel_world_size(self):
        return 1

    def get_sep_parallel_group(self):
        return self._alone["sep"]

    def get_sep_parallel_group_src_rank(self):
        return self.global_rank

    def get_context_parallel_rank(self):
        return 0

    def get_context_parallel_world_size(self):
        return 1

    def get_context_parallel_group(self):
        return self._alone["context"]

    def get_context_parallel_group_src_rank(self):
        return self.global_rank


def _alone(rank, axis):
    """A group of `rank` alone (Paddle's own one-rank groups: not a member of any collective)."""
    return Group(0, -1, [rank], pg=None, name=f"fleetlite_{axis}_alone")
