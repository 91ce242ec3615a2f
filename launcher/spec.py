"""Command line + environment -> `LaunchSpec`, the one value the rest of fleetrun reads.

The flags are Paddle's (`fleetrun --ips=... --gpus=... train.py args`), and each can also come
from the environment variable Paddle's launcher reads for it (`PADDLE_NPROC_PER_NODE`...).
One precedence rule: flag > environment > default. Paddle lets the environment override a
flag silently; here every value that the environment supplies, or that a flag overrides,
becomes a line in `LaunchSpec.notes`, which fleetrun prints before it starts anything.
"""
import argparse
import shlex
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

from fleetlite.errors import LaunchError
from fleetlite.launcher.collective_stall import DEFAULT_STALL_TIMEOUT_S
from fleetlite.launcher.tune_flags import TuneOptions, add_tune_options, tune_options


def _text(raw):
    if not raw.strip():
        raise ValueError("it is empty")
    return raw.strip()


def _count(raw):
    value = int(raw)
    if value < 0:
        raise ValueError("it is negative")
    return value


def _port(raw):
    value = int(raw)
    if not 1024 <= value <= 65535:
        raise ValueError("a port must be in [1024, 65535]")
    return value


def _endpoint(raw):
    host, sep, port = raw.strip().rpartition(":")
    if not sep or not host:
        raise ValueError("expected host:port")
    return f"{host}:{_port(port)}"


def _list(raw):
    if not raw.strip():
        raise ValueError("it is empty")
    items = [item.strip() for item in raw.split(",")]
    empty = [position for position, item in enumerate(items, 1) if not item]
    if empty:
        raise ValueError(f"item {empty[0]} of the comma-separated list is empty: remove the extra "
                         f"comma")
    return tuple(items)


def _command(raw):
    words = tuple(shlex.split(raw))
    if not words:
        raise ValueError("it is empty")
    return words


def _seconds(raw):
    value = float(raw)
    if not value >= 0:
        raise ValueError("it must be a number of seconds, 0 or more")
    return value


def _device_ids(raw):
    return tuple(int(item) for item in _list(raw))


@dataclass(frozen=True)
class Option:
    """A launch setting: its flag is --<name>, `env` the variable Paddle's launcher reads for it."""
    name: str
    env: str
    default: object
    parse: Callable[[str], object]
    help: str
    aliases: Tuple[str, ...] = ()


OPTIONS = (
    Option("ips", "PADDLE_IPS", ("127.0.0.1",), _list,
           "comma-separated hosts in rank order; the first hosts rank 0 and its store"),
    Option("host", "POD_IP", None, _text,
           "which of --ips this host is (default: found among this machine's addresses)"),
    Option("devices", "PADDLE_DEVICES", None, _device_ids,
           "GPU ids for this host, one worker each (e.g. 0,1,2,3); omit for CPU workers",
           aliases=("--gpus",)),
    Option("nproc_per_node", "PADDLE_NPROC_PER_NODE", None, _count,
           "workers per host (CPU: default 1; GPU: must equal the number of --gpus)"),
    Option("log_dir", "PADDLE_LOG_DIR", "log", _text, "where workerlog.<rank> files go"),
    Option("start_port", "PADDLE_START_PORT", None, _port,
           "rank 0's store port (endpoints are start_port + local rank); default: a free port"),
    Option("master", "PADDLE_MASTER", None, _endpoint,
           "host:port of rank 0's store; the host must be the first of --ips"),
    Option("max_restarts", "PADDLE_MAX_RESTART", 0, _count,
           "restart this host's workers up to N times after a failure", aliases=("--max_restart",)),
    Option("job_id", "PADDLE_JOB_ID", "default", _text,
           "names the job; hand-launched multi-host jobs derive their default port from it"),
    Option("ssh_command", "FLEETLITE_SSH_COMMAND", ("ssh",), _command,
           "the command --ssh runs as `<command> <host> <remote command>`"),
    Option("collective_stall_timeout", "FLEETLITE_COLLECTIVE_STALL_TIMEOUT", DEFAULT_STALL_TIMEOUT_S, _seconds,
           "stop the job when ranks have waited this many seconds in different fleet collectives "
           "(e.g. one in fleet.util.all_reduce, another in fleet.util.barrier); 0: never"),
    Option("timeline", "FLEETLITE_TIMELINE", None, _text,
           "write the job's step timeline (Chrome Trace Event Format, one track per rank) to this file"),
)


@dataclass(frozen=True)
class LaunchSpec:
    """What the user asked for, resolved (flag > environment > default) but not yet checked
    against this machine: that is preflight's job."""
    script: str
    script_args: Tuple[str, ...] = ()
    ips: Tuple[str, ...] = ("127.0.0.1",)
    host: Optional[str] = None
    devices: Optional[Tuple[int, ...]] = None
    nproc_per_node: Optional[int] = None
    log_dir: str = "log"
    start_port: Optional[int] = None
    master: Optional[str] = None
    max_restarts: int = 0
    job_id: str = "default"
    ssh_command: Tuple[str, ...] = ("ssh",)
    collective_stall_timeout: float = DEFAULT_STALL_TIMEOUT_S
    timeline: Optional[str] = None
    explain: bool = False
    quiet: bool = False
    ssh: bool = False
    follow_stdin: bool = False
    notes: Tuple[str, ...] = ()
    tune: Optional[TuneOptions] = None   # --tune: time trials and write the best strategy
    ips_stated: bool = False   # whether --ips or PADDLE_IPS said the hosts (else: the default)


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        raise LaunchError(f"{message} (see {self.prog} --help)")


def build_parser(prog="fleetrun"):
    parser = _Parser(
        prog=prog, allow_abbrev=False,
        description="Start a PaddlePaddle script on every device of every host and supervise it: "
                    "the first failure stops the whole job and is reported once.")
    for option in OPTIONS:
        parser.add_argument(f"--{option.name}", *option.aliases, dest=option.name, default=None,
                            metavar=option.name.upper(), help=f"{option.help} [env {option.env}]")
    parser.add_argument("--explain", action="store_true",
                        help="print the compile report of the script's strategy and exit")
    parser.add_argument("--quiet", action="store_true",
                        help="no live progress line (rank 0's log is still copied to the console)")
    parser.add_argument("--ssh", action="store_true",
                        help="run from the first host: start fleetrun on the other hosts over ssh")
    parser.add_argument("--follow_stdin", action="store_true", help=argparse.SUPPRESS)
    add_tune_options(parser)
    parser.add_argument("script", help="the training script")
    parser.add_argument("script_args", nargs=argparse.REMAINDER, help="passed to the script")
    return parser


def _resolve(option, flag_value, environ):
    """(value, note): flag > environment > default, with a note when the environment mattered."""
    env_value = environ.get(option.env)
    if flag_value is not None:
        source, raw = f"--{option.name}", flag_value
        note = None
        if env_value is not None and env_value != flag_value:
            note = f"--{option.name}={flag_value} (flag) overrides {option.env}={env_value} (environment)"
    elif env_value is not None:
        source, raw = option.env, env_value
        note = f"--{option.name}={env_value} taken from the environment ({option.env})"
    else:
        return option.default, None
    try:
        return option.parse(raw), note
    except ValueError as exc:
        raise LaunchError(f"{source}={raw!r}: {exc}") from None


def parse_launch_spec(argv, environ, prog="fleetrun"):
    """The LaunchSpec for a fleetrun command line; raises LaunchError on bad input."""
    args = build_parser(prog).parse_args(argv)
    values, notes = {}, []
    for option in OPTIONS:
        values[option.name], note = _resolve(option, getattr(args, option.name), environ)
        if note:
            notes.append(note)
    return LaunchSpec(script=args.script, script_args=tuple(args.script_args), explain=args.explain,
                      quiet=args.quiet, ssh=args.ssh, follow_stdin=args.follow_stdin, notes=tuple(notes),
                      tune=tune_options(args), ips_stated=args.ips is not None or "PADDLE_IPS" in environ,
                      **values)


def follower_argv(spec, host, start_port):
    """The fleetrun command line that --ssh runs on `host`: every resolved value spelled out as
    a flag (ssh does not carry the environment), the port pinned so all hosts agree."""
    return host_argv(spec, spec.ips, spec.job_id, ["--host", host, "--start_port", str(start_port),
                                                   "--follow_stdin"])


def host_argv(spec, ips, job_id, pinned=()):
    """The command line of one host's fleetrun in a job that another fleetrun starts on every host
    (over ssh, or in a Slurm allocation): the resolved values as flags, with `pinned` ones."""
    argv = ["--ips", ",".join(ips), *pinned, "--log_dir", spec.log_dir,
            "--max_restarts", str(spec.max_restarts), "--job_id", job_id,
            "--collective_stall_timeout", str(spec.collective_stall_timeout)]
    if spec.devices is not None:
        argv += ["--devices", ",".join(map(str, spec.devices))]
    if spec.nproc_per_node is not None:
        argv += ["--nproc_per_node", str(spec.nproc_per_node)]
    return argv + [spec.script, *spec.script_args]
