"""Starting processes: this host's workers, and the other hosts' fleetruns over ssh.

Every process gets its own session, so a Ctrl-C in the terminal reaches only fleetrun, which
then stops the job in order, and a signal to the process group also reaches the worker's own
children. Workers are spawned from the main thread only: PR_SET_PDEATHSIG (set by the
bootstrap) fires when the *thread* that spawned the worker ends, not just the process.

The supervisor sees both kinds through the same four calls (poll, terminate, kill, close), so
tests can hand it anything that has them.
"""
import base64
import os
import shlex
import signal
import subprocess
import sys
import time

from fleetlite.topology import env_contract
from fleetlite.launcher import worker_records
from fleetlite.launcher.host_link import RemoteLink
from fleetlite.launcher.log_tee import LogTee

GROUP_EXIT_WAIT_S = 2.0  # a SIGKILLed process is gone within moments, later on a loaded machine


class Process:
    """A started process and its process group."""

    def __init__(self, name, host, popen, slot=None, log_start=0, tee=None):
        self.name, self.host, self.slot, self.log_start = name, host, slot, log_start
        self._popen, self._tee = popen, tee

    @property
    def pid(self):
        return self._popen.pid

    @property
    def teed(self):
        return self._tee is not None

    def poll(self):
        return self._popen.poll()

    def _signal_group(self, signum):
        try:
            os.killpg(self._popen.pid, signum)
        except ProcessLookupError:  # the group is already empty
            pass

    def terminate(self):
        self._signal_group(signal.SIGTERM)

    def kill(self):
        self._signal_group(signal.SIGKILL)

    def close(self):
        """After the process ended: kill what it left in its group and wait (bounded) until it
        is gone, so nothing outlives fleetrun; finish the console copy."""
        self.kill()
        deadline = time.monotonic() + GROUP_EXIT_WAIT_S
        while _live_members(self._popen.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        if self._tee:
            self._tee.stop()


class RemoteFleetrun(Process):
    """fleetrun on another host, started over ssh with --follow_stdin; `ranks` says which ranks
    it runs ("ranks 2-3"). Its poll() also beats on the link and gives the host up when the link
    stays silent (host_link)."""

    def __init__(self, name, host, popen, link, ranks):
        super().__init__(name, host, popen)
        self.link, self.ranks = link, ranks
        self._silent = None     # why the link was given up, when it was
        self._stopping = False  # this fleetrun stopped it

    def poll(self):
        code = self._popen.poll()
        if code is None:
            self.link.beat()
            self._silent = self.link.silence()
            if self._silent is None:
                return None
            self._signal_group(signal.SIGKILL)
            code = self._popen.wait()
        self.link.finish()
        return code

    def terminate(self):
        """Close its stdin: the remote fleetrun stops its workers and reports, then exits (a
        SIGTERM would kill the ssh client and lose that report)."""
        self._stopping = True
        self.link.close_input()

    def kill(self):
        self._stopping = True
        super().kill()

    def lost(self, returncode):
        """How the connection to the host was lost, in words; None when its fleetrun reported
        its end (or this fleetrun had to kill it while stopping the job)."""
        if self._silent:
            return f"the connection to {self.host} was lost ({self._silent}): {self.ranks} were there"
        if self.link.reported or returncode == 0 or (self._stopping and returncode < 0):
            return None
        said = f": {self.link.said[-1]}" if self.link.said else ""
        if not self.link.ever_heard:
            return (f"could not start fleetrun on {self.host} over ssh (ssh exited with code "
                    f"{returncode}{said}): {self.ranks} never started")
        return (f"the connection to {self.host} was lost (ssh exited with code {returncode} before "
                f"its fleetrun reported: the host went down, or the connection did): "
                f"{self.ranks} were there")


def _live_members(group):
    """Pids of the processes of this process group that have not exited (a zombie has)."""
    live = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    state, _parent, process_group = stat.read().rsplit(")", 1)[1].split()[:3]
            except OSError:     # it exited while we looked
                continue
            if state != "Z" and int(process_group) == group:
                live.append(int(entry))
    return live


def worker_command(spec, python=sys.executable):
    return [python, "-u", "-m", "fleetlite.launcher.bootstrap", spec.script, *spec.script_args]


class LocalTransport:
    """Starts this host's workers, each writing to its own log file."""

    def __init__(self, console=None, before_lines=lambda: None):
        self._console = console if console is not None else sys.stdout.buffer
        self._before_lines = before_lines   # called before rank 0's lines reach the console

    def start(self, slot, command, tee_prefix=None):
        worker_records.clear_records(slot.error_file, slot.progress_file, slot.steps_file)
        os.makedirs(os.path.dirname(slot.log_path) or ".", exist_ok=True)
        restart = int(slot.env[env_contract.RESTART_COUNT])
        with open(slot.log_path, "ab" if restart else "wb") as log:
            if restart:
                log.write(f"===== fleetrun: restart {restart} =====\n".encode())
                log.flush()
            log_start = log.tell()
            popen = subprocess.Popen(
                command, env={**slot.env, env_contract.LAUNCHER_PID: str(os.getpid())},
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        tee = (LogTee(slot.log_path, log_start, tee_prefix, self._console, before_lines=self._before_lines).start()
               if tee_prefix else None)
        return Process(f"rank {slot.rank}", slot.host, popen, slot, log_start, tee)


def remote_command(cwd, argv):
    """The command line ssh hands the remote user's login shell: `cd cwd && exec argv`, run by
    `sh -c`. The POSIX text travels base64-encoded, so the login shell reads only `sh -c`'s
    fixed text and letters: fish and csh quote differently from POSIX shells, and there an
    argument ending in a backslash or holding a newline broke out of its quotes."""
    script = f"cd {shlex.quote(cwd)} && exec {shlex.join(argv)}"
    encoded = base64.b64encode(script.encode()).decode()
    return f"sh -c 'eval \"$(printf %s \"$1\" | base64 -d)\"' fleetrun {encoded}"


class SshTransport:
    """Starts fleetrun on another host as `<ssh command> <host> <remote command>`; its output
    comes back on this console (stderr) through its link. The remote side runs the same python
    and working directory."""

    def __init__(self, ssh_command, python=sys.executable, cwd=None, console=None):
        self._ssh_command, self._python = list(ssh_command), python
        self._cwd = cwd or os.getcwd()
        self._console = console if console is not None else sys.stderr.buffer

    def start(self, host, fleetrun_argv, ranks):
        remote = remote_command(self._cwd, [self._python, "-u", "-m", "fleetlite.launcher", *fleetrun_argv])
        popen = subprocess.Popen([*self._ssh_command, host, remote], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        link = RemoteLink(popen.stdin, popen.stdout, self._console)
        return RemoteFleetrun(f"fleetrun on {host}", host, popen, link, ranks)
