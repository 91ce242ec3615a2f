"""Packaging, the strategy CLI, presets, generated files and the Paddle version gate."""
import re
import subprocess
import sys
from pathlib import Path

import pytest

import fleetlite
from fleetlite.paddle_compat import version_check as paddle_check
from fleetlite.strategy import reference_doc
from fleetlite.strategy.distributed_strategy import DistributedStrategy

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = sorted(p for p in (ROOT / "configs").iterdir() if p.suffix in (".yaml", ".prototxt"))


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "fleetlite.cli", *map(str, args)], capture_output=True,
                          text=True, timeout=60, cwd=ROOT)


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.name)
def test_every_preset_loads_and_validates(path):
    DistributedStrategy.load(path).validate()


def test_resnet50_preset_is_the_fleet_recipe():
    s = DistributedStrategy.load(ROOT / "configs" / "resnet50_4x8_gpu.yaml")
    assert (s.amp, s.nccl_comm_num, s.fuse_grad_size_in_MB, s.fuse_grad_size_in_TFLOPS) == (True, 2, 16, 50)
    assert (s.execution_strategy.num_threads, s.execution_strategy.num_iteration_per_drop_scope) == (3, 100)
    assert s.build_strategy.fuse_bn_act_ops and s.build_strategy.fuse_elewise_add_act_ops


def test_generated_proto_module_is_fresh(tmp_path):
    grpc_tools = pytest.importorskip("grpc_tools.protoc", reason="grpcio-tools is in the test extra")
    rc = grpc_tools.main(["protoc", f"-I{ROOT}", f"--python_out={tmp_path}",
                          str(ROOT / "fleetlite" / "proto" / "strategy.proto")])
    assert rc == 0
    fresh = (tmp_path / "fleetlite" / "proto" / "strategy_pb2.py").read_text()
    assert fresh == (ROOT / "fleetlite" / "proto" / "strategy_pb2.py").read_text(), "run `make proto`"


def test_strategy_reference_is_fresh():
    committed = (ROOT / "docs" / "strategy_reference.md").read_text()
    assert committed == reference_doc.render(), "run `make docs`"


def test_strategy_reference_documents_every_field():
    page = reference_doc.render()
    for message in reference_doc.parse_proto(reference_doc.PROTO.read_text()).values():
        for name, *_, comment in message:
            assert comment, f"field {name} has no comment in strategy.proto"
    assert "| `nccl_comm_num` | int32 | 1 | >= 1 |" in page


def test_cli_validate_show_convert_diff(tmp_path):
    preset = ROOT / "configs" / "resnet50_4x8_gpu.yaml"
    ok = _cli("strategy", "validate", *CONFIGS)
    assert ok.returncode == 0 and ok.stdout.count(": ok") == len(CONFIGS)
    shown = _cli("strategy", "show", preset)
    assert shown.returncode == 0 and "nccl_comm_num" in shown.stdout
    assert _cli("strategy", "convert", preset, tmp_path / "r.prototxt").returncode == 0
    assert _cli("strategy", "convert", tmp_path / "r.prototxt", tmp_path / "r.yaml").returncode == 0
    same = _cli("strategy", "diff", preset, tmp_path / "r.yaml")
    assert same.returncode == 0 and "no differences" in same.stdout
    other = _cli("strategy", "diff", preset, ROOT / "configs" / "default.yaml")
    assert other.returncode == 1 and re.search(r"^nccl_comm_num +2  ->  1$", other.stdout, re.M)


def test_cli_bad_input_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("nccl_comm_num: 0\n")
    result = _cli("strategy", "validate", bad)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert result.stderr.strip().count("\n") == 0
    assert f"{bad}:1: strategy field 'nccl_comm_num' = 0 is out of range; allowed: >= 1" in result.stderr
    missing = _cli("strategy", "show", tmp_path / "nope.prototxt")
    assert missing.returncode == 2 and "no such strategy file" in missing.stderr


@pytest.mark.parametrize("versions, importable, words", [
    ({"paddlepaddle": "2.6.2"}, True, "found paddlepaddle 2.6.2"),
    ({}, False, "not installed"),
])
def test_paddle_gate_names_what_to_install(versions, importable, words):
    reason = paddle_check.problem(versions, importable)
    assert words in reason and "pip install 'paddlepaddle>=3.0'" in reason


@pytest.mark.parametrize("versions", [{"paddlepaddle": "3.3.1"}, {"paddlepaddle-gpu": "3.0.0"},
                                      {"paddlepaddle": "0.0.0"}])
def test_paddle_gate_accepts_paddle3(versions):
    assert paddle_check.problem(versions, True) is None


def test_import_fails_clearly_on_paddle2(tmp_path):
    (tmp_path / "paddlepaddle-2.6.2.dist-info").mkdir()   # found first on sys.path: what is installed
    code = f"import sys; sys.path.insert(0, {str(tmp_path)!r}); import fleetlite"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert result.returncode != 0
    assert "ImportError: fleetlite needs PaddlePaddle >= 3.0" in result.stderr


def test_launcher_and_strategies_install_inside_the_package():
    import fleetlite.launcher
    import fleetlite.strategies
    assert Path(fleetlite.launcher.__file__).parent == ROOT / "launcher"
    assert Path(fleetlite.strategies.__file__).parent == ROOT / "strategies"
    assert fleetlite.__version__


def test_the_fleetrun_command_is_fleetlites():
    """Paddle installs a `fleetrun` of its own; the install must leave ours in its place."""
    fleetrun = Path(sys.executable).parent / "fleetrun"
    result = subprocess.run([str(fleetrun), "--help"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "--explain" in result.stdout and "--ssh_command" in result.stdout, \
        f"{fleetrun} is not fleetlite's launcher (Paddle's?): reinstall fleetlite after Paddle"
