"""fleetrun across real network stacks: hosts are network namespaces with their own address,
name and sshd (benchmarks/harness/namespace_cluster.py), and `fleetrun --ssh` runs in node-a as a user
would run it on the first host. Faults are real: a host's every process killed, a link cut, an
ssh that cannot start, a hostname that resolves to 127.0.1.1. Every wait is bounded.
"""
import io
import ipaddress
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from fleetlite.errors import LaunchError
from fleetlite.launcher.host_link import HEARTBEAT, RemoteLink, follow_first_host
from fleetlite.launcher.preflight import gloo_interface
from fleetlite.launcher.supervisor import StopRequest
from support.job_sockets import tcp_sockets
from support.multiprocess import clean_environment, run_job

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))   # the repository root, where benchmarks/ is a package
from benchmarks.harness import namespace_cluster  # noqa: E402

TRAIN = str(Path(__file__).resolve().parents[1] / "launcher_scripts" / "train_linear.py")
HOLD = Path(__file__).resolve().parents[1] / "launcher_scripts" / "hold_after_init.py"
WORKERS = Path(__file__).resolve().parents[1] / "workers"
STEPS = 6
JOB_TIMEOUT_S = 90


@pytest.fixture(scope="module")
def cluster():
    reason = namespace_cluster.unavailable()
    if reason:
        pytest.skip(f"no test cluster here: {reason}")
    with namespace_cluster.Cluster(3) as made:
        yield made


@pytest.fixture
def hosts_files(cluster):
    """Lets a test give hosts Debian's 127.0.1.1 line; every hosts file is clean again after."""
    yield cluster
    for name in cluster.hosts:
        cluster.write_hosts_file(name)


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    """Final weights of the same training as one process: the oracle every multi-host run matches."""
    cwd = tmp_path_factory.mktemp("one-process")
    result = subprocess.run([sys.executable, "-m", "fleetlite.launcher", "--job_id", "one", TRAIN,
                             "--steps", str(STEPS), "--out", "w.npy"], cwd=cwd, env=clean_environment(),
                            capture_output=True, text=True, timeout=JOB_TIMEOUT_S)
    assert result.returncode == 0, result.stderr
    return np.load(cwd / "w.npy")


def run_from_first_host(cluster, cwd, ips, *args, ssh_command=None, timeout=JOB_TIMEOUT_S):
    """fleetrun --ssh run in ips[0] to its end: (the finished process, seconds it took)."""
    started = time.monotonic()
    fleetrun = cluster.fleetrun(ips, args, cwd, ssh_command, env=clean_environment(), stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)
    try:
        out, err = fleetrun.communicate(timeout=timeout)
    finally:
        fleetrun.kill()
    return subprocess.CompletedProcess(fleetrun.args, fleetrun.returncode, out, err), time.monotonic() - started


def wait_until_no_fleetlite_processes(cluster, name, timeout):
    deadline = time.monotonic() + timeout
    while cluster.fleetlite_processes(name):
        assert time.monotonic() < deadline, f"left on {name}: {cluster.fleetlite_processes(name)}"
        time.sleep(0.1)


def test_four_ranks_on_two_hosts_over_ssh_train_like_one_process(cluster, tmp_path, one_process):
    result, _ = run_from_first_host(cluster, tmp_path, ["node-a", "node-b"], "--nproc_per_node", "2",
                                    "--job_id", "two-by-two", TRAIN, "--steps", str(STEPS), "--out", "w.npy")
    assert result.returncode == 0, result.stderr
    assert "ranks 2-3 on node-b: started its fleetrun over ssh" in result.stderr
    assert "  3     node-b  cpu     node-b:" in result.stderr   # node-b's own start table, relayed
    assert "gloo binds GLOO_SOCKET_IFNAME=eth0, the interface of node-b" in result.stderr
    assert "heartbeat" not in result.stderr + result.stdout
    np.testing.assert_allclose(np.load(tmp_path / "w.npy"), one_process, rtol=1e-5)


def test_a_job_across_hosts_listens_only_on_each_hosts_ips_address_and_only_while_it_starts(cluster, tmp_path):
    """Every socket of the job's processes on each host, sampled from /proc while it starts and
    once it runs, is on that host's address: rank 0's store listens on node-a's while the ranks
    connect (node-b's rank starts 1 s late), and nothing listens once the job runs."""
    ips = ["node-a", "node-b"]
    fleetrun = cluster.fleetrun(ips, ["--job_id", "listeners", str(HOLD), str(tmp_path)], tmp_path,
                                env=clean_environment(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = {name: set() for name in ips}
    try:
        deadline = time.monotonic() + JOB_TIMEOUT_S
        while not all((tmp_path / f"ready.{rank}").exists() for rank in range(2)):
            assert fleetrun.poll() is None and time.monotonic() < deadline, "the job ended or stalled before it was ready"
            for name in ips:
                seen[name] |= tcp_sockets(cluster.processes(name))
            time.sleep(0.01)
        running = {name: tcp_sockets(cluster.processes(name)) for name in ips}
        (tmp_path / "stop").touch()
        output, _ = fleetrun.communicate(timeout=JOB_TIMEOUT_S)
    finally:
        fleetrun.kill()
        fleetrun.wait()
    assert fleetrun.returncode == 0, output
    store_port = int(re.search(r"rank 0's store at node-a:(\d+)", output).group(1))
    assert ("listen", ipaddress.ip_address(cluster.hosts["node-a"].address), store_port) in seen["node-a"]
    for name in ips:   # ssh's connections included: they are on the host's address too
        assert {str(address) for _, address, _ in seen[name] | running[name]} == {cluster.hosts[name].address}, name
        assert [s for s in running[name] if s[0] == "listen"] == [], name


def test_three_hosts_named_127_0_1_1_by_themselves_train_like_one_process_listed_by_address(
        hosts_files, tmp_path, one_process):
    """Debian's /etc/hosts maps a host's own name to 127.0.1.1, where gloo would bind by default
    and the others could not connect; each worker binds its --ips address's interface instead."""
    cluster = hosts_files
    for name in cluster.hosts:
        cluster.write_hosts_file(name, own_name_on_loopback=True)
    addresses = [host.address for host in cluster.hosts.values()]
    result, _ = run_from_first_host(cluster, tmp_path, addresses, "--job_id", "three-hosts",
                                    TRAIN, "--steps", str(STEPS), "--out", "w.npy")
    assert result.returncode == 0, result.stderr
    np.testing.assert_allclose(np.load(tmp_path / "w.npy"), one_process, rtol=1e-5)


def test_a_host_name_resolving_to_loopback_there_is_refused_before_its_workers_start(hosts_files, tmp_path):
    cluster = hosts_files
    cluster.write_hosts_file("node-b", own_name_on_loopback=True)
    result, seconds = run_from_first_host(cluster, tmp_path, ["node-a", "node-b"], "--job_id", "loopback-name",
                                          TRAIN, "--steps", str(STEPS))
    assert result.returncode == 2, result.stderr
    assert ("fleetrun: error: --ips: this host, node-b, resolves to 127.0.1.1 here, a loopback address "
            "(Debian's /etc/hosts maps a machine's own name to 127.0.1.1): the other hosts cannot reach its "
            "workers there; list this host in --ips by an address they reach, or map node-b to that "
            "address in this host's /etc/hosts") in result.stderr
    assert "fleetrun: the job failed on node-b: its fleetrun exited with code 2 (its report is above)" \
        in result.stderr
    assert seconds < 20


@pytest.mark.parametrize("ssh_option, said", [
    ("UserKnownHostsFile=/dev/null", "Host key verification failed."),
    ("HostName=no-such-host.invalid", "Could not resolve hostname no-such-host.invalid"),
])
def test_an_ssh_that_fails_at_once_fails_the_job_at_once_naming_the_host(cluster, tmp_path, ssh_option, said):
    result, seconds = run_from_first_host(
        cluster, tmp_path, ["node-a", "node-b"], "--job_id", "no-ssh", TRAIN, "--steps", str(STEPS),
        ssh_command=f"{cluster.ssh_command} -o {ssh_option}", timeout=60)
    assert result.returncode == 255, result.stderr
    assert re.search(r"fleetrun: root cause: could not start fleetrun on node-b over ssh \(ssh exited with "
                     rf"code 255: [^)]*{re.escape(said)}[^)]*\): rank 1 never started", result.stderr), result.stderr
    assert seconds < 15   # not the 120 s store wait
    wait_until_no_fleetlite_processes(cluster, "node-a", 10)


def fault_during_long_job(cluster, tmp_path, job_id, fault):
    """(exit code, seconds from `fault` to fleetrun's end, its output) of a 2 x 2 job from node-a
    with `fault()` once rank 3 on node-b trains."""
    args = ["--nproc_per_node", "2", "--job_id", job_id, TRAIN, "--steps", "400", "--step_seconds", "0.1"]
    return cluster.fault_during_job(["node-a", "node-b"], args, tmp_path, fault,
                                    (tmp_path / "log" / "workerlog.3@node-b", "rank 3 step 2 "),
                                    env=clean_environment())


def test_a_host_killed_outright_is_named_with_its_ranks_within_seconds(cluster, tmp_path):
    try:
        code, seconds, output = fault_during_long_job(cluster, tmp_path, "host-kill",
                                                      lambda: cluster.kill_host("node-b"))
    finally:
        cluster.start_sshd("node-b")
    assert code == 255, output
    assert ("fleetrun: root cause: the connection to node-b was lost (ssh exited with code 255 before its "
            "fleetrun reported: the host went down, or the connection did): ranks 2-3 were there") in output
    assert "its report is above" not in output
    assert seconds < 10, output
    wait_until_no_fleetlite_processes(cluster, "node-a", 10)


def test_a_cut_link_is_named_within_30_s_and_both_hosts_stop_their_workers(cluster, tmp_path):
    try:
        code, seconds, output = fault_during_long_job(cluster, tmp_path, "cut-link",
                                                      lambda: cluster.cut_link("node-b"))
        wait_until_no_fleetlite_processes(cluster, "node-b", 15)   # node-b stopped its own workers
    finally:
        cluster.cut_link("node-b", up=True)
    assert code == 137, output
    assert ("fleetrun: root cause: the connection to node-b was lost (no word from its fleetrun for 10 s): "
            "ranks 2-3 were there") in output
    assert seconds < 30, output
    wait_until_no_fleetlite_processes(cluster, "node-a", 10)


def test_a_restart_across_hosts_resumes_from_the_checkpoint_like_an_uninterrupted_run(cluster, tmp_path,
                                                                                       one_process):
    result, _ = run_from_first_host(cluster, tmp_path, ["node-a", "node-b"], "--nproc_per_node", "2",
                                    "--max_restarts", "1", "--job_id", "restart", TRAIN, "--steps", str(STEPS),
                                    "--fail", "2:3:kill", "--checkpoint", "ckpt.npz", "--out", "w.npy")
    assert result.returncode == 0, result.stderr
    assert "root cause: rank 2 on node-b" in result.stderr and "was killed by SIGKILL" in result.stderr
    assert result.stderr.count("restarting this host's workers (restart 1 of 1)") == 2   # each host its own
    np.testing.assert_allclose(np.load(tmp_path / "w.npy"), one_process, rtol=1e-5)


def across_the_cluster(cluster):
    """run_job's arguments that put node i of a job in host i of the cluster."""
    names = list(cluster.hosts)
    return {"hosts": [cluster.hosts[name].address for name in names],
            "wrap": lambda node, argv: cluster.command(names[node], argv),
            "extra_env": {"GLOO_SOCKET_IFNAME": namespace_cluster.HOST_INTERFACE}}


NODE_LEVEL_STRATEGIES = {
    "hierarchical_all_reduce": {"use_hierarchical_allreduce": True, "fuse_all_reduce_ops": False},
    # density 1: the node's reduce-scatter, the cross-node gather and the node's gather all run,
    # and nothing is left out, so the result is one process's (the selection is test_topk's)
    "hierarchical_top_k": {"topk": True, "topk_configs": {"density": 1.0, "min_numel": 64, "hierarchical": True}},
}


def test_hierarchical_exchanges_across_a_real_node_boundary_train_like_one_process(cluster):
    strategies = json.dumps(NODE_LEVEL_STRATEGIES)
    oracle = run_job(WORKERS / "parity_worker.py", 1, args=[4, strategies], timeout=150)[0]
    ranks = run_job(WORKERS / "parity_worker.py", 4, 2, args=[4, strategies], timeout=200,
                    **across_the_cluster(cluster))
    for key, expected in oracle.items():
        passes = {"use_hierarchical_allreduce"} if key.endswith("all_reduce") else {"topk"}
        assert passes | {"gloo_lowering"} <= set(ranks[0][key]["applied"]), key
        for rank, result in enumerate(ranks):
            for param, values in expected["params"].items():
                np.testing.assert_allclose(result[key]["params"][param], values, rtol=0, atol=1e-5,
                                           err_msg=f"{key}: rank {rank}, parameter {param}")


# -- the parts, without a cluster ---------------------------------------------------------------

INTERFACES = {"127.0.0.1": "lo", "10.213.0.2": "eth0"}
RESOLVES = {"node-a": "10.213.0.1", "node-b": "10.213.0.2", "debian-b": "127.0.1.1", "vm": "127.0.1.1"}


def bind_interface(ips, this_host, environ=None, hostname="vm"):
    return gloo_interface(ips, this_host, environ or {}, INTERFACES, hostname, RESOLVES.get)


def test_workers_bind_the_interface_of_their_hosts_ips_entry_whatever_the_hostname_resolves_to():
    assert bind_interface(["10.213.0.1", "10.213.0.2"], "10.213.0.2") == "eth0"
    assert bind_interface(["node-a", "node-b"], "node-b") == "eth0"


def test_one_machine_jobs_bind_loopback_and_an_exported_interface_is_left_as_it_is():
    assert bind_interface(["127.0.0.1", "127.0.0.2"], "127.0.0.2") == "lo"
    assert bind_interface(["localhost"], "localhost") == "lo"
    assert bind_interface(["127.0.0.1"], "127.0.0.1", {"GLOO_SOCKET_IFNAME": "ens5"}) is None
    assert bind_interface(["node-a", "node-b"], "node-b", {"GLOO_SOCKET_IFNAME": "ens5"}) is None


@pytest.mark.parametrize("ips, this_host, cause, fix", [
    (["node-a", "debian-b"], "debian-b", "--ips: this host, debian-b, resolves to 127.0.1.1 here, a loopback address",
     "list this host in --ips by an address they reach, or map debian-b to that address in this host's /etc/hosts"),
    (["10.213.0.1", "127.0.0.1"], "127.0.0.1", "--ips: this host is listed as 127.0.0.1, a loopback address",
     "list it by an address they reach"),
    (["node-a", "203.0.113.7"], "203.0.113.7", "this host's name 'vm' resolves to 127.0.1.1, a loopback address, "
                                               "and 203.0.113.7 is not an address of its interfaces",
     "map vm to the address the other hosts reach in /etc/hosts, or set GLOO_SOCKET_IFNAME to that interface"),
])
def test_a_host_whose_workers_would_bind_loopback_in_a_multi_host_job_is_refused_with_the_fix(ips, this_host,
                                                                                              cause, fix):
    with pytest.raises(LaunchError) as refused:
        bind_interface(ips, this_host)
    assert str(refused.value).startswith(cause) and fix in str(refused.value)


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def test_the_first_hosts_link_relays_output_without_heartbeats_and_says_when_a_host_went_silent():
    to_remote_read, to_remote_write = os.pipe()
    from_remote_read, from_remote_write = os.pipe()
    console, clock = io.BytesIO(), Clock()
    with os.fdopen(to_remote_write, "wb") as stdin, os.fdopen(from_remote_read, "rb") as output:
        link = RemoteLink(stdin, output, console, silence=10, first_word=30, clock=clock)
        assert link.silence() is None and not link.ever_heard
        clock.now = 31
        assert link.silence() == "no word from its fleetrun within 30 s of starting ssh"
        os.write(from_remote_write, HEARTBEAT + b"fleetrun: job failed, exit code 1\n" + HEARTBEAT)
        os.close(from_remote_write)
        link.finish()
        assert console.getvalue() == b"fleetrun: job failed, exit code 1\n"
        assert link.reported and link.ever_heard and link.silence() is None
        clock.now = 42
        assert link.silence() == "no word from its fleetrun for 10 s"
        link.beat()
        assert os.read(to_remote_read, 16) == b"\n"
        link.close_input()
    os.close(to_remote_read)


def test_a_remote_fleetrun_stops_when_the_first_host_closes_its_stdin_or_goes_silent():
    for close, reason in ((True, "the first host (its connection closed)"),
                          (False, "the first host (no word from it for 0.3 s: the connection to it is lost)")):
        stdin_read, stdin_write = os.pipe()
        beats_read, beats_write = os.pipe()
        stop = StopRequest()
        follow_first_host(stop, stdin_read, beats_write, silence=0.3, interval=0.1)
        if close:
            os.close(stdin_write)
        assert stop.wait(5) and stop.reason == reason
        assert os.read(beats_read, len(HEARTBEAT)) == HEARTBEAT
        os.close(beats_read)   # the heartbeat thread ends at its next write
        if not close:
            os.close(stdin_write)
