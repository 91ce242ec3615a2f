"""Worker logs hold what the user can act on, not Paddle talking to itself: a real 2-rank job
through fleetrun logs neither of the two start-up warnings fleetlite stops at their source
(fleetlite/paddle_compat/quiet_warnings.py), each stop holds only its own message, and Paddle's
glog line about `out` tensors (which no Python filter can stop, and fleetlite does not hide by
wrapping Paddle's op bindings) stays in the log file but not on fleetrun's console. Outside
fleetrun, a plain import of a fleetlite module that imports Paddle first is quiet too."""
import io
import os
import subprocess
import sys
import warnings

from fleetlite.launcher.log_tee import LogTee
from fleetlite.paddle_compat import quiet_warnings as paddle_noise
from support.multiprocess import clean_environment, fleetrun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HELD = ("No ccache found", "Tensor do not have 'place' interface for pir graph mode")
NOISE = (*HELD, "PIR not support input out tensor")


def test_a_two_rank_job_shows_none_of_paddles_start_up_noise(tmp_path):
    result = fleetrun(["--nproc_per_node", "2", "--log_dir", "log", os.path.join(ROOT, "examples", "train_digits.py"),
                       "--strategy", os.path.join(ROOT, "configs", "cpu_gloo.yaml"), "--epochs", "1"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    logs = {rank: (tmp_path / "log" / f"workerlog.{rank}").read_text() for rank in (0, 1)}
    assert "fleetlite compile report" in logs[0] and "test accuracy" in logs[0]
    for rank, log in logs.items():
        assert [message for message in HELD if message in log] == [], f"rank {rank}:\n{log}"
        assert log.count(paddle_noise.EMPTY_OUT) <= 1, f"rank {rank}:\n{log}"     # glog's, once per process
    console = result.stdout + result.stderr
    assert [message for message in NOISE if message in console] == [], console
    acted_on = [line for line in logs[0].splitlines() if paddle_noise.EMPTY_OUT not in line]
    assert acted_on[0].startswith("fleetlite compile report: rank 0/2")


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


def test_fleetruns_console_drops_paddles_glog_line_and_the_log_file_keeps_it(tmp_path):
    log = tmp_path / "workerlog.0"
    glog = f"W1125 10:00:00.000000  4242 eager_utils.cc:2907] {paddle_noise.EMPTY_OUT}, please check.\n"
    log.write_text(f"{glog}loss 0.5\n")
    console = io.BytesIO()
    LogTee(str(log), 0, "[rank 0] ", console, poll_interval=0.01).start().stop()
    assert console.getvalue().decode() == "[rank 0] loss 0.5\n"
    assert log.read_text().startswith(glog)
