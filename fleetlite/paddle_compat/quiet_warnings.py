"""Paddle 3.3.1 talking to itself in every worker's log, stopped where it starts.

Three messages open every worker's log and none asks anything of the user:
- "No ccache found": `import paddle` imports its custom-C++-op builder, which looks for ccache
  (a compiler cache only that builder uses) and warns when it is not installed.
  `importing_paddle()` holds that one warning while Paddle's own module runs (fleetrun's
  bootstrap wraps the script's first `import paddle` in it; `fleetlite explain` its own).
- "Paddle static graph(PIR) not support input out tensor": Paddle's Python API passes
  `out=None` to many ops (paddle.mean, add, multiply, softmax, ...: every cross_entropy loss),
  and the C++ binding logs this through glog once per process for any `out` keyword in static
  mode, None included. fleetlite does not wrap Paddle's op bindings to hide it:
  `spend_the_out_tensor_line` (fleetrun's bootstrap calls it right after the script's
  `import paddle`) builds one static op in a throwaway program while stderr points at
  /dev/null, so glog's one line goes nowhere and the script's ops find it already logged.
- "Tensor do not have 'place' interface for pir graph mode": Paddle's static backward seeds
  d(loss)/d(loss) with `full_like(loss)`, which asks the loss for its place; PIR values have
  none, and Paddle then uses the current place, as meant. `differentiating()` holds that one
  warning around fleetlite's call of the optimizer's backward.
Every other warning passes untouched: each message is held only at the call that triggers it,
never by a process-wide filter. This module imports nothing from Paddle (the bootstrap uses it
before the script imports Paddle; `spend_the_out_tensor_line` is handed the module).
"""
import contextlib
import os
import sys
import warnings

from fleetlite.paddle_compat.version_gate import needed

CCACHE = "No ccache found"
PLACE = "Tensor do not have 'place' interface for pir graph mode"
EMPTY_OUT = "Paddle static graph(PIR) not support input out tensor"


@contextlib.contextmanager
def _holding(message, **where):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=message, category=UserWarning, **where)
        yield


def importing_paddle():
    """Around the execution of Paddle's top module: hold its "No ccache found" warning."""
    if not needed("ccache warning"):
        return contextlib.nullcontext()
    return _holding(CCACHE, module=r"paddle\.utils\.cpp_extension")


def differentiating():
    """Around the optimizer's backward: hold the warning of Paddle seeding the loss gradient."""
    if not needed("place warning"):
        return contextlib.nullcontext()
    return _holding(PLACE)


@contextlib.contextmanager
def _stderr_to_nowhere():
    """fd 2 (where glog writes) points at /dev/null inside; Python's pending stderr goes out first."""
    sys.stderr.flush()
    saved, nowhere = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(nowhere, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(nowhere)


def spend_the_out_tensor_line(paddle):
    """Have glog log its once-per-process EMPTY_OUT line where no one reads it: one static
    `paddle.mean` in a throwaway program, stderr silenced, the static/dynamic mode restored."""
    if not needed("out tensor glog line"):
        return
    was_dynamic = paddle.in_dynamic_mode()
    paddle.enable_static()
    try:
        with _stderr_to_nowhere(), paddle.utils.unique_name.guard(), \
                paddle.static.program_guard(paddle.static.Program(), paddle.static.Program()):
            paddle.mean(paddle.static.data("fleetlite_out_tensor_line", [1], "float32"))
    finally:
        if was_dynamic:
            paddle.disable_static()
