"""A cluster of hosts on one machine, for multi-host tests and benchmarks (Linux, root).

Each host is a network namespace with one interface (`eth0`, a veth pair whose other end is a
port of a bridge in a namespace of its own), an address in 10.213.0.0/24, a hostname of its own
(a UTS namespace), its own /etc/hosts and resolv.conf (`/etc/netns/<namespace>/`, which
`ip netns exec` mounts over /etc) and an sshd listening on its address only, with host keys and
a client key made for the run. Nothing of it is in the machine's own namespace: the addresses
exist only inside the cluster, no namespace has a route out, and names resolve from the hosts
files (the resolver points at the namespace's own loopback, where nothing answers).

`fleetrun --ssh --ssh_command "<cluster.ssh_command>" --ips node-a,node-b` run in node-a then
crosses real network stacks and a real sshd, and faults are real: `kill_host` kills every
process of a host, `cut_link` takes its link down. The link counters (`sent_bytes`) count
exactly the traffic between hosts, the loopback counters (`loopback_bytes`) that within each.

Everything is removed when the `with` block ends, a SIGTERM included; a run killed outright is
swept by the next one (its namespaces, their processes, veths and bridge, /etc/netns folders
and key folder are named after its pid).
"""
import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from fleetlite.interprocess import tcp_ports
from fleetlite.interprocess.process_liveness import process_exists
from benchmarks.harness import apt_packages
from benchmarks.harness.network_namespace import _exit_on_terminate, _run, limit_rate

PREFIX = "flmh-"
SUBNET = "10.213.0"          # 10.213.0.0/24: private, and only inside the cluster's namespaces
HOST_INTERFACE = "eth0"
SSHD = "/usr/sbin/sshd"
SSH_PORT = 22
START_TIMEOUT_S = 15
KILL_WAIT_S = 5
NETNS_ETC = Path("/etc/netns")
KEYS_ROOT = Path(tempfile.gettempdir())


@dataclass
class Host:
    name: str           # its hostname, as --ips lists it
    address: str
    namespace: str
    port_name: str      # its link's end on the bridge (in the bridge's namespace)
    folder: Path        # its sshd's config, host key and pid file
    sshd: subprocess.Popen = None


def unavailable():
    """Why a cluster cannot be made here (one line), None when it can. Installs Debian's
    openssh-server when sshd is missing and apt-get is there."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return "network namespaces need root (ip netns add)"
    missing = [tool for tool in ("ip", "nsenter", "unshare", "ssh-keygen") if not shutil.which(tool)]
    if missing:
        return f"{', '.join(missing)} not installed (iproute2, util-linux, openssh-client)"
    reason = install_openssh()
    if reason:
        return reason
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        _run(["ip", "netns", "add", probe])
    except (RuntimeError, subprocess.TimeoutExpired) as error:
        return f"cannot create a network namespace: {error}"
    _run(["ip", "netns", "delete", probe])
    return None


def install_openssh():
    """Install openssh-server and -client with apt-get when sshd or ssh is missing (bounded);
    returns why they are still missing, or None."""
    return apt_packages.install_missing(["openssh-server", "openssh-client"], [SSHD, "ssh"])


def _namespaces():
    listing = _run(["ip", "netns", "list"])
    return [line.split()[0] for line in listing.splitlines() if line.strip()]


def _kill_namespace_processes(namespace):
    """SIGKILL every process in `namespace` and wait (bounded) until they are gone."""
    deadline = time.monotonic() + KILL_WAIT_S
    while time.monotonic() < deadline:
        pids = [int(pid) for pid in _run(["ip", "netns", "pids", namespace]).split()]
        if not pids:
            return
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)


def _remove_namespace(namespace):
    with contextlib.suppress(RuntimeError):
        _kill_namespace_processes(namespace)
        _run(["ip", "netns", "delete", namespace])
    shutil.rmtree(NETNS_ETC / namespace, ignore_errors=True)


def sweep_stale():
    """Remove what clusters of runs that no longer exist left behind."""
    stale_owners = set()
    for namespace in _namespaces():
        owner = namespace[len(PREFIX):].split("-")[0] if namespace.startswith(PREFIX) else ""
        if owner.isdigit() and not process_exists(int(owner)):
            _remove_namespace(namespace)
            stale_owners.add(owner)
    for folder in [*NETNS_ETC.glob(f"{PREFIX}*"), *KEYS_ROOT.glob(f"{PREFIX}*")]:
        owner = folder.name[len(PREFIX):].split("-")[0]
        if owner.isdigit() and not process_exists(int(owner)):
            shutil.rmtree(folder, ignore_errors=True)


class Cluster:
    """`with Cluster(3) as cluster:` hosts node-a, node-b, node-c, each with a running sshd."""

    def __init__(self, count, names=None):
        self.tag = f"{PREFIX}{os.getpid()}-{int(time.time() * 1000) % 100000}"
        self.switch = f"{self.tag}-switch"
        names = names or [f"node-{chr(ord('a') + index)}" for index in range(count)]
        self.folder = None
        self.hosts = {name: Host(name, f"{SUBNET}.{index + 1}", f"{self.tag}-{name}", f"port-{name}"[:15],
                                 None) for index, name in enumerate(names)}
        self._previous_sigterm = None

    # -- set-up and removal ------------------------------------------------------------------

    def __enter__(self):
        sweep_stale()
        self._previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_terminate)
        try:
            self.folder = Path(tempfile.mkdtemp(prefix=f"{self.tag}-", dir=KEYS_ROOT))
            self._make_keys()
            _run(["ip", "netns", "add", self.switch])
            _run(["ip", "-n", self.switch, "link", "add", "switch", "type", "bridge"])
            _run(["ip", "-n", self.switch, "link", "set", "switch", "up"])
            for host in self.hosts.values():
                self._add_host(host)
            for host in self.hosts.values():
                self.start_sshd(host.name)
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *failure):
        for namespace in [*(host.namespace for host in self.hosts.values()), self.switch]:
            _remove_namespace(namespace)
        for host in self.hosts.values():
            if host.sshd is not None:
                host.sshd.wait(KILL_WAIT_S)
        if self.folder:
            shutil.rmtree(self.folder, ignore_errors=True)
        if self._previous_sigterm is not None:
            signal.signal(signal.SIGTERM, self._previous_sigterm)

    def _add_host(self, host):
        host.folder = self.folder / host.name
        host.folder.mkdir()
        _run(["ip", "netns", "add", host.namespace])
        self.write_hosts_file(host.name)
        (NETNS_ETC / host.namespace / "resolv.conf").write_text(
            "# the cluster has no DNS: names come from its hosts file\nnameserver 127.0.0.1\n"
            "options timeout:1 attempts:1\n")
        _run(["ip", "link", "add", HOST_INTERFACE, "netns", host.namespace, "type", "veth",
              "peer", "name", host.port_name, "netns", self.switch])
        _run(["ip", "-n", self.switch, "link", "set", host.port_name, "master", "switch", "up"])
        _run(["ip", "-n", host.namespace, "addr", "add", f"{host.address}/24", "dev", HOST_INTERFACE])
        _run(["ip", "-n", host.namespace, "link", "set", HOST_INTERFACE, "up"])
        _run(["ip", "-n", host.namespace, "link", "set", "lo", "up"])

    def write_hosts_file(self, name, own_name_on_loopback=False):
        """The host's /etc/hosts: every host of the cluster by its address; with
        `own_name_on_loopback`, its own name first on 127.0.1.1, as Debian's installer writes it.
        Rewritten in place, so processes already in the host see the change."""
        host = self.hosts[name]
        lines = ["127.0.0.1 localhost"]
        if own_name_on_loopback:
            lines.append(f"127.0.1.1 {name}")
        lines += [f"{other.address} {other.name}" for other in self.hosts.values()]
        folder = NETNS_ETC / host.namespace
        folder.mkdir(parents=True, exist_ok=True)
        with open(folder / "hosts", "w") as hosts:
            hosts.write("\n".join(lines) + "\n")

    def _make_keys(self):
        keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", self.tag, "-f"]
        _run([*keygen, str(self.folder / "client_key")])
        (self.folder / "authorized_keys").write_text((self.folder / "client_key.pub").read_text())
        known = []
        for host in self.hosts.values():
            key = self.folder / f"{host.name}_host_key"
            _run([*keygen, str(key)])
            known.append(f"{host.name},{host.address} {' '.join(key.with_suffix('.pub').read_text().split()[:2])}")
        (self.folder / "known_hosts").write_text("\n".join(known) + "\n")
        (self.folder / "ssh_config").write_text(
            f"Host *\n  User root\n  IdentityFile {self.folder / 'client_key'}\n  IdentitiesOnly yes\n"
            f"  UserKnownHostsFile {self.folder / 'known_hosts'}\n  GlobalKnownHostsFile /dev/null\n"
            f"  StrictHostKeyChecking yes\n  BatchMode yes\n  ConnectTimeout 5\n  LogLevel ERROR\n")

    def start_sshd(self, name):
        """Start (or restart) the host's sshd, listening on its address only; returns once it
        listens."""
        host = self.hosts[name]
        config = host.folder / "sshd_config"
        config.write_text(
            f"ListenAddress {host.address}:{SSH_PORT}\nHostKey {self.folder / f'{name}_host_key'}\n"
            f"PidFile {host.folder / 'sshd.pid'}\nAuthorizedKeysFile {self.folder / 'authorized_keys'}\n"
            "StrictModes no\nUsePAM no\nPasswordAuthentication no\nKbdInteractiveAuthentication no\n"
            "PermitRootLogin prohibit-password\nPrintMotd no\nMaxStartups 100\nMaxSessions 100\n"
            "LogLevel ERROR\n")
        os.makedirs("/run/sshd", mode=0o755, exist_ok=True)   # sshd's privilege separation folder
        # unshare --uts: the host's own hostname, inherited by every session sshd starts
        with open(host.folder / "sshd.log", "w") as log:
            host.sshd = subprocess.Popen(
                ["ip", "netns", "exec", host.namespace, "unshare", "--uts", "sh", "-c",
                 'hostname "$0" && exec "$@"', name, SSHD, "-D", "-e", "-f", str(config)],
                stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=log)
        tables = (f"/proc/{host.sshd.pid}/net/tcp",)
        if not tcp_ports.wait_until_listening(SSH_PORT, START_TIMEOUT_S, tables=tables):
            raise RuntimeError(f"sshd on {name} did not listen within {START_TIMEOUT_S} s: "
                               f"{(host.folder / 'sshd.log').read_text()[-500:]}")

    # -- using it ------------------------------------------------------------------------------

    @property
    def ssh_command(self):
        """The --ssh_command that reaches every host of the cluster by name or address."""
        return f"ssh -F {self.folder / 'ssh_config'}"

    def command(self, name, argv, cwd=None):
        """`argv` run in host `name`: its network, hostname and /etc files (those of its sshd),
        in folder `cwd` (entering a mount namespace would otherwise start it in sshd's)."""
        folder = [f"--wd={os.path.abspath(cwd)}"] if cwd else []
        return ["nsenter", "-t", str(self.hosts[name].sshd.pid), "-n", "-u", "-m", *folder, "--", *argv]

    def run(self, name, argv, timeout, cwd=None, **options):
        return subprocess.run(self.command(name, argv, cwd), timeout=timeout, **options)

    def popen(self, name, argv, cwd=None, **options):
        return subprocess.Popen(self.command(name, argv, cwd), **options)

    def processes(self, name):
        """Pids of the processes in host `name` other than its sshd."""
        pids = {int(pid) for pid in _run(["ip", "netns", "pids", self.hosts[name].namespace]).split()}
        return sorted(pids - {self.hosts[name].sshd.pid})

    def fleetlite_processes(self, name):
        """'pid: command line' of each fleetrun and worker still running in host `name`."""
        left = []
        for pid in self.processes(name):
            try:
                command = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except FileNotFoundError:
                continue
            if "fleetlite" in command:
                left.append(f"{pid}: {command}")
        return left

    def host_named(self, name_or_address):
        return next(host.name for host in self.hosts.values() if name_or_address in (host.name, host.address))

    def fleetrun(self, ips, args, cwd, ssh_command=None, **options):
        """`fleetrun --ssh --ips <ips> <args>` started in the first host of `ips`, as a user would
        start it there (this Python's fleetlite, in folder `cwd`); the Popen."""
        argv = [sys.executable, "-m", "fleetlite.launcher", "--ssh", "--ssh_command",
                ssh_command or self.ssh_command, "--ips", ",".join(ips), *args]
        return self.popen(self.host_named(ips[0]), argv, cwd=cwd, **options)

    def fault_during_job(self, ips, args, cwd, fault, once, env=None, timeout=60):
        """Start `fleetrun --ssh` as `fleetrun` does (output in cwd/fleetrun.out), call `fault()`
        once file `once[0]` holds text `once[1]` (say, a rank's log its step 2), and wait for
        fleetrun's end: (its exit code, seconds from the fault to its end, its output)."""
        with open(Path(cwd) / "fleetrun.out", "w") as out:
            fleetrun = self.fleetrun(ips, args, cwd, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            wait_for_text(*once, timeout)
            faulted = time.monotonic()
            fault()
            code = fleetrun.wait(timeout)
            return code, time.monotonic() - faulted, (Path(cwd) / "fleetrun.out").read_text()
        finally:
            fleetrun.kill()
            fleetrun.wait()

    def kill_host(self, name):
        """Every process of the host, its sshd included, SIGKILLed at once: the host is gone."""
        _kill_namespace_processes(self.hosts[name].namespace)
        self.hosts[name].sshd.wait(KILL_WAIT_S)

    def cut_link(self, name, up=False):
        """Take the host's link down (its packets are dropped, no connection is reset); `up`
        restores it."""
        _run(["ip", "-n", self.switch, "link", "set", self.hosts[name].port_name, "up" if up else "down"])

    def limit_link(self, name, rate):
        """What host `name` sends over its link limited to `rate` (tc's units, e.g. 1gbit): with every
        host limited, each direction of every link between hosts runs at `rate`, the hosts' own
        loopbacks at full speed."""
        limit_rate(self.hosts[name].namespace, HOST_INTERFACE, rate)

    def sent_bytes(self, name):
        """Bytes host `name` sent over its link so far (counted where it enters the bridge): summed
        over the hosts, every byte between hosts once."""
        (link,) = json.loads(_run(["ip", "-n", self.switch, "-s", "-j", "link", "show",
                                   self.hosts[name].port_name]))
        return link["stats64"]["rx"]["bytes"]

    def loopback_bytes(self, name):
        """Bytes sent over host `name`'s loopback so far: the traffic between its own processes."""
        (link,) = json.loads(_run(["ip", "-n", self.hosts[name].namespace, "-s", "-j", "link", "show", "lo"]))
        return link["stats64"]["tx"]["bytes"]


def wait_for_text(path, text, timeout):
    """Wait until file `path` contains `text`; TimeoutError after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and text in path.read_text(errors="replace")):
        if time.monotonic() > deadline:
            raise TimeoutError(f"no {text!r} in {path} after {timeout} s")
        time.sleep(0.05)
