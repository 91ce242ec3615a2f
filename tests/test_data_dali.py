"""`data_configs.loader: dali`: the CPU pipeline through fleetrun on 2 ranks (disjoint fixed
shards, equal batches under pad and drop, images decoded as PIL decodes them), and the GPU
path's structure checked without a GPU (operators and their devices, reader sharding, the
Paddle plugin iterator's wiring)."""
import json
import os

import numpy as np
import pytest
from PIL import Image

from fleetlite.data import dali_pipeline
from fleetlite.data.image_transforms import IMAGENET_MEAN, IMAGENET_STD
from fleetlite.data.node_partition import block
from fleetlite.errors import DataError
from test_launcher_processes import SCRIPTS, fleetrun

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


def pil_reference(path):
    """The evaluation crop as PIL decodes it: centre CROP x CROP, normalized, CHW."""
    picture = np.asarray(Image.open(path).convert("RGB"), dtype=np.float32)
    top, left = (HEIGHT - CROP) // 2, (WIDTH - CROP) // 2
    picture = picture[top:top + CROP, left:left + CROP]
    return ((picture - 255 * np.array(IMAGENET_MEAN)) / (255 * np.array(IMAGENET_STD))).transpose(2, 0, 1)


def test_two_ranks_through_fleetrun_read_disjoint_fixed_shards_in_equal_batches_and_decode_like_pil(tmp_path, jpegs):
    result = fleetrun(["--nproc_per_node", "2", "--job_id", "dali", os.path.join(SCRIPTS, "dali_images.py"),
                       "--list", str(jpegs / "list.txt"), "--batch", "4", "--crop", str(CROP),
                       "--resize", str(HEIGHT), "--out", str(tmp_path)], tmp_path, timeout=240)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"result.{r}.json").read_text())["epochs"] for r in range(2)]
    shards = [{label for b in epochs["pad/0"] for label in b["labels"]} for epochs in ranks]
    assert sorted(map(len, shards)) == [11, 12] and not shards[0] & shards[1]
    assert shards[0] | shards[1] == set(range(IMAGES))
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

    decoded = {}
    for rank in range(2):
        with np.load(tmp_path / f"eval.{rank}.npz") as saved:
            assert set(map(int, saved.files)) == set(range(*block(rank, 2, IMAGES)))  # in list order
            decoded.update({int(k): saved[k] for k in saved.files})
    for label, picture in decoded.items():
        difference = np.abs(picture - pil_reference(jpegs / f"img{label:02d}.jpg")) * 255 * 0.226
        assert difference.mean() < 2.0 and difference.max() < 24, (label, difference.mean(), difference.max())


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


def test_the_cpu_iterator_refuses_uneven_shards_under_the_error_policy():
    class Pipeline:
        max_batch_size = 4
    with pytest.raises(DataError, match="rank 0: 11, rank 1: 12"):
        dali_pipeline.DaliBatches(Pipeline(), IMAGES, 2, "error")
    assert len(dali_pipeline.DaliBatches(Pipeline(), IMAGES, 2, "pad")) == 3
    assert len(dali_pipeline.DaliBatches(Pipeline(), IMAGES, 2, "drop")) == 2
