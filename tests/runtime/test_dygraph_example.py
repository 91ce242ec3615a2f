"""examples/train_digits_dygraph.py trains through fleetrun on 2 ranks and resumes from its
checkpoint (model and optimizer saved with paddle.save) in a restarted job; `fleetrun --explain`
prints its compile report and trains nothing."""
import re
import subprocess
import sys
from pathlib import Path

from support.multiprocess import clean_environment

ROOT = Path(__file__).resolve().parents[2]


def train(tmp_path, epochs, *launcher_flags):
    run = subprocess.run([sys.executable, "-m", "fleetlite.cli", "run", *launcher_flags, "--nproc_per_node", "2",
                          "--log_dir", str(tmp_path / "log"), str(ROOT / "examples" / "train_digits_dygraph.py"),
                          "--strategy", str(ROOT / "configs" / "cpu_gloo.yaml"), "--epochs", str(epochs),
                          "--checkpoint_dir", str(tmp_path)],
                         cwd=tmp_path, env=clean_environment(), capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout


def test_the_dygraph_example_trains_and_resumes_through_fleetrun(tmp_path):
    first = train(tmp_path, 3)
    assert "fleetlite compile report" in first and "epoch 2:" in first
    resumed = train(tmp_path, 4)
    assert "resumed from" in resumed and "epoch 3:" in resumed and "epoch 2:" not in resumed
    accuracy = float(re.search(r"test accuracy ([0-9.]+)", resumed).group(1))
    assert accuracy > 0.9


def test_explain_prints_the_dygraph_scripts_compile_report_and_trains_nothing(tmp_path):
    explained = train(tmp_path, 3, "--explain")
    assert "fleetlite compile report" in explained and "data_parallel" in explained
    assert "epoch 0:" not in explained and not list(tmp_path.glob("digits_dygraph*"))
