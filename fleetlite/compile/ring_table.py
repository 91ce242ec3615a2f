"""The communication rings a compiled program uses, with the ranks in each.

A collective op names a ring only by its `ring_id`; what the ring *means* (which ranks sum
together) lives here. Passes add rings as they lay out communication (several world rings
for `nccl_comm_num`, intra- and inter-node rings for hierarchical all-reduce); the gloo
lowering reads the members to decide whether a ring is the world (run it on ring 0) or a
subgroup (emulate it on ring 0); on GPUs the API creates one NCCL communicator per ring the
program uses. Ring ids are the same on every rank; the members differ per rank.
"""
from dataclasses import dataclass
from typing import Tuple

WORLD, INTRA, INTER = "world", "intra", "inter"


@dataclass(frozen=True)
class Ring:
    ring_id: int
    kind: str
    groups: Tuple[Tuple[int, ...], ...]   # the partition of all ranks into this ring's groups

    def group_of(self, rank):
        """(index of the group holding `rank`, that group's ranks)."""
        for index, group in enumerate(self.groups):
            if rank in group:
                return index, group
        raise KeyError(f"rank {rank} is in no group of ring {self.ring_id}")

    @property
    def group_size(self):
        return len(self.groups[0])

    @property
    def is_world(self):
        return len(self.groups) == 1

    def describe(self, rank):
        _, members = self.group_of(rank)
        return {"ring": self.ring_id, "kind": self.kind, "size": len(members),
                "groups": len(self.groups), "members": list(members)}


class RingTable:
    """Rings by id; ring 0 is always the world (the default process group)."""

    def __init__(self, world_size):
        self.world_size = world_size
        self._rings = {0: Ring(0, WORLD, (tuple(range(world_size)),))}

    def add(self, kind, groups):
        """Register a new ring over `groups` (a partition of the ranks); returns its id."""
        ring_id = max(self._rings) + 1
        self._rings[ring_id] = Ring(ring_id, kind, tuple(tuple(g) for g in groups))
        return ring_id

    def add_world(self):
        return self.add(WORLD, [range(self.world_size)])

    def __getitem__(self, ring_id):
        return self._rings[ring_id]

    def __contains__(self, ring_id):
        return ring_id in self._rings

    def __iter__(self):
        return iter(self._rings[i] for i in sorted(self._rings))
