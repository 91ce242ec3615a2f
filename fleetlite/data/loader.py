"""`fleetlite.data.loader(dataset, strategy)`: a `paddle.io.DataLoader` with the sampler the
strategy's `data_configs` asks for, so a Fleet script needs one line to feed every rank its
own, equal share."""
from fleetlite.data import job, settings
from fleetlite.data.cached_samples import CachedSamples
from fleetlite.data.class_balanced import ClassBalancedBatchSampler
from fleetlite.data.distributed import DistributedBatchSampler, EvalBatchSampler, ShardBatchSampler
from fleetlite.data.pk import PKBatchSampler
from fleetlite.data.records import RecordShard
from fleetlite.errors import DataError


def loader(dataset, strategy=None, batch_size=None, *, labels=None, weights=None, evaluation=False,
           shuffle=True, drop_last=False, **dataloader_args):
    """A DataLoader over `dataset` for this rank (extra keyword arguments go to DataLoader).

    - evaluation=True: every sample exactly once over the ranks (EvalBatchSampler);
    - a RecordShard from shard_files: this rank's shard, equalised (ShardBatchSampler);
    - else `data_configs.sampler`: "distributed" (DistributedBatchSampler), "class_balanced"
      (needs `labels` or `dataset.labels`; optional `weights`) or "pk" (pk_classes x
      pk_samples per batch: batch_size may be left out).
    `data_configs.equal_batches` and `seed` apply to all of them; `strategy` defaults to the
    one given to fleet.init. The sampler is the loader's `batch_sampler` (call its set_epoch
    to resume at an epoch).
    """
    import paddle

    config = job.data_config(strategy)
    settings.check(config)
    refuse_image_settings(dataset, config)
    return paddle.io.DataLoader(dataset, batch_sampler=make_sampler(
        dataset, strategy, batch_size, labels=labels, weights=weights, evaluation=evaluation,
        shuffle=shuffle, drop_last=drop_last), **dataloader_args)


def refuse_image_settings(dataset, config):
    """`loader: dali` and `cache_levels` belong to image_loader: say so rather than ignore them."""
    if config.loader == "dali":
        raise DataError("data_configs.loader = 'dali' reads image files itself: use "
                        "fleetlite.data.image_loader(images, strategy, batch_size); loader(dataset, ...) builds a "
                        "paddle.io.DataLoader over a dataset")
    if config.cache_levels and not isinstance(dataset, CachedSamples):
        raise DataError(f"data_configs.cache_levels = {list(config.cache_levels)} cache sample files: use "
                        f"fleetlite.data.image_loader(images, ...), or pass a fleetlite.data.CachedSamples "
                        f"dataset (a {type(dataset).__name__} is not cached)")


def make_sampler(dataset, strategy=None, batch_size=None, *, labels=None, weights=None, evaluation=False,
                 shuffle=True, drop_last=False):
    """The batch sampler `loader` uses (see there)."""
    config = job.data_config(strategy)
    seed = int(config.seed)
    if config.sampler == "pk" and not evaluation:
        p, k = config.pk_classes, config.pk_samples
        if batch_size is not None and batch_size != p * k:
            raise DataError(f"batch_size {batch_size} but the pk sampler's batches hold pk_classes x pk_samples "
                            f"= {p} x {k} = {p * k}; leave batch_size out or set it to {p * k}")
        return PKBatchSampler(_labels(dataset, labels), p, k, seed=seed)
    if batch_size is None:
        raise DataError(f"the {'evaluation' if evaluation else config.sampler} sampler needs batch_size "
                        f"(samples per rank per step)")
    if isinstance(dataset, RecordShard):
        if evaluation:
            return EvalBatchSampler(dataset, batch_size, num_replicas=1, rank=0)
        return ShardBatchSampler(dataset, batch_size, rank=dataset.rank, shuffle=shuffle, drop_last=drop_last,
                                 seed=seed, equal_batches=config.equal_batches)
    if evaluation:
        return EvalBatchSampler(dataset, batch_size)
    if config.sampler == "class_balanced":
        return ClassBalancedBatchSampler(_labels(dataset, labels), batch_size, weights, seed=seed)
    return DistributedBatchSampler(dataset, batch_size, shuffle=shuffle, drop_last=drop_last, seed=seed,
                                   equal_batches=config.equal_batches)


def _labels(dataset, labels):
    labels = getattr(dataset, "labels", None) if labels is None else labels
    if labels is None:
        raise DataError("the class_balanced and pk samplers need every sample's label: pass labels=..., "
                        "or give the dataset a `labels` attribute")
    return labels
