"""Which Paddle releases each workaround of this room is for; on a later one it stands aside.

`LAST_NEEDED[workaround]` is the last (major, minor) release known to need it. The canary tests
(tests/paddle_compat/) check on the installed Paddle that each problem is still there: once one
fails, Paddle fixed it, and the workaround (with its entry here) can go. The version is read
from the installed wheel's metadata, so a gate costs no `import paddle`.
"""
import functools

from fleetlite.paddle_compat import version_check

LAST_NEEDED = {
    "ccache warning": (3, 3),          # quiet_warnings.importing_paddle
    "place warning": (3, 3),           # quiet_warnings.differentiating
    "out tensor glog line": (3, 3),    # quiet_warnings.spend_the_out_tensor_line
    "PIR value clip": (3, 3),          # value_clip.buildable
    "LR scheduler in the global scope": (3, 3),    # static_execution.static_mode
    "eager parameter list": (3, 3),    # static_execution.eager_parameters_hidden
    "SIGTERM crash report": (3, 3),    # termination.quiet_sigterm
    "ExecutionStrategy removed": (3, 3),   # removed_names.fix_for
    "no CPU sync_batch_norm kernel": (3, 3),   # runtime.eager_sync_batch_norm.swap
    "GradScaler float() of its scale": (3, 3),   # scale_update.lowers_without_crashing
    "N-step plan and named persistable custom-op inputs": (3, 3),   # steps_plan.custom_ops_read_named_persistables
    "CPU collectives ignore ring_id": (3, 3),   # ring_aware_collectives.refusal
}


def release(version):
    """(major, minor) of a version string; None for a develop build (0.0.0) or an unreadable one."""
    parts = version.split(".")[:2]
    if len(parts) < 2 or not all(part.isdigit() for part in parts) or version.startswith("0.0.0"):
        return None
    return int(parts[0]), int(parts[1])


def needed(workaround, versions=None):
    """Whether the installed Paddle (or `versions`, {distribution: version}) needs `workaround`.
    Yes where the release cannot be told (a develop build, none installed)."""
    releases = [release(v) for v in (_installed_versions() if versions is None else versions).values()]
    known = [r for r in releases if r is not None]
    return not known or min(known) <= LAST_NEEDED[workaround]


@functools.cache
def _installed_versions():
    """Read once per process: listing sys.path costs ~0.6 ms, and a gate is asked on hot paths
    (the sub-group gate before every Executor.run)."""
    return version_check.installed_versions()
