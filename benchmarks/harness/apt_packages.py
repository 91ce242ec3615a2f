"""Debian packages a test set-up needs (sshd for the namespace cluster, fish and tcsh for the
remote-command quoting test), installed with apt-get when missing, bounded."""
import os
import shutil
import subprocess

APT_TIMEOUT_S = 300


def install_missing(packages, provides):
    """Install `packages` when any of `provides` (commands or absolute paths) is missing;
    returns why one is still missing (one line), or None."""
    def present():
        return all(os.path.exists(p) if os.path.isabs(p) else shutil.which(p) for p in provides)

    if present():
        return None
    names = " ".join(packages)
    if not shutil.which("apt-get"):
        return f"{names} not installed and apt-get is not available"
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *packages]
    environment = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    try:
        for command in ([install], [["apt-get", "update", "-q"], install]):
            results = [subprocess.run(step, capture_output=True, text=True, env=environment,
                                      timeout=APT_TIMEOUT_S) for step in command]
            if results[-1].returncode == 0 and present():
                return None
    except subprocess.TimeoutExpired:
        return f"apt-get install {names} did not finish within {APT_TIMEOUT_S} s"
    return f"apt-get install {names} failed: {results[-1].stderr.strip()[-200:]}"
