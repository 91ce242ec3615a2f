"""`data_configs.loader: dali`: the CPU pipeline through fleetrun on 2 ranks (disjoint fixed
shards, equal batches under pad and drop, images decoded as PIL decodes them), the DALI
augmentation after the sample cache (feeds bit-identical to an uncached run), and the GPU
paths' structure checked without a GPU (operators and their devices, reader sharding, the
Paddle plugin iterator's wiring)."""
import functools
import json
import os

import numpy as np
import pytest
from PIL import Image

import fleetlite as fleet
from fleetlite.data import (CachedSamples, NodePartitionBatchSampler, PrefetchLoader, ThrottledSource, dali_pipeline,
                            image_list, image_loader)
from fleetlite.data.dali_augmentation import DaliAugmentation, cached_image_pipeline, epoch_seed
from fleetlite.data.image_transforms import IMAGENET_MEAN, IMAGENET_STD, decode_image
from fleetlite.data.node_partition import block
from fleetlite.errors import DataError
from support.multiprocess import SCRIPTS, fleetrun

pytest.importorskip("nvidia.dali", reason="the `test` extra installs nvidia-dali-cuda120; this checkout lacks it")

IMAGES, HEIGHT, WIDTH, CROP = 23, 40, 52, 32


@pytest.fixture(scope="module")
def jpegs(tmp_path_factory):
    """IMAGES smooth JPEGs (gradients plus a shape: what JPEG keeps well); label = index."""
    folder = tmp_path_factory.mktemp("jpegs")
    y, x = np.mgrid[0:HEIGHT, 0:WIDTH]
    lines = []
    for i in range(IMAGES):
        picture = np.stack([(x * 4 + i * 9) % 256, (y * 5 + i * 13) % 256, ((x + y) * 2 + i * 31) % 256], -1)
        picture[(y - 20) ** 2 + (x - 10 - i) ** 2 < 64] = (250, 30, 30)
        Image.fromarray(picture.astype("uint8")).save(folder / f"img{i:02d}.jpg", quality=92)
        lines.append(f"img{i:02d}.jpg {i}\n")
    (folder / "list.txt").write_text("".join(lines))
    return folder


def normalized_centre_crop(picture):
    """uint8 HWC -> its centre CROP x CROP, normalized, CHW."""
    top, left = (picture.shape[0] - CROP) // 2, (picture.shape[1] - CROP) // 2
    picture = picture[top:top + CROP, left:left + CROP].astype(np.float32)
    return ((picture - 255 * np.array(IMAGENET_MEAN)) / (255 * np.array(IMAGENET_STD))).transpose(2, 0, 1)


def pil_reference(path):
    """The evaluation crop as PIL decodes it."""
    return normalized_centre_crop(np.asarray(Image.open(path).convert("RGB")))


def test_two_ranks_through_fleetrun_read_disjoint_fixed_shards_in_equal_batches_and_decode_like_pil(tmp_path, jpegs):
    result = fleetrun(["--nproc_per_node", "2", "--job_id", "dali", os.path.join(SCRIPTS, "dali_images.py"),
                       "--list", str(jpegs / "list.txt"), "--batch", "4", "--crop", str(CROP),
                       "--resize", str(HEIGHT), "--out", str(tmp_path)], tmp_path, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"result.{r}.json").read_text())["epochs"] for r in range(2)]
    shards = [{label for b in epochs["pad/0"] for label in b["labels"]} for epochs in ranks]
    assert sorted(map(len, shards)) == [11, 12] and not shards[0] & shards[1]
    assert shards[0] | shards[1] == set(range(IMAGES))
    results = [json.loads((tmp_path / f"result.{r}.json").read_text()) for r in range(2)]
    for epoch in range(2):          # with the cache: the node's ranks split each epoch of the whole (one node)
        labels = [[label for b in epochs.pop(f"cached/{epoch}") for label in b["labels"]] for epochs in ranks]
        assert len(labels[0]) == len(labels[1]) == 12 and set(labels[0] + labels[1]) == set(range(IMAGES))
    assert sum(r["cache_stats"][0].get("disk_misses", 0) for r in results) == IMAGES      # each file copied once
    assert [r["cache_stats"][1] for r in results] == [{"memory_hits": 12}] * 2
    for rank, epochs in enumerate(ranks):
        for key, batches in epochs.items():
            assert all(b["shape"][1:] == [3, CROP, CROP] and b["dtype"] == "float32" and b["label_dtype"] == "int64"
                       for b in batches)
            labels = [label for b in batches for label in b["labels"]]
            if key.startswith("pad"):    # 3 batches of 4 on both ranks; the 11-sample shard repeats its last to fill
                assert [len(b["labels"]) for b in batches] == [4, 4, 4] and set(labels) == shards[rank], key
            else:                        # 2 full batches: the smaller shard holds 11 samples, so 8 of each shard
                assert [len(b["labels"]) for b in batches] == [4, 4] and len(set(labels)) == 8
                assert set(labels) <= shards[rank], key          # stick_to_shard: the same shard every epoch
        assert epochs["pad/0"] != epochs["pad/1"]                # shuffled anew each epoch, within the shard

    for name in ("dali", "dali cached", "paddle"):    # evaluation: every sample once, the padding left out
        evaluated = [result["evaluation"][name] for result in results]
        for epoch in range(2):
            batches = [epochs[epoch] for epochs in evaluated]
            assert [[len(b) for b in rank_batches] for rank_batches in batches] == [[4, 4, 3], [4, 4, 4]], name
            assert sorted(label for rank_batches in batches for b in rank_batches for label in b) == \
                list(range(IMAGES)), (name, epoch)

    decoded = {}
    for rank in range(2):
        with np.load(tmp_path / f"eval.{rank}.npz") as saved:
            assert set(map(int, saved.files)) == set(range(*block(rank, 2, IMAGES)))  # in list order
            decoded.update({int(k): saved[k] for k in saved.files})
    for label, picture in decoded.items():
        difference = np.abs(picture - pil_reference(jpegs / f"img{label:02d}.jpg")) * 255 * 0.226
        assert difference.mean() < 2.0 and difference.max() < 24, (label, difference.mean(), difference.max())


def test_dali_augmentation_after_the_cache_feeds_bit_identical_batches_with_and_without_the_cache(tmp_path, jpegs):
    root, names, labels = image_list(jpegs / "list.txt")
    decode = functools.partial(decode_image, size=HEIGHT)

    def batches(levels, training=True):
        samples = CachedSamples(ThrottledSource(root, 200, 1), names, labels, decode, levels=levels,
                                cache_dir=tmp_path / "cache", memory_bytes=1 << 20, seed=3, store_folder=tmp_path)
        sampler = NodePartitionBatchSampler(samples, 4, 1, 1, 0, seed=3, shuffle=training)
        augmentation = DaliAugmentation(4, 0, 3, crop=CROP, resize=HEIGHT, training=training)
        return samples, PrefetchLoader(samples, sampler, assemble=augmentation)

    cached, cached_batches = batches(["disk", "memory"])
    plain, plain_batches = batches([])
    feeds = []
    for epoch in range(3):
        with_cache = [[field.copy() for field in batch] for batch in cached_batches]
        if epoch == 0:
            cached_batches.close()          # drops the read-ahead of epoch 1, which DALI had begun to augment
        without = list(plain_batches)
        order = [b[1].ravel().tolist() for b in with_cache]
        assert order == cached_batches.batch_sampler.batches(epoch)       # label = index: the sampler's order
        assert [b[0].shape for b in with_cache] == [(4, 3, CROP, CROP)] * 5 + [(3, 3, CROP, CROP)]
        assert with_cache[0][0].dtype == np.float32 and with_cache[0][1].dtype == np.int64
        for mine, theirs in zip(with_cache, without, strict=True):
            assert all(np.array_equal(a, b) and a.dtype == b.dtype for a, b in zip(mine, theirs))
        feeds.append(np.concatenate([b[0] for b in with_cache]))
    assert cached.stats(0) == {"memory_misses": IMAGES, "disk_misses": IMAGES}
    assert cached.stats(2) == {"memory_hits": IMAGES} and plain.stats(2) == {"source_reads": IMAGES}
    assert cached.stats(1).keys() == {"memory_hits"}      # (and the dropped read-ahead's hits)
    assert not np.array_equal(feeds[1], feeds[2])                     # a new augmentation each epoch

    _, evaluation = batches(["disk", "memory"], training=False)       # no random part: DALI's centre crop
    for images, indices in evaluation:
        for image, index in zip(images, indices.ravel()):
            expected = normalized_centre_crop(decode((jpegs / names[index]).read_bytes()))
            np.testing.assert_allclose(image, expected, rtol=0, atol=1e-5)


def test_image_loader_runs_dali_after_the_cache_when_the_strategy_names_both(tmp_path, jpegs):
    strategy = fleet.DistributedStrategy()
    strategy.data_configs = {"loader": "dali", "cache_levels": ["disk", "memory"], "cache_dir": str(tmp_path),
                             "memory_cache_MB": 1}
    batches = image_loader(jpegs / "list.txt", strategy, 8, crop=CROP, resize=HEIGHT)
    assert isinstance(batches.assemble, DaliAugmentation) and batches.dataset.augment is None
    assert batches.assemble.options == dict(device="cpu", device_id=None, crop=CROP, resize=HEIGHT, training=True,
                                            num_threads=2)
    assert [len(labels) for _, labels in batches] == [8, 8, 7]
    assert [len(labels) for _, labels in batches] == [8, 8, 7] and batches.dataset.stats(1) == {"memory_hits": IMAGES}
    batches.close()
    batches.dataset.memory.unlink()


def operators(pipeline):
    """[(operator, device)] of a pipeline's graph, defined without building it (no GPU needed)."""
    pipeline._build_graph()
    return [(type(op._op).__name__, op._op.device) for op in pipeline._ops]


def test_the_gpu_pipeline_decodes_mixed_and_runs_every_image_operator_on_the_gpu(jpegs):
    train = dali_pipeline.image_pipeline(str(jpegs / "list.txt"), 8, 1, 4, device="gpu", device_id=1, crop=CROP)
    assert operators(train) == [("File", "cpu"), ("Image", "mixed"), ("RandomResizedCrop", "gpu"),
                                ("CoinFlip", "cpu"), ("CropMirrorNormalize", "gpu")]
    assert [node.device for node in train._graph_outputs] == ["gpu", "gpu"]
    assert train.device_id == 1 and train.max_batch_size == 8
    evaluate = dali_pipeline.image_pipeline(str(jpegs / "list.txt"), 8, 1, 4, device="gpu", device_id=1,
                                            training=False)
    assert operators(evaluate) == [("File", "cpu"), ("Image", "mixed"), ("Resize", "gpu"),
                                   ("CropMirrorNormalize", "gpu")]
    cpu = dali_pipeline.image_pipeline(str(jpegs / "list.txt"), 8, 1, 4, crop=CROP)
    assert {device for _, device in operators(cpu)} == {"cpu"} and cpu.device_id is None
    with pytest.raises(DataError, match="needs device_id"):
        dali_pipeline.image_pipeline(str(jpegs / "list.txt"), 8, 0, 1, device="gpu")


def test_the_gpu_pipeline_after_the_cache_runs_the_same_augmentation_on_the_gpu():
    train = cached_image_pipeline(iter([]), 8, device="gpu", device_id=1, crop=CROP)
    assert operators(train) == [("ExternalSource", "cpu"), ("RandomResizedCrop", "gpu"), ("CoinFlip", "cpu"),
                                ("CropMirrorNormalize", "gpu"), ("ExternalSource", "cpu")]   # images, then labels
    assert [node.device for node in train._graph_outputs] == ["gpu", "gpu"] and train.device_id == 1
    evaluate = cached_image_pipeline(iter([]), 8, device="gpu", device_id=1, crop=CROP, training=False)
    assert operators(evaluate) == [("ExternalSource", "cpu"), ("Resize", "gpu"), ("CropMirrorNormalize", "gpu"),
                                   ("ExternalSource", "cpu")]
    cpu = cached_image_pipeline(iter([]), 8, crop=CROP)
    assert {device for _, device in operators(cpu)} == {"cpu"} and cpu.device_id is None


def test_the_reader_keeps_rank_r_on_shard_r_of_world_with_padding(jpegs):
    pipeline = dali_pipeline.image_pipeline(str(jpegs / "list.txt"), 4, 1, 2, crop=CROP, num_threads=1)
    pipeline.build()
    meta = pipeline.reader_meta(dali_pipeline.READER)
    assert (meta["shard_id"], meta["number_of_shards"], meta["stick_to_shard"], meta["pad_last_batch"]) == (1, 2, 1, 1)
    assert meta["epoch_size"] == IMAGES


@pytest.mark.parametrize("policy, expected", [("pad", "FILL"), ("drop", "DROP")])
def test_the_gpu_path_wires_dalis_paddle_iterator_to_the_reader(monkeypatch, jpegs, policy, expected):
    plugin = pytest.importorskip("nvidia.dali.plugin.paddle", reason="DALI's Paddle plugin needs paddle")
    calls = []
    monkeypatch.setattr(plugin, "DALIGenericIterator", lambda *args, **kw: calls.append((args, kw)) or "iterator")
    pipeline = dali_pipeline.image_pipeline(str(jpegs / "list.txt"), 8, 0, 2, device="gpu", device_id=0)
    assert dali_pipeline.gpu_batches(pipeline, policy) == "iterator"
    (args, kw), = calls
    assert args == ([pipeline], ["image", "label"])
    assert kw["reader_name"] == "Reader" and kw["auto_reset"] and kw["last_batch_policy"].name == expected
    with pytest.raises(DataError, match="equal_batches='error' is not available"):
        dali_pipeline.gpu_batches(pipeline, "error")


def test_the_gpu_path_after_the_cache_hands_a_pipeline_per_epoch_to_dalis_paddle_iterator(monkeypatch):
    plugin = pytest.importorskip("nvidia.dali.plugin.paddle", reason="DALI's Paddle plugin needs paddle")
    calls = []
    monkeypatch.setattr(plugin, "DALIGenericIterator",
                        lambda *args, **kw: calls.append((args, kw)) or iter([{"image": "tensor", "label": "labels"}]))
    augmentation = DaliAugmentation(8, 1, 5, device="gpu", device_id=1, crop=CROP)
    assert list(augmentation(2, iter([]))) == [["tensor", "labels"]]
    ((pipelines, names), kw), = calls
    assert names == ["image", "label"] and kw == {}        # no size: it runs until the cache's batches end
    assert pipelines[0].device_id == 1 and pipelines[0].seed == epoch_seed(5, 1, 2) != epoch_seed(5, 1, 3)


def test_the_cpu_evaluation_batches_cut_the_readers_padding_off(jpegs):
    """Shards of 11 and 12 in batches of 4: the reader pads both to 3 batches (rank 0's last
    holds one repeat); evaluation yields each sample once, in list order, epoch after epoch."""
    for rank, expected in ((0, [4, 4, 3]), (1, [4, 4, 4])):
        pipeline = dali_pipeline.image_pipeline(str(jpegs / "list.txt"), 4, rank, 2, crop=CROP, resize=HEIGHT,
                                                training=False, num_threads=1)
        pipeline.build()
        batches = dali_pipeline.DaliEvaluationBatches(pipeline, IMAGES, 2, rank)
        assert len(batches) == len(expected)
        for _ in range(2):
            epoch = list(batches)
            assert [len(labels) for _, labels in epoch] == [len(images) for images, _ in epoch] == expected
            assert np.concatenate([labels for _, labels in epoch]).ravel().tolist() == list(range(*block(rank, 2, IMAGES)))


def test_the_gpu_path_evaluates_with_dalis_partial_policy(monkeypatch, jpegs):
    plugin = pytest.importorskip("nvidia.dali.plugin.paddle", reason="DALI's Paddle plugin needs paddle")
    calls = []
    monkeypatch.setattr(plugin, "DALIGenericIterator", lambda *args, **kw: calls.append((args, kw)) or "iterator")
    pipeline = dali_pipeline.image_pipeline(str(jpegs / "list.txt"), 8, 0, 2, device="gpu", device_id=0, training=False)
    for policy in ("pad", "drop", "error"):             # evaluation's rule, whatever equal_batches says
        assert dali_pipeline.gpu_batches(pipeline, policy, training=False) == "iterator"
    assert [kw["last_batch_policy"].name for _, kw in calls] == ["PARTIAL"] * 3
    assert all(kw["reader_name"] == "Reader" for _, kw in calls)


def test_the_cpu_iterator_refuses_uneven_shards_under_the_error_policy():
    class Pipeline:
        max_batch_size = 4
    with pytest.raises(DataError, match="rank 0: 11, rank 1: 12"):
        dali_pipeline.DaliBatches(Pipeline(), IMAGES, 2, "error")
    assert len(dali_pipeline.DaliBatches(Pipeline(), IMAGES, 2, "pad")) == 3
    assert len(dali_pipeline.DaliBatches(Pipeline(), IMAGES, 2, "drop")) == 2
