"""Another local user, for the shared-host tests: plant files and symlinks as `nobody`, or run
the victim as `daemon`, with setpriv (CI and developers run the tests as root).

`shared_folder` is a fresh world-writable sticky folder like /tmp (made under /tmp, since
pytest's own folders are closed to other users); `tree` lists a folder so a test can check
that nothing was written into what the attacker owns.
"""
import os
import shutil
import stat
import subprocess
import sys
import tempfile

import pytest

ATTACKER, VICTIM = "nobody", "daemon"        # nobody: uid 65534; daemon: uid 1 (Debian)
TIMEOUT_S = 60


def needs_root():
    if os.geteuid() != 0 or shutil.which("setpriv") is None:
        pytest.skip("planting files as another user needs root and setpriv")


def uid_of(user):
    import pwd
    return pwd.getpwnam(user).pw_uid


def as_user(user, argv, env=None, timeout=TIMEOUT_S, check=True):
    """Run `argv` as `user` (its own group, no supplementary groups); the CompletedProcess."""
    import pwd
    entry = pwd.getpwnam(user)
    done = subprocess.run(["setpriv", f"--reuid={entry.pw_uid}", f"--regid={entry.pw_gid}", "--clear-groups",
                           *argv], env=env, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        raise AssertionError(f"{argv} as {user} failed ({done.returncode}): {done.stderr[-2000:]}")
    return done


def plant(user, script, *args):
    """Run the Python `script` as `user` (argv[1:] = args): how the attacker sets a trap."""
    return as_user(user, [sys.executable, "-c", script, *map(str, args)])


@pytest.fixture
def shared_folder():
    """A fresh folder with /tmp's mode (1777, root's), removed after the test."""
    needs_root()
    folder = tempfile.mkdtemp(prefix="fleetlite-shared-host-", dir="/tmp")
    os.chmod(folder, 0o1777)
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def shared_subfolder(folder):
    """Another fresh folder with /tmp's mode inside `folder`."""
    inner = tempfile.mkdtemp(dir=folder)
    os.chmod(inner, 0o1777)
    return inner


def victim_file(folder, text="the victim's own secret\n"):
    """A root-owned 0600 file outside the shared folder's attacker parts, and its content."""
    path = os.path.join(folder, "victim-secret.txt")
    with open(path, "w") as out:
        out.write(text)
    os.chmod(path, 0o600)
    return path, text


def tree(folder):
    """{relative path: (owner uid, mode, size, link target or None for a folder)} of everything
    under `folder`."""
    listing = {}
    for root, folders, files in os.walk(folder):
        for name in folders + files:
            path = os.path.join(root, name)
            info = os.lstat(path)
            what = (os.readlink(path) if stat.S_ISLNK(info.st_mode) else
                    None if stat.S_ISDIR(info.st_mode) else info.st_size)
            listing[os.path.relpath(path, folder)] = (info.st_uid, stat.S_IMODE(info.st_mode), what)
    return listing
