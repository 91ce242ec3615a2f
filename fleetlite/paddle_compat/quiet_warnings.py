"""Paddle 3.3.1 talking to itself in every worker's log, stopped where it starts.

Three messages open every worker's log and none asks anything of the user:
- "No ccache found": `import paddle` imports its custom-C++-op builder, which looks for ccache
  (a compiler cache only that builder uses) and warns when it is not installed.
  `importing_paddle()` holds that one warning while Paddle's own module runs (fleetrun's
  bootstrap wraps the script's first `import paddle` in it; `fleetlite explain` its own).
- "Paddle static graph(PIR) not support input out tensor": Paddle's Python API passes
  `out=None` to many ops (paddle.mean, add, multiply, softmax, ...: every cross_entropy loss),
  and the C++ binding logs this through glog once per process for any `out` keyword in static
  mode, None included. fleetlite does not wrap Paddle's op bindings to hide it: the line stays
  in the worker's log file, and fleetrun's console copy of the logs drops it (`CONSOLE_DROPPED`).
- "Tensor do not have 'place' interface for pir graph mode": Paddle's static backward seeds
  d(loss)/d(loss) with `full_like(loss)`, which asks the loss for its place; PIR values have
  none, and Paddle then uses the current place, as meant. `differentiating()` holds that one
  warning around fleetlite's call of the optimizer's backward.
Every other warning passes untouched: each message is held only at the call that triggers it,
never by a process-wide filter. This module imports nothing from Paddle (the bootstrap uses it
before the script imports Paddle).
"""
import contextlib
import warnings

from fleetlite.paddle_compat.version_gate import needed

CCACHE = "No ccache found"
PLACE = "Tensor do not have 'place' interface for pir graph mode"
EMPTY_OUT = "Paddle static graph(PIR) not support input out tensor"
# worker log lines fleetrun's console does not show (the log files keep them)
CONSOLE_DROPPED = (EMPTY_OUT,) if needed("out tensor glog line") else ()


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
