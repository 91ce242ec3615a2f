"""`data_configs.loader: dali`: an image classification pipeline in NVIDIA DALI that feeds Paddle
static programs.

The pipeline: `readers.file` (this rank's shard: shard_id=rank, num_shards=world,
stick_to_shard so a rank reads the same files every epoch, pad_last_batch so every shard runs
the same number of iterations; the reader shuffles the whole list before sharding it, so its
seed is the shared one: with a seed per rank the shards would overlap) → `decoders.image` →
`random_resized_crop` → `crop_mirror_normalize` (CHW float, ImageNet mean/std, random flip).
For evaluation the crop is a resize of the shorter side and a centre crop, without flip.

- GPU: decoding is "mixed" (nvJPEG), the rest runs on the GPU, and batches come from DALI's
  Paddle plugin (`DALIGenericIterator`), which needs a GPU.
- CPU: the same operators with device "cpu" and `device_id=None`, fed through `DaliBatches`,
  which runs the pipeline and hands numpy arrays to the executor.

In training every rank runs the same number of steps: `equal_batches` "pad" fills the last batch
with repeats of the shard's last sample (DALI's FILL), "drop" keeps only full batches of the
smallest shard, "error" refuses shards of different sizes. Evaluation (`training=False`) has its
own rule, whatever equal_batches says: every sample exactly once over the ranks (the reader's
padding is cut off: DaliEvaluationBatches on CPU, DALI's PARTIAL policy on GPU), so a metric
summed over the ranks counts each sample once; ranks may then run one batch fewer, which
evaluation (no collective per step) allows.
"""
from fleetlite.data.distributed import equal_batches_policy, equal_shard_size
from fleetlite.data.image_transforms import IMAGENET_MEAN, IMAGENET_STD
from fleetlite.data.node_partition import block
from fleetlite.errors import DataError

READER = "Reader"
OUTPUTS = ("image", "label")


def dali_modules():
    try:
        from nvidia import dali
    except ImportError:
        raise DataError("data_configs.loader = 'dali' needs NVIDIA DALI: pip install 'fleetlite[dali]' "
                        "(nvidia-dali-cuda120; it runs CPU pipelines too)") from None
    from nvidia.dali import fn, types
    return dali, fn, types


def check_device(device, device_id):
    if device not in ("cpu", "gpu"):
        raise DataError(f"DALI device {device!r}: use 'cpu' or 'gpu'")
    if device == "gpu" and device_id is None:
        raise DataError("a GPU DALI pipeline needs device_id (the rank's GPU)")


def image_pipeline(file_list, batch_size, shard_id, num_shards, *, device="cpu", device_id=None, crop=224,
                   resize=256, training=True, num_threads=2, seed=0, prefetch_queue_depth=2):
    """The DALI pipeline (not built) for one rank. `file_list`: DALI's format, one
    "relative/path label" per line, paths relative to the list's folder. device "gpu" decodes
    with "mixed" and needs `device_id`; "cpu" runs without a GPU."""
    dali, fn, types = dali_modules()
    check_device(device, device_id)

    @dali.pipeline_def(batch_size=batch_size, num_threads=num_threads, device_id=device_id if device == "gpu" else None,
                       seed=seed + shard_id, prefetch_queue_depth=prefetch_queue_depth)
    def classification():
        jpegs, labels = fn.readers.file(file_list=file_list, shard_id=shard_id, num_shards=num_shards,
                                        stick_to_shard=True, pad_last_batch=True, random_shuffle=training,
                                        seed=seed, name=READER)
        images = fn.decoders.image(jpegs, device="mixed" if device == "gpu" else "cpu", output_type=types.RGB)
        return augmentation(images, crop, resize, training), labels.gpu() if device == "gpu" else labels

    return classification()


def augmentation(images, crop, resize, training):
    """The operators after decoding, the one definition both pipelines use: training, a random
    resized crop to `crop` and a random flip; evaluation, the shorter side resized to `resize`
    and a centre crop; then CHW float normalized by ImageNet's mean and std. The operators run
    where `images` are (GPU images: GPU operators)."""
    _, fn, types = dali_modules()
    if training:
        images = fn.random_resized_crop(images, size=crop)
        mirror = fn.random.coin_flip()
    else:
        images = fn.resize(images, resize_shorter=resize)
        mirror = 0
    return fn.crop_mirror_normalize(images, dtype=types.FLOAT, output_layout="CHW", crop=(crop, crop),
                                    mean=[255 * m for m in IMAGENET_MEAN], std=[255 * s for s in IMAGENET_STD],
                                    mirror=mirror)


def shard_sizes(size, num_shards):
    """Samples in each DALI shard: floor((r+1)S/N) - floor(rS/N)."""
    return [b - a for a, b in (block(r, num_shards, size) for r in range(num_shards))]


class DaliBatches:
    """The CPU path's iterator: runs a built CPU pipeline and yields [images, labels] as numpy
    (float32 NCHW, int64 N x 1), the same number of batches on every rank (see the module)."""

    def __init__(self, pipeline, dataset_size, num_shards, equal_batches=None):
        self.pipeline = pipeline
        self.policy = equal_batches_policy(equal_batches)
        self.batch_size = pipeline.max_batch_size
        sizes = shard_sizes(dataset_size, num_shards)
        kept = equal_shard_size(sizes, self.policy)       # raises for "error" on unequal shards
        self.runs = -(-max(sizes) // self.batch_size)       # iterations DALI makes per epoch (pad_last_batch)
        self.steps = self.runs if self.policy == "pad" else kept // self.batch_size
        if self.steps == 0:
            raise DataError(f"equal_batches='drop' with shards of {min(sizes)} samples and batch size "
                            f"{self.batch_size} leaves no full batch; use a smaller batch or 'pad'")

    def __len__(self):
        return self.steps

    def __iter__(self):
        for run in range(self.runs):
            images, labels = self.pipeline.run()
            if run < self.steps:
                yield [images.as_array(), labels.as_array().astype("int64").reshape(-1, 1)]


class DaliEvaluationBatches:
    """The CPU path in evaluation: this rank's shard, every sample once, in list order. The reader
    pads every shard to the same number of batches (pad_last_batch); those repeats are cut off, so
    the last batch may be smaller and a smaller shard may yield one batch fewer."""

    def __init__(self, pipeline, dataset_size, num_shards, shard_id):
        self.pipeline = pipeline
        self.batch_size = pipeline.max_batch_size
        sizes = shard_sizes(dataset_size, num_shards)
        self.samples = sizes[shard_id]
        self.runs = -(-max(sizes) // self.batch_size)       # iterations DALI makes per epoch (pad_last_batch)

    def __len__(self):
        return -(-self.samples // self.batch_size)

    def __iter__(self):
        left = self.samples
        for _ in range(self.runs):             # the whole epoch, so the next one starts at the shard's head
            images, labels = self.pipeline.run()
            if left > 0:
                take = min(left, self.batch_size)
                yield [images.as_array()[:take], labels.as_array()[:take].astype("int64").reshape(-1, 1)]
                left -= take


def gpu_batches(pipeline, equal_batches=None, training=True):
    """The GPU path: DALI's Paddle iterator over the rank's pipeline (needs a GPU). Evaluation
    takes the PARTIAL policy: the reader's padding is dropped, every sample seen once."""
    from nvidia.dali.plugin.base_iterator import LastBatchPolicy
    from nvidia.dali.plugin.paddle import DALIGenericIterator

    policy = equal_batches_policy(equal_batches)
    if not training:
        last_batch = LastBatchPolicy.PARTIAL
    elif policy == "error":
        raise DataError("equal_batches='error' is not available with DALI's GPU iterator: use 'pad' or 'drop'")
    else:
        last_batch = LastBatchPolicy.FILL if policy == "pad" else LastBatchPolicy.DROP
    return DALIGenericIterator([pipeline], list(OUTPUTS), reader_name=READER, auto_reset=True,
                               last_batch_policy=last_batch)
