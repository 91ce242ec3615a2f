"""What fleetrun and each worker's bootstrap load before the script runs: launch speed depends
on it (benchmarks/launch/launch_speed.py measures the whole path)."""
import importlib.metadata
import subprocess
import sys

from fleetlite.paddle_compat import version_check as paddle_check

HEAVY = ("paddle", "fleetlite.strategy.distributed_strategy", "fleetlite.api", "yaml", "google.protobuf",
         "importlib.metadata")


def test_fleetrun_and_the_bootstrap_start_without_paddle_or_the_strategy_schema():
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, fleetlite.launcher.main, fleetlite.launcher.bootstrap; "
                               f"print([m for m in {HEAVY!r} if m in sys.modules])"],
        capture_output=True, text=True, timeout=60, check=True).stdout.strip()
    assert loaded == "[]"


def test_lazy_names_are_the_real_ones():
    import fleetlite
    from fleetlite.base.role_maker import UserDefinedRoleMaker
    from fleetlite.strategy.distributed_strategy import DistributedStrategy
    assert fleetlite.DistributedStrategy is DistributedStrategy
    assert fleetlite.UserDefinedRoleMaker is UserDefinedRoleMaker


def test_the_paddle_gate_reads_versions_from_dist_info_folders(tmp_path):
    for name in ("paddlepaddle-2.6.2.dist-info", "paddlepaddle_gpu-3.0.0.dist-info", "numpy-2.0.0.dist-info",
                 "paddlepaddle-3.3.1.data"):
        (tmp_path / name).mkdir()
    assert paddle_check.installed_versions([str(tmp_path), str(tmp_path / "missing")]) == \
        {"paddlepaddle": "2.6.2", "paddlepaddle-gpu": "3.0.0"}
    assert paddle_check.installed_versions() == {"paddlepaddle": importlib.metadata.version("paddlepaddle")}
