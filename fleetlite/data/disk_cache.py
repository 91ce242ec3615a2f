"""The disk level of the sample cache: local copies of source files under `cache_dir`.

The first read of a file copies its bytes from the (slow) source into the cache; later reads,
by this job or the next one on the same node, read the copy. A copy is written to a temporary
file and renamed into place, so a killed process never leaves a torn entry (the rename is
atomic on POSIX file systems; a power loss is not covered: there is no fsync). Ranks of one
node copy each file once between them: a per-file lock makes the second rank wait for the
first and then read its copy. Temporary files of dead processes are removed when a cache opens.

The cache is trusted: its folder must belong to this user and be writable by nobody else (the
default, `~/.cache/fleetlite/samples`, is made 0700), checked with every folder above it before
anything is read or written (fleetlite.interprocess.private_paths), so another user can neither
serve planted entries as hits, nor link an entry to a file of ours, nor receive our copies.
Copies are written 0600 without following symlinks.
"""
import contextlib
import hashlib
import itertools
import os
import threading

from fleetlite.data.sources import checked_name
from fleetlite.errors import DataError
from fleetlite.interprocess.file_lock import FileLock
from fleetlite.interprocess.private_paths import open_private_file, trusted_folder
from fleetlite.proto import strategy_pb2
from fleetlite.interprocess.process_liveness import process_exists

ENTRIES, LOCKS, PARTIAL = "entries", "locks", "partial"
DEFAULT_CACHE_DIR = strategy_pb2.DataConfig().cache_dir     # per user: ~/.cache/fleetlite/samples


@contextlib.contextmanager
def cache_dir_errors(folder):
    """An OS error on the cache folder (a file in its place, no permission, a full disk) as one
    line naming data_configs.cache_dir and the path, instead of a traceback from deep inside a read."""
    try:
        yield
    except OSError as error:
        cause = error.strerror or str(error)
        if isinstance(error, (FileExistsError, NotADirectoryError)):
            cause += ", a file stands where the cache needs a folder"
        where = f" ({error.filename})" if error.filename and error.filename != folder else ""
        raise DataError(f"data_configs.cache_dir {folder} cannot be used: {cause}{where}; set cache_dir to a "
                        f"local folder this process can create and write") from None


def cache_folder_path(folder):
    """`folder` as the cache uses it: `~` expanded, absolute."""
    return os.path.abspath(os.path.expanduser(os.fspath(folder)))


def make_cache_dir(folder, *parts):
    """`folder` (absolute) with its sub-folders `parts`, created 0700 or checked to be this user's
    alone; else the DataError of cache_dir_errors, or one naming the folder another user controls."""
    folder = cache_folder_path(folder)

    def unsafe(why):
        return DataError(f"data_configs.cache_dir {folder} cannot be used: {why}")

    with cache_dir_errors(folder):
        for path in (folder, *(os.path.join(folder, part) for part in parts)):
            trusted_folder(path, unsafe)
    return folder


class DiskCache:
    """Copies of `source`'s files under `folder`; `read(name)` returns (bytes, hit)."""

    def __init__(self, folder, source, lock_timeout=300.0):
        self.folder = make_cache_dir(folder, ENTRIES, LOCKS, PARTIAL)
        self.source, self.lock_timeout = source, lock_timeout
        self._counter = itertools.count()
        self._remove_partial_copies_of_dead_processes()

    def entry_path(self, name):
        return os.path.join(self.folder, ENTRIES, checked_name(name))

    def read(self, name):
        """The bytes of `name` and whether they came from the cache (False: copied from the source)."""
        entry, hit = self.local_path(name)
        with cache_dir_errors(self.folder):
            with os.fdopen(open_private_file(entry, os.O_RDONLY, DataError), "rb") as handle:
                return handle.read(), hit

    def local_path(self, name):
        """(path of the local copy, hit): the copy is made first when missing."""
        entry = self.entry_path(name)
        if os.path.exists(entry):
            return entry, True
        with contextlib.ExitStack() as held:
            with cache_dir_errors(self.folder):    # the lock file lives in the cache folder too
                held.enter_context(self._file_lock(name))
            if os.path.exists(entry):       # a neighbour copied it while we waited
                return entry, True
            data = self.source.read(name)
            partial = os.path.join(self.folder, PARTIAL,
                                   f"{os.getpid()}-{threading.get_ident()}-{next(self._counter)}")
            with cache_dir_errors(self.folder):
                os.makedirs(os.path.dirname(entry), exist_ok=True)
                fresh = open_private_file(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, DataError)
                with os.fdopen(fresh, "wb") as out:
                    out.write(data)
                os.replace(partial, entry)
        return entry, False

    def _file_lock(self, name):
        digest = hashlib.sha1(checked_name(name).encode()).hexdigest()
        return FileLock(os.path.join(self.folder, LOCKS, digest[:2], digest), self.lock_timeout,
                        f"copy {name!r} into the disk cache", DataError)

    def _remove_partial_copies_of_dead_processes(self):
        folder = os.path.join(self.folder, PARTIAL)
        for name in os.listdir(folder):
            pid = name.split("-", 1)[0]
            if pid.isdigit() and not process_exists(int(pid)):
                try:
                    os.unlink(os.path.join(folder, name))
                except FileNotFoundError:
                    pass
