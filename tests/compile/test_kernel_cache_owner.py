"""The compiled-kernel cache on a host shared with other users (issue 25, item 4): loading a
library runs its code, so a library in a folder another user controls ($FLEETLITE_KERNEL_CACHE
pointed at a shared folder), or one another user owns, is never loaded: one warning names it
and the Paddle-op composition runs. The planted library writes a marker file when loaded."""
import os
import shutil
import subprocess
import sys

import pytest

from fleetlite.compile.kernel_library import CACHE_ENV
from fleetlite.compression import mstopk_kernel
from support.other_users import ATTACKER, plant, shared_folder, tree, uid_of  # noqa: F401

CONSTRUCTOR = """
#include <stdio.h>
__attribute__((constructor)) static void planted(void) {
    FILE *marker = fopen("%s", "w");
    if (marker) { fputs("the planted library ran\\n", marker); fclose(marker); }
}
"""

LOAD_IN_CHILD = """
from fleetlite.compression import mstopk_kernel
print(mstopk_kernel.load_error() is None)
"""


@pytest.fixture(scope="module")
def library_name():
    """The file name of the MSTopK kernel's library in any cache (naming it loads nothing, so this
    process may; only the loads below need a fresh process)."""
    return os.path.basename(mstopk_kernel.library_path())


def planted_library(folder, marker):
    """A library that writes `marker` when loaded, built in `folder` (readable by the attacker)."""
    source = os.path.join(folder, "planted.c")
    with open(source, "w") as out:
        out.write(CONSTRUCTOR % marker)
    library = os.path.join(folder, "planted.so")
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", library, source], check=True, timeout=60)
    os.chmod(library, 0o755)
    return library


def load(cache):
    """(stdout, stderr) of a fresh process that loads the MSTopK kernel from `cache`."""
    done = subprocess.run([sys.executable, "-c", LOAD_IN_CHILD], env={**os.environ, CACHE_ENV: cache},
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, done.stderr


@pytest.mark.parametrize("owner", ["folder", "library"])
def test_a_library_another_user_could_have_planted_is_never_loaded(owner, library_name, tmp_path, shared_folder):
    if shutil.which("gcc") is None:
        pytest.skip("needs gcc to build the planted library")
    marker = os.path.join(shared_folder, "marker")
    library = planted_library(shared_folder, marker)
    if owner == "folder":            # FLEETLITE_KERNEL_CACHE at a folder another user made
        cache = os.path.join(shared_folder, "kernels")
        plant(ATTACKER, "import os, sys; os.mkdir(sys.argv[1]); os.chmod(sys.argv[1], 0o777)", cache)
        path = os.path.join(cache, library_name)
        plant(ATTACKER, "import shutil, sys; shutil.copy(sys.argv[1], sys.argv[2])", library, path)
        why = f"{cache} belongs to user {ATTACKER} (uid {uid_of(ATTACKER)}), not to you"
    else:                            # our own folder, the library someone else's
        cache = str(tmp_path / "kernels")
        os.mkdir(cache, 0o700)
        path = os.path.join(cache, library_name)
        shutil.copy(library, path)
        os.chown(path, uid_of(ATTACKER), -1)
        why = f"{path} belongs to user {ATTACKER} (uid {uid_of(ATTACKER)}), not to you"
    before = tree(cache)
    out, err = load(cache)
    assert out == "False\n" and not os.path.exists(marker)
    assert (f"fleetlite: warning: MSTopK runs as Paddle ops, slower on CPU: {why}: another user may control it; "
            f"remove it") in err, err
    assert tree(cache) == before
