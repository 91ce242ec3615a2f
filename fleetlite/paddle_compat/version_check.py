"""Refuse to run on a Paddle fleetlite cannot drive, before anything imports it.

fleetlite rewrites PIR static programs, which exist from Paddle 3.0 on; Paddle 2.x programs
(legacy ProgramDesc, c_allreduce_* ops) would be rewritten wrongly, not fail. The check reads
the installed distributions' names only, so it works before `import paddle`; it lists the
`*.dist-info` folders on sys.path itself because importing importlib.metadata costs every
fleetrun and every worker a tenth of a second of start-up.
"""
import importlib.util
import os
import re
import sys

DISTRIBUTIONS = ("paddlepaddle", "paddlepaddle-gpu")
_DIST_INFO = re.compile(r"^(paddlepaddle(?:[-_]gpu)?)-([^-]+)\.dist-info$", re.IGNORECASE)
INSTALL_HINT = ("install PaddlePaddle >= 3.0: `pip install 'paddlepaddle>=3.0'` for CPU, or "
                "paddlepaddle-gpu >= 3.0 from PaddlePaddle's package index for GPUs")


def installed_versions(path=None):
    """{distribution: version} for the Paddle wheels installed on `path` (default sys.path)."""
    found = {}
    for entry in sys.path if path is None else path:
        try:
            names = os.listdir(entry or ".")
        except OSError:   # a zip file or a missing folder on sys.path
            continue
        for name in names:
            match = _DIST_INFO.match(name)
            if match:
                found.setdefault(match.group(1).lower().replace("_", "-"), match.group(2))
    return found


def problem(versions, importable):
    """Why these installed Paddle versions cannot be used, or None when one is fine."""
    if not versions:
        return None if importable else f"fleetlite needs PaddlePaddle, which is not installed: {INSTALL_HINT}"
    for name, version in versions.items():
        major = version.split(".")[0]
        if major.isdigit() and int(major) >= 3 or version.startswith("0.0.0"):  # 0.0.0 = develop build
            return None
    listed = ", ".join(f"{n} {v}" for n, v in versions.items())
    return f"fleetlite needs PaddlePaddle >= 3.0 (PIR static programs), found {listed}: {INSTALL_HINT}"


def require_paddle3():
    reason = problem(installed_versions(), importlib.util.find_spec("paddle") is not None)
    if reason:
        raise ImportError(reason)
