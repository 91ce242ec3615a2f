"""`fleetrun` (also `fleetlite run` and `python -m fleetlite.launcher`): flags -> spec ->
pre-flight -> job (or, with --tune, the tuner's trial jobs).

The only place that exits. Bad input ends with one line naming the cause and the fix, and exit
status 2, before any process starts; otherwise the exit status is the root cause's.
"""
import os
import signal
import sys
import threading

from fleetlite.errors import FleetliteError
from fleetlite.launcher.explain import explain
from fleetlite.launcher.job import Job
from fleetlite.launcher.preflight import run_preflight
from fleetlite.launcher.spec import parse_launch_spec
from fleetlite.launcher.supervisor import StopRequest
from fleetlite.launcher.transport import LocalTransport, SshTransport


def stop_when_stdin_closes(stop):
    """--follow_stdin: the first host of an --ssh job is gone, or asks this host to stop."""
    def wait_for_end_of_input():
        while os.read(sys.stdin.fileno(), 4096):  # os.read: no buffer lock held at interpreter exit
            continue
        stop.request(signal.SIGTERM, "the first host (its connection closed)")
    threading.Thread(target=wait_for_end_of_input, name="follow stdin", daemon=True).start()


def main(argv=None, prog="fleetrun"):
    environ = dict(os.environ)
    stop = StopRequest()
    stop.install()
    reservation = None
    try:
        spec = parse_launch_spec(sys.argv[1:] if argv is None else argv, environ, prog)
        for note in spec.notes:
            print(f"fleetrun: {note}", file=sys.stderr)
        if spec.explain:
            return explain(spec, environ)
        if spec.tune:
            from fleetlite.tuning.tuner import tune
            return tune(spec, environ, stop)
        preflight = run_preflight(spec, environ)
        reservation = preflight.reservation
        job = Job(spec, preflight, environ, LocalTransport(), stop,
                  remote=SshTransport(spec.ssh_command) if spec.ssh else None)
        if spec.follow_stdin:
            stop_when_stdin_closes(stop)
        return job.run()
    except FleetliteError as exc:
        print(f"fleetrun: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if reservation:
            reservation.release()


if __name__ == "__main__":
    sys.exit(main())
