"""Run a test's body in a child process, so a native crash fails that one test, not the suite.

    @isolated(timeout=120)
    def test_bfloat16_trains():
        ...                      # runs in a fresh Python; assertions work as usual

Paddle's bfloat16/float16 kernels can die with SIGSEGV (notes: oneDNN's bfloat16 matmul_grad);
in-process, that takes pytest and every later test down. The decorated test re-runs its own
function in a child (`python -m support.isolated FOLDER MODULE FUNCTION ARGS`), with faulthandler on; the parent
fails with the child's exit status or signal and the tail of its output (faulthandler's Python
stack and Paddle's C++ stack), and the suite goes on. Arguments (pytest parameters) must be
JSON values; fixtures are not available in the child. Every child is bounded by `timeout` and
killed with its process group.
"""
import functools
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
CHILD_ENV = {"OMP_NUM_THREADS": "1", "GLOG_minloglevel": "2"}
TAIL_LINES = 40


class ChildFailed(AssertionError):
    """The isolated body failed, crashed or ran past its deadline."""


def isolated(timeout=120):
    def decorate(function):
        @functools.wraps(function)
        def run_in_child(*args, **kwargs):
            run(function, args, kwargs, timeout)

        return run_in_child

    return decorate


def run(function, args=(), kwargs=None, timeout=120):
    """Call `function(*args, **kwargs)` in a child Python; raise ChildFailed unless it returns."""
    module = function.__module__
    folder = str(Path(function.__code__.co_filename).resolve().parent)
    command = [sys.executable, "-m", "support.isolated", folder, module, function.__qualname__,
               json.dumps({"args": list(args), "kwargs": kwargs or {}})]
    # faulthandler is switched on in the child once Paddle is imported (PYTHONFAULTHANDLER would
    # make that a no-op: enabled before Paddle's handler, then replaced by it)
    environ = {name: value for name, value in os.environ.items() if name != "PYTHONFAULTHANDLER"}
    child = subprocess.Popen(command, cwd=TESTS, env={**environ, **CHILD_ENV}, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, errors="replace", start_new_session=True)
    try:
        output, _ = child.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)
        output, _ = child.communicate()
        raise ChildFailed(f"{function.__qualname__} still running after {timeout} s (killed):\n{_tail(output)}")
    if child.returncode != 0:
        raise ChildFailed(f"{function.__qualname__} {_status(child.returncode)} in its child process:\n{_tail(output)}")


def _status(code):
    if code < 0:
        return f"died of {signal.Signals(-code).name}"
    return f"exited with {code}"


def _tail(output):
    return "\n".join(output.splitlines()[-TAIL_LINES:])


def _child_main(folder, module_name, qualname, arguments):
    import faulthandler
    import importlib

    import paddle  # noqa: F401  (installs Paddle's fatal-signal handler, which faulthandler then chains to)

    sys.path[:0] = [folder, str(TESTS)]    # the test's own folder (tests/<area>/) and the helpers'
    target = importlib.import_module(module_name)
    for part in qualname.split("."):
        target = getattr(target, part)
    faulthandler.enable()      # the Python stack first, then Paddle's handler prints the C++ stack
    call = json.loads(arguments)
    getattr(target, "__wrapped__", target)(*call["args"], **call["kwargs"])


if __name__ == "__main__":
    _child_main(*sys.argv[1:5])
