"""Shard-only samplers that give every rank the same number of batches.

A rank with one batch fewer than the others waits forever in the next gradient all-reduce
(pytorch#33148, horovod#708, webdataset#188). `equal_batches` says how sample counts are made
equal before batching, each way costing at most N-1 samples per epoch (N ranks):
- "pad": repeat samples from the head of the epoch's order (Paddle and torch always do this);
- "drop": leave the tail out (it changes every epoch when shuffled);
- "error": refuse data that does not split evenly, naming the sizes.
"""
import numpy as np

from fleetlite.data import running_job as job
from fleetlite.data.epoch_sampler import (EpochSampler, batch_count, check_batch_size, dataset_size,
                                          split_batches)
from fleetlite.errors import DataError

POLICIES = ("pad", "drop", "error")


def equal_batches_policy(policy):
    policy = job.data_config().equal_batches if policy is None else policy
    if policy not in POLICIES:
        raise DataError(f"equal_batches = {policy!r}: use one of {', '.join(map(repr, POLICIES))}")
    return policy


def even_split(size, world, policy):
    """Samples per rank when `size` samples are dealt over `world` ranks under `policy`."""
    share, rest = divmod(size, world)
    if rest == 0:
        return share
    if policy == "error":
        raise DataError(
            f"equal_batches='error': {size} samples do not split evenly over {world} ranks "
            f"({size} = {world} x {share} + {rest}: {rest} rank(s) would get {share + 1} samples, "
            f"the others {share}); use equal_batches='pad' (repeats {world - rest}) or 'drop' (leaves {rest} out)")
    if policy == "drop" and share == 0:
        raise DataError(f"equal_batches='drop': {size} samples over {world} ranks leaves every rank "
                        f"with none; use 'pad' or fewer ranks")
    return share + 1 if policy == "pad" else share


def equal_shard_size(sizes, policy):
    """Samples every rank uses when rank r holds sizes[r] of its own under `policy`."""
    if min(sizes) == max(sizes):
        return sizes[0]
    listed = ", ".join(f"rank {r}: {n}" for r, n in enumerate(sizes))
    if policy == "error":
        raise DataError(f"equal_batches='error': the ranks hold different numbers of samples ({listed}); "
                        f"use equal_batches='pad' (every rank repeats samples up to {max(sizes)}) or "
                        f"'drop' (every rank stops at {min(sizes)})")
    if min(sizes) == 0:
        raise DataError(f"a rank holds no samples ({listed}): it has nothing to pad from and dropping would "
                        f"leave every rank with none; shard by sample (shard_files(by='sample')) or use fewer ranks")
    return max(sizes) if policy == "pad" else min(sizes)


def deal_batches(order, batch_size, nranks, rank, drop_last):
    """Rank `rank`'s batches when `order` (a multiple of `nranks` long) is cut into global
    batches of `batch_size x nranks` and each is dealt in rank-sized blocks (as Paddle does);
    the short tail is split evenly."""
    global_batch = batch_size * nranks
    full = len(order) // global_batch
    head = order[:full * global_batch].reshape(full, nranks, batch_size)[:, rank]
    tail = order[full * global_batch:]
    share = len(tail) // nranks
    mine = np.concatenate([head.ravel(), tail[rank * share:(rank + 1) * share]])
    return split_batches(mine, batch_size, drop_last)


class DistributedBatchSampler(EpochSampler):
    """`paddle.io.DistributedBatchSampler`, with a shared seed, `set_epoch` and a choice of
    how the ranks are kept equal.

    Each step takes the next `batch_size x num_replicas` indices of the epoch's order and gives
    rank r the r-th block (as Paddle does), so N ranks see exactly the global batches one
    process would see with `batch_size x N`. `padded` / `dropped` report what equal_batches did.
    """

    def __init__(self, dataset, batch_size, num_replicas=None, rank=None, shuffle=True, drop_last=False,
                 seed=None, equal_batches=None):
        super().__init__(num_replicas, rank, seed)
        self.dataset = dataset
        self.size = dataset_size(dataset)
        self.batch_size = check_batch_size(batch_size)
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.equal_batches = equal_batches_policy(equal_batches)
        self.num_samples = even_split(self.size, self.nranks, self.equal_batches)
        self.total_size = self.num_samples * self.nranks
        self.padded = max(0, self.total_size - self.size)
        self.dropped = max(0, self.size - self.total_size)

    def __len__(self):
        return batch_count(self.num_samples, self.batch_size, self.drop_last)

    def epoch_order(self, epoch):
        """The global order of `epoch`, `total_size` long (padded or cut)."""
        order = self.rng(epoch).permutation(self.size) if self.shuffle else np.arange(self.size)
        return np.resize(order, self.total_size)

    def batches(self, epoch):
        return deal_batches(self.epoch_order(epoch), self.batch_size, self.nranks, self.local_rank, self.drop_last)

    def describe(self):
        kept = (f"pads {self.padded} duplicate(s)" if self.padded else
                f"drops {self.dropped} sample(s)" if self.dropped else "needs no padding")
        return (f"{self.size} samples over {self.nranks} ranks, {self.num_samples} per rank, "
                f"{len(self)} batches of {self.batch_size}; equal_batches={self.equal_batches} {kept} per epoch")


class ShardBatchSampler(EpochSampler):
    """Batches of this rank's own shard (a record shard, or data each rank loaded itself) when
    the shards differ in size: `shard_sizes` lists every rank's size (`RecordShard.sizes`, or
    `job.gather_sizes(len(local))`), and equal_batches evens them out (pad: every rank repeats
    up to the largest; drop: every rank stops at the smallest; error: names the sizes)."""

    def __init__(self, shard_sizes, batch_size, num_replicas=None, rank=None, shuffle=True, drop_last=False,
                 seed=None, equal_batches=None):
        sizes = [int(n) for n in getattr(shard_sizes, "sizes", shard_sizes)]
        super().__init__(len(sizes) if num_replicas is None else num_replicas, rank, seed)
        if len(sizes) != self.nranks:
            raise DataError(f"{len(sizes)} shard sizes for {self.nranks} ranks: give one size per rank")
        if sum(sizes) == 0:
            raise DataError("every shard is empty: there is nothing to sample")
        self.shard_sizes = sizes
        self.batch_size = check_batch_size(batch_size)
        self.shuffle, self.drop_last = bool(shuffle), bool(drop_last)
        self.equal_batches = equal_batches_policy(equal_batches)
        self.num_samples = equal_shard_size(sizes, self.equal_batches)
        own = sizes[self.local_rank]
        self.padded, self.dropped = max(0, self.num_samples - own), max(0, own - self.num_samples)

    def __len__(self):
        return batch_count(self.num_samples, self.batch_size, self.drop_last)

    def batches(self, epoch):
        own = self.shard_sizes[self.local_rank]
        order = self.rng(epoch, self.local_rank).permutation(own) if self.shuffle else np.arange(own)
        return split_batches(np.resize(order, self.num_samples), self.batch_size, self.drop_last)


class EvalBatchSampler(EpochSampler):
    """Evaluation: every sample exactly once over all ranks, no padding duplicates.

    Rank r takes the contiguous block [floor(rS/N), floor((r+1)S/N)) of the S samples, so the
    ranks' blocks in rank order are the dataset, and they differ by at most one sample (a rank
    may then have one batch fewer: evaluation runs no collective per step). Sum the metric's
    numerators and counts with `all_reduce_sums` and divide once: N ranks give the 1-rank value.
    """

    def __init__(self, dataset, batch_size, num_replicas=None, rank=None, seed=None, shuffle=False):
        super().__init__(num_replicas, rank, seed)
        self.dataset = dataset
        self.size = dataset_size(dataset)
        self.batch_size = check_batch_size(batch_size)
        self.shuffle = bool(shuffle)
        self.start = self.local_rank * self.size // self.nranks
        self.stop = (self.local_rank + 1) * self.size // self.nranks
        self.num_samples = self.stop - self.start

    def __len__(self):
        return batch_count(self.num_samples, self.batch_size, False)

    def batches(self, epoch):
        mine = np.arange(self.start, self.stop)
        if self.shuffle:
            mine = self.rng(epoch, self.local_rank).permutation(mine)
        return split_batches(mine, self.batch_size, False)
