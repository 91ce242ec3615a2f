"""The contract every fleetlite sampler keeps, and the one place its randomness comes from.

A sampler yields this rank's batches (lists of dataset indices) for one epoch. What it yields
is a pure function of (seed, epoch, rank, world): every rank computes the same global plan and
takes its own part, so shards cannot overlap, and a job restarted at epoch e that calls
`set_epoch(e)` replays that epoch exactly. Like Paddle's DistributedBatchSampler, each
iteration moves to the next epoch by itself; `set_epoch` says which one comes next.
"""
import abc
import numbers

import numpy as np

from fleetlite.data import job
from fleetlite.errors import DataError


class EpochSampler(abc.ABC):
    """Base of the samplers: topology and seed defaults from the job, epochs, iteration."""

    def __init__(self, num_replicas=None, rank=None, seed=None):
        self.nranks, self.local_rank = job.replicas_and_rank(num_replicas, rank)
        if self.nranks < 1 or not 0 <= self.local_rank < self.nranks:
            raise DataError(f"rank {self.local_rank} of {self.nranks} replicas is impossible: "
                            f"num_replicas must be >= 1 and rank in [0, num_replicas)")
        self.seed = job.shared_seed(seed)
        self.epoch = 0

    @property
    def num_replicas(self):
        return self.nranks

    @property
    def rank(self):
        return self.local_rank

    def set_epoch(self, epoch):
        """The epoch the next iteration yields (resume at epoch e: set_epoch(e))."""
        if int(epoch) < 0:
            raise DataError(f"epoch {epoch} is negative")
        self.epoch = int(epoch)

    def __iter__(self):
        epoch, self.epoch = self.epoch, self.epoch + 1
        return iter(self.batches(epoch))

    @abc.abstractmethod
    def batches(self, epoch):
        """This rank's batches of `epoch`: a list of lists of dataset indices."""

    def rng(self, epoch, *streams):
        """The generator of (seed, epoch, *streams); the same on every rank unless a stream is
        the rank."""
        return np.random.default_rng([self.seed % 2**63, epoch, *streams])


def dataset_size(dataset_or_size):
    if isinstance(dataset_or_size, numbers.Integral):
        size = int(dataset_or_size)
    else:
        try:
            size = len(dataset_or_size)
        except TypeError:
            raise DataError(f"{type(dataset_or_size).__name__} has no len(): the samplers need a "
                            f"map-style dataset or its size") from None
    if size <= 0:
        raise DataError(f"the dataset is empty ({size} samples): there is nothing to sample")
    return size


def check_batch_size(batch_size, name="batch_size"):
    if not isinstance(batch_size, numbers.Integral) or isinstance(batch_size, bool) or batch_size < 1:
        raise DataError(f"{name} = {batch_size!r}: it must be a whole number >= 1")
    return int(batch_size)


def split_batches(indices, batch_size, drop_last):
    """Consecutive batches of `indices` (a numpy array); the last one short unless dropped."""
    flat = indices.tolist()
    stop = len(flat) - len(flat) % batch_size if drop_last else len(flat)
    return [flat[i:i + batch_size] for i in range(0, stop, batch_size)]


def batch_count(samples, batch_size, drop_last):
    return samples // batch_size if drop_last else -(-samples // batch_size)
