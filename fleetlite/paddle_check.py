"""Refuse to run on a Paddle fleetlite cannot drive, before anything imports it.

fleetlite rewrites PIR static programs, which exist from Paddle 3.0 on; Paddle 2.x programs
(legacy ProgramDesc, c_allreduce_* ops) would be rewritten wrongly, not fail. The check reads
package metadata only, so it costs nothing and works before `import paddle`.
"""
import importlib.metadata
import importlib.util

DISTRIBUTIONS = ("paddlepaddle", "paddlepaddle-gpu")
INSTALL_HINT = ("install PaddlePaddle >= 3.0: `pip install 'paddlepaddle>=3.0'` for CPU, or "
                "paddlepaddle-gpu >= 3.0 from PaddlePaddle's package index for GPUs")


def installed_versions():
    found = {}
    for name in DISTRIBUTIONS:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            pass
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
