"""Paddle 3.3.1 talking to itself in every worker's log, stopped where it starts.

Three messages open every worker's log and none asks anything of the user:
- "No ccache found": `import paddle` imports its custom-C++-op builder, which looks for ccache
  (a compiler cache only that builder uses) and warns when it is not installed.
  `importing_paddle()` holds that one warning while Paddle's own module runs (fleetrun's
  bootstrap wraps the script's first `import paddle` in it; `fleetlite explain` its own).
- "Paddle static graph(PIR) not support input out tensor": Paddle's Python API passes
  `out=None` to the ops in `OPS_GIVEN_EMPTY_OUT` (paddle.mean, add, multiply, softmax, ...: every
  cross_entropy loss), and the C++ binding logs this once per process for any `out` keyword in
  static mode, None included. `drop_empty_out` makes those ops drop the keyword when it is None,
  so the binding never sees it (the call means the same without it).
- "Tensor do not have 'place' interface for pir graph mode": Paddle's static backward seeds
  d(loss)/d(loss) with `full_like(loss)`, which asks the loss for its place; PIR values have
  none, and Paddle then uses the current place, as meant. `differentiating()` holds that one
  warning around fleetlite's call of the optimizer's backward.
Every other warning passes untouched: each message is held only at the call that triggers it,
never by a process-wide filter. This module imports nothing from Paddle (the bootstrap uses it
before the script imports Paddle).
"""
import contextlib
import functools
import warnings

CCACHE = "No ccache found"
PLACE = "Tensor do not have 'place' interface for pir graph mode"
# the _C_ops functions Paddle 3.3.1's Python API calls with out=out (from its source)
OPS_GIVEN_EMPTY_OUT = (
    "add", "arange", "clip", "complex", "concat", "cumprod", "cumsum", "divide", "elementwise_pow", "empty",
    "equal", "eye", "floor_divide", "gaussian", "greater_equal", "greater_than", "index_add", "index_select",
    "less_equal", "less_than", "linspace", "logical_xor", "masked_select", "mean", "median", "multinomial",
    "multiply", "nonzero", "not_equal", "pow", "prod", "randperm", "range_v2", "remainder", "searchsorted",
    "slogdet_v2", "softmax", "stack", "subtract", "svd", "take_along_axis", "topk", "trunc_divide", "uniform",
    "var", "where")


@contextlib.contextmanager
def _holding(message, **where):
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=message, category=UserWarning, **where)
        yield


def importing_paddle():
    """Around the execution of Paddle's top module: hold its "No ccache found" warning."""
    return _holding(CCACHE, module=r"paddle\.utils\.cpp_extension")


def differentiating():
    """Around the optimizer's backward: hold the warning of Paddle seeding the loss gradient."""
    return _holding(PLACE)


def drop_empty_out(ops):
    """Make the OPS_GIVEN_EMPTY_OUT functions of `ops` (paddle._C_ops) drop `out=None`. Idempotent."""
    for name in OPS_GIVEN_EMPTY_OUT:
        op = getattr(ops, name, None)
        if op is not None and not hasattr(op, "__wrapped__"):
            setattr(ops, name, _without_empty_out(op))


def _without_empty_out(op):
    @functools.wraps(op)
    def call(*args, out=None, **kwargs):
        return op(*args, **kwargs) if out is None else op(*args, out=out, **kwargs)

    return call
