"""`fleetrun --explain`: print the compile report of the script's strategy, train nothing.

The script runs once, alone, under the worker's bootstrap with rank 0's environment of the planned
job and FLEETLITE_EXPLAIN_ONLY=1. The fleet API then compiles for that topology without bringing
up a process group, prints the CompileReport and ends the script (ScriptDone, which the bootstrap
turns into exit status 0), so a 32-rank job is explained on a laptop.
"""
import subprocess

from fleetlite.topology import env_contract
from fleetlite.errors import LaunchError
from fleetlite.launcher.plan import job_port, pinned_port, plan_workers
from fleetlite.launcher.preflight import check_script
from fleetlite.launcher.transport import worker_command

EXPLAIN_TIMEOUT_S = 300


def explain(spec, environ):
    """The exit status of the script run in explain-only mode."""
    check_script(spec.script)
    rank0 = plan_workers(spec, pinned_port(spec) or job_port(spec.job_id), environ)[0]
    env = {name: value for name, value in rank0.env.items()
           if name not in (env_contract.ERROR_FILE, env_contract.PROGRESS_FILE)}
    env[env_contract.EXPLAIN_ONLY] = "1"
    try:
        return subprocess.run(worker_command(spec), env=env, stdin=subprocess.DEVNULL,
                              timeout=EXPLAIN_TIMEOUT_S).returncode
    except subprocess.TimeoutExpired:
        raise LaunchError(f"--explain: {spec.script} was still running after {EXPLAIN_TIMEOUT_S} s; "
                          f"its fleet API must print the report and exit when "
                          f"{env_contract.EXPLAIN_ONLY}=1") from None
