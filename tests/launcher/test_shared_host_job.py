"""A whole fleetrun job on a host shared with another user (issue 25): the attacker (`nobody`)
plants folders, entries and symlinks at the paths a job uses, in a shared temporary folder like
/tmp. The job either reads and fits exactly what the clean run did, or stops with one line
naming the path; the victim's file keeps its content and nothing lands in the attacker's
folders. The victim is root here (CI's user): its memory store lives in /dev/shm/fleetlite-0,
which the tests leave alone (tests/data/test_shared_host_cache.py plants there instead)."""
import json
import os

import numpy as np
import pytest

from fleetlite.launcher.plan import job_port
from support.multiprocess import SCRIPTS, fleetrun
from support.other_users import ATTACKER, plant, shared_folder, shared_subfolder, tree, uid_of, victim_file  # noqa: F401

SCRIPT = os.path.join(SCRIPTS, "read_through_cache.py")
SAMPLES = 6

SYMLINKED_LOCKS = """
import os, sys
shared, secret, first, *folders = sys.argv[1:]
for folder in folders:
    os.makedirs(os.path.join(shared, folder), mode=0o777, exist_ok=True)
    os.chmod(os.path.join(shared, folder), 0o777)
    if folder.endswith("ports"):
        for port in range(int(first), int(first) + 8):
            os.symlink(secret, os.path.join(shared, folder, f"{port}.lock"))
"""

PLANTED_CACHE = """
import os, sys
cache, secret = sys.argv[1], sys.argv[2]
os.makedirs(os.path.join(cache, "entries"), mode=0o777)
for folder in (cache, os.path.join(cache, "entries")):
    os.chmod(folder, 0o777)
with open(os.path.join(cache, "entries", "0.bin"), "wb") as planted:
    planted.write(bytes(16))
os.symlink(secret, os.path.join(cache, "entries", "1.bin"))
"""


@pytest.fixture
def source(tmp_path):
    folder = tmp_path / "source"
    folder.mkdir()
    for i in range(SAMPLES):
        (np.arange(4, dtype=np.float32) * (i + 1) + i * i).tofile(folder / f"{i}.bin")
    return folder


def run(tmp_path, name, temp, *args):
    """fleetrun of the cache-reading script with TMPDIR=`temp` and a fresh HOME of the victim's;
    (exit status, stderr, {rank: result})."""
    home, out = tmp_path / f"{name}-home", tmp_path / f"{name}-out"
    home.mkdir()
    out.mkdir()
    done = fleetrun(["--nproc_per_node", "2", "--job_id", f"shared-host-{name}", "--log_dir", str(tmp_path / name),
                     SCRIPT, *map(str, args[:1]), str(out), *map(str, args[1:])], cwd=tmp_path,
                    prefix=["env", f"HOME={home}", f"TMPDIR={temp}"])
    results = {int(f.name[4]): json.loads(f.read_text()) for f in out.iterdir()}
    return done.returncode, done.stderr, results


def test_planted_old_paths_change_nothing_and_a_planted_private_folder_stops_fleetrun(tmp_path, shared_folder, source):
    secret, text = victim_file(tmp_path)
    clean_status, clean_err, clean = run(tmp_path, "clean", shared_subfolder(shared_folder), source)
    assert clean_status == 0, clean_err
    features = np.stack([np.fromfile(source / f"{i}.bin", np.float32) for i in range(SAMPLES)])
    for rank in (0, 1):
        assert np.array_equal(clean[rank]["features"], features)
        assert clean[rank]["cache"] == str(tmp_path / "clean-home" / ".cache" / "fleetlite" / "samples")
        assert os.path.dirname(clean[rank]["store"]) == f"/dev/shm/fleetlite-{os.geteuid()}"

    trapped = shared_subfolder(shared_folder)
    plant(ATTACKER, SYMLINKED_LOCKS, trapped, secret, job_port("shared-host-trapped"),
          "fleetlite-ports")      # where fleetrun kept them
    before = tree(trapped)
    status, err, results = run(tmp_path, "trapped", trapped, source)
    assert status == 0, err
    assert [results[rank]["weights"] for rank in (0, 1)] == [clean[rank]["weights"] for rank in (0, 1)]
    assert [results[rank]["features"] for rank in (0, 1)] == [clean[rank]["features"] for rank in (0, 1)]
    assert {k: v for k, v in tree(trapped).items() if not k.startswith(f"fleetlite-{os.geteuid()}")} == before

    taken = shared_subfolder(shared_folder)
    plant(ATTACKER, SYMLINKED_LOCKS, taken, secret, job_port("shared-host-taken"), f"fleetlite-{os.geteuid()}",
          f"fleetlite-{os.geteuid()}/ports")
    before = tree(taken)
    status, err, results = run(tmp_path, "taken", taken, source)
    folder = os.path.join(taken, f"fleetlite-{os.geteuid()}")
    assert (status, results) == (2, {})       # fleetrun's status for a refused launch
    assert err == (f"fleetrun: error: {folder} belongs to user {ATTACKER} (uid {uid_of(ATTACKER)}), not to you: "
                   f"another user may control it; remove it, or point fleetlite at a folder of your own\n")
    assert tree(taken) == before
    assert open(secret).read() == text


def test_a_cache_dir_of_another_user_stops_the_job_naming_it(tmp_path, shared_folder, source):
    """The reproduced attack on the disk cache: the attacker's folder with a planted entry and an
    entry linked to a file of the victim's. Before: served as cache hits, the victim's file read
    as a sample, the victim's copies left 0644 in the attacker's folder."""
    secret, text = victim_file(tmp_path)
    cache = os.path.join(shared_folder, "fleetlite_cache")
    plant(ATTACKER, PLANTED_CACHE, cache, secret)
    before = tree(cache)
    status, err, results = run(tmp_path, "cache", shared_subfolder(shared_folder), source, cache)
    assert (status, results) == (1, {})
    assert (f"\n  DataError: data_configs.cache_dir {cache} cannot be used: {cache} belongs to user {ATTACKER} "
            f"(uid {uid_of(ATTACKER)}), not to you: another user may control it; remove it, or point fleetlite at "
            f"a folder of your own\n") in err, err
    assert tree(cache) == before
    assert open(secret).read() == text
