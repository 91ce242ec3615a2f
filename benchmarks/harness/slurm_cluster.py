"""A real Slurm on the namespace cluster: slurmctld on the first host, one slurmd per host, munge.

Debian's daemons (slurmctld, slurmd, munge; installed with apt-get when missing), configured for
the run in one folder: a munge key made for it, a `slurm.conf` with each host's NodeName and
NodeAddr, per-node spool and pid files through `%n`. Each daemon runs inside its host (the host's
network, hostname and /etc files: `nsenter` into its sshd's namespaces, which `ip netns exec` made
without remounting /sys for them), with ProctrackType=proctrack/linuxproc and TaskPlugin=task/none,
which need no cgroups. One munged serves every host (its socket is a file, which every namespace
sees; munge wants the socket's folder 0755). `srun`, `sbatch` and `salloc` run in the first host.
Everything stops when the `with` block ends (the cluster then removes the hosts and whatever ran
in them).
"""
import os
import signal
import subprocess
import time

from benchmarks.harness import apt_packages, namespace_cluster

PACKAGES = ["slurmctld", "slurmd", "slurm-client", "munge"]
COMMANDS = ["/usr/sbin/slurmctld", "/usr/sbin/slurmd", "/usr/sbin/munged", "srun", "sbatch", "salloc", "sinfo"]
CONTROLLER_PORT, SLURMD_PORT = 6817, 6818
START_TIMEOUT_S = 30
CPUS_PER_HOST = 4


def unavailable():
    """Why a Slurm cluster cannot be made here (one line), None when it can; installs Debian's
    Slurm and munge when missing and apt-get is there."""
    return namespace_cluster.unavailable() or apt_packages.install_missing(PACKAGES, COMMANDS)


def open_mpi_unavailable():
    """Why Open MPI's mpirun cannot run here (one line), None when it can; installs openmpi-bin."""
    return apt_packages.install_missing(["openmpi-bin"], ["mpirun", "orted"])


def versions():
    """{'slurm': 'slurm-wlm 22.05.8', 'open_mpi': 'mpirun (Open MPI) 4.1.4'} of what runs here."""
    def first_line(argv):
        return subprocess.run(argv, capture_output=True, text=True, timeout=10).stdout.strip().splitlines()[0]
    return {"slurm": first_line(["/usr/sbin/slurmctld", "-V"]), "open_mpi": first_line(["mpirun", "--version"])}


class SlurmCluster:
    """`with SlurmCluster(2) as slurm:` hosts node-a and node-b under one slurmctld, every node idle."""

    def __init__(self, count):
        self.hosts = namespace_cluster.Cluster(count)
        self.names = list(self.hosts.hosts)
        self.daemons = []

    def __enter__(self):
        self.hosts.__enter__()
        try:
            self.folder = self.hosts.folder / "slurm"
            self._configure()
            self._start_munge()
            self._start(self.names[0], ["/usr/sbin/slurmctld", "-D", "-i", "-f", str(self.config)], "slurmctld")
            for name in self.names:
                self._start_slurmd(name)
            self._wait_until_idle()
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *failure):
        for daemon in self.daemons:
            daemon.kill()
        for daemon in self.daemons:
            daemon.wait(namespace_cluster.KILL_WAIT_S)
        self.hosts.__exit__(*failure)

    @property
    def environment(self):
        """What the Slurm commands need: this run's slurm.conf."""
        return {"SLURM_CONF": str(self.config)}

    def _configure(self):
        self.folder.mkdir()
        for sub in ("state", "spool", "log", "munge"):
            (self.folder / sub).mkdir()
        (self.folder / "munge").chmod(0o755)
        (self.folder / "munge.key").write_bytes(subprocess.run(
            ["dd", "if=/dev/urandom", "bs=1024", "count=1"], capture_output=True, timeout=10).stdout)
        (self.folder / "munge.key").chmod(0o400)
        first = self.hosts.hosts[self.names[0]]
        nodes = "\n".join(f"NodeName={host.name} NodeAddr={host.address} CPUs={CPUS_PER_HOST} State=UNKNOWN"
                          for host in self.hosts.hosts.values())
        self.config = self.folder / "slurm.conf"
        self.config.write_text(f"""ClusterName=fleetlite
SlurmctldHost={first.name}({first.address})
SlurmctldPort={CONTROLLER_PORT}
SlurmdPort={SLURMD_PORT}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket={self.folder / 'munge' / 'munge.socket'}
StateSaveLocation={self.folder / 'state'}
SlurmdSpoolDir={self.folder / 'spool'}/%n
SlurmctldPidFile={self.folder / 'slurmctld.pid'}
SlurmdPidFile={self.folder / 'spool'}/%n.pid
SlurmctldLogFile={self.folder / 'log' / 'slurmctld.log'}
SlurmdLogFile={self.folder / 'log'}/slurmd-%n.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
MpiDefault=none
ReturnToService=2
SchedulerType=sched/backfill
KillWait=5
InactiveLimit=0
MinJobAge=10
{nodes}
PartitionName=all Nodes=ALL Default=YES MaxTime=INFINITE State=UP
""")
        for name in self.names:
            (self.folder / "spool" / name).mkdir()

    def _start(self, name, argv, label):
        log = open(self.folder / "log" / f"{label}.out", "w")
        self.daemons.append(self.hosts.popen(name, argv, stdin=subprocess.DEVNULL, stdout=log,
                                             stderr=subprocess.STDOUT))
        log.close()

    def _start_slurmd(self, name):
        """slurmd in the host's network namespace, with a mount and UTS namespace of its own: the
        machine's /sys (`ip netns exec` remounts it, and slurmd then finds no cgroup filesystem),
        the host's hostname and its /etc/hosts bound over the machine's."""
        host = self.hosts.hosts[name]
        hosts_file = namespace_cluster.NETNS_ETC / host.namespace / "hosts"
        script = f'hostname "$0" && mount --bind {hosts_file} /etc/hosts && exec "$@"'
        argv = ["nsenter", f"--net=/run/netns/{host.namespace}", "unshare", "--mount", "--uts", "--propagation",
                "private", "sh", "-c", script, name, "/usr/sbin/slurmd", "-D", "-f", str(self.config)]
        log = open(self.folder / "log" / f"slurmd-{name}.out", "w")
        self.daemons.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT))
        log.close()

    def _start_munge(self):
        munge = self.folder / "munge"
        self._start(self.names[0], ["/usr/sbin/munged", "-F", "--force", f"--key-file={self.folder / 'munge.key'}",
                                    f"--socket={munge / 'munge.socket'}", f"--pid-file={munge / 'munged.pid'}",
                                    f"--log-file={self.folder / 'log' / 'munged.log'}",
                                    f"--seed-file={munge / 'munged.seed'}"], "munged")
        self._wait_for(lambda: (munge / "munge.socket").exists(), "munged's socket")

    def _wait_until_idle(self):
        def idle():
            result = self.run(["sinfo", "-h", "-N", "-o", "%N %t"], timeout=10)
            states = dict(line.split() for line in result.stdout.splitlines() if line.strip())
            return result.returncode == 0 and all(states.get(name) == "idle" for name in self.names)
        self._wait_for(idle, "every slurmd to register as idle")

    def _wait_for(self, ready, what):
        deadline = time.monotonic() + START_TIMEOUT_S
        while not ready():
            if time.monotonic() > deadline:
                logs = "\n".join(f"{path.name}: {path.read_text()[-400:]}" for path in (self.folder / "log").iterdir())
                raise RuntimeError(f"Slurm: no {what} within {START_TIMEOUT_S} s\n{logs}")
            time.sleep(0.2)

    def run(self, argv, timeout, cwd=None, env=None, **options):
        """`argv` (srun, sbatch, ...) run in the first host, to its end, output captured."""
        return self.hosts.run(self.names[0], argv, timeout, cwd=cwd, env={**(env or {}), **self.environment},
                              capture_output=True, text=True, **options)

    def popen(self, argv, cwd=None, env=None, **options):
        return self.hosts.popen(self.names[0], argv, cwd=cwd, env={**(env or {}), **self.environment}, **options)

    def mpirun(self, slots, cwd, exported, argv):
        """Open MPI's command line that runs `argv` on `slots` (['node-a:2', 'node-b:2']) over the
        hosts' sshd, with `exported` ('NAME=value' or 'NAME') in every rank's environment; run it in
        the first host."""
        ranks = sum(int(slot.rsplit(":", 1)[1]) for slot in slots)
        interface = namespace_cluster.HOST_INTERFACE
        command = ["mpirun", "--allow-run-as-root", "-np", str(ranks), "-H", ",".join(slots),
                   "--mca", "plm_rsh_agent", self.hosts.ssh_command, "--mca", "oob_tcp_if_include", interface,
                   "--mca", "btl", "self,tcp", "--mca", "btl_tcp_if_include", interface, "-wdir", str(cwd)]
        for variable in exported:
            command += ["-x", variable]
        return command + list(argv)

    def kill_rank_during(self, argv, cwd, env, rank, after_step=2, timeout=150):
        """Start the job `argv` in the first host (its ranks print `rank R pid P` and `rank R step S`,
        as tests/launcher_scripts/train_linear.py does), SIGKILL `rank` once it printed step
        `after_step`, wait for the job's end: (seconds from the kill to the end, the whole output)."""
        job = self.popen(argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines, pid = [], None
        try:
            for line in job.stdout:
                lines.append(line)
                if line.startswith(f"rank {rank} pid "):
                    pid = int(line.split()[-1])
                if line.startswith(f"rank {rank} step {after_step} "):
                    break
            if pid is None:
                raise RuntimeError(f"rank {rank} never trained: {''.join(lines)[-2000:]}")
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                rest, _ = job.communicate(timeout=timeout)
                raise RuntimeError(f"rank {rank} (pid {pid}) had ended before it was to be killed: "
                                   f"{(''.join(lines) + rest)[-3000:]}") from None
            killed = time.monotonic()
            rest, _ = job.communicate(timeout=timeout)
            return time.monotonic() - killed, "".join(lines) + rest
        finally:
            job.kill()
            job.wait()

    def left_running(self, text, within_s):
        """What still runs in the hosts with `text` in its command line after `within_s` seconds
        (sooner when nothing does): [] when nothing was left."""
        deadline = time.monotonic() + within_s
        while (left := self.processes_running(text)) and time.monotonic() < deadline:
            time.sleep(0.2)
        return left

    def processes_running(self, text):
        """'host pid: command line' of every process in the hosts whose command line holds `text`."""
        found = []
        for name in self.names:
            for pid in self.hosts.processes(name):
                try:
                    command = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode()
                except FileNotFoundError:
                    continue
                if text in command:
                    found.append(f"{name} {pid}: {command}")
        return found
