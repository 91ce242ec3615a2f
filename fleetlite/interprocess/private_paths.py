"""Folders and files that only this user can change: where fleetlite keeps what it trusts on a
shared host.

Another local user may create a name before us in a shared folder (/tmp, /dev/shm), plant a
symlink there, or own a folder above ours and swap what is in it. So a folder fleetlite keeps
locks, caches or libraries in must be a real folder (not a symlink), owned by this user and
writable by nobody else, and every folder above it must be owned by root or this user and,
when others may write it, sticky (/tmp, /dev/shm): then nobody else can rename or replace what
lies below. Folders fleetlite creates are 0700, files 0600 (O_EXCL or O_NOFOLLOW). A folder
that fails a check is refused with one line naming the path, its owner and mode, and the fix.
"""
import errno
import os
import pwd
import stat
import tempfile


class UnsafePathError(Exception):
    """A path another user could change; the message names it and the fix."""


def _owner(uid):
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def _folder_problem(info, me, leaf):
    """Why a folder with lstat `info` on the way to (leaf: at) a trusted path cannot be trusted
    by user `me`, or None."""
    if stat.S_ISLNK(info.st_mode):
        return "is a symlink"
    others_write = info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    if leaf:
        if info.st_uid != me:
            return f"belongs to {_owner(info.st_uid)}, not to you"
        if others_write:
            return f"is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
        return None
    if info.st_uid not in (0, me):
        return f"belongs to {_owner(info.st_uid)}"
    if others_write and not info.st_mode & stat.S_ISVTX:
        return f"is writable by others and not sticky (mode {stat.S_IMODE(info.st_mode):04o})"
    return None


def _make_and_check(path, me, error, leaf, below):
    """Walk down to `path` as the kernel does, creating each missing folder 0700 and checking
    each one before anything is made inside it (so nothing is ever created in a folder another
    user controls). A symlink on the way counts only if root or `me` owns it; its target is
    checked in turn."""
    parent = os.path.dirname(path)
    if parent != path:
        _make_and_check(parent, me, error, False, below)
    if not os.path.lexists(path):
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode) and not leaf and info.st_uid in (0, me):
        _make_and_check(os.path.realpath(path), me, error, False, below)
        return
    if not stat.S_ISDIR(info.st_mode) and not stat.S_ISLNK(info.st_mode):    # a plain mistake: said as mkdir would
        code = errno.EEXIST if leaf else errno.ENOTDIR
        raise OSError(code, os.strerror(code), path)
    problem = _folder_problem(info, me, leaf)
    if problem and leaf:
        raise error(f"{path} {problem}: another user may control it; remove it, or point fleetlite at a "
                    f"folder of your own")
    if problem:
        raise error(f"{path} (on the way to {below}) {problem}: another user may control what lies below it; "
                    f"use a folder of your own")


def trusted_folder(path, error=UnsafePathError, private=False):
    """`path` (made absolute, `~` expanded), created 0700 with its missing parents when absent,
    after checking that nobody but this user can change it or what lies below it: `error`
    otherwise. `private` also refuses a folder others may read or enter (mode & 077): for a
    folder fleetlite names directly inside a shared one."""
    path = os.path.abspath(os.path.expanduser(os.fspath(path)))
    _make_and_check(path, os.geteuid(), error, True, path)
    mode = stat.S_IMODE(os.lstat(path).st_mode)
    if private and mode & 0o077:
        raise error(f"{path} is open to others (mode {mode:04o}, not 0700): another user may have used it; "
                    f"remove it, or point fleetlite at a folder of your own")
    return path


def user_temp_folder(error=UnsafePathError, shared=None):
    """This user's private folder in the shared temporary folder (`shared`, default the
    system's: $TMPDIR or /tmp): `<shared>/fleetlite-<uid>`, mode 0700, owner and mode checked."""
    shared = shared or tempfile.gettempdir()
    return trusted_folder(os.path.join(shared, f"fleetlite-{os.geteuid()}"), error, private=True)


def open_private_file(path, flags, error=UnsafePathError):
    """os.open of `path` (inside a trusted folder) that never follows a symlink and creates
    files 0600; an existing file must be a regular file of this user that others cannot
    write. Returns the descriptor."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    except OSError as failure:
        if failure.errno == errno.ELOOP:     # O_NOFOLLOW met a symlink
            raise error(f"{path} is a symlink: another user may control it; remove it") from None
        raise
    info = os.fstat(fd)
    problem = None
    if not stat.S_ISREG(info.st_mode):
        problem = "is not a regular file"
    elif info.st_uid != os.geteuid():
        problem = f"belongs to {_owner(info.st_uid)}, not to you"
    elif info.st_mode & (stat.S_IWGRP | stat.S_IWOTH):
        problem = f"is writable by others (mode {stat.S_IMODE(info.st_mode):04o})"
    if problem:
        os.close(fd)
        raise error(f"{path} {problem}: another user may control it; remove it")
    return fd
