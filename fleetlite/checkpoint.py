"""Checkpoint directories written once, by the first worker, atomically.

Saving is a local operation of the calling rank, as in Paddle's Fleet: no collective inside,
so the Fleet idiom works,

    if fleet.is_first_worker():
        fleet.save_persistables(exe, dirname, main_program)
    fleet.util.barrier()

and so does every rank calling the save: the first worker writes, the others return at once
without writing. (Paddle 3's collective Fleet saves nothing at all: its CollectiveRuntime keeps
RuntimeBase's empty `_save_persistables`; Fleet 1.x's collective mode saved on whichever rank
called, hence the idiom.) Ranks that read the checkpoint afterwards wait for the first worker
with the script's own `fleet.util.barrier()`, as in Fleet. A failed write raises on the first
worker only, whose failure ends the job under fleetrun.

The first worker writes the checkpoint into a hidden directory beside the target
(`.<name>.partial-XXXX`), flushes it to disk, and puts it in place with one rename: where the
target already exists, the two directories are exchanged atomically (Linux renameat2
RENAME_EXCHANGE) and the previous one is deleted. So the target holds either the previous
checkpoint or the complete new one, never a half-written one, even when the writer is killed
(a killed write leaves only the hidden partial directory, named with the writer's process id,
and the next save beside it deletes it once that process is gone). On a file
system without the exchange, the previous checkpoint is first renamed aside to
`.<name>.previous-XXXX`: a kill between the two renames leaves it there, complete.
"""
import ctypes
import glob
import os
import shutil
import tempfile

from fleetlite.errors import FleetliteError
from fleetlite.process_liveness import process_exists

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2


def save_once(topology, dirname, write):
    """On the first worker, `write(directory)` fills a fresh directory that becomes `dirname`;
    on the other ranks nothing happens."""
    if topology.rank == 0:
        write_atomically(dirname, write)


def write_atomically(dirname, write):
    target = os.path.abspath(dirname)
    parent, name = os.path.split(target)
    if os.path.exists(target) and not os.path.isdir(target):
        raise FleetliteError(f"cannot save a checkpoint to {dirname}: it is a file; pass a directory path")
    os.makedirs(parent, exist_ok=True)
    _remove_abandoned_partials(parent, name)
    staging = tempfile.mkdtemp(prefix=f".{name}.partial-{os.getpid()}-", dir=parent)
    try:
        write(staging)
        _flush_tree(staging)
        if os.path.isdir(target):
            _replace_directory(staging, target, parent, name)
        else:
            os.rename(staging, target)
        _flush(parent)
    finally:
        shutil.rmtree(staging, ignore_errors=True)   # the partial write, or the previous checkpoint


def _remove_abandoned_partials(parent, name):
    """Delete partial writes of `name` whose writer process no longer exists (killed saves)."""
    for partial in glob.glob(os.path.join(glob.escape(parent), f".{glob.escape(name)}.partial-*-*")):
        writer = os.path.basename(partial)[len(f".{name}.partial-"):].split("-", 1)[0]
        if writer.isdigit() and not process_exists(int(writer)):
            shutil.rmtree(partial, ignore_errors=True)


def _replace_directory(staging, target, parent, name):
    """Put `staging` at `target`; `staging` then holds the previous checkpoint."""
    libc = ctypes.CDLL(None, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is not None and renameat2(_AT_FDCWD, os.fsencode(staging), _AT_FDCWD,
                                           os.fsencode(target), _RENAME_EXCHANGE) == 0:
        return
    previous = tempfile.mkdtemp(prefix=f".{name}.previous-", dir=parent)
    os.rename(target, previous)        # onto the empty directory
    os.rename(staging, target)
    os.rename(previous, staging)       # so the caller deletes it (staging's name is free again)


def _flush_tree(root):
    for folder, _, files in os.walk(root):
        for file_name in files:
            _flush(os.path.join(folder, file_name))
        _flush(folder)


def _flush(path):
    descriptor = os.open(path, os.O_RDONLY)
    try:
        os.fsync(descriptor)
    finally:
        os.close(descriptor)
