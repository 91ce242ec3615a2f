"""P×K batches for metric learning (triplet and other pair losses), distributed.

Every step builds one global batch of P×N classes × K samples and gives each rank P whole
classes: a rank's batch is always exactly P classes × K samples, and no class is on two ranks
in the same step. Generic distributed wrappers deal an inner sampler's list out by stride,
which scatters a class's K samples over the ranks; pytorch-metric-learning's MPerClassSampler
has no distributed version (its #546) and covers an arbitrary subset of the data per "epoch".
"""
import numpy as np

from fleetlite.data.class_draws import class_members, draw_stream
from fleetlite.data.epoch_sampler import EpochSampler, check_batch_size
from fleetlite.errors import DataError


class PKBatchSampler(EpochSampler):
    """Each rank's batch: `p` distinct classes × `k` samples of each (p*k indices, grouped by
    class in runs of k).

    An epoch cuts every class into groups of k (ceil(size / k) groups, the last one completed
    from the class's other samples) and deals the groups into steps of p × num_replicas
    distinct classes. Every class gets at least one group per epoch, so every class is visited
    every epoch; groups beyond what whole steps can hold are left out, chosen anew each epoch.
    Only a class with fewer than k samples is drawn with replacement: `upsampled` lists them.
    The label of each yielded index is `labels[index]`, from the labels given.
    """

    def __init__(self, labels, p, k, num_replicas=None, rank=None, seed=None):
        super().__init__(num_replicas, rank, seed)
        self.labels = labels
        self.classes, self.members = class_members(labels)
        self.p, self.k = check_batch_size(p, "p"), check_batch_size(k, "k")
        self.batch_size = self.p * self.k
        self.slots = self.p * self.nranks
        if len(self.classes) < self.slots:
            raise DataError(
                f"a step needs P x N = {self.p} classes x {self.nranks} ranks = {self.slots} distinct classes, "
                f"but the labels have {len(self.classes)}; lower p to at most {len(self.classes) // self.nranks} "
                f"or use fewer ranks")
        sizes = np.array([len(m) for m in self.members])
        self.groups = -(-sizes // self.k)
        self.steps = _steps(self.groups, self.slots)
        self.upsampled = {c: int(n) for c, n in zip(self.classes.tolist(), sizes.tolist()) if n < self.k}

    def __len__(self):
        return self.steps

    def label_of(self, index):
        return self.labels[index]

    def describe(self):
        replaced = (f"; drawn with replacement (fewer than k={self.k} samples): {self.upsampled}"
                    if self.upsampled else "")
        return (f"{len(self.classes)} classes, {self.steps} steps of {self.p} x {self.k} per rank over "
                f"{self.nranks} ranks{replaced}")

    def batches(self, epoch):
        rng = self.rng(epoch)
        counts = _level(np.minimum(self.groups, self.steps), self.steps * self.slots, self.steps, rng)
        drawn = []
        for c in rng.permutation(len(self.classes)):
            total = counts[c] * self.k
            drawn.append(draw_stream(rng, self.members[c], total, np.arange(0, total, self.k)).reshape(-1, self.k))
        # Group i goes to step i mod T: a class's (at most T) consecutive groups land in distinct steps.
        table = np.concatenate(drawn).reshape(self.slots, self.steps, self.k).transpose(1, 0, 2)
        table = table[rng.permutation(self.steps)]
        table = np.take_along_axis(table, np.argsort(rng.random(table.shape[:2]), axis=1)[:, :, None], axis=1)
        mine = table[:, self.local_rank * self.p:(self.local_rank + 1) * self.p]
        return mine.reshape(self.steps, self.batch_size).tolist()


def _steps(groups, slots):
    """Steps per epoch: as many whole steps as the groups fill when a class may appear in each
    step at most once, and at least enough to give every class a slot."""
    steps = int(groups.sum()) // slots
    while True:
        fewer = int(np.minimum(groups, steps).sum()) // slots
        if fewer == steps:
            break
        steps = fewer
    return max(steps, -(-len(groups) // slots))


def _level(counts, total, ceiling, rng):
    """Groups per class summing to `total`, each in [1, ceiling]: trim the largest counts (or
    raise the smallest) to one level, the last few of them picked at random."""
    trim = counts.sum() >= total
    clipped = (lambda h: np.minimum(counts, h)) if trim else (lambda h: np.maximum(counts, h))
    low, high = 1, ceiling     # the largest level whose clipped counts fit in `total`
    while low < high:
        middle = (low + high + 1) // 2
        low, high = (middle, high) if clipped(middle).sum() <= total else (low, middle - 1)
    out = clipped(low)
    candidates = np.flatnonzero(counts > low if trim else out == low)
    out[rng.choice(candidates, total - int(out.sum()), replace=False)] += 1
    return out
