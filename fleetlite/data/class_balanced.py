"""Class-balanced (or class-weighted) batches, distributed: each epoch draws every class in
proportion to its target weight, and the global batch of every step is split over the ranks.

torch's request for a distributed weighted sampler is open since 2022 (pytorch#77154) and
Paddle answered that it is not supported (Paddle#42870): a weighted sampler run on each rank
with its own random state overlaps the shards and gives the ranks unequal lengths.
"""
import math

import numpy as np

from fleetlite.data.class_draws import class_members, draw_stream
from fleetlite.data.epoch_sampler import EpochSampler, check_batch_size
from fleetlite.errors import DataError


class ClassBalancedBatchSampler(EpochSampler):
    """Batches whose classes follow `weights` (uniform by default) over an epoch.

    An epoch is `num_samples` draws (default: the dataset's size), cut down to whole global
    batches of `batch_size x num_replicas`, so every rank gets the same number of full batches.
    Class c receives round(epoch x weight_c) draws (largest remainder: within one draw of the
    target), spread evenly over the epoch and shuffled inside each step; inside a class every
    member is drawn equally often (small classes are repeated, large ones subsampled). One step
    never holds a sample twice, so no sample is on two ranks in the same step: a class needs at
    least as many samples as its share of one global batch, or the constructor says which.
    """

    def __init__(self, labels, batch_size, weights=None, num_replicas=None, rank=None, seed=None,
                 num_samples=None):
        super().__init__(num_replicas, rank, seed)
        self.labels = labels
        self.classes, self.members = class_members(labels)
        self.batch_size = check_batch_size(batch_size)
        self.global_batch = self.batch_size * self.nranks
        requested = (sum(map(len, self.members)) if num_samples is None
                     else check_batch_size(num_samples, "num_samples"))
        self.steps = requested // self.global_batch
        if self.steps == 0:
            raise DataError(f"an epoch of {requested} samples does not fill one global batch "
                            f"({self.batch_size} x {self.nranks} ranks = {self.global_batch}); "
                            f"lower batch_size or raise num_samples")
        self.num_samples = self.steps * self.global_batch
        self.weights = self._normalised(weights)
        self.quotas = largest_remainder(self.num_samples * self.weights)
        self._check_step_shares()

    def __len__(self):
        return self.steps

    def _normalised(self, weights):
        count = len(self.classes)
        if weights is None:
            return np.full(count, 1.0 / count)
        if isinstance(weights, dict):
            unknown = [c for c in weights if c not in set(self.classes.tolist())]
            missing = [c for c in self.classes.tolist() if c not in weights]
            if unknown or missing:
                raise DataError(f"weights must name every class once: unknown {unknown}, missing {missing}")
            values = np.array([weights[c] for c in self.classes.tolist()], dtype="float64")
        else:
            values = np.asarray(weights, dtype="float64").reshape(-1)
            if len(values) != count:
                raise DataError(f"{len(values)} weights for {count} classes (in sorted order: "
                                f"{self.classes.tolist()[:8]}{'...' if count > 8 else ''})")
        if not np.all(np.isfinite(values)) or values.min() < 0 or values.sum() <= 0:
            raise DataError(f"weights must be finite, >= 0 and not all 0, got {values.tolist()}")
        return values / values.sum()

    def _check_step_shares(self):
        for c, quota in enumerate(self.quotas):
            share = math.ceil(self.global_batch * quota / self.num_samples)
            if quota and len(self.members[c]) < share:
                raise DataError(
                    f"class {self.classes[c].item()!r} has {len(self.members[c])} samples, but a step of "
                    f"{self.global_batch} samples ({self.batch_size} x {self.nranks} ranks) holds up to "
                    f"{share} of it at weight {self.weights[c]:.3g}: one sample would be in a step twice; "
                    f"lower batch_size or that class's weight")

    def frequencies(self):
        """{class: share of the epoch's draws} (the same every epoch)."""
        return {c: q / self.num_samples for c, q in zip(self.classes.tolist(), self.quotas.tolist())}

    def batches(self, epoch):
        rng = self.rng(epoch)
        active = np.flatnonzero(self.quotas)
        quotas = self.quotas[active]
        points = np.concatenate([(np.arange(q) + rng.random()) * (self.num_samples / q) for q in quotas])
        slot_class = np.repeat(active, quotas)[np.argsort(points, kind="stable")]
        slot_class = rng.permuted(slot_class.reshape(self.steps, self.global_batch), axis=1).ravel()
        drawn = np.empty(self.num_samples, dtype="int64")
        positions = np.split(np.argsort(slot_class, kind="stable"), np.cumsum(quotas)[:-1])
        for c, where in zip(active, positions):
            step = where // self.global_batch
            starts = np.concatenate([[0], np.flatnonzero(np.diff(step)) + 1])
            drawn[where] = draw_stream(rng, self.members[c], len(where), starts)
        mine = drawn.reshape(self.steps, self.nranks, self.batch_size)[:, self.local_rank]
        return mine.tolist()


def largest_remainder(exact):
    """Whole numbers summing to round(sum(exact)), each within one of its exact value."""
    floors = np.floor(exact).astype("int64")
    missing = int(round(exact.sum())) - int(floors.sum())
    floors[np.argsort(floors - exact, kind="stable")[:missing]] += 1
    return floors

