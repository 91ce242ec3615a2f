"""fleetlite's data side: samplers that keep the ranks in step, per-worker record shards, and
a DataLoader built from the strategy's `data_configs`, and for images a DALI loader and a
multi-level sample cache (docs/data.md).

Samplers are pure: what a rank yields is a function of (seed, epoch, rank, world), so tests
build every rank's sampler in one process, and a restarted job replays an epoch exactly.
"""
from fleetlite.data.cached_samples import CachedSamples
from fleetlite.data.class_balanced import ClassBalancedBatchSampler
from fleetlite.data.distributed import DistributedBatchSampler, EvalBatchSampler, ShardBatchSampler
from fleetlite.data.image_loader import PrefetchLoader, image_list, image_loader
from fleetlite.data.running_job import all_reduce_sums, gather_sizes
from fleetlite.data.loader import loader, make_sampler
from fleetlite.data.node_partition import NodePartitionBatchSampler
from fleetlite.data.pk import PKBatchSampler
from fleetlite.data.records import RecordShard, shard_files
from fleetlite.data.sources import FileSource, ThrottledSource

__all__ = ["DistributedBatchSampler", "ShardBatchSampler", "EvalBatchSampler", "ClassBalancedBatchSampler",
           "PKBatchSampler", "all_reduce_sums", "gather_sizes", "loader", "make_sampler", "RecordShard",
           "shard_files", "CachedSamples", "NodePartitionBatchSampler", "PrefetchLoader", "image_list", "image_loader",
           "FileSource", "ThrottledSource"]
