"""`fleetrun` inside a Slurm allocation (salloc, sbatch) with no --ips: one fleetrun per host.

The allocation already says the hosts (SLURM_JOB_NODELIST) and, when it was asked for, the tasks
per host (SLURM_NTASKS_PER_NODE), so fleetrun starts one job step, `srun --ntasks-per-node=1`, that
runs a fleetrun on every host of the allocation with those hosts as --ips and this host's Slurm
name as --host; each supervises its host's workers as a hand-started multi-host fleetrun does, on
the port the job id gives them all. srun, not ssh: the allocation's hosts need no ssh between them,
Slurm accounts and stops the step, and `--kill-on-bad-exit=1` ends every host's fleetrun when one
fails. The per-host fleetruns start with the step's own rank variables removed: their workers are
fleetrun's, and their ranks come from it.
"""
import dataclasses
import shlex
import subprocess
import sys

from fleetlite.errors import LaunchError
from fleetlite.launcher.spec import host_argv
from fleetlite.topology.slurm_variables import expand_hostlist

STOP_WAIT_S = 30
# the step's variables that would otherwise make each worker look like a Slurm task (rank 0, 1, ...)
STEP_RANK_VARIABLES = ("SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID")


def applies(spec, environ):
    """Whether this fleetrun runs in an allocation and was not told the hosts."""
    return not spec.ips_stated and spec.host is None and bool(environ.get("SLURM_JOB_NODELIST"))


def _tasks_per_node(spec, environ):
    if spec.nproc_per_node is not None or spec.devices is not None:
        return spec.nproc_per_node
    raw = environ.get("SLURM_NTASKS_PER_NODE")
    if raw is None:
        return None
    if not raw.isdigit() or int(raw) < 1:
        raise LaunchError(f"SLURM_NTASKS_PER_NODE={raw!r} is not a number of tasks: pass --nproc_per_node")
    return int(raw)


def step_command(spec, environ, python=sys.executable):
    """(the srun command line that starts a fleetrun on every host, the line that says so)."""
    nodelist = environ["SLURM_JOB_NODELIST"]
    hosts = expand_hostlist(nodelist)
    per_host = _tasks_per_node(spec, environ)
    job_id = spec.job_id if spec.job_id != "default" else f"slurm-{environ.get('SLURM_JOB_ID', 'allocation')}"
    inner = host_argv(dataclasses.replace(spec, nproc_per_node=per_host), hosts, job_id)
    per_host_fleetrun = (f'unset {" ".join(STEP_RANK_VARIABLES)}; '
                         f'exec {shlex.quote(python)} -m fleetlite.launcher --host "$SLURMD_NODENAME" "$@"')
    argv = ["srun", f"--nodes={len(hosts)}", f"--ntasks={len(hosts)}", "--ntasks-per-node=1", f"--nodelist={nodelist}",
            "--kill-on-bad-exit=1", "sh", "-c", per_host_fleetrun, "fleetrun", *inner]
    workers = f"{per_host} workers" if per_host is not None else "its default workers"
    said = (f"inside Slurm allocation {environ.get('SLURM_JOB_ID', '?')} with no --ips: one fleetrun on each "
            f"of its {len(hosts)} hosts ({', '.join(hosts)}), {workers} per host, started by one srun "
            f"step (--kill-on-bad-exit=1); each host's start table follows")
    return argv, said


def fan_out(spec, environ, stop, popen=subprocess.Popen):
    """Run the step to its end; fleetrun's exit status is srun's. A stop request is passed on."""
    argv, said = step_command(spec, environ)
    print(f"fleetrun: {said}", file=sys.stderr, flush=True)
    try:
        step = popen(argv)
    except FileNotFoundError:
        raise LaunchError("SLURM_JOB_NODELIST says this is a Slurm allocation, but srun is not on PATH: "
                          "pass --ips to start the job without Slurm") from None
    while step.poll() is None:
        if stop.wait(0.2):
            step.send_signal(stop.signum)
            try:
                return step.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                step.kill()
                return step.wait()
    return step.returncode
