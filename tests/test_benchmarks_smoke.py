"""The benchmark drivers still run end to end (one round, no timing asserted: speed targets
live in the benchmarks' own ratios, never in tests)."""
import json
import subprocess
import sys
from pathlib import Path

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def test_gradsync_driver_runs_its_contenders_and_reports_ratios(tmp_path):
    out = tmp_path / "gradsync.json"
    result = subprocess.run(
        [sys.executable, "gradsync.py", "--only", "paddle_flat_limit", "fleetlite_cpu_preset",
         "--rounds", "1", "--warmup", "0", "--reps", "1", "--json", str(out)],
        cwd=BENCHMARKS, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    assert [row["contender"] for row in report["rows"]] == ["paddle_flat_limit", "fleetlite_cpu_preset"]
    assert all(row["median_ms"] > 0 for row in report["rows"])
    assert report["ratios"]["best_fleetlite"] == "fleetlite_cpu_preset"
    assert "ratios:" in result.stdout


def test_topk_select_driver_runs_its_contenders_and_reports_ratios(tmp_path):
    out = tmp_path / "topk.json"
    result = subprocess.run(
        [sys.executable, "topk_select.py", "--sizes", "0.05", "--densities", "0.01", "--rounds", "1", "--warmup", "0",
         "--json", str(out)], cwd=BENCHMARKS, capture_output=True, text=True, timeout=240)
    assert result.returncode == 0, result.stderr[-2000:]
    report = json.loads(out.read_text())
    (row,) = report["rows"]
    assert row["k"] == 500 and row["recall"] == 1.0
    assert all(row[name] > 0 for name in ("mstopk_static", "mstopk_eager", "numpy_argpartition", "stream"))
    assert "numpy_argpartition_over_mstopk" in report["ratios"]
