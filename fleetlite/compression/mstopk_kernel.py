"""The compiled MSTopK selection (mstopk_select.cc) for CPU tensors: built once, cached, loaded
(fleetlite.compile.kernel_library). Where it cannot be built, `load_error()` says why, once as a
one-line warning, and fleetlite.topk runs its Paddle-op composition instead, as it does on GPUs.

Once loaded, `select` builds the op: run eagerly on an eager tensor, or appended to the PIR
program being built (custom_op.fleetlite_mstopk), which Paddle's executor runs like any other.
"""
import os

from fleetlite.paddle_compat import quiet_warnings as paddle_noise
from fleetlite.compile.kernel_library import CACHE_ENV, KernelLibrary  # noqa: F401 (CACHE_ENV: the tests' name for it)

with paddle_noise.importing_paddle():       # a plain `import fleetlite.compression.mstopk_kernel` may be Paddle's first
    import paddle

OP_NAME = "fleetlite_mstopk"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mstopk_select.cc")
LIBRARY = KernelLibrary(OP_NAME, SOURCE, "the MSTopK kernel", "MSTopK runs as Paddle ops, slower on CPU")
load_error = LIBRARY.load_error
library_path = LIBRARY.library_path


def select(flat, k, stride, target, iterations):
    """(values, indices) of the op on a 1-D CPU tensor or PIR value (see mstopk_select.cc)."""
    values, indices = paddle._C_ops._run_custom_op(OP_NAME, flat, k, stride, target, iterations)
    return values, indices
