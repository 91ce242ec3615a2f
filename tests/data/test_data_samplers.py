"""The samplers as whole tables: every rank's sampler is built in one process (they are pure
functions of seed, epoch, rank and world) and checked together, over many sizes, batch sizes,
world sizes and policies."""
import collections
import itertools

import numpy as np
import pytest

from fleetlite.data import (ClassBalancedBatchSampler, DistributedBatchSampler, EvalBatchSampler,
                            PKBatchSampler, ShardBatchSampler)
from fleetlite.errors import DataError

WORLDS = (1, 2, 3, 4, 8)
SIZES = (1, 2, 7, 10, 64, 100, 101, 997)
BATCHES = (1, 3, 8, 32)


def every_rank(make, world, epoch):
    samplers = [make(rank) for rank in range(world)]
    return samplers, [s.batches(epoch) for s in samplers]


def test_distributed_sampler_properties_over_sizes_batches_worlds_and_policies():
    checked = 0
    for size, batch, world, policy, drop_last in itertools.product(SIZES, BATCHES, WORLDS, ("pad", "drop"),
                                                                   (False, True)):
        if policy == "drop" and size < world:
            with pytest.raises(DataError, match="leaves every rank with none"):
                DistributedBatchSampler(size, batch, world, 0, drop_last=drop_last, seed=1, equal_batches=policy)
            continue
        case = f"size={size} batch={batch} world={world} {policy} drop_last={drop_last}"

        def make(rank, seed=7):
            return DistributedBatchSampler(size, batch, num_replicas=world, rank=rank, drop_last=drop_last,
                                           seed=seed, equal_batches=policy)
        samplers, ranks = every_rank(make, world, epoch=3)
        counts = {len(batches) for batches in ranks}
        assert counts == {len(samplers[0])}, case                      # equal batch counts
        for step in zip(*ranks):                                       # ranks in step, batch for batch
            assert len({len(b) for b in step}) == 1 and 0 < len(step[0]) <= batch, case
        seen = collections.Counter(i for batches in ranks for b in batches for i in b)
        duplicates = sum(seen.values()) - len(seen)
        assert all(0 <= i < size for i in seen), case
        s = samplers[0]
        assert s.padded <= world - 1 and s.dropped <= world - 1, case
        if policy == "drop":
            assert duplicates == 0 and s.padded == 0, case                # no overlap
        if not drop_last:
            assert sum(seen.values()) == size + s.padded - s.dropped, case
            if policy == "pad":
                assert set(seen) == set(range(size)) and duplicates == s.padded, case  # union = dataset
        assert make(1 % world).batches(3) == ranks[1 % world], case        # deterministic
        checked += 1
    assert checked > 550


@pytest.mark.parametrize("world", WORLDS)
def test_an_epoch_is_a_function_of_seed_and_epoch_so_a_restart_at_epoch_e_replays_it(world):
    def make(rank, seed=3):
        return DistributedBatchSampler(1000, 16, num_replicas=world, rank=rank, seed=seed)
    running = make(world - 1)
    epochs = [list(running) for _ in range(4)]             # each iteration moves to the next epoch
    resumed = make(world - 1)
    resumed.set_epoch(2)
    assert list(resumed) == epochs[2] and list(resumed) == epochs[3]
    assert epochs[0] != epochs[1]
    assert make(world - 1, seed=4).batches(0) != epochs[0]


def test_unshuffled_batches_match_paddles_distributed_batch_sampler():
    import paddle

    for size, batch, world, drop_last in itertools.product((10, 64, 101), (3, 8), (1, 2, 3, 4), (False, True)):
        for rank in range(world):
            theirs = paddle.io.DistributedBatchSampler(list(range(size)), batch, num_replicas=world, rank=rank,
                                                       shuffle=False, drop_last=drop_last)
            ours = DistributedBatchSampler(list(range(size)), batch, world, rank, shuffle=False,
                                           drop_last=drop_last, seed=0, equal_batches="pad")
            assert list(ours) == list(theirs) and len(ours) == len(theirs), (size, batch, world, rank)


def test_error_policy_names_the_sizes_and_accepts_even_data():
    with pytest.raises(DataError, match=r"101 samples do not split evenly over 4 ranks \(101 = 4 x 25 \+ 1"):
        DistributedBatchSampler(101, 8, num_replicas=4, rank=0, seed=0, equal_batches="error")
    assert len(DistributedBatchSampler(100, 8, num_replicas=4, rank=3, seed=0, equal_batches="error")) == 4


@pytest.mark.parametrize("make, message", [
    (lambda: DistributedBatchSampler([], 4, num_replicas=2, rank=0, seed=0), "the dataset is empty"),
    (lambda: DistributedBatchSampler(10, 0, num_replicas=2, rank=0, seed=0), "batch_size = 0"),
    (lambda: DistributedBatchSampler(10, 2, num_replicas=2, rank=2, seed=0), "rank 2 of 2 replicas"),
    (lambda: DistributedBatchSampler(10, 2, num_replicas=2, rank=0, seed=0, equal_batches="even"),
     "equal_batches = 'even'"),
    (lambda: DistributedBatchSampler(object(), 2, num_replicas=2, rank=0, seed=0), "has no len()"),
    (lambda: ClassBalancedBatchSampler([], 4, num_replicas=2, rank=0, seed=0), "the labels are empty"),
    (lambda: PKBatchSampler([], 2, 2, num_replicas=2, rank=0, seed=0), "the labels are empty"),
    (lambda: EvalBatchSampler(0, 4, num_replicas=2, rank=0), "the dataset is empty"),
    (lambda: ShardBatchSampler([0, 0], 4, rank=0, seed=0), "every shard is empty"),
    (lambda: ShardBatchSampler([3, 0], 4, rank=0, seed=0), r"a rank holds no samples \(rank 0: 3, rank 1: 0\)"),
])
def test_bad_input_is_a_clear_error(make, message):
    with pytest.raises(DataError, match=message):
        make()


def test_topology_and_seed_default_to_the_job(monkeypatch):
    for name in ("PADDLE_TRAINER_ID", "PADDLE_TRAINERS_NUM", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"):
        monkeypatch.delenv(name, raising=False)
    sampler = DistributedBatchSampler(10, 4)
    assert (sampler.num_replicas, sampler.rank, sampler.seed) == (1, 0, 0)   # data_configs.seed defaults to 0


@pytest.mark.parametrize("size, world", [(1, 1), (7, 2), (10, 3), (101, 4), (997, 8), (5, 8)])
def test_evaluation_yields_every_sample_exactly_once(size, world):
    for batch in (1, 4, 25):
        _, ranks = every_rank(lambda r: EvalBatchSampler(size, batch, num_replicas=world, rank=r), world, 0)
        flat = [i for batches in ranks for b in batches for i in b]
        assert flat == list(range(size))                               # once each, in rank order
        per_rank = [sum(map(len, batches)) for batches in ranks]
        assert max(per_rank) - min(per_rank) <= 1


@pytest.mark.parametrize("sizes", [[5, 3], [4, 4, 4], [10, 1, 7, 7]])
def test_shard_sampler_evens_out_ranks_of_different_sizes(sizes):
    world = len(sizes)
    for policy, batch, drop_last in itertools.product(("pad", "drop"), (1, 2, 3), (False, True)):
        samplers, ranks = every_rank(lambda r: ShardBatchSampler(sizes, batch, rank=r, seed=2, drop_last=drop_last,
                                                                 equal_batches=policy), world, 1)
        assert {len(b) for b in ranks} == {len(samplers[0])}
        for rank, batches in enumerate(ranks):
            mine = [i for b in batches for i in b]
            assert all(0 <= i < sizes[rank] for i in mine)
            if policy == "pad" and not drop_last:
                assert set(mine) == set(range(sizes[rank]))
            if policy == "drop":
                assert len(set(mine)) == len(mine)
    if min(sizes) != max(sizes):
        listed = ", ".join(f"rank {r}: {n}" for r, n in enumerate(sizes))
        with pytest.raises(DataError, match=f"different numbers of samples \\({listed}\\)"):
            ShardBatchSampler(sizes, 2, rank=0, seed=0, equal_batches="error")


def imbalanced_labels(classes=6, smallest=120, seed=0):
    sizes = [smallest * (1 + 3 * c) for c in range(classes)]
    labels = np.concatenate([np.full(n, 10 + c) for c, n in enumerate(sizes)])
    return np.random.default_rng(seed).permutation(labels)


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("weights", [None, {10: 1, 11: 1, 12: 2, 13: 2, 14: 3, 15: 1}])
def test_class_balanced_frequencies_are_within_one_percent_and_ranks_never_share_a_sample(world, weights):
    labels = imbalanced_labels()
    classes = sorted(set(labels.tolist()))
    target = np.array([1.0] * len(classes) if weights is None else [weights[c] for c in classes], dtype=float)
    target /= target.sum()
    samplers, ranks = every_rank(lambda r: ClassBalancedBatchSampler(labels, 16, weights, num_replicas=world,
                                                                     rank=r, seed=11), world, 2)
    assert {len(b) for b in ranks} == {len(samplers[0])} and all(len(b) == 16 for r in ranks for b in r)
    drawn = np.array([i for batches in ranks for b in batches for i in b])
    frequency = np.array([np.mean(labels[drawn] == c) for c in classes])
    assert np.all(np.abs(frequency / target - 1) <= 0.01), frequency / target
    for step in zip(*ranks):
        flat = [i for b in step for i in b]
        assert len(set(flat)) == len(flat)                              # no sample on two ranks in a step
    uses = collections.Counter(drawn[labels[drawn] == classes[0]].tolist())
    assert max(uses.values()) - min(uses.values()) <= 1                 # a small class: members used evenly
    again = ClassBalancedBatchSampler(labels, 16, weights, num_replicas=world, rank=world - 1, seed=11)
    again.set_epoch(2)
    assert list(again) == ranks[-1]


def test_class_balanced_one_class_and_a_class_too_small_for_its_share():
    only = ClassBalancedBatchSampler([4] * 50, 5, num_replicas=2, rank=1, seed=0)
    assert len(only) == 5 and sorted(i for b in only.batches(0) for i in b) != []
    with pytest.raises(DataError, match=r"class 1 has 2 samples, but a step of 64 samples \(32 x 2 ranks\) "
                                        r"holds up to 32 of it"):
        ClassBalancedBatchSampler([0] * 200 + [1] * 2, 32, num_replicas=2, rank=0, seed=0)
    with pytest.raises(DataError, match="does not fill one global batch"):
        ClassBalancedBatchSampler([0, 1, 2], 4, num_replicas=2, rank=0, seed=0)
    with pytest.raises(DataError, match="2 weights for 3 classes"):
        ClassBalancedBatchSampler([0, 1, 2] * 10, 2, [1, 2], num_replicas=1, rank=0, seed=0)


def pk_labels(seed=0):
    """60 classes of 1 to 40 samples: some smaller than K."""
    rng = np.random.default_rng(seed)
    sizes = rng.integers(1, 41, 60)
    return rng.permutation(np.concatenate([np.full(n, c) for c, n in enumerate(sizes)]))


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("p, k", [(2, 4), (3, 2), (7, 5)])
def test_pk_batches_are_exactly_p_classes_by_k_samples_with_whole_classes_per_rank(world, p, k):
    labels = pk_labels()
    if p * world > 60:
        with pytest.raises(DataError, match=f"a step needs P x N = {p} classes x {world} ranks"):
            PKBatchSampler(labels, p, k, num_replicas=world, rank=0, seed=0)
        return
    for epoch in (0, 1):
        samplers, ranks = every_rank(lambda r: PKBatchSampler(labels, p, k, num_replicas=world, rank=r, seed=5),
                                     world, epoch)
        assert {len(b) for b in ranks} == {len(samplers[0])} and len(samplers[0]) > 0
        visited = set()
        for step in zip(*ranks):
            step_classes = []
            for batch in step:
                groups = np.array([samplers[0].label_of(i) for i in batch]).reshape(p, k)
                assert len(batch) == p * k and np.all(groups == groups[:, :1])      # P runs of K, one class each
                assert len(set(groups[:, 0])) == p
                step_classes += groups[:, 0].tolist()
                for group in np.array(batch).reshape(p, k):
                    if len(set(group)) < k:                                          # replacement: small classes only
                        assert samplers[0].upsampled[labels[group[0]]] < k
            assert len(set(step_classes)) == p * world                              # disjoint whole classes
            visited |= set(step_classes)
        assert len(visited) / 60 >= 0.99
    assert samplers[0].upsampled == {c: n for c, n in collections.Counter(labels.tolist()).items() if n < k}


def test_pk_with_one_class_and_exactly_p_times_n_classes():
    one = PKBatchSampler([3] * 9, 1, 4, num_replicas=1, rank=0, seed=0)
    assert len(one) == 3 and all(len(set(b)) == 4 for b in one.batches(0))
    labels = np.repeat(np.arange(8), 5)
    _, ranks = every_rank(lambda r: PKBatchSampler(labels, 2, 5, num_replicas=4, rank=r, seed=1), 4, 0)
    assert sorted(labels[i] for batches in ranks for i in batches[0]) == sorted(labels.tolist())


@pytest.mark.parametrize("make", [
    lambda: DistributedBatchSampler(500, 7, num_replicas=3, rank=2, seed=4, equal_batches="drop"),
    lambda: ShardBatchSampler([40, 37, 39], 5, rank=1, seed=4),
    lambda: ClassBalancedBatchSampler(imbalanced_labels(), 8, num_replicas=3, rank=2, seed=4),
    lambda: PKBatchSampler(pk_labels(), 2, 3, num_replicas=3, rank=2, seed=4),
    lambda: EvalBatchSampler(500, 7, num_replicas=3, rank=2, seed=4, shuffle=True),
], ids=["distributed", "shard", "class_balanced", "pk", "evaluation"])
def test_every_sampler_resumes_at_an_epoch_exactly(make):
    uninterrupted = make()
    epochs = [list(uninterrupted) for _ in range(3)]
    restarted = make()
    restarted.set_epoch(2)
    assert list(restarted) == epochs[2] and len(restarted) == len(epochs[2])
    assert epochs[1] != epochs[2]
