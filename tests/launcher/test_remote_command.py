"""The command `fleetrun --ssh` hands each remote login shell reaches the remote python with
every argument intact under POSIX shells (bash, dash) and non-POSIX ones (fish, csh/tcsh,
installed with apt-get when missing): ssh runs `<login shell> -c <command>`, so the test runs
the exact string through each shell here, no ssh needed. Plain POSIX quoting broke out under
fish and csh on an argument ending in a backslash or holding a newline."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from fleetlite.launcher.transport import remote_command

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the repository root, where benchmarks/ is a package
from benchmarks.harness import apt_packages  # noqa: E402

SHELLS = ("bash", "dash", "fish", "tcsh", "csh")
HOSTILE = ["ends with a backslash\\", "holds\na newline", "it's", "\"double\"", "$HOME", "${PATH}", "!1", "!!",
           "`id`", "$(id)", "; touch PWNED", "| touch PWNED", "*", "~", "{a,b}", "tab\there", "", " ", "é ü",
           "--ips=127.0.0.1", "\\n", "\\\\", "'", "%s"]
SHOW_ARGV = "import json, os, sys; print(json.dumps([os.getcwd()] + sys.argv[1:]))"


@pytest.fixture(scope="module")
def non_posix_shells():
    return apt_packages.install_missing(["fish", "tcsh"], ["fish", "tcsh"])


@pytest.mark.parametrize("shell", SHELLS)
def test_every_argument_reaches_the_remote_python_intact_under_each_login_shell(shell, non_posix_shells,
                                                                                 tmp_path):
    if not shutil.which(shell):
        pytest.skip(f"{shell} is not installed ({non_posix_shells or 'not in its package'})")
    cwd = tmp_path / "a folder's name\\ with $HOME\nand a newline"
    cwd.mkdir()
    command = remote_command(str(cwd), [sys.executable, "-c", SHOW_ARGV, *HOSTILE])
    shown = subprocess.run([shell, "-c", command], cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout) == [str(cwd), *HOSTILE]
    assert not (tmp_path / "PWNED").exists() and not (cwd / "PWNED").exists()


def test_the_login_shell_reads_only_fixed_text_and_base64_letters():
    command = remote_command("/x", ["python", *HOSTILE])
    fixed, encoded = command.rsplit(" ", 1)
    assert fixed == "sh -c 'eval \"$(printf %s \"$1\" | base64 -d)\"' fleetrun"
    assert set(encoded) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")
