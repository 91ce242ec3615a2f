"""Building and running a PIR program from a dygraph script (fleet.train_step), around two gaps of
Paddle 3.3.

- The PIR executor reads and writes an LRScheduler's value in `global_scope()`, whatever scope
  `Executor.run` is given: a program run in a scope of its own fails with "Variable
  learning_rate_0 is not found in scope". `static_mode(scope)` makes that scope the global one.
- An optimizer built in dygraph (`parameters=model.parameters()`) keeps the eager parameters in
  `_parameter_list`, and `minimize` in a static program hands them to backward, which fails
  ("Value Wrapper is only support None and pir.Value"). `eager_parameters_hidden(optimizer)`
  hides them while the program's update is built.

Static mode itself is no workaround: PIR programs are built there, and Paddle 3.3's Executor runs
them only there.
"""
import contextlib

import paddle

from fleetlite.paddle_compat.version_gate import needed


@contextlib.contextmanager
def static_mode(scope=None):
    """Static mode, with `scope` (if given) as the global scope while the LR scheduler needs it."""
    paddle.enable_static()
    try:
        global_scope = scope is not None and needed("LR scheduler in the global scope")
        with paddle.static.scope_guard(scope) if global_scope else contextlib.nullcontext():
            yield
    finally:
        paddle.disable_static()


@contextlib.contextmanager
def eager_parameters_hidden(optimizer):
    """Build with the optimizer's eager parameter list hidden: backward must see the program's."""
    if not needed("eager parameter list"):
        yield
        return
    saved, optimizer._parameter_list = optimizer._parameter_list, None
    try:
        yield
    finally:
        optimizer._parameter_list = saved
