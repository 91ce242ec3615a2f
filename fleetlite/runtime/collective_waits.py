"""Which fleet-level collective this process waits in, told to whoever listens.

Ranks that call different collectives (one fleet.util.all_reduce, another fleet.util.barrier)
never meet: gloo ends the job only after its fixed 30 s, with a C++ traceback that names
neither call. fleetrun's worker bootstrap listens and writes each entry to the worker's
progress record, so fleetrun can stop such a job sooner and say where each rank waits
(launcher/collective_stall.py). Without a listener (outside fleetrun) this costs nothing.
"""
import contextlib
import os
import sys

# The whole package, not only runtime/: fleet.save_persistables (api.py) gathers pto's state
# through fleet.util, and the report must name the script's call, not api.py's.
_FLEETLITE_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_listener = None


def listen(listener):
    """From now on, call `listener.enter_collective(kind, where)` and `listener.leave_collective()`."""
    global _listener
    _listener = listener


def _caller():
    """'file.py:line' of the innermost frame outside fleetlite and contextlib: the user's call."""
    frame = sys._getframe(1)
    while frame is not None and (frame.f_code.co_filename.startswith(_FLEETLITE_DIR)
                                 or frame.f_code.co_filename == contextlib.__file__):
        frame = frame.f_back
    if frame is None:
        return "unknown"
    return f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}"


@contextlib.contextmanager
def waiting_in(kind):
    """The body is the collective `kind` (e.g. 'fleet.util.barrier') that every rank must call."""
    listener = _listener
    if listener is None:
        yield
        return
    listener.enter_collective(kind, _caller())
    try:
        yield
    finally:
        listener.leave_collective()
