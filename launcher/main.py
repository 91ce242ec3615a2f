"""`fleetrun` (also `fleetlite run` and `python -m fleetlite.launcher`): flags -> spec ->
pre-flight -> job (or, with --tune, the tuner's trial jobs).

The tuner runs its trials as launcher jobs, so it sits above the launcher: the entry points hand
it in (`tune`), and the launcher imports nothing of fleetlite/tuning/. Bad input ends with one
line naming the cause and the fix, and exit status 2, before any process starts; otherwise the
exit status is the root cause's. Only the entry points (`launcher/__main__.py`, `fleetlite
run`/`tune`) exit, with what main returns.
"""
import os
import sys

from fleetlite.errors import FleetliteError
from fleetlite.launcher.explain import explain
from fleetlite.launcher.host_link import follow_first_host
from fleetlite.launcher.job import Job
from fleetlite.launcher import pod_meeting, slurm_allocation
from fleetlite.launcher.preflight import run_preflight
from fleetlite.launcher.progress_line import ProgressLine
from fleetlite.launcher.spec import parse_launch_spec
from fleetlite.launcher.supervisor import StopRequest
from fleetlite.launcher.transport import LocalTransport, SshTransport


def main(argv=None, prog="fleetrun", tune=None):
    """fleetrun's exit status; `tune(spec, environ, stop)` runs --tune (fleetlite.tuning.tune)."""
    environ = dict(os.environ)
    stop = StopRequest()
    stop.install()
    reservation = None
    try:
        spec = parse_launch_spec(sys.argv[1:] if argv is None else argv, environ, prog)
        if spec.follow_stdin:   # from the start, so the first host hears this one at once
            follow_first_host(stop)
        for note in spec.notes:
            print(f"fleetrun: {note}", file=sys.stderr)
        if spec.explain:
            return explain(spec, environ)
        if spec.tune:
            return tune(spec, environ, stop)
        if slurm_allocation.applies(spec, environ):
            return slurm_allocation.fan_out(spec, environ, stop)
        if pod_meeting.applies(spec, environ):
            spec = pod_meeting.meet(spec, environ)
            print(f"fleetrun: the {len(spec.ips)} pods met at {environ.get('PADDLE_MASTER')}: --ips "
                  f"{','.join(spec.ips)}, this pod {spec.host}, rank 0's store at {spec.master}", file=sys.stderr)
        preflight = run_preflight(spec, environ)
        reservation = preflight.reservation
        progress = None if spec.quiet else ProgressLine(sys.stderr)
        local = LocalTransport(before_lines=progress.clear if progress else lambda: None)
        job = Job(spec, preflight, environ, local, stop,
                  remote=SshTransport(spec.ssh_command) if spec.ssh else None, progress=progress)
        return job.run()
    except FleetliteError as exc:
        print(f"fleetrun: error: {exc}", file=sys.stderr)
        return 2
    finally:
        if reservation:
            reservation.release()
