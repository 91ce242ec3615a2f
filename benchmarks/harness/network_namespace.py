"""A private network namespace per benchmark contender (Linux, root, iproute2).

Its loopback carries only the contender's traffic, so the loopback's byte counter is exactly what
the contender's ranks send each other (TCP/IP headers and acknowledgements included), and a token
bucket filter (`tc ... tbf`) on it emulates a slower link. Shaping `lo` shapes both directions
at once: the ranks share one link of the given rate (a full-duplex link of that rate each way
would carry twice as much). Namespaces are named after the driver's pid; ones left by a driver
that was killed are removed when the next one starts.
"""
import contextlib
import json
import os
import shutil
import signal
import subprocess
from pathlib import Path

from fleetlite.interprocess.process_liveness import process_exists
from benchmarks.harness.runner import WorkerGroup

PREFIX = "fleetlite-bench-"
COMMAND_TIMEOUT = 30
LOOPBACK_MTU = 65536


def unavailable():
    """Why contenders cannot run in their own network namespace here; None when they can."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (ip netns add); run the benchmark as root"
    if not shutil.which("ip"):
        return "the ip command (iproute2) is not installed"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        _ip("netns", "add", probe)
    except RuntimeError as error:
        return f"cannot create a network namespace: {error}"
    _ip("netns", "delete", probe)
    return None


def shaping_unavailable():
    """Why loopback cannot be shaped with tc's tbf here; None when it can."""
    if not shutil.which("tc"):
        return "the tc command (iproute2) is not installed"
    with NetworkNamespace("tbf-probe") as namespace:
        try:
            namespace.shape("100mbit")
        except RuntimeError as error:
            return f"tc cannot add a tbf qdisc: {error}"
    return None


class NetworkNamespace:
    """`with NetworkNamespace(label) as ns:` a fresh namespace with loopback up, deleted on exit."""

    def __init__(self, label):
        self.name = f"{PREFIX}{os.getpid()}-{label}"

    def __enter__(self):
        remove_stale()
        _ip("netns", "add", self.name)
        try:
            _ip("-n", self.name, "link", "set", "lo", "up")
        except RuntimeError:
            self.__exit__()
            raise
        return self

    def __exit__(self, *failure):
        _ip("netns", "delete", self.name)

    def shape(self, rate):
        """Limit loopback to `rate` (tc's units: 100mbit, 1gbit), see `limit_rate`."""
        limit_rate(self.name, "lo", rate)

    def command(self, argv):
        """`argv` run inside the namespace (`ip netns exec` keeps the process id)."""
        return ["ip", "netns", "exec", self.name, *argv]

    def loopback_bytes(self):
        """Bytes sent over the namespace's loopback so far."""
        (link,) = json.loads(_ip("-n", self.name, "-s", "-j", "link", "show", "lo"))
        return link["stats64"]["tx"]["bytes"]


@contextlib.contextmanager
def isolated_groups(contenders, world, rate=None, extra_env=None):
    """Yield [(WorkerGroup, NetworkNamespace)] for `contenders` [(name, worker argv)], each group in a
    namespace of its own, its loopback shaped to `rate` if given, `extra_env` in its workers'
    environment; all stopped and deleted on exit, a SIGTERM included (a SIGKILL leaves them to
    `remove_stale` at the next start)."""
    started = []
    previous = signal.signal(signal.SIGTERM, _exit_on_terminate)
    try:
        for name, argv in contenders:
            namespace = NetworkNamespace(f"{rate or 'lo'}-{name}".replace(".", "_"))
            namespace.__enter__()
            started.append((None, namespace))
            if rate:
                namespace.shape(rate)
            started[-1] = (WorkerGroup(name, argv, world=world, extra_env=extra_env, wrap=namespace.command), namespace)
        yield started
    finally:
        for group, namespace in started:
            if group:
                group.close()
            namespace.__exit__()
        signal.signal(signal.SIGTERM, previous)


def _exit_on_terminate(signum, frame):
    """SIGTERM unwinds like an error, so the namespaces are deleted on the way out."""
    raise SystemExit(f"terminated by signal {signum}")


def own_loopback_bytes():
    """Bytes sent over the loopback of the calling process's namespace (/proc/net/dev is per
    namespace), for a worker that counts its own job's traffic."""
    for line in Path("/proc/net/dev").read_text().splitlines():
        name, _, counters = line.partition(":")
        if name.strip() == "lo":
            return int(counters.split()[8])
    raise RuntimeError("no loopback interface in /proc/net/dev")


def remove_stale():
    """Delete the namespaces of benchmark drivers that no longer run."""
    for line in _ip("netns", "list").splitlines():
        name = line.split()[0] if line.strip() else ""
        owner = name[len(PREFIX):].split("-")[0] if name.startswith(PREFIX) else ""
        if owner.isdigit() and not process_exists(int(owner)):
            _ip("netns", "delete", name)


def limit_rate(namespace, device, rate):
    """Limit what `device` of `namespace` sends to `rate` with a token bucket filter.

    The bucket holds at least four 64 KiB packets (tbf drops any packet larger than it; loopback's
    MTU, and a veth's segmentation-offloaded packets) and 1/100 s of traffic; the queue holds 0.2 s
    more, so TCP is slowed down, not dropped."""
    per_second = rate_bytes(rate)
    burst = max(4 * LOOPBACK_MTU, per_second // 100)
    limit = burst + max(per_second // 5, 16 * LOOPBACK_MTU)
    _run(["tc", "-n", namespace, "qdisc", "add", "dev", device, "root", "tbf", "rate", rate,
          "burst", str(burst), "limit", str(limit)])


def rate_bytes(rate):
    """Bytes per second of a tc rate such as 100mbit (ValueError naming the accepted units)."""
    units = {"gbit": 10 ** 9 / 8, "mbit": 10 ** 6 / 8, "kbit": 10 ** 3 / 8}
    for unit, scale in units.items():
        if rate.endswith(unit):
            return int(float(rate[:-len(unit)]) * scale)
    raise ValueError(f"link rate {rate!r}: give it in kbit, mbit or gbit, e.g. 100mbit")


def _ip(*args):
    return _run(["ip", *args])


def _run(argv):
    result = subprocess.run(argv, capture_output=True, text=True, timeout=COMMAND_TIMEOUT)
    if result.returncode:
        raise RuntimeError(f"{' '.join(argv)}: {result.stderr.strip() or result.returncode}")
    return result.stdout
