"""`fleetlite.data.image_loader(images, strategy, batch_size)`: batches of an image
classification set for this rank, from the loader and cache levels `data_configs` names.

- loader "paddle": files read through `CachedSamples` (cache_levels, cache_dir,
  memory_cache_MB), decoded with PIL to `resize` x `resize`, augmented with numpy (evaluation:
  the centre crop), batched by the node-partition sampler (or the distributed one without a
  cache) and read ahead by a prefetch thread;
- loader "dali" without cache levels: the DALI pipeline of dali_pipeline.py, which reads the
  files itself, sharded by rank;
- loader "dali" with cache levels ("cache after decode"): files read and decoded through
  `CachedSamples` as for "paddle", batched by the node-partition sampler, and augmented in DALI
  operators fed from the cache (dali_augmentation.py), read ahead by the prefetch thread.
All yield [images float32 NCHW, labels int64 N x 1], ready for `exe.run(feed=...)`, normalized by
ImageNet's mean and std in training and evaluation (`training=False`: the `crop` x `crop` centre
of the image resized to `resize` on its shorter side). Evaluation sees every sample exactly once
over the ranks, whatever `equal_batches` says (EvalBatchSampler; on the DALI reader path the
reader's padding is cut off), so metrics summed over the ranks count each sample once.
"""
import functools
import numbers
import os

import numpy as np

from fleetlite.data import running_job as job, settings
from fleetlite.data.cached_samples import CachedSamples
from fleetlite.data.dali_augmentation import DaliAugmentation
from fleetlite.data.dali_pipeline import DaliBatches, DaliEvaluationBatches, gpu_batches, image_pipeline
from fleetlite.data.disk_cache import cache_dir_errors, make_cache_dir
from fleetlite.data.distributed import DistributedBatchSampler, EvalBatchSampler
from fleetlite.data.epoch_sampler import check_batch_size
from fleetlite.data.image_transforms import augment_image, centre_crop_image, decode_image
from fleetlite.data.node_partition import NodePartitionBatchSampler
from fleetlite.data.prefetch import Prefetcher
from fleetlite.data.sources import FileSource
from fleetlite.errors import DataError

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp")


def image_list(images):
    """(root, names, labels) of a folder `root/<class>/<image>` (classes numbered in sorted
    order, as DALI does) or of a file list in DALI's format ("relative/path label" per line,
    relative to the list's folder)."""
    images = os.fspath(images)
    if os.path.isdir(images):
        classes = sorted(d for d in os.listdir(images) if os.path.isdir(os.path.join(images, d)))
        names, labels = [], []
        for label, name in enumerate(classes):
            files = sorted(f for f in os.listdir(os.path.join(images, name)) if f.lower().endswith(IMAGE_SUFFIXES))
            names += [f"{name}/{f}" for f in files]
            labels += [label] * len(files)
        root = os.path.abspath(images)
    elif os.path.isfile(images):
        rows = [line.split() for line in open(images) if line.strip()]
        bad = [i + 1 for i, row in enumerate(rows) if len(row) != 2 or not row[1].lstrip("-").isdigit()]
        if bad:
            raise DataError(f"{images}: line {bad[0]} is not 'relative/path label'")
        names, labels = [row[0] for row in rows], [int(row[1]) for row in rows]
        root = os.path.dirname(os.path.abspath(images))
    else:
        raise DataError(f"{images} is neither a folder of class folders nor a file list")
    if not names:
        raise DataError(f"no images ({', '.join(IMAGE_SUFFIXES)}) in {images}")
    return root, names, labels


def stacked(epoch, sample_batches):
    """Each batch of samples as a list of fields stacked into numpy arrays (PrefetchLoader's default)."""
    for samples in sample_batches:
        yield [np.stack(field) for field in zip(*samples)]


class PrefetchLoader:
    """Batches of `dataset` in `batch_sampler`'s order, read ahead by a thread. `assemble(epoch,
    batches of samples)` turns an epoch's samples into what is fed: stacked numpy fields by
    default, DALI-augmented batches on the DALI path with the cache. When an epoch's last batch
    is handed out, the next epoch's first batches are read already (unless `set_epoch` then
    picks another epoch), so no epoch starts with an empty queue. `wait_s[epoch]` is the time
    the training loop waited for data."""

    def __init__(self, dataset, batch_sampler, prefetch=4, assemble=stacked):
        self.dataset, self.batch_sampler, self.prefetch, self.assemble = dataset, batch_sampler, prefetch, assemble
        self.wait_s = {}
        self._ahead = None          # (epoch, reader) started at the end of the previous epoch

    def __len__(self):
        return len(self.batch_sampler)

    def __iter__(self):
        epoch, reader = self._ahead if self._ahead else (None, None)
        self._ahead = None
        if reader is None or self.batch_sampler.epoch != epoch + 1:   # set_epoch chose another epoch
            if reader is not None:
                reader.close()
            epoch, reader = self._start()
        finished = False
        try:
            for batch in reader:
                yield batch
            finished = True
        finally:
            self.wait_s[epoch] = reader.wait_s
            reader.close()
            if finished:
                self._ahead = self._start()

    def close(self):
        """Stop reading ahead; the next iteration reads the epoch it would have read."""
        if self._ahead:
            epoch, reader = self._ahead
            reader.close()
            self._ahead = None
            if self.batch_sampler.epoch == epoch + 1:
                self.batch_sampler.set_epoch(epoch)

    def _start(self):
        epoch = self.batch_sampler.epoch
        if hasattr(self.dataset, "set_epoch"):
            self.dataset.set_epoch(epoch)
        samples = ([self.dataset[i] for i in batch] for batch in iter(self.batch_sampler))
        return epoch, Prefetcher(self.assemble(epoch, samples), self.prefetch)


def image_loader(images, strategy=None, batch_size=None, *, crop=224, resize=256, training=True, source=None,
                 seed=None, prefetch=4, num_threads=2):
    """This rank's batches of `images` (see image_list) under `data_configs` (module docstring).
    `source` replaces plain file reads (e.g. a ThrottledSource over the same folder); `seed`
    defaults to data_configs.seed."""
    config = job.data_config(strategy)
    check_options(batch_size=batch_size, crop=crop, resize=resize, prefetch=prefetch, num_threads=num_threads,
                  training=training, seed=seed)
    settings.check(config, job.topology())
    if config.sampler != settings.ANY_LOADER_SAMPLER:
        raise DataError(f"data_configs.sampler = {config.sampler!r}: image_loader batches with the distributed sampler "
                        f"(node partition with cache_levels) and cannot honour it; set sampler: distributed, or "
                        f"use fleetlite.data.loader(dataset, strategy) for the {config.sampler} sampler")
    seed = int(config.seed) if seed is None else seed
    root, names, labels = image_list(images)
    if config.loader == "dali" and not config.cache_levels:
        return _dali_batches(images, root, names, labels, config, batch_size, crop, resize, training, seed,
                             num_threads)
    if config.loader == "dali":        # cache after decode: DALI augments what the cache delivers
        augment = None
    else:
        augment = functools.partial(augment_image if training else centre_crop_image, crop=crop)
    dataset = CachedSamples(source or FileSource(root), names, labels,
                            functools.partial(decode_image, size=resize), augment,
                            levels=config.cache_levels, cache_dir=config.cache_dir,
                            memory_bytes=config.memory_cache_MB << 20, seed=seed)
    if not training:                   # evaluation's own rule: every sample once, no padding
        sampler = EvalBatchSampler(dataset, batch_size)
    elif config.cache_levels:
        sampler = NodePartitionBatchSampler(dataset, batch_size, shuffle=True, seed=seed,
                                            equal_batches=config.equal_batches)
    else:
        sampler = DistributedBatchSampler(dataset, batch_size, shuffle=True, seed=seed,
                                          equal_batches=config.equal_batches)
    if config.loader == "paddle":
        return PrefetchLoader(dataset, sampler, prefetch)
    here = job.topology()
    gpu = here.device == "gpu"
    augmentation = DaliAugmentation(batch_size, here.rank, dataset.seed, device="gpu" if gpu else "cpu",
                                    device_id=here.device_id if gpu else None, crop=crop, resize=resize,
                                    training=training, num_threads=num_threads)
    return PrefetchLoader(dataset, sampler, prefetch, augmentation)


def check_options(training, seed, **counts):
    """image_loader's own options (they reach DALI's operators, whose type errors name no option)."""
    for name, value in counts.items():
        check_batch_size(value, f"image_loader's {name}")
    if not isinstance(training, bool):
        raise DataError(f"image_loader's training = {training!r}: pass True (augment) or False (evaluation)")
    if seed is not None and (not isinstance(seed, numbers.Integral) or isinstance(seed, bool)):
        raise DataError(f"image_loader's seed = {seed!r}: pass a whole number, or None for data_configs.seed")


def _dali_batches(images, root, names, labels, config, batch_size, crop, resize, training, seed, num_threads):
    if os.path.isdir(images):      # DALI's own folder reading skips nothing; give it the same list
        folder = make_cache_dir(config.cache_dir)
        images = os.path.join(folder, f"dali-files-{os.getpid()}.txt")
        with cache_dir_errors(folder):
            with open(images, "w") as out:
                out.writelines(f"{os.path.join(root, n)} {label}\n" for n, label in zip(names, labels))
    here = job.topology()
    gpu = here.device == "gpu"
    pipeline = image_pipeline(os.path.abspath(images), batch_size, here.rank, here.world_size,
                              device="gpu" if gpu else "cpu", device_id=here.device_id, crop=crop, resize=resize,
                              training=training, num_threads=num_threads, seed=seed)
    if gpu:
        return gpu_batches(pipeline, config.equal_batches, training)
    pipeline.build()
    if not training:
        return DaliEvaluationBatches(pipeline, len(names), here.world_size, here.rank)
    return DaliBatches(pipeline, len(names), here.world_size, config.equal_batches)
