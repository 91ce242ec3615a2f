"""Port locks on a host shared with other users (issue 25, item 1): another user plants a
folder or a symlink where fleetrun keeps its locks, holds locks of its own, or made the folder
first; fleetrun neither writes through the trap nor dies with a traceback, and nothing is
written into what the attacker owns."""
import os
import subprocess
import sys
import tempfile

import pytest

from fleetlite.errors import LaunchError
from fleetlite.launcher import ports
from support.other_users import (ATTACKER, VICTIM, as_user, plant, shared_folder, shared_subfolder,  # noqa: F401
                                 tree, uid_of, victim_file)

PORT = 6190
NO_TCP = ("/nonexistent/tcp", "/nonexistent/tcp6")       # no socket in use: only the locks decide

SYMLINKED_LOCK = """
import os, sys
folder = os.path.join(sys.argv[1], f"fleetlite-{sys.argv[2]}", "ports")
os.makedirs(folder, mode=0o777)
os.chmod(os.path.dirname(folder), 0o777)
os.chmod(folder, 0o777)
os.symlink(sys.argv[3], os.path.join(folder, f"{sys.argv[4]}.lock"))
"""


@pytest.fixture
def temp_is(monkeypatch):
    def point_at(folder):
        monkeypatch.setattr(tempfile, "tempdir", folder)
    return point_at


def test_locks_live_in_a_private_folder_of_the_user(shared_folder, temp_is):
    temp_is(shared_folder)
    reservation = ports.reserve_free_port(PORT, "job-a", tables=NO_TCP)
    try:
        mine = os.path.join(shared_folder, f"fleetlite-{os.geteuid()}")
        assert reservation.port == PORT
        assert tree(shared_folder) == {
            f"fleetlite-{os.geteuid()}": (0, 0o700, None),
            f"fleetlite-{os.geteuid()}/ports": (0, 0o700, None),
            f"fleetlite-{os.geteuid()}/ports/{PORT}.lock": (0, 0o600, len(f"pid {os.getpid()} job job-a\n"))}
        assert os.path.isdir(mine)
    finally:
        reservation.release()


def test_a_planted_folder_and_symlinked_lock_are_refused_in_one_line(shared_folder, temp_is, tmp_path):
    """The reproduced attack: the folder made first by another user, the lock a symlink to a file
    of the victim's. The victim's file keeps its content, the attacker's folder gets nothing."""
    secret, text = victim_file(tmp_path)
    plant(ATTACKER, SYMLINKED_LOCK, shared_folder, os.geteuid(), secret, PORT)
    before = tree(shared_folder)
    temp_is(shared_folder)
    with pytest.raises(LaunchError) as refused:
        ports.reserve_free_port(PORT, "job-a", tables=NO_TCP)
    folder = os.path.join(shared_folder, f"fleetlite-{os.geteuid()}")
    assert str(refused.value) == (f"{folder} belongs to user {ATTACKER} (uid {uid_of(ATTACKER)}), not to you: another "
                                  f"user may control it; remove it, or point fleetlite at a folder of your own")
    assert open(secret).read() == text
    assert tree(shared_folder) == before


def test_a_symlink_in_place_of_the_private_folder_is_refused(shared_folder, temp_is, tmp_path):
    target = tmp_path / "elsewhere"
    target.mkdir(mode=0o700)
    plant(ATTACKER, "import os, sys; os.symlink(sys.argv[1], sys.argv[2])",
          target, os.path.join(shared_folder, f"fleetlite-{os.geteuid()}"))
    temp_is(shared_folder)
    with pytest.raises(LaunchError, match=r"fleetlite-0 is a symlink: another user may control it"):
        ports.reserve_free_port(PORT, "job-a", tables=NO_TCP)
    assert list(target.iterdir()) == []


def test_a_private_folder_opened_to_others_is_refused(shared_folder, temp_is):
    """Made by us but opened (0755) since: whatever it holds may not be ours alone any more."""
    os.mkdir(os.path.join(shared_folder, f"fleetlite-{os.geteuid()}"), 0o755)
    os.chmod(os.path.join(shared_folder, f"fleetlite-{os.geteuid()}"), 0o755)
    temp_is(shared_folder)
    with pytest.raises(LaunchError, match=r"fleetlite-0 is open to others \(mode 0755, not 0700\)"):
        ports.reserve_free_port(PORT, "job-a", tables=NO_TCP)


HOLD_LOCK = """
import sys, tempfile, time
tempfile.tempdir = sys.argv[1]
from fleetlite.launcher import ports
held = [ports.reserve_port(int(sys.argv[2]) + i, "hoarder", "", tables=("/nonexistent", "/nonexistent")) for i in range(3)]
print("holding", flush=True)
time.sleep(60)
"""


def test_another_users_locks_do_not_block_a_launch(shared_folder, temp_is):
    """The attacker holds the locks of the next ports in its own folder: ours are not theirs."""
    import pwd
    attacker = pwd.getpwnam(ATTACKER)
    hoarder = subprocess.Popen(["setpriv", f"--reuid={attacker.pw_uid}", f"--regid={attacker.pw_gid}",
                                "--clear-groups", sys.executable, "-c", HOLD_LOCK, shared_folder, str(PORT)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert hoarder.stdout.readline() == "holding\n", hoarder.stderr.read()
        temp_is(shared_folder)
        reservation = ports.reserve_free_port(PORT, "job-a", tables=NO_TCP)
        assert reservation.port == PORT
        reservation.release()
    finally:
        hoarder.kill()
        hoarder.wait(timeout=10)


VICTIM_RESERVES = """
import sys, tempfile
tempfile.tempdir = sys.argv[1]
from fleetlite.errors import LaunchError
from fleetlite.launcher import ports
try:
    ports.reserve_free_port(int(sys.argv[2]), "job-v", tables=("/nonexistent", "/nonexistent"))
except LaunchError as error:
    sys.exit(f"fleetrun: error: {error}")
print("reserved")
"""


def test_an_unprivileged_victim_gets_one_line_not_a_permission_error(shared_folder):
    """As the issue reproduced it: two ordinary users; the second one's folder was made by the
    first. Before, a raw PermissionError traceback; now one line naming the folder."""
    victim_uid = uid_of(VICTIM)
    plant(ATTACKER, "import os, sys; os.mkdir(sys.argv[1], 0o700)",
          os.path.join(shared_folder, f"fleetlite-{victim_uid}"))
    done = as_user(VICTIM, [sys.executable, "-c", VICTIM_RESERVES, shared_folder, str(PORT)], check=False)
    folder = os.path.join(shared_folder, f"fleetlite-{victim_uid}")
    assert (done.returncode, done.stdout) == (1, "")
    assert done.stderr == (f"fleetrun: error: {folder} belongs to user {ATTACKER} (uid {uid_of(ATTACKER)}), not to "
                           f"you: another user may control it; remove it, or point fleetlite at a folder of your "
                           f"own\n")
    clean = as_user(VICTIM, [sys.executable, "-c", VICTIM_RESERVES, shared_subfolder(shared_folder), str(PORT)],
                    check=False)
    assert (clean.returncode, clean.stdout) == (0, "reserved\n"), clean.stderr
