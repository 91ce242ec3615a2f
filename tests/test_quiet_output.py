"""Worker logs hold what the user can act on, not Paddle talking to itself: a real 2-rank job
through fleetrun logs none of the three start-up messages fleetlite stops at their source
(fleetlite/paddle_noise.py), and each stop holds only its own message. Outside fleetrun, a
plain import of a fleetlite module that imports Paddle first is quiet too."""
import os
import subprocess
import sys
import warnings
from types import SimpleNamespace

from fleetlite import paddle_noise
from multiprocess import clean_environment
from test_launcher_processes import fleetrun

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NOISE = ("No ccache found", "Tensor do not have 'place' interface for pir graph mode",
         "PIR not support input out tensor")


def test_a_two_rank_job_logs_none_of_paddles_start_up_noise(tmp_path):
    result = fleetrun(["--nproc_per_node", "2", "--log_dir", "log", os.path.join(ROOT, "examples", "train_digits.py"),
                       "--strategy", os.path.join(ROOT, "configs", "cpu_gloo.yaml"), "--epochs", "1"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    logs = {rank: (tmp_path / "log" / f"workerlog.{rank}").read_text() for rank in (0, 1)}
    assert "fleetlite compile report" in logs[0] and "test accuracy" in logs[0]
    for rank, log in logs.items():
        assert [message for message in NOISE if message in log] == [], f"rank {rank}:\n{log}"
    assert logs[0].splitlines()[0].startswith("fleetlite compile report: rank 0/2")


def test_importing_fleetlite_topk_first_prints_nothing(tmp_path):
    env = {name: value for name, value in clean_environment().items() if name != "PYTHONWARNINGS"}
    result = subprocess.run([sys.executable, "-c", "import fleetlite.topk"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=60)
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


def test_each_hold_is_one_message_from_one_place_and_lasts_only_around_its_call():
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with paddle_noise.importing_paddle():
            warnings.warn_explicit(f"{paddle_noise.CCACHE}. Please ...", UserWarning, "extension_utils.py", 1,
                                   module="paddle.utils.cpp_extension.extension_utils")
            warnings.warn_explicit(f"{paddle_noise.CCACHE}. Please ...", UserWarning, "mine.py", 1, module="mine")
            warnings.warn("a warning the user can act on")
        with paddle_noise.differentiating():
            warnings.warn(f"{paddle_noise.PLACE}, try not to use it.")
            warnings.warn("another one")
        warnings.warn(f"{paddle_noise.PLACE}, from the user's own code")
    assert [str(w.message) for w in seen] == [f"{paddle_noise.CCACHE}. Please ...", "a warning the user can act on",
                                              "another one", f"{paddle_noise.PLACE}, from the user's own code"]


def test_the_ops_paddle_hands_an_empty_out_drop_it_and_keep_a_real_one():
    calls = []
    ops = SimpleNamespace(mean=lambda *args, **kwargs: calls.append((args, kwargs)), relu=print)
    paddle_noise.drop_empty_out(ops)
    paddle_noise.drop_empty_out(ops)                         # idempotent: wrapped once
    ops.mean("x", None, False, out=None)
    ops.mean("x", None, False, out="buffer")
    ops.mean("x", None, False)
    assert calls == [(("x", None, False), {}), (("x", None, False), {"out": "buffer"}), (("x", None, False), {})]
    assert not hasattr(ops.mean.__wrapped__, "__wrapped__") and ops.relu is print     # only the listed ops
