"""What ranks exchange is plain data, never pickle: every value fleet.util.all_gather and pto's
sharded save send arrives unchanged, a crafted pickle payload (or any
malformed header) is refused with one line before anything is built, and nothing that could
unpickle is ever called."""
import ast
import json
import pickle
import struct
from pathlib import Path

import numpy as np
import pytest

import fleetlite.runtime.job_values
import fleetlite.runtime.plain_values
import fleetlite.runtime.sharded_state
from fleetlite.errors import FleetliteError
from fleetlite.runtime.plain_values import MAGIC, MalformedValue, decode, encode
from support.multiprocess import run_job
from support.plain_samples import Planted, differences, rank_values

GATHER_WORKER = Path(__file__).resolve().parents[1] / "workers" / "plain_gather_worker.py"


@pytest.fixture
def no_unpickling(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("something tried to unpickle")
    for name in ("loads", "load", "Unpickler"):
        monkeypatch.setattr(pickle, name, refuse)


@pytest.mark.parametrize("rank", [0, 3])
def test_every_value_arrives_unchanged(rank):
    """Types, dtypes (byte order included, which pickle made native), shapes and values."""
    assert differences(decode(encode(rank_values(rank))), rank_values(rank)) == []


def _header(tree, buffers, body=b""):
    header = json.dumps({"value": tree, "buffers": buffers}).encode()
    return MAGIC + struct.pack("<Q", len(header)) + header + body


@pytest.mark.parametrize("payload, cause", [
    (pickle.dumps({"x": 1}), "no FLV1 mark"),
    (MAGIC + pickle.dumps({"x": 1}), "header claims"),
    (_header({"array": 0}, [{"dtype": "|O8", "shape": [1]}], b"\0" * 8), "dtype '|O8' is not a plain number type"),
    (_header({"array": 0}, [{"dtype": "<f4,<i4", "shape": [1]}], b"\0" * 8), "is not a plain number type"),
    (_header({"array": 0}, [{"dtype": "<f4", "shape": [-1]}], b""), "is not a list of at most 32 sizes"),
    (_header({"array": 0}, [{"dtype": "<f4", "shape": [2 ** 62, 2 ** 62]}], b""), "runs past the 0 sent"),
    (_header({"array": 0}, [{"dtype": "<f4", "shape": [1]}], b"\0" * 5), "1 bytes follow the last array"),
    (_header({"array": 1}, [{"dtype": "<f4", "shape": [1]}], b"\0" * 4), "IndexError"),
    (_header({"bytes": 0}, [{"dtype": "<f4", "shape": [1]}], b"\0" * 4), "a bytes node refers to an array"),
    (_header({"scalar": 0}, [{"dtype": "<f4", "shape": [1]}], b"\0" * 4), "a scalar node refers to an array"),
    (_header({"pickle": "gASVBQAAAAAAAAB9lC4="}, []), "unknown node 'pickle'"),
    (_header({"dict": [[[1], 2]]}, []), "unhashable type: 'list'"),
    (MAGIC + struct.pack("<Q", 5) + b"{bad}", "JSONDecodeError"),
    (MAGIC + struct.pack("<Q", 20001) + b"[" * 10000 + b"]" * 10000 + b'x', "RecursionError"),
])
def test_a_malformed_or_pickled_payload_is_refused_in_one_line_and_never_unpickled(payload, cause, no_unpickling):
    with pytest.raises(MalformedValue) as refused:
        decode(payload)
    assert cause in str(refused.value) and "\n" not in str(refused.value)


def test_a_crafted_pickle_never_runs_even_behind_the_mark(tmp_path, no_unpickling):
    marker = tmp_path / "ran"
    for payload in (pickle.dumps(Planted(marker)), MAGIC + struct.pack("<Q", 0) + pickle.dumps(Planted(marker))):
        with pytest.raises(MalformedValue):
            decode(payload)
    assert not marker.exists()


@pytest.mark.parametrize("value, named", [
    ({1, 2}, "cannot send a set between ranks"),
    (np.array([object()]), "cannot send a ndarray between ranks"),
    ([Planted("/nowhere")], "cannot send a Planted between ranks"),
])
def test_values_that_are_not_plain_data_are_refused_when_sent(value, named):
    with pytest.raises(FleetliteError, match=named):
        encode(value)


def test_no_module_that_exchanges_values_imports_pickle_or_gathers_objects():
    for module in (fleetlite.runtime.plain_values, fleetlite.runtime.job_values, fleetlite.runtime.sharded_state):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = {alias.name for node in ast.walk(tree) if isinstance(node, (ast.Import, ast.ImportFrom))
                    for alias in node.names} | {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
        called = {node.attr for node in ast.walk(tree) if isinstance(node, ast.Attribute)}
        assert not {"pickle", "cloudpickle", "dill", "marshal"} & imported, module.__name__
        assert not {"all_gather_object", "broadcast_object_list", "scatter_object_list"} & called, module.__name__


def test_two_ranks_gather_unchanged_values_and_refuse_a_peers_pickle(tmp_path):
    ranks = run_job(GATHER_WORKER, 2, args=[str(tmp_path / "ran")], timeout=120)
    assert [r["differences"] for r in ranks] == [[], []]
    for rank in ranks:   # rank 1 decodes its own part too
        assert rank["refused"].startswith("a peer sent bytes that are not a fleetlite value (no FLV1 mark)")
    assert not (tmp_path / "ran").exists()
