"""Worker logs hold what the user can act on, not Paddle talking to itself: a real 2-rank job
through fleetrun logs none of the three start-up messages fleetlite stops at their source
(fleetlite/paddle_compat/quiet_warnings.py), each stop holds only its own message, and Paddle's
glog line about `out` tensors (which no Python filter can stop, and fleetlite does not hide by
wrapping Paddle's op bindings) is spent with stderr silenced right after `import paddle`, so it
is in no log, no failure report's last lines and not on `fleetrun --explain`'s console. Outside
fleetrun, a plain import of a fleetlite module that imports Paddle first is quiet too."""
import os
import signal
import subprocess
import sys
import warnings

from fleetlite.paddle_compat import quiet_warnings as paddle_noise
from support.multiprocess import clean_environment, fleetrun

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCRIPTS = os.path.join(ROOT, "tests", "launcher_scripts")
HELD = ("No ccache found", "Tensor do not have 'place' interface for pir graph mode")
NOISE = (*HELD, paddle_noise.EMPTY_OUT)


def test_a_two_rank_job_shows_none_of_paddles_start_up_noise(tmp_path):
    result = fleetrun(["--nproc_per_node", "2", "--log_dir", "log", os.path.join(ROOT, "examples", "train_digits.py"),
                       "--strategy", os.path.join(ROOT, "configs", "cpu_gloo.yaml"), "--epochs", "1"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    logs = {rank: (tmp_path / "log" / f"workerlog.{rank}").read_text() for rank in (0, 1)}
    assert "fleetlite compile report" in logs[0] and "test accuracy" in logs[0]
    for rank, log in logs.items():
        assert [message for message in NOISE if message in log] == [], f"rank {rank}:\n{log}"
    console = result.stdout + result.stderr
    assert [message for message in NOISE if message in console] == [], console
    assert logs[0].startswith("fleetlite compile report: rank 0/2")


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


def test_a_sigkilled_ranks_report_ends_with_the_scripts_last_line_not_paddles_glog_line(tmp_path):
    result = fleetrun(["--nproc_per_node", "2", "--log_dir", "log", os.path.join(SCRIPTS, "static_mean.py"),
                       "--kill", "1"], tmp_path)
    assert result.returncode == 128 + signal.SIGKILL, result.stdout + result.stderr
    assert "last 1 lines of log/workerlog.1:\n    built a static mean\n" in result.stderr, result.stderr
    assert (tmp_path / "log" / "workerlog.1").read_text() == "built a static mean\n"
    assert paddle_noise.EMPTY_OUT not in result.stdout + result.stderr


def test_fleetrun_explains_without_paddles_glog_line_on_the_console(tmp_path):
    result = fleetrun(["--explain", os.path.join(SCRIPTS, "static_mean.py")], tmp_path)
    assert (result.returncode, result.stdout) == (0, "built a static mean\n"), result.stderr
    assert paddle_noise.EMPTY_OUT not in result.stderr, result.stderr


def test_the_line_is_spent_with_stderr_silenced_and_the_mode_is_restored():
    """Directly: after spend_the_out_tensor_line, a static op logs nothing; stderr works again and
    Paddle is back in dynamic mode. (The canary test shows the same op logs the line otherwise.)"""
    script = ("import sys, paddle\n"
              "from fleetlite.paddle_compat import quiet_warnings\n"
              "quiet_warnings.spend_the_out_tensor_line(paddle)\n"
              "print('dynamic', paddle.in_dynamic_mode(), file=sys.stderr)\n"
              "paddle.enable_static()\n"
              "paddle.mean(paddle.static.data('x', [4, 3], 'float32'))\n")
    env = {**clean_environment(), "GLOG_minloglevel": "0"}
    result = subprocess.run([sys.executable, "-W", "ignore", "-c", script], env=env, capture_output=True,
                            text=True, timeout=120)
    assert (result.returncode, result.stderr) == (0, "dynamic True\n")
