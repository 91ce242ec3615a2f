"""The timestamp operator of the step timeline (step_stamps.cc), built and loaded by
fleetlite.compile.kernel_library like the bucket and MSTopK kernels.

`stamp(value, slot)` builds one into the program being edited: in place on `value`, it records the
wall clock in `slot` when the executor reaches it; `read(count)` returns the first `count` slots
(seconds on time.time()'s clock; 0.0 for a slot never reached). Only a job that asks for a
timeline compiles these ops in (step_events).
"""
import ctypes
import functools
import os

from fleetlite.compile.kernel_library import KernelLibrary
from fleetlite.paddle_compat import quiet_warnings as paddle_noise

with paddle_noise.importing_paddle():
    import paddle

STAMP = "fleetlite_timestamp"
SLOTS = 4096
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "step_stamps.cc")
LIBRARY = KernelLibrary("fleetlite_step_stamps", SOURCE, "the step timeline's timestamp kernel",
                        "the timeline shows each step and the host time before it, no events inside the step")
load_error = LIBRARY.load_error


def stamp(value, slot):
    return paddle._C_ops._run_custom_op(STAMP, value, int(slot))[0]


@functools.cache
def _library():
    return ctypes.CDLL(LIBRARY.library_path())     # the library load_error() registered: one table


def read(count):
    values = (ctypes.c_int64 * count)()
    _library().fleetlite_timestamps(values, count)
    return [value / 1e9 for value in values]
