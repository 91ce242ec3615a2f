"""Bad data settings get one clear line naming the cause and the fix, and the same line from
`fleetlite strategy validate` as from the loaders (one rule table: fleetlite/data/settings.py)."""
import os

import pytest
import yaml

import fleetlite as fleet
from fleetlite import cli
from fleetlite.data import cached_samples, disk_cache, image_loader, loader
from fleetlite.errors import DataError, StrategyConflictError
from fleetlite.topology import Topology
from test_data_cache import photos  # noqa: F401 (the fixture: 30 small JPEGs in 3 class folders)

# (data_configs, the field named, words of the one line every surface prints)
REFUSED_SETTINGS = [
    ({"cache_levels": ["disk", "disk"]}, "cache_levels",
     "data_configs.cache_levels = ['disk', 'disk'] lists 'disk' more than once; list each of 'disk', 'memory' at most once"),
    ({"cache_levels": ["memory", "disk", "memory"]}, "cache_levels", "lists 'memory' more than once"),
    ({"cache_levels": ["disk"], "cache_dir": ""}, "cache_dir",
     "data_configs.cache_dir is empty, but cache_levels has 'disk'"),
    ({"cache_levels": ["memory", "disk"], "cache_dir": "  "}, "cache_dir", "set cache_dir to a local folder"),
    ({"cache_levels": ["memory"], "memory_cache_MB": 0}, "memory_cache_MB",
     "data_configs.memory_cache_MB = 0, but cache_levels has 'memory': a store of 0 MiB keeps no sample; "
     "set memory_cache_MB >= 1, or drop 'memory' from cache_levels"),
    ({"loader": "dali", "sampler": "pk"}, "sampler",
     "data_configs.sampler = 'pk', but loader 'dali' batches with the distributed sampler only"),
    ({"loader": "dali", "sampler": "class_balanced", "cache_levels": ["disk"]}, "sampler",
     "set sampler: distributed, or loader: paddle"),
]
IDS = [f"{field}-{i}" for i, (_, field, _) in enumerate(REFUSED_SETTINGS)]


def strategy_with(data_configs):
    strategy = fleet.DistributedStrategy()
    strategy.data_configs = data_configs
    return strategy


@pytest.mark.parametrize("configs, field, words", REFUSED_SETTINGS, ids=IDS)
def test_validate_refuses_what_the_loaders_refuse_with_the_same_line(configs, field, words, tmp_path, photos, capsys):
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump({"data_configs": configs}))
    assert cli.main(["strategy", "validate", str(path)]) == 2
    err = capsys.readouterr().err
    assert words in err and err.count("\n") == 1, err
    line = 1 + next(i for i, text in enumerate(path.read_text().splitlines()) if text.strip().startswith(field))
    assert err.startswith(f"fleetlite: error: {path}:{line}: "), err
    with pytest.raises(StrategyConflictError) as refused:
        strategy_with(configs).validate()
    assert refused.value.field == f"data_configs.{field}"
    with pytest.raises(DataError) as by_image_loader:
        image_loader(photos, strategy_with(configs), 2)
    with pytest.raises(DataError) as by_loader:
        loader(list(range(8)), strategy_with(configs), 2)
    assert str(by_image_loader.value) == str(by_loader.value) == str(refused.value)
    assert err.endswith(f": {refused.value}\n")


def test_a_rule_that_needs_the_device_runs_once_the_topology_is_declared():
    strategy = strategy_with({"loader": "dali", "equal_batches": "error"})
    strategy.validate()                                  # no topology yet: the GPU rule cannot apply
    strategy.validate(Topology.grid(2, device="cpu"))    # DALI's CPU path counts its shards itself
    with pytest.raises(StrategyConflictError, match="equal_batches = 'error' is not available with DALI's GPU "
                                                    "iterator .*; use equal_batches 'pad' or 'drop'"):
        strategy.validate(Topology.grid(2, device="gpu"))


@pytest.mark.parametrize("sampler", ["pk", "class_balanced"])
def test_image_loader_refuses_a_sampler_it_cannot_honour(sampler, photos):
    with pytest.raises(DataError, match=f"data_configs.sampler = '{sampler}': image_loader batches with the "
                                        f"distributed sampler .* and cannot honour it; set sampler: distributed, or "
                                        rf"use fleetlite.data.loader\(dataset, strategy\) for the {sampler} sampler"):
        image_loader(photos, strategy_with({"sampler": sampler}), 4)


@pytest.mark.parametrize("option, value, words", [
    ("crop", "224", "image_loader's crop = '224': it must be a whole number >= 1"),
    ("crop", 0, "image_loader's crop = 0: it must be a whole number >= 1"),
    ("resize", 25.6, "image_loader's resize = 25.6: it must be a whole number >= 1"),
    ("num_threads", None, "image_loader's num_threads = None: it must be a whole number >= 1"),
    ("prefetch", True, "image_loader's prefetch = True: it must be a whole number >= 1"),
    ("batch_size", "8", "image_loader's batch_size = '8': it must be a whole number >= 1"),
    ("training", "yes", "image_loader's training = 'yes': pass True (augment) or False (evaluation)"),
    ("seed", 1.5, "image_loader's seed = 1.5: pass a whole number, or None for data_configs.seed"),
])
@pytest.mark.parametrize("loader_name", ["paddle", "dali"])
def test_image_loader_options_of_the_wrong_type_name_the_option(loader_name, option, value, words, photos):
    """DALI's operators would fail deep inside with a message that names no option."""
    options = {"batch_size": 4, option: value}
    with pytest.raises(DataError) as refused:
        image_loader(photos, strategy_with({"loader": loader_name}), **options)
    assert str(refused.value) == words


def _file_in_its_place(tmp_path, monkeypatch):
    (tmp_path / "cache").write_text("not a folder")
    return tmp_path / "cache", "File exists"


def _under_a_file(tmp_path, monkeypatch):
    (tmp_path / "plain").write_text("a file")
    return tmp_path / "plain" / "cache", "Not a directory"


def _no_permission(tmp_path, monkeypatch):
    """A read-only cache folder. Root writes anyway, so there the write is refused as the
    kernel refuses it to a user (os.open and open of the cache's modules)."""
    folder = tmp_path / "cache"
    for part in (disk_cache.ENTRIES, disk_cache.LOCKS, disk_cache.PARTIAL):
        (folder / part).mkdir(parents=True)
    for path in (folder, *folder.iterdir()):
        path.chmod(0o555)
    if os.geteuid() == 0:
        def refuse(path, *args, **kwargs):
            raise PermissionError(13, "Permission denied", str(path))
        monkeypatch.setattr(disk_cache, "open", refuse, raising=False)
        monkeypatch.setattr(disk_cache.os, "makedirs", refuse)
    return folder, "Permission denied"


def test_the_memory_store_in_cache_dir_names_it_too(tmp_path, monkeypatch, photos):
    """Without /dev/shm the memory level's store lives in cache_dir."""
    monkeypatch.setattr(cached_samples, "default_folder", lambda: None)
    folder, cause = _under_a_file(tmp_path, monkeypatch)
    strategy = strategy_with({"cache_levels": ["memory"], "cache_dir": str(folder)})
    with pytest.raises(DataError, match=f"^data_configs.cache_dir {folder} cannot be used: {cause}"):
        image_loader(photos, strategy, 4)


@pytest.mark.parametrize("make", [_file_in_its_place, _under_a_file, _no_permission], ids=lambda f: f.__name__[1:])
def test_os_errors_on_the_cache_folder_name_cache_dir_and_the_path(make, tmp_path, monkeypatch, photos):
    folder, cause = make(tmp_path, monkeypatch)
    strategy = strategy_with({"cache_levels": ["disk"], "cache_dir": str(folder)})
    with pytest.raises(DataError) as refused:
        list(image_loader(photos, strategy, 4))
    message = str(refused.value)
    assert message.startswith(f"data_configs.cache_dir {folder} cannot be used: {cause}"), message
    assert message.endswith("; set cache_dir to a local folder this process can create and write")
