"""Copy-free gradient buckets on CPU: backward writes each gradient straight into its bucket.

A bucket built by gradient_buckets.emit copies every byte twice per step (concat in, split
out) and allocates a fresh buffer for each; on small CPU machines those copies cost more than
the all-reduce they batch (notes/p1_gradsync_study.md: 1.54-1.67x one flat all-reduce of the
same bytes). strategies/copy_free_buckets.py replaces that with
    pack(grads, buffer, scale) -> all_reduce_(buffer) -> alias(buffer, grads)
on a persistable buffer per bucket. The operators are compiled (bucket_views.cc, built and
cached by fleetlite.compile.kernel_library):
- the pack copies a gradient into its slot of the buffer (times the 1/N scale) only when it is
  not already there, and re-points the gradient's variable at its slot;
- the gradient values are persistable variables named `<parameter>@GRAD` (zeros from the startup
  program, so every persistable value has a name and is in the scope, as Paddle's save/load and
  `list_vars()` users expect), so the executor keeps them instead of freeing them, and from the
  second step on the backward kernel writes each gradient into the
  memory it finds: its slot (Paddle reuses an output's holder when it is large enough). The
  pack then finds every member in place and only scales;
- the alias hands the optimizer each gradient's slot of the reduced buffer: the executor has
  shared each (re-pointed) gradient's memory with the alias's outputs before it runs, so the
  outputs are views; where one is not, the alias copies the slot out.
Both fall back to a copy for anything not in place, so the result is right whatever a Paddle
version does with the memory; `counts()` says how often they had to (the steady state is 0).

The bucket buffers and the kept gradients are no training state: fleetlite's saving and the
dygraph step's optimizer state skip them (`is_bucket_variable`); to Paddle's `save` the
gradients are no parameter or optimizer state either (backward writes them, not a `pd_op.data`).
"""
import ctypes
import os

from fleetlite.paddle_compat import quiet_warnings as paddle_noise, steps_plan
from fleetlite.compile.kernel_library import KernelLibrary

with paddle_noise.importing_paddle():       # a plain `import fleetlite.compile.bucket_views` may be Paddle's first
    import paddle
    from paddle.pir.core import create_persistable_value

PACK = "fleetlite_bucket_pack"
ALIAS = "fleetlite_bucket_alias"
BUFFER_PREFIX = "fleetlite_bucket_buffer"
GRADIENT_SUFFIX = "@GRAD"
DTYPES = ("float32", "float64")
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bucket_views.cc")
LIBRARY = KernelLibrary("fleetlite_bucket_views", SOURCE, "the copy-free bucket kernels",
                        "gradient buckets copy through concat and split, slower on CPU")
load_error = LIBRARY.load_error


def new_buffer(dtype, numel):
    """A persistable zero buffer of `numel` elements (created in the startup program)."""
    return create_persistable_value(dtype, [numel], paddle.utils.unique_name.generate(BUFFER_PREFIX),
                                    initializer=paddle.nn.initializer.Constant(0.0))


def new_gradient_variable(grad, param_name):
    """The name of a zero variable shaped like `grad`, created in the startup program, that
    `keep_in_scope` will make `grad` (named like Paddle's own gradients, `<parameter>@GRAD`)."""
    name = param_name + GRADIENT_SUFFIX
    with paddle.static.program_guard(paddle.static.default_startup_program()):
        initial = paddle.zeros(grad.shape, grad.dtype)
        initial.persistable = True
        paddle._C_ops.set_persistable_value(initial, name)
    return name


def can_keep_gradients(steps_per_run):
    """Whether keep_in_scope works in a program run `steps_per_run` steps per executor call."""
    return steps_plan.custom_ops_read_named_persistables(steps_per_run)


def keep_in_scope(grad, name):
    """Make `grad` the persistable variable `name`, which the executor keeps between steps (so
    backward finds its slot again). Naming it keeps Paddle's invariant that every persistable
    value has a name and is in the scope: `list_vars()` users, save and load rely on it."""
    grad.persistable = True
    paddle._C_ops.set_persistable_value(grad, name)


def pack(grads, buffer, scale):
    """The buffer, holding `grads` back to back times `scale` (see bucket_views.cc)."""
    return paddle._C_ops._run_custom_op(PACK, list(grads), buffer, float(scale))[0]


def alias(buffer, grads):
    """One value per gradient: its slot of the (reduced) `buffer`, shaped like it."""
    return list(paddle._C_ops._run_custom_op(ALIAS, buffer, list(grads)))


def is_bucket_variable(name):
    """True for the name of a variable the copy-free buckets keep (a buffer, a kept gradient):
    persistable for the run, but no checkpoint or optimizer state holds it (it is rewritten at
    every step)."""
    return name.startswith(BUFFER_PREFIX) or name.endswith(GRADIENT_SUFFIX)


def is_bucket_state(value):
    """True for what the copy-free buckets keep persistable but saving must skip."""
    return value.persistable and is_bucket_variable(value.name) if value.has_name else False


def counts():
    """{packed_in_place, packed_copied, aliased_in_place, aliased_copied}: bucket members this
    process's kernels found in place or had to copy, since the library loaded."""
    values = (ctypes.c_int64 * 4)()
    ctypes.CDLL(LIBRARY.library_path()).fleetlite_bucket_counts(values)
    return dict(zip(("packed_in_place", "packed_copied", "aliased_in_place", "aliased_copied"), values))
