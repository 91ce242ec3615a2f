"""Refuse, in one line, to train under PaddlePaddle's own launcher.

Paddle installs a `fleetrun` command of its own (paddle.distributed.launch), and whichever
package was installed last owns that name. Paddle's launcher sets fleetrun's variable names
with other meanings (its PADDLE_MASTER is a port of its own, not rank 0's endpoint), so a
fleetlite worker under it would wait for a rendezvous in the wrong place. Its workers carry
variables fleetrun never sets (read from Paddle 3.3's launch code): PADDLE_GLOBAL_RANK, which
paddle.distributed.launch's collective controller gives every worker, and
PADDLE_WORLD_DEVICE_IDS, which the legacy paddle.distributed.fleet.launch gives every worker.
fleetrun's workers carry FLEETLITE_LAUNCHER_PID (`fleetrun --explain`'s, FLEETLITE_EXPLAIN_ONLY),
so a fleetrun started from inside such a job is never mistaken for it.
"""
import os
import shlex

from fleetlite.topology import env_contract

# (variable only that launcher sets, what to call it, its module)
PADDLE_LAUNCHERS = (
    ("PADDLE_GLOBAL_RANK", "PaddlePaddle's launcher (paddle.distributed.launch, which Paddle "
                           "also installs as `fleetrun`)", "paddle.distributed.launch"),
    ("PADDLE_WORLD_DEVICE_IDS", "PaddlePaddle's legacy launcher (paddle.distributed.fleet.launch)",
     "paddle.distributed.fleet.launch"),
)
LAUNCHER_COMMANDS = {module for _, _, module in PADDLE_LAUNCHERS} | {"fleetrun"}


def paddle_launcher(environ):
    """The Paddle launcher that started this process, or None (fleetrun, mpirun, srun, none)."""
    if env_contract.LAUNCHER_PID in environ or env_contract.EXPLAIN_ONLY in environ:
        return None
    return next((name for marker, name, _ in PADDLE_LAUNCHERS if marker in environ), None)


def rerun_command(launcher_argv, script_argv):
    """`fleetlite run` with the arguments the Paddle launcher was given; when its command line
    is unknown, with the script's own arguments and a placeholder for the launcher's flags."""
    for index, word in enumerate(launcher_argv):
        if os.path.basename(word) in LAUNCHER_COMMANDS:
            return shlex.join(["fleetlite", "run", *launcher_argv[index + 1:]])
    return f"fleetlite run <the launcher's flags> {shlex.join(script_argv)}"


def parent_argv(pid=None):
    """The command line of this process's parent (the launcher), or [] where /proc cannot tell."""
    try:
        with open(f"/proc/{pid or os.getppid()}/cmdline", "rb") as cmdline:
            return [word.decode(errors="replace") for word in cmdline.read().split(b"\0") if word]
    except OSError:
        return []


def refusal(environ, launcher_argv, script_argv):
    """The one line that stops a worker started by a Paddle launcher, or None."""
    launcher = paddle_launcher(environ)
    if launcher is None:
        return None
    return (f"fleetlite: this worker was started by {launcher}, not by fleetlite's launcher, and "
            f"cannot train under it; start the job with: {rerun_command(launcher_argv, script_argv)}")
