"""The DALI path with the sample cache ("cache after decode"): samples come through
`CachedSamples` (source → disk level → decode → memory level), and the random augmentation runs
in DALI operators fed by `fn.external_source` in batch mode, in C++ and on DALI's threads
instead of in the Python thread that reads the cache.

The operators are `dali_pipeline.augmentation`, the ones the file-reader pipeline runs after
its decoder. Each epoch gets its own pipeline, seeded by (seed, rank, epoch), so an epoch's
augmentation depends on its sample order alone: it is the same with or without the cache, when
reading ahead into an epoch was abandoned (`PrefetchLoader.close`), and when a restarted job
replays the epoch. On GPU the decoded samples are copied to the device after external_source,
the augmentation operators run there, and DALI's Paddle iterator hands the batches over.
"""
import numpy as np

from fleetlite.data.dali_pipeline import OUTPUTS, augmentation, check_device, dali_modules


def cached_image_pipeline(source, batch_size, *, device="cpu", device_id=None, crop=224, resize=256, training=True,
                          num_threads=2, seed=0, prefetch_queue_depth=2):
    """The DALI pipeline (not built) that augments what `source` yields: per batch a pair (decoded
    uint8 HWC images, int64 [1] labels), each a list with one array per sample; a batch may be
    smaller than `batch_size`. The pipeline stops (StopIteration) when `source` ends."""
    dali, fn, types = dali_modules()
    check_device(device, device_id)

    @dali.pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=device_id if device == "gpu" else None,
                       seed=seed, prefetch_queue_depth=prefetch_queue_depth)
    def augmented():
        images, labels = fn.external_source(source=source, num_outputs=2, batch=True, layout=["HWC", ""],
                                            dtype=[types.UINT8, types.INT64])
        if device == "gpu":
            images, labels = images.gpu(), labels.gpu()
        return augmentation(images, crop, resize, training), labels

    return augmented()


def epoch_seed(seed, rank, epoch):
    """DALI's seed for one rank's epoch."""
    return int(np.random.SeedSequence([seed % 2**63, rank, epoch]).generate_state(1)[0])


class DaliAugmentation:
    """`PrefetchLoader`'s batch assembly for the DALI path with the cache: called with
    (epoch, batches of samples (image, label)), it yields [images float32 NCHW, labels int64 N×1]
    per batch from a pipeline of its own for that epoch; numpy arrays on CPU, Paddle tensors on
    the rank's GPU from DALI's Paddle iterator on GPU."""

    def __init__(self, batch_size, rank, seed, *, device="cpu", device_id=None, crop=224, resize=256, training=True,
                 num_threads=2):
        check_device(device, device_id)
        self.batch_size, self.rank, self.seed, self.device = batch_size, rank, seed, device
        self.options = dict(device=device, device_id=device_id, crop=crop, resize=resize, training=training,
                            num_threads=num_threads)

    def pipeline(self, epoch, sample_batches):
        source = (tuple(map(list, zip(*samples))) for samples in sample_batches)
        return cached_image_pipeline(source, self.batch_size, seed=epoch_seed(self.seed, self.rank, epoch),
                                     **self.options)

    def __call__(self, epoch, sample_batches):
        pipeline = self.pipeline(epoch, sample_batches)
        if self.device == "gpu":
            yield from ([batch[name] for name in OUTPUTS] for batch in gpu_iterator(pipeline))
            return
        pipeline.build()
        while True:
            try:
                images, labels = pipeline.run()
            except StopIteration:
                return
            yield [images.as_array(), labels.as_array()]


def gpu_iterator(pipeline):
    """DALI's Paddle iterator over an external-source pipeline: it runs until the source ends and
    hands every batch over as it is (the sampler has made the ranks' batches equal already)."""
    from nvidia.dali.plugin.paddle import DALIGenericIterator

    return DALIGenericIterator([pipeline], list(OUTPUTS))
