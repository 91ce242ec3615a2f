"""The compiled MSTopK selection (mstopk_select.cc) for CPU tensors: built once, cached, loaded.

Paddle's custom-operator toolchain (paddle.utils.cpp_extension) compiles the C++ source into a
shared library the first time a process needs it; the library is kept in a cache folder
($FLEETLITE_KERNEL_CACHE, default ~/.cache/fleetlite/kernels) under a name that hashes the
source, the Paddle build and the Python ABI, so an edited kernel or a new Paddle builds afresh
and every later process only loads it (milliseconds). Ranks of one node that start together take
turns through a file lock: the first builds it, in a child process with a deadline, into a
private folder, and renames the library into place (atomic); the others wait for the lock and
load that library. Where it cannot be built (no C++ compiler, a compile error, the deadline),
`load_error()` says why, once as a one-line warning, and fleetlite.compression.topk_select runs its Paddle-op
composition instead, as it does on GPUs.

Once loaded, `select` builds the op: run eagerly on an eager tensor, or appended to the PIR
program being built (custom_op.fleetlite_mstopk), which Paddle's executor runs like any other.
"""
import functools
import hashlib
import os
import platform
import shutil
import signal
import subprocess
import sys
import sysconfig
import textwrap
import threading

import paddle
from paddle.utils import cpp_extension

from fleetlite.interprocess.file_lock import FileLock

OP_NAME = "fleetlite_mstopk"
SOURCE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mstopk_select.cc")
CACHE_ENV = "FLEETLITE_KERNEL_CACHE"
COMPILE_FLAGS = ["-O3", "-g0"]
BUILD_TIMEOUT = 300.0      # seconds; measured 31-40 s on this project's 2 busy cores
_LOADING = threading.Lock()


class KernelUnavailable(Exception):
    """The compiled kernel cannot be used in this process; the message says why."""


def select(flat, k, stride, target, iterations):
    """(values, indices) of the op on a 1-D CPU tensor or PIR value (see mstopk_select.cc)."""
    values, indices = paddle._C_ops._run_custom_op(OP_NAME, flat, k, stride, target, iterations)
    return values, indices


def load_error():
    """None once the op is registered in this process; otherwise why it is not (warned once)."""
    with _LOADING:      # one registration per process, whichever thread asks first
        return _load()


@functools.cache
def _load():
    try:
        cpp_extension.load_op_meta_info_and_register_op(_built_library())
    except (KernelUnavailable, OSError, RuntimeError) as error:
        print(f"fleetlite: warning: MSTopK runs as Paddle ops, slower on CPU: {error}", file=sys.stderr)
        return str(error)
    return None


def library_path():
    """Where the library of this source for this Paddle is cached (built or not)."""
    folder = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "fleetlite", "kernels")
    return os.path.join(folder, f"{OP_NAME}-{_digest()}.so")


def _built_library():
    library = library_path()
    if not os.path.exists(library):
        with FileLock(library + ".lock", BUILD_TIMEOUT + 60, "build the MSTopK kernel", KernelUnavailable):
            if not os.path.exists(library):     # a neighbour built it while we waited
                _build(library)
    return library


def _digest():
    with open(SOURCE, "rb") as source:
        hashed = hashlib.sha256(source.read())
    for part in (paddle.version.full_version, paddle.version.commit, sys.implementation.cache_tag,
                 platform.machine(), " ".join(COMPILE_FLAGS)):
        hashed.update(part.encode())
    return hashed.hexdigest()[:16]


def _build(library):
    compiler = (os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++").split()[0]
    if shutil.which(compiler) is None:
        raise KernelUnavailable(f"no C++ compiler ({compiler!r} is not on PATH; install g++ or set CXX)")
    folder, log = library + ".build", library + ".log"
    shutil.rmtree(folder, ignore_errors=True)       # what a killed build left
    os.makedirs(folder)
    print(f"fleetlite: building the MSTopK kernel into {library} (once per Paddle version)", file=sys.stderr)
    try:
        output, status = _run_build(folder)
        built = os.path.join(folder, OP_NAME, OP_NAME + ".so")
        if status != 0 or not os.path.exists(built):
            with open(log, "w") as out:
                out.write(output)
            errors = [line for line in output.splitlines() if "error" in line.lower()] or output.splitlines()[-1:]
            cause = textwrap.shorten(errors[0], 160, placeholder=" ...") if errors else "no output"
            raise KernelUnavailable(f"building the kernel failed: {cause} (log: {log})")
        os.replace(built, library)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _run_build(folder):
    """(output, exit status) of the child that compiles into `folder`, killed at the deadline."""
    child = subprocess.Popen([sys.executable, "-m", __name__, folder], stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = child.communicate(timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(child.pid, signal.SIGKILL)        # the compiler runs in the child's session
        child.communicate()
        raise KernelUnavailable(f"building the kernel took more than {BUILD_TIMEOUT:.0f} s") from None
    return output, child.returncode


def _compile_into(folder):
    """The child's job: compile SOURCE into `folder` and load it once (a library that does not
    load fails the build rather than every later process)."""
    cpp_extension.load(OP_NAME, [SOURCE], extra_cxx_cflags=COMPILE_FLAGS, build_directory=folder)


if __name__ == "__main__":
    if len(sys.argv) == 2:
        _compile_into(sys.argv[1])
    else:
        sys.exit(f"usage: {sys.executable} -m fleetlite.compression.mstopk_kernel BUILD_FOLDER")
