"""Record shards: the digits written as WebDataset tar shards by the tool, indexed once, and
sharded by sample (any file count, shards within one sample) or by file; the DataLoader
built from data_configs."""
import io
import json
import os
import subprocess
import sys
import tarfile

import numpy as np
import pytest
from sklearn.datasets import load_digits

from fleetlite.data import (ClassBalancedBatchSampler, DistributedBatchSampler, EvalBatchSampler, PKBatchSampler,
                            ShardBatchSampler, make_sampler, shard_files)
from fleetlite.data.records import INDEX_SUFFIX, RecordIndex
from fleetlite.data.write_records import main as write_records
from fleetlite.errors import DataError
from fleetlite.strategy.distributed_strategy import DistributedStrategy


@pytest.fixture(scope="module")
def digits_shards(tmp_path_factory):
    folder = tmp_path_factory.mktemp("digits")
    assert write_records([str(folder), "--digits", "--shards", "3"]) == 0
    return sorted(str(p) for p in folder.glob("*.tar"))


def test_the_tool_writes_webdataset_shards_with_an_index_beside_each(digits_shards):
    digits = load_digits()
    assert len(digits_shards) == 3 and all(os.path.exists(p + INDEX_SUFFIX) for p in digits_shards)
    with tarfile.open(digits_shards[0]) as tar:                       # a plain tar: <key>.npy + <key>.cls
        assert tar.getnames()[:4] == ["000000.npy", "000000.cls", "000001.npy", "000001.cls"]
        image = np.load(io.BytesIO(tar.extractfile("000000.npy").read()))
    assert np.array_equal(image, digits.images[0].astype("uint8"))
    whole = shard_files(digits_shards, rank=0, world=1)
    assert len(whole) == len(digits.target) == sum(len(RecordIndex.load(p)) for p in digits_shards)
    for i in (0, 1, 600, 1796):
        assert whole[i]["cls"] == digits.target[i]
        assert np.array_equal(whole[i]["npy"], digits.images[i].astype("uint8"))
    streamed = list(whole)
    assert [s["cls"] for s in streamed] == digits.target.tolist()


@pytest.mark.parametrize("world", (1, 2, 4, 5, 8))
def test_sample_shards_cover_the_files_once_within_one_sample_even_with_fewer_files_than_workers(digits_shards, world):
    shards = [shard_files(digits_shards, rank=r, world=world) for r in range(world)]
    assert shards[0].sizes == [len(s) for s in shards] and shards[0].imbalance <= 1
    labels = [s["cls"] for shard in shards for s in shard]
    assert labels == load_digits().target.tolist()                  # every sample once, in order


def test_file_shards_need_a_file_per_worker_and_report_their_imbalance(digits_shards):
    with pytest.raises(DataError, match="by='file' needs at least one file per worker: 3 files for 4 workers"):
        shard_files(digits_shards, rank=0, world=4, by="file")
    shards = [shard_files(digits_shards, rank=r, world=2, by="file") for r in range(2)]
    assert shards[0].sizes == [len(shards[0]), len(shards[1])] == [1198, 599]
    with pytest.raises(DataError, match="by='row'"):
        shard_files(digits_shards, rank=0, world=2, by="row")
    with pytest.raises(DataError, match="no record files"):
        shard_files(os.path.join(os.path.dirname(digits_shards[0]), "*.missing"), rank=0, world=1)


def test_the_index_is_built_once_and_rebuilt_when_the_file_changes(tmp_path, monkeypatch):
    write_records([str(tmp_path), "--digits", "--shards", "1"])
    path = str(tmp_path / "data-00000.tar")
    built = []
    original = RecordIndex.build.__func__
    monkeypatch.setattr(RecordIndex, "build", classmethod(lambda cls, p: built.append(p) or original(cls, p)))
    assert len(RecordIndex.load(path)) == 1797 and built == []                 # cached beside the data
    with tarfile.open(path, "w") as tar:                                        # the file changes
        info = tarfile.TarInfo("a.cls")
        info.size = 1
        tar.addfile(info, io.BytesIO(b"3"))
    assert len(RecordIndex.load(path)) == 1 and built == [path]
    assert json.loads((tmp_path / ("data-00000.tar" + INDEX_SUFFIX)).read_text())["keys"] == ["a"]


def test_the_tool_writes_a_folder_of_images(tmp_path):
    for name, count in (("cat", 3), ("dog", 2)):
        (tmp_path / "images" / name).mkdir(parents=True)
        for i in range(count):
            (tmp_path / "images" / name / f"{i}.PNG").write_bytes(bytes([i]) * 10)
    assert write_records([str(tmp_path / "out"), "--images", str(tmp_path / "images"), "--shards", "2"]) == 0
    samples = list(shard_files(str(tmp_path / "out" / "*.tar"), rank=0, world=1))
    assert [s["cls"] for s in samples] == [0, 0, 0, 1, 1] and samples[4]["png"] == bytes([1]) * 10
    assert json.loads((tmp_path / "out" / "classes.json").read_text()) == ["cat", "dog"]
    assert write_records([str(tmp_path / "none"), "--images", str(tmp_path / "out")]) == 2


def strategy(**data):
    chosen = DistributedStrategy()
    chosen.data_configs = data
    return chosen


def test_the_strategy_picks_the_sampler(digits_shards):
    labels = load_digits().target
    dataset = list(range(len(labels)))
    plain = make_sampler(dataset, strategy(equal_batches="drop", seed=9), 32)
    assert isinstance(plain, DistributedBatchSampler) and (plain.equal_batches, plain.seed) == ("drop", 9)
    balanced = make_sampler(dataset, strategy(sampler="class_balanced"), 32, labels=labels)
    assert isinstance(balanced, ClassBalancedBatchSampler)
    pk = make_sampler(dataset, strategy(sampler="pk", pk_classes=4, pk_samples=3), labels=labels)
    assert isinstance(pk, PKBatchSampler) and (pk.p, pk.k, pk.batch_size) == (4, 3, 12)
    assert isinstance(make_sampler(dataset, strategy(sampler="pk"), 8, evaluation=True), EvalBatchSampler)
    shard = shard_files(digits_shards, rank=1, world=2, by="file")
    equalised = make_sampler(shard, strategy(equal_batches="pad"), 32)
    assert isinstance(equalised, ShardBatchSampler) and equalised.num_samples == 1198 and equalised.rank == 1
    with pytest.raises(DataError, match="pk_classes x pk_samples = 8 x 4 = 32; leave batch_size out"):
        make_sampler(dataset, strategy(sampler="pk"), 16, labels=labels)
    with pytest.raises(DataError, match="need every sample's label"):
        make_sampler(dataset, strategy(sampler="class_balanced"), 16)
    with pytest.raises(DataError, match="needs batch_size"):
        make_sampler(dataset, strategy(), None)


def test_the_loader_feeds_a_record_shard_through_paddles_data_loader(digits_shards):
    from fleetlite.data import loader

    shard = shard_files(digits_shards, rank=0, world=1, transform=lambda s: (s["npy"].astype("float32"), s["cls"]))
    batches = list(loader(shard, strategy(), 100, shuffle=False))
    assert len(batches) == 18 and np.array(batches[0][0]).shape == (100, 8, 8)
    assert np.concatenate([np.array(y) for _, y in batches]).tolist() == load_digits().target.tolist()


def test_fleet_data_needs_no_import_of_its_own():
    run = subprocess.run([sys.executable, "-c", "import fleetlite as fleet; print(fleet.data.loader.__module__)"],
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "fleetlite.data.loader"
