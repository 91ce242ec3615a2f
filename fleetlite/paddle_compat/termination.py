"""SIGTERM ends a worker quietly. Paddle 3.3 installs a fatal-signal handler for SIGTERM too, which
turns fleetrun's stop of a job into a C++ "FatalError: `Termination signal` is detected" report:
in the log of every rank that was only stopped, it would read like a crash."""
import signal

from fleetlite.paddle_compat.version_gate import needed


def quiet_sigterm():
    """After `import paddle`: SIGTERM's default action again (the process ends, nothing printed)."""
    if needed("SIGTERM crash report"):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
