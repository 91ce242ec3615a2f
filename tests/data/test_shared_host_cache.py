"""The sample cache on a host shared with other users (issue 25, items 2 and 3): the memory
store's folder, name and file, and the disk cache's folder. Another user (`nobody`) plants
folders and symlinks where the cache would go; a store file that is not this user's, or holds
bad offsets or an object dtype, is refused with one line naming it, never read past its end,
never mapped as objects (before: a bare struct.error, and a segfault)."""
import os
import stat
import subprocess
import sys

import numpy as np
import pytest

from fleetlite.data import CachedSamples, FileSource
from fleetlite.data import shared_store
from fleetlite.data.shared_store import READY, SharedSampleStore
from fleetlite.errors import DataError
from fleetlite.topology.env_contract import NODE_SECRET
from support.other_users import ATTACKER, plant, shared_folder, tree, uid_of, victim_file  # noqa: F401

ENTRIES, CAPACITY = 4, 4096
REFUSAL = "another user may control it; remove it"


@pytest.fixture
def source(tmp_path):
    folder = tmp_path / "source"
    folder.mkdir()
    for i in range(3):
        np.arange(i, i + 8, dtype=np.float32).tofile(folder / f"{i}.bin")
    return folder


def floats(data):
    return np.frombuffer(data, dtype=np.float32)


def memory_samples(source, **settings):
    return CachedSamples(FileSource(source), sorted(os.listdir(source)), decode=floats, levels=["memory"],
                         memory_bytes=1 << 16, **settings)


def mode(path):
    return stat.S_IMODE(os.lstat(path).st_mode)


# --- the memory store's folder and name --------------------------------------------------------

def test_the_store_lives_in_a_private_folder_under_a_name_with_the_jobs_secret(source, monkeypatch, shared_folder):
    monkeypatch.setattr(shared_store, "SHARED_MEMORY", shared_folder)
    paths = []
    for secret in ("job-one", "job-two"):
        monkeypatch.setenv(NODE_SECRET, secret)
        samples = memory_samples(source)
        assert np.array_equal(samples[1][0], np.arange(1, 9, dtype=np.float32))
        paths.append(samples.memory.path)
        assert (mode(os.path.dirname(samples.memory.path)), mode(samples.memory.path)) == (0o700, 0o600)
        samples.close()
        samples.memory.unlink()
    private = os.path.join(shared_folder, f"fleetlite-{os.geteuid()}")
    assert [os.path.dirname(path) for path in paths] == [private, private]
    assert paths[0] != paths[1]


@pytest.mark.parametrize("trap", ["folder", "symlink"])
def test_a_private_store_folder_planted_by_another_user_is_refused(trap, source, monkeypatch, shared_folder, tmp_path):
    monkeypatch.setattr(shared_store, "SHARED_MEMORY", shared_folder)
    private = os.path.join(shared_folder, f"fleetlite-{os.geteuid()}")
    if trap == "folder":
        plant(ATTACKER, "import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)", private)
        why = f"belongs to user {ATTACKER} (uid {uid_of(ATTACKER)}), not to you"
    else:
        plant(ATTACKER, "import os, sys; os.symlink(sys.argv[2], sys.argv[1])", private, tmp_path)
        why = "is a symlink"
    before = tree(shared_folder)
    with pytest.raises(DataError) as refused:
        memory_samples(source)
    assert str(refused.value) == f"{private} {why}: {REFUSAL}, or point fleetlite at a folder of your own"
    assert tree(shared_folder) == before
    assert [p.name for p in tmp_path.iterdir()] == ["source"]


def test_a_store_folder_given_in_a_shared_folder_is_refused(source, shared_folder):
    """Straight into /tmp or /dev/shm, where everyone writes: never."""
    with pytest.raises(DataError, match=f"^{shared_folder} is writable by others \\(mode 1777\\): "):
        memory_samples(source, store_folder=shared_folder)


# --- the memory store's file --------------------------------------------------------------------

@pytest.fixture
def store_path(tmp_path):
    folder = tmp_path / "shm"
    folder.mkdir(mode=0o700)
    return str(folder / "cache-test")


def filled_store(path):
    store = SharedSampleStore(path, ENTRIES, CAPACITY)
    assert store.put(0, [np.arange(6, dtype=np.float32).reshape(2, 3), np.array([7], dtype=np.int64)])
    return store


def test_a_store_file_of_another_user_is_refused(store_path):
    filled_store(store_path).close()
    os.chown(store_path, uid_of(ATTACKER), -1)
    os.chmod(store_path, 0o666)
    with pytest.raises(DataError) as refused:
        SharedSampleStore(store_path, ENTRIES, CAPACITY)
    assert str(refused.value) == (f"{store_path} belongs to user {ATTACKER} (uid {uid_of(ATTACKER)}), "
                                  f"not to you: {REFUSAL}")


def test_a_symlink_at_the_store_path_is_refused_and_its_target_untouched(store_path, tmp_path):
    secret, text = victim_file(tmp_path)
    os.symlink(secret, store_path)
    with pytest.raises(DataError, match=f"^{store_path} is a symlink: {REFUSAL}$"):
        SharedSampleStore(store_path, ENTRIES, CAPACITY)
    assert open(secret).read() == text


def test_a_short_store_or_a_header_past_its_arena_is_refused(store_path):
    filled_store(store_path).close()
    os.truncate(store_path, 100)
    with pytest.raises(DataError, match=f"^the shared sample store {store_path} is 100 bytes, shorter than .*; "
                                        f"remove it$"):
        SharedSampleStore(store_path, ENTRIES, CAPACITY)
    os.unlink(store_path)
    filled_store(store_path)._map[24:32] = (CAPACITY + 1).to_bytes(8, "little")
    with pytest.raises(DataError, match=f"^the shared sample store {store_path} says {CAPACITY + 1} bytes of its "
                                        f"{CAPACITY}-byte arena are used: it is damaged or not fleetlite's"):
        SharedSampleStore(store_path, ENTRIES, CAPACITY)


def test_an_entry_pointing_outside_the_arena_is_refused_naming_the_file(store_path):
    store = filled_store(store_path)
    nbytes = int(store.table[0]["nbytes"])
    store.table[0] = (READY, CAPACITY - 8, 64, 0)
    with pytest.raises(DataError, match=f"^the shared sample store {store_path} holds a damaged entry for sample 0: "
                                        f"its bytes \\[{CAPACITY - 8}, {CAPACITY + 56}\\) are not inside"):
        store.get(0)
    store.table[0] = (READY, 0, nbytes, 0)
    assert [a.tolist() for a in store.get(0)] == [[[0, 1, 2], [3, 4, 5]], [7]]
    store._map[store.arena_start:store.arena_start + 8] = (10 ** 6).to_bytes(8, "little")    # a million arrays
    with pytest.raises(DataError, match=f"it lists 1000000 arrays that do not fit in its {nbytes} bytes"):
        store.get(0)
    store.table[0] = (READY, 0, 48, 0)
    with pytest.raises(DataError, match="an array of shape \\(2, 3\\) runs past the entry's 48 bytes"):
        store.get(0)


READ_IN_CHILD = """
import sys
from fleetlite.data.shared_store import SharedSampleStore
from fleetlite.errors import DataError
try:
    print(SharedSampleStore(sys.argv[1], 4, 4096).get(0))
except DataError as error:
    print(error)
"""


def test_an_object_dtype_in_the_store_is_refused_not_mapped(store_path):
    """numpy would read object pointers from the file: the victim segfaulted (exit 139). Read in a
    child, so a regression fails this test rather than killing pytest."""
    store = filled_store(store_path)
    head = store.arena_start + 16
    store._map[head:head + 8] = b"|O".ljust(8, b"\0")
    store.close()
    child = subprocess.run([sys.executable, "-c", READ_IN_CHILD, store_path], capture_output=True, text=True,
                           timeout=60)
    assert (child.returncode, child.stdout) == (0, (
        f"the shared sample store {store_path} holds a damaged entry for sample 0: an array head names dtype "
        f"b'|O\\x00\\x00\\x00\\x00\\x00\\x00' with 2 dimensions (object and structured dtypes are never mapped); "
        f"remove the file\n")), child.stderr


def test_samples_with_object_arrays_are_not_stored(store_path):
    store = SharedSampleStore(store_path, ENTRIES, CAPACITY)
    with pytest.raises(DataError, match="^sample 1 holds arrays of dtype object, which the memory cache cannot share"):
        store.put(1, [np.array([{"a": 1}], dtype=object)])
    assert 1 not in store and store.used == 0


# --- the disk cache's folder --------------------------------------------------------------------

def test_the_default_disk_cache_is_the_users_own_and_its_copies_private(source, monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    samples = CachedSamples(FileSource(source), ["2.bin"], decode=floats, levels=["disk"])
    assert np.array_equal(samples[0][0], np.arange(2, 10, dtype=np.float32))
    folder = tmp_path / "home" / ".cache" / "fleetlite" / "samples"
    assert samples.disk.folder == str(folder)
    assert [mode(folder), mode(folder / "entries"), mode(folder / "entries" / "2.bin")] == [0o700, 0o700, 0o600]


@pytest.mark.parametrize("trap", ["parent", "symlink"])
def test_a_cache_dir_another_user_can_change_is_refused(trap, source, shared_folder, tmp_path):
    """Below a folder the attacker owns (it could swap what is inside), or a symlink it planted to a
    folder of the victim's: refused before anything is written."""
    mine = tmp_path / "mine"
    mine.mkdir()
    if trap == "parent":
        theirs = os.path.join(shared_folder, "theirs")
        plant(ATTACKER, "import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o755)", theirs)
        cache, why = os.path.join(theirs, "cache"), (f"{theirs} (on the way to {theirs}/cache) belongs to user "
                                                     f"{ATTACKER} (uid {uid_of(ATTACKER)}): another user may control "
                                                     f"what lies below it; use a folder of your own")
    else:
        cache = os.path.join(shared_folder, "cache")
        plant(ATTACKER, "import os, sys; os.symlink(sys.argv[2], sys.argv[1])", cache, mine)
        why = f"{cache} is a symlink: {REFUSAL}, or point fleetlite at a folder of your own"
    before = tree(shared_folder)
    with pytest.raises(DataError) as refused:
        CachedSamples(FileSource(source), ["0.bin"], decode=floats, levels=["disk"], cache_dir=cache)
    assert str(refused.value) == f"data_configs.cache_dir {cache} cannot be used: {why}"
    assert tree(shared_folder) == before and list(mine.iterdir()) == []
