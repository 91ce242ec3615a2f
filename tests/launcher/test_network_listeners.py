"""A one-host job listens and connects on loopback only: every TCP socket its processes hold,
sampled from /proc while it starts and once it runs, is on a loopback address, and once every
rank is connected nothing listens at all (rank 0's store closed its port, gloo's pairs are
connected). Where this test may (root, `unshare`), the job runs with the machine's hostname
resolving to a non-loopback address of its own, in a private mount and UTS namespace: left
alone, gloo would bind that address."""
import ipaddress
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from fleetlite.launcher.preflight import interface_addresses
from support.job_sockets import descendants, tcp_sockets
from support.multiprocess import FLEETRUN, QUIET_CPU, clean_environment

SCRIPT = Path(__file__).resolve().parents[1] / "launcher_scripts" / "hold_after_init.py"
HOSTNAME = "fleetlite-lan"


def _hostname_off_loopback(folder):
    """(command prefix, address): under the prefix this machine's hostname resolves to
    `address`, one of its non-loopback addresses; ([], None) where that cannot be arranged."""
    outside = [address for address in interface_addresses() if not address.startswith("127.")]
    if os.geteuid() != 0 or not shutil.which("unshare") or not outside:
        return [], None
    hosts = folder / "hosts"
    hosts.write_text(f"127.0.0.1 localhost\n{outside[0]} {HOSTNAME}\n")
    setup = f'hostname {HOSTNAME} && mount --bind {hosts} /etc/hosts && exec "$@"'
    return ["unshare", "--mount", "--uts", "sh", "-c", setup, "sh"], outside[0]


def _run_and_sample(command, folder, ranks):
    """Run the job; return (sockets seen while it started, sockets once every rank was ready,
    its output)."""
    job = subprocess.Popen(command, env={**clean_environment(), **QUIET_CPU}, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, text=True, start_new_session=True)
    seen = set()
    try:
        deadline = time.monotonic() + 90
        while not all((folder / f"ready.{rank}").exists() for rank in range(ranks)):
            assert job.poll() is None and time.monotonic() < deadline, "the job ended or stalled before it was ready"
            seen |= tcp_sockets(descendants(job.pid))
            time.sleep(0.01)
        running = tcp_sockets(descendants(job.pid))
        (folder / "stop").touch()
        output, _ = job.communicate(timeout=60)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
            job.communicate()
    assert job.returncode == 0, output
    return seen, running, output


def test_a_one_host_job_listens_and_connects_on_loopback_only(tmp_path):
    prefix, hostname_address = _hostname_off_loopback(tmp_path)
    command = [*prefix, *FLEETRUN, "--nproc_per_node", "2", "--log_dir", str(tmp_path / "log"), str(SCRIPT),
               str(tmp_path)]
    seen, running, output = _run_and_sample(command, tmp_path, 2)
    assert [(tmp_path / f"ready.{rank}").read_text() for rank in range(2)] == ["2", "2"]
    store_port = int(re.search(r"rank 0's store at 127\.0\.0\.1:(\d+)", output).group(1))
    assert ("listen", ipaddress.ip_address("127.0.0.1"), store_port) in seen   # while it started
    off_loopback = sorted(str(s) for s in seen | running if not s[1].is_loopback)
    assert off_loopback == [], f"hostname resolves to {hostname_address}: {off_loopback}"
    assert [s for s in running if s[0] == "listen"] == []
    assert sum(state == "connected" for state, _, _ in running) >= 6   # 2 store clients + their 2 ends, gloo's pair
