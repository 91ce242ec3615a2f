"""Small compiled CPU operators (a C++ source next to the module that uses it): built once,
cached, loaded.

Paddle's custom-operator toolchain (paddle.utils.cpp_extension) compiles the C++ source into a
shared library the first time a process needs it; the library is kept in a cache folder
($FLEETLITE_KERNEL_CACHE, default ~/.cache/fleetlite/kernels) under a name that hashes the
source, the Paddle build and the Python ABI, so an edited kernel or a new Paddle builds afresh
and every later process only loads it (milliseconds). Ranks of one node that start together take
turns through a file lock: the first builds it, in a child process with a deadline, into a
private folder, and renames the library into place (atomic); the others wait for the lock and
load that library. Where it cannot be built (no C++ compiler, a compile error, the deadline),
`load_error()` says why, once as a one-line warning, and the caller runs its Paddle-op
composition instead.

Loading a library runs its code, so the cache folder must be this user's alone: it (and every
folder above it) is checked as fleetlite.interprocess.private_paths says, and a library is
loaded only if it is a regular file of this user that nobody else can write. A cache folder
another user controls (a shared $FLEETLITE_KERNEL_CACHE) is refused the same way as a failed
build: one warning naming the path, and the Paddle-op composition runs.
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

from fleetlite.paddle_compat import quiet_warnings as paddle_noise
from fleetlite.interprocess.file_lock import FileLock
from fleetlite.interprocess.private_paths import open_private_file, trusted_folder

with paddle_noise.importing_paddle():       # a plain import of this module may be Paddle's first
    import paddle
    from paddle.utils import cpp_extension

CACHE_ENV = "FLEETLITE_KERNEL_CACHE"
COMPILE_FLAGS = ["-O3", "-g0"]
BUILD_TIMEOUT = 300.0      # seconds; measured 31-40 s on this project's 2 busy cores
_LOADING = threading.Lock()


class KernelUnavailable(Exception):
    """The compiled kernel cannot be used in this process; the message says why."""


class KernelLibrary:
    """The operators of one C++ source. `title` names them in messages ("the MSTopK kernel");
    `fallback` says what runs without them ("MSTopK runs as Paddle ops, slower on CPU")."""

    def __init__(self, name, source, title, fallback, headers=None):
        self.name, self.source, self.title, self.fallback = name, source, title, fallback
        self.headers = dict(headers or {})   # {include path: text}: stubs of headers the wheel lacks

    def load_error(self):
        """None once the operators are registered in this process; otherwise why they are not
        (warned once)."""
        with _LOADING:      # one registration per process, whichever thread asks first
            return self._load()

    @functools.cache
    def _load(self):
        try:
            cpp_extension.load_op_meta_info_and_register_op(self._built_library())
        except (KernelUnavailable, OSError, RuntimeError) as error:
            print(f"fleetlite: warning: {self.fallback}: {error}", file=sys.stderr)
            return str(error)
        return None

    def library_path(self):
        """Where the library of this source for this Paddle is cached (built or not)."""
        folder = os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "fleetlite", "kernels")
        return os.path.join(folder, f"{self.name}-{self._digest()}.so")

    def _built_library(self):
        library = self.library_path()
        trusted_folder(os.path.dirname(library), KernelUnavailable)
        if not os.path.lexists(library):
            with FileLock(library + ".lock", BUILD_TIMEOUT + 60, f"build {self.title}", KernelUnavailable):
                if not os.path.lexists(library):     # a neighbour built it while we waited
                    self._build(library)
        os.close(open_private_file(library, os.O_RDONLY, KernelUnavailable))    # ours, and only ours to change
        return library

    def _digest(self):
        with open(self.source, "rb") as source:
            hashed = hashlib.sha256(source.read())
        for part in (paddle.version.full_version, paddle.version.commit, sys.implementation.cache_tag,
                     platform.machine(), " ".join(COMPILE_FLAGS), *sorted(self.headers.items())):
            hashed.update(str(part).encode())
        return hashed.hexdigest()[:16]

    def _build(self, library):
        compiler = (os.environ.get("CXX") or sysconfig.get_config_var("CXX") or "c++").split()[0]
        if shutil.which(compiler) is None:
            raise KernelUnavailable(f"no C++ compiler ({compiler!r} is not on PATH; install g++ or set CXX)")
        folder, log = library + ".build", library + ".log"
        shutil.rmtree(folder, ignore_errors=True)       # what a killed build left
        os.makedirs(folder)
        print(f"fleetlite: building {self.title} into {library} (once per Paddle version)", file=sys.stderr)
        try:
            output, status = self._run_build(folder)
            built = os.path.join(folder, self.name, self.name + ".so")
            if status != 0 or not os.path.exists(built):
                with open(log, "w") as out:
                    out.write(output)
                errors = [line for line in output.splitlines() if "error" in line.lower()] or output.splitlines()[-1:]
                cause = textwrap.shorten(errors[0], 160, placeholder=" ...") if errors else "no output"
                raise KernelUnavailable(f"building the kernel failed: {cause} (log: {log})")
            os.replace(built, library)
        finally:
            shutil.rmtree(folder, ignore_errors=True)

    def _run_build(self, folder):
        """(output, exit status) of the child that compiles into `folder`, killed at the deadline."""
        child = subprocess.Popen([sys.executable, "-m", __name__, self.name, self.source, folder,
                                  *self._include_flags(folder)],
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
        try:
            output, _ = child.communicate(timeout=BUILD_TIMEOUT)
        except subprocess.TimeoutExpired:
            os.killpg(child.pid, signal.SIGKILL)        # the compiler runs in the child's session
            child.communicate()
            raise KernelUnavailable(f"building the kernel took more than {BUILD_TIMEOUT:.0f} s") from None
        return output, child.returncode

    def _include_flags(self, folder):
        """The -I flag of the stub headers, written under the build `folder` (none without them)."""
        if not self.headers:
            return []
        include = os.path.join(folder, "include")
        for path, text in self.headers.items():
            os.makedirs(os.path.dirname(os.path.join(include, path)), exist_ok=True)
            with open(os.path.join(include, path), "w") as header:
                header.write(text)
        return [f"-I{include}"]


def _compile_into(name, source, folder, *include_flags):
    """The child's job: compile `source` into `folder` and load it once (a library that does not
    load fails the build rather than every later process)."""
    cpp_extension.load(name, [source], extra_cxx_cflags=COMPILE_FLAGS + list(include_flags), build_directory=folder)


if __name__ == "__main__":
    if len(sys.argv) >= 4:
        _compile_into(*sys.argv[1:])
    else:
        sys.exit(f"usage: {sys.executable} -m fleetlite.compile.kernel_library NAME SOURCE BUILD_FOLDER [-IDIR ...]")
