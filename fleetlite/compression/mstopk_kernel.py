"""The compiled MSTopK selection (mstopk_select.cc) for CPU tensors, and the top-k exchange's
bucket ops: built once, cached, loaded (fleetlite.compile.kernel_library). Where they cannot be
built, `load_error()` says why, once as a one-line warning, and fleetlite.topk runs its Paddle-op
composition instead, as it does on GPUs (and the topk pass exchanges gradients one by one).

Once loaded, `select` (one tensor), `select_bucket` and `scatter_bucket` build the ops: run eagerly
on eager tensors, or appended to the PIR program being built (custom_op.fleetlite_mstopk and the
bucket ops), which Paddle's executor runs like any other.
"""
import os

from fleetlite.paddle_compat import quiet_warnings as paddle_noise
from fleetlite.compile.kernel_library import CACHE_ENV, KernelLibrary  # noqa: F401 (CACHE_ENV: the tests' name for it)

with paddle_noise.importing_paddle():       # a plain `import fleetlite.compression.mstopk_kernel` may be Paddle's first
    import paddle

OP_NAME = "fleetlite_mstopk"
BUCKET_SELECT = "fleetlite_topk_bucket_select"
BUCKET_SELECT_ACCUMULATED = "fleetlite_topk_bucket_select_accumulated"
BUCKET_SCATTER = "fleetlite_topk_bucket_scatter"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mstopk_select.cc")
LIBRARY = KernelLibrary(OP_NAME, SOURCE, "the MSTopK kernel", "MSTopK runs as Paddle ops, slower on CPU")
load_error = LIBRARY.load_error
library_path = LIBRARY.library_path


def select(flat, k, stride, target, iterations):
    """(values, indices) of the op on a 1-D CPU tensor or PIR value (see mstopk_select.cc)."""
    values, indices = paddle._C_ops._run_custom_op(OP_NAME, flat, k, stride, target, iterations)
    return values, indices


def select_bucket(grads, ks, strides, targets, iterations, names, residuals=None, wire_float16=False):
    """(values, int32 bucket offsets) of each gradient's top-k in one op; with `residuals` (error
    feedback, in place) followed by the residuals as the op left them (see mstopk_select.cc)."""
    if residuals is None:
        return tuple(paddle._C_ops._run_custom_op(BUCKET_SELECT, list(grads), ks, strides, targets, iterations, names))
    return tuple(paddle._C_ops._run_custom_op(BUCKET_SELECT_ACCUMULATED, list(grads), list(residuals), ks, strides,
                                              targets, iterations, names, wire_float16))


def scatter_bucket(grads, values, indices, scale):
    """The gradients, in place, as the scaled sum of the (value, bucket offset) pairs (see mstopk_select.cc)."""
    return list(paddle._C_ops._run_custom_op(BUCKET_SCATTER, list(grads), values, indices, float(scale)))
