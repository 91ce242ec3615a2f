"""`Topology`: who this process is in the job, as a plain value.

The compiler reads only this (never the environment), so a test can build the program that
rank 3 of 32 on 4 GPU nodes would run, in one process, from `Topology.grid(...)`.
"""
from dataclasses import dataclass, field
from typing import Optional, Tuple

from fleetlite.errors import TopologyError

DEVICES = ("cpu", "gpu")


@dataclass(frozen=True)
class Topology:
    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_size: int = 1
    node_rank: int = 0
    node_count: int = 1
    endpoints: Tuple[str, ...] = field(default=("127.0.0.1:6070",))
    device: str = "cpu"
    device_id: Optional[int] = None
    # True when the launcher (Open MPI) did not say where each rank runs: until the process group
    # exchanges them through the store, endpoints other than rank 0's (the master) are guesses.
    endpoints_from_store: bool = False

    def __post_init__(self):
        object.__setattr__(self, "endpoints", tuple(self.endpoints))
        problems = []
        if self.world_size < 1:
            problems.append(f"world size {self.world_size} < 1")
        if not 0 <= self.rank < self.world_size:
            problems.append(f"rank {self.rank} is not in [0, {self.world_size})")
        if not 0 <= self.local_rank < self.local_size:
            problems.append(f"local rank {self.local_rank} is not in [0, {self.local_size})")
        if not 0 <= self.node_rank < self.node_count:
            problems.append(f"node rank {self.node_rank} is not in [0, {self.node_count})")
        if self.node_count > self.world_size:
            problems.append(f"{self.node_count} nodes for only {self.world_size} ranks")
        if len(self.endpoints) != self.world_size:
            problems.append(f"{len(self.endpoints)} endpoints for a world of {self.world_size}")
        if self.device not in DEVICES:
            problems.append(f"device '{self.device}' is not one of {', '.join(DEVICES)}")
        if problems:
            raise TopologyError("impossible topology: " + "; ".join(problems))

    @classmethod
    def grid(cls, world_size, node_count=1, rank=0, device="cpu", base_port=6070):
        """A uniform job (world_size / node_count ranks per node, ranks contiguous per node),
        with endpoints 127.0.0.<node+1>:<base_port+local rank>. Used by tests and `explain`."""
        if world_size % node_count:
            raise TopologyError(f"{world_size} ranks cannot be spread evenly over {node_count} nodes "
                                f"({world_size} % {node_count} = {world_size % node_count})")
        per_node = world_size // node_count
        endpoints = [f"127.0.0.{r // per_node + 1}:{base_port + r % per_node}" for r in range(world_size)]
        return cls(rank=rank, world_size=world_size, local_rank=rank % per_node, local_size=per_node,
                   node_rank=rank // per_node, node_count=node_count, endpoints=endpoints,
                   device=device, device_id=(rank % per_node) if device == "gpu" else None)

    @property
    def backend(self):
        return "nccl" if self.device == "gpu" else "gloo"

    @property
    def master(self):
        """The endpoint that hosts the rendezvous store (rank 0's)."""
        return self.endpoints[0]

    @property
    def is_uniform(self):
        """Every node has local_size ranks and ranks are contiguous per node."""
        return self.local_size * self.node_count == self.world_size

    def node_ranks(self, node=None):
        """Global ranks on `node` (default: this node), assuming a uniform, contiguous layout."""
        node = self.node_rank if node is None else node
        return list(range(node * self.local_size, (node + 1) * self.local_size))

    def describe(self):
        return (f"rank {self.rank}/{self.world_size} (local {self.local_rank}/{self.local_size}, "
                f"node {self.node_rank}/{self.node_count}, {self.device}, {self.backend})")
