"""A sampler that keeps each node on a fixed part of the dataset, for the node caches.

Node n of N always reads the contiguous block [floor(nS/N), floor((n+1)S/N)) of the S samples
and shuffles only within it each epoch; its ranks split each epoch's order as
DistributedBatchSampler splits the global one. A node's caches then hold at most ceil(S/N)
samples and every sample a node reads from the second epoch on is one it has read before.
The price is a weaker shuffle: a global batch mixes the nodes' blocks, but a sample never
meets, within one rank's batch, samples of another node's block (docs/data.md discusses
when that matters). With one node it is a full shuffle.
"""
import numpy as np

from fleetlite.data import running_job as job
from fleetlite.data.distributed import deal_batches, equal_batches_policy, equal_shard_size
from fleetlite.data.epoch_sampler import EpochSampler, batch_count, check_batch_size, dataset_size
from fleetlite.errors import DataError


def block(index, count, size):
    """[start, stop) of block `index` when `size` items are cut into `count` near-equal blocks."""
    return index * size // count, (index + 1) * size // count


class NodePartitionBatchSampler(EpochSampler):
    """Batches of this rank from its node's fixed partition, shuffled within it per epoch.

    `num_nodes` and `ranks_per_node` default to the job's topology (ranks are contiguous per
    node, as fleetrun places them). Every rank gets the same number of batches: the ranks'
    shares are made equal by `equal_batches` (pad repeats the head of the node's epoch order,
    drop leaves its tail out, error names the sizes).
    """

    def __init__(self, dataset, batch_size, num_nodes=None, ranks_per_node=None, rank=None, shuffle=True,
                 drop_last=False, seed=None, equal_batches=None):
        here = job.topology()
        num_nodes = here.node_count if num_nodes is None else int(num_nodes)
        ranks_per_node = here.local_size if ranks_per_node is None else int(ranks_per_node)
        if num_nodes < 1 or ranks_per_node < 1:
            raise DataError(f"{num_nodes} nodes of {ranks_per_node} ranks: both must be >= 1")
        super().__init__(num_nodes * ranks_per_node, rank, seed)
        self.num_nodes, self.ranks_per_node = num_nodes, ranks_per_node
        self.node, self.local = divmod(self.local_rank, ranks_per_node)
        self.size = dataset_size(dataset)
        if self.size < num_nodes:
            raise DataError(f"{self.size} samples for {num_nodes} nodes: a node would hold none")
        self.batch_size = check_batch_size(batch_size)
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.equal_batches = equal_batches_policy(equal_batches)
        self.start, self.stop = block(self.node, num_nodes, self.size)
        shares = []                  # each rank's natural share of its node's partition
        for node in range(num_nodes):
            first, last = block(node, num_nodes, self.size)
            shares += [b - a for a, b in (block(r, ranks_per_node, last - first) for r in range(ranks_per_node))]
        self.num_samples = equal_shard_size(shares, self.equal_batches)
        own = shares[self.local_rank]
        self.padded, self.dropped = max(0, self.num_samples - own), max(0, own - self.num_samples)

    @property
    def partition(self):
        """The dataset indices this node reads, every epoch."""
        return range(self.start, self.stop)

    def __len__(self):
        return batch_count(self.num_samples, self.batch_size, self.drop_last)

    def batches(self, epoch):
        held = self.stop - self.start
        order = self.rng(epoch, self.node).permutation(held) if self.shuffle else np.arange(held)
        order = np.resize(order, self.num_samples * self.ranks_per_node) + self.start
        return deal_batches(order, self.batch_size, self.ranks_per_node, self.local, self.drop_last)
