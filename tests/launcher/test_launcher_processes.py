"""fleetrun end to end: real processes training over gloo on loopback, every wait bounded.

127.0.0.1 and 127.0.0.2 stand for two hosts. Process checks read /proc, where a zombie counts
as gone (it has exited; only its parent's bookkeeping is left).
"""
import os
import re
import signal
import socket
import subprocess
import sys
import time

import numpy as np
import pytest

from support.multiprocess import FLEETRUN, SCRIPTS, clean_environment, fleetrun, without_root_override

TRAIN = os.path.join(SCRIPTS, "train_linear.py")
STEPS = 6


def start_fleetrun(args, cwd, name="fleetrun"):
    """fleetrun in the background, its output in files (a full pipe would block it)."""
    out = open(os.path.join(cwd, f"{name}.out"), "w")
    return subprocess.Popen(FLEETRUN + args, cwd=cwd, env=clean_environment(), stdout=out,
                            stderr=subprocess.STDOUT)


def output_of(cwd, name="fleetrun"):
    with open(os.path.join(cwd, f"{name}.out")) as out:
        return out.read()


def wait_for(condition, timeout, what):
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out after {timeout} s waiting for {what}"
        time.sleep(0.05)


def alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def logged_pids(log_dir, pattern):
    """{rank: pid} for lines like 'rank 1 pid 123' / 'rank 1 child pid 456' in the workers' logs."""
    found = {}
    for name in os.listdir(log_dir) if os.path.isdir(log_dir) else ():
        if name.startswith("workerlog."):
            with open(os.path.join(log_dir, name), errors="replace") as log:
                found.update({int(r): int(p) for r, p in re.findall(pattern, log.read())})
    return found


def worker_and_child_pids(log_dir, ranks):
    pids = {}

    def all_started():
        pids["workers"] = logged_pids(log_dir, r"rank (\d+) pid (\d+)")
        pids["children"] = logged_pids(log_dir, r"rank (\d+) child pid (\d+)")
        return len(pids["workers"]) == len(pids["children"]) == ranks

    wait_for(all_started, 60, "every worker to start its child")
    return pids["workers"], pids["children"]


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory):
    """Final weights of 2 CPU processes on one host, the oracle the other runs must match."""
    cwd = tmp_path_factory.mktemp("uninterrupted")
    result = fleetrun(["--nproc_per_node", "2", "--job_id", "oracle", TRAIN, "--steps", str(STEPS),
                       "--out", "w.npy"], cwd)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[rank 0] rank 0 step 5 loss" in result.stdout and "job succeeded" in result.stderr
    assert sorted(os.listdir(cwd / "log")) == [".fleetlite", "workerlog.0", "workerlog.1"]
    return np.load(cwd / "w.npy")


def test_two_hosts_train_together_like_one(tmp_path, uninterrupted):
    common = ["--ips", "127.0.0.1,127.0.0.2", "--job_id", "two-hosts"]
    train = [TRAIN, "--steps", str(STEPS), "--out", "w.npy"]
    second = start_fleetrun(common + ["--host", "127.0.0.2"] + train, tmp_path, "second")
    first = fleetrun(common + ["--host", "127.0.0.1"] + train, tmp_path)
    assert second.wait(timeout=60) == 0, output_of(tmp_path, "second")
    assert first.returncode == 0, first.stdout + first.stderr
    np.testing.assert_array_equal(np.load(tmp_path / "w.npy"), uninterrupted)
    assert sorted(n for n in os.listdir(tmp_path / "log") if n.startswith("workerlog")) == \
        ["workerlog.0@127.0.0.1", "workerlog.1@127.0.0.2"]


def test_ssh_fan_out_from_the_first_host(tmp_path, uninterrupted):
    result = fleetrun(["--ssh", "--ips", "127.0.0.1,127.0.0.2", "--host", "127.0.0.1", "--job_id", "ssh",
                       "--ssh_command", f"{sys.executable} {os.path.join(SCRIPTS, 'fake_ssh.py')}",
                       TRAIN, "--steps", str(STEPS), "--out", "w.npy"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "rank 1 on 127.0.0.2: started its fleetrun over ssh" in result.stderr
    assert "1     127.0.0.2  cpu     127.0.0.2:" in result.stderr  # the remote fleetrun's own table
    np.testing.assert_array_equal(np.load(tmp_path / "w.npy"), uninterrupted)


def test_a_failure_on_an_ssh_host_is_reported_there_once_and_fails_the_job(tmp_path):
    result = fleetrun(["--ssh", "--ips", "127.0.0.1,127.0.0.2", "--host", "127.0.0.1", "--job_id", "ssh-fail",
                       "--ssh_command", f"{sys.executable} {os.path.join(SCRIPTS, 'fake_ssh.py')}",
                       TRAIN, "--fail", "1:2:raise"], tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.count("root cause") == 1
    assert "root cause: rank 1 on 127.0.0.2" in result.stderr
    assert "the job failed on 127.0.0.2: its fleetrun exited with code 1" in result.stderr


def test_kill_9_of_a_worker_stops_the_job_and_names_that_rank(tmp_path):
    job = start_fleetrun(["--nproc_per_node", "2", "--job_id", "kill-worker", TRAIN, "--steps", "100000",
                          "--step_seconds", "0.02", "--child"], tmp_path)
    workers, children = worker_and_child_pids(tmp_path / "log", 2)
    killed_at = time.monotonic()
    os.kill(workers[1], signal.SIGKILL)
    assert job.wait(timeout=20) == 128 + signal.SIGKILL
    assert time.monotonic() - killed_at < 5
    output = output_of(tmp_path)
    assert f"root cause: rank 1 on 127.0.0.1 (pid {workers[1]}) was killed by SIGKILL" in output
    assert output.count("root cause") == 1
    survivors = [pid for pid in [*workers.values(), *children.values()] if alive(pid)]
    assert survivors == [], output


def test_sigkill_of_fleetrun_takes_every_worker_down(tmp_path):
    job = start_fleetrun(["--nproc_per_node", "2", "--job_id", "kill-fleetrun", TRAIN, "--steps", "100000",
                          "--step_seconds", "0.02", "--child"], tmp_path)
    workers, children = worker_and_child_pids(tmp_path / "log", 2)
    job.kill()
    job.wait(timeout=10)
    try:
        wait_for(lambda: not any(alive(pid) for pid in workers.values()), 10, "the workers to die")
    finally:  # a worker's own children outlive a SIGKILLed fleetrun (docs/launcher.md, Limits)
        for pid in children.values():
            os.kill(pid, signal.SIGKILL)


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_or_sigterm_to_fleetrun_stops_the_job(tmp_path, signum):
    job = start_fleetrun(["--nproc_per_node", "2", "--job_id", f"stop{signum}", TRAIN, "--steps", "100000",
                          "--step_seconds", "0.02", "--child"], tmp_path)
    workers, children = worker_and_child_pids(tmp_path / "log", 2)
    job.send_signal(signum)
    assert job.wait(timeout=20) == 128 + signum
    output = output_of(tmp_path)
    assert f"stopped by {signal.Signals(signum).name}" in output
    assert f"job stopped, exit code {128 + signum}" in output
    assert not [pid for pid in [*workers.values(), *children.values()] if alive(pid)]


@pytest.mark.parametrize("rank", [0, 1])
def test_an_uncaught_exception_is_reported_once_with_its_traceback(tmp_path, rank):
    result = fleetrun(["--nproc_per_node", "2", "--job_id", f"raise{rank}", TRAIN, "--fail", f"{rank}:2:raise"],
                      tmp_path)
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert f"root cause: rank {rank} on 127.0.0.1" in result.stderr
    assert output.count('raise ValueError("injected failure")') == 1  # the traceback's source line
    assert "victims (a collective failed because a peer was gone): rank" in result.stderr


def test_a_restart_resumes_from_the_checkpoint_and_ends_like_an_uninterrupted_run(tmp_path, uninterrupted):
    result = fleetrun(["--nproc_per_node", "2", "--max_restarts", "1", "--job_id", "restart",
                       TRAIN, "--steps", str(STEPS), "--fail", "1:3:kill", "--checkpoint", "ckpt.npz",
                       "--out", "w.npy"], tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "root cause: rank 1 on 127.0.0.1" in result.stderr
    assert "restarting this host's workers (restart 1 of 1)" in result.stderr
    assert "attempt 2 of 2" in result.stderr
    assert "[rank 0] rank 0 step 3 loss" in result.stdout.split("restart 1")[-1]  # resumed at step 3
    np.testing.assert_array_equal(np.load(tmp_path / "w.npy"), uninterrupted)
    with open(tmp_path / "log" / "workerlog.1") as log:
        assert "===== fleetrun: restart 1 =====" in log.read()


def test_a_stalled_rank_is_named_when_the_collective_times_out(tmp_path):
    """gloo gives up after a fixed 30 s: the slowest test here, and the only way to see it."""
    result = fleetrun(["--nproc_per_node", "2", "--job_id", "stall", TRAIN, "--steps", "10",
                       "--fail", "1:2:stall"], tmp_path, timeout=120)
    assert result.returncode == 1, result.stdout + result.stderr
    assert "rank 0 on 127.0.0.1" in result.stderr and "after a collective failed" in result.stderr
    assert re.search(r"likely cause, ranks that had not reached the collective rank 0 waited in: "
                     r"rank 1 \(entered 2 of 3 steps, the last 3\d\.\d s ago\)", result.stderr), result.stderr
    assert "stopped by fleetrun: rank 1" in result.stderr


def test_ranks_in_different_collectives_are_stopped_at_the_stall_deadline_naming_each_call(tmp_path):
    """Rank 0 in fleet.util.all_reduce, rank 1 in fleet.util.barrier: without fleetrun's stall
    watch, gloo would end the job after 30 s with a C++ traceback."""
    script = os.path.join(SCRIPTS, "fleet_save_idiom.py")
    line_of = {marker: line_number(script, marker)
               for marker in ("fleet.util.all_reduce(1)", "fleet.util.barrier()       # the others")}
    started = time.monotonic()
    result = fleetrun(["--nproc_per_node", "2", "--job_id", "mismatch", "--collective_stall_timeout", "4",
                       script, "out", "--mismatch"], tmp_path)
    elapsed = time.monotonic() - started
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(
        r"fleetrun: root cause: rank 0 waits in fleet.util.all_reduce \(called from fleet_save_idiom.py:"
        rf"{line_of['fleet.util.all_reduce(1)']}, its fleet collective #1\) while rank 1 waits in "
        rf"fleet.util.barrier \(called from fleet_save_idiom.py:{line_of['fleet.util.barrier()       # the others']}, "
        r"its fleet collective #1\), for [45] s: the ranks called different collectives; call the same "
        r"collectives in the same order on every rank", result.stderr), result.stderr
    assert "stopped by fleetrun: rank 0, rank 1" in result.stderr
    assert "C++ Traceback" not in result.stdout + result.stderr and "third_party/gloo" not in result.stderr
    assert elapsed < 30, f"{elapsed:.1f} s: gloo's timeout, not the stall deadline, ended the job"


def line_number(script, marker):
    """The number of the first line of `script` that contains `marker`."""
    with open(script) as source:
        return next(number for number, line in enumerate(source, start=1) if marker in line)


def test_under_pto_the_stall_report_names_the_scripts_save_persistables_line(tmp_path):
    """Fleet's idiom (only the first worker saves) under pto: save_persistables gathers the
    sharded optimizer state through fleet.util, and the report must name the script's call of
    it, not the line inside fleetlite that gathers."""
    script = os.path.join(SCRIPTS, "fleet_save_idiom.py")
    save = line_number(script, "fleet.save_persistables(exe, os.path.join(out, \"ckpt\"), main)")
    result = fleetrun(["--nproc_per_node", "2", "--job_id", "pto-idiom", "--collective_stall_timeout", "4",
                       script, "out", "--pto-idiom"], tmp_path)
    assert result.returncode == 1, result.stdout + result.stderr
    assert re.search(rf"fleetrun: root cause: rank 0 waits in fleet.util.all_gather \(called from "
                     rf"fleet_save_idiom.py:{save}, its fleet collective #1\) while rank 1 waits in fleet.util.barrier "
                     rf"\(called from fleet_save_idiom.py:{save + 1}, ", result.stderr), result.stderr


def test_two_jobs_on_one_host_get_different_store_ports(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    args = ["--nproc_per_node", "1", TRAIN, "--steps", "1"]
    first = start_fleetrun(args, tmp_path / "a")
    second = start_fleetrun(args, tmp_path / "b")
    assert first.wait(timeout=60) == 0 and second.wait(timeout=60) == 0
    stores = {re.search(r"rank 0's store at (\S+),", output_of(tmp_path / d)).group(1) for d in "ab"}
    assert len(stores) == 2, stores


def test_a_pinned_port_in_use_is_refused_before_anything_starts(tmp_path):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = fleetrun(["--start_port", str(port), TRAIN], tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip() == (f"fleetrun: error: port {port} (rank 0's store) is already in use "
                                     f"on this host: stop what uses it, or pass another --start_port")
    assert not (tmp_path / "log").exists()


@pytest.mark.parametrize("args, message", [
    (["missing.py"], "script not found: missing.py"),
    (["--gpus", "0", TRAIN], "no visible GPU"),
    (["--ips", "127.0.0.1,127.0.0.2", TRAIN], "pass --host"),
    (["--nproc_per_node", "2", "--gpus", "0", TRAIN], "one worker per GPU"),
])
def test_pre_flight_errors_are_one_line_and_exit_2(tmp_path, args, message):
    result = fleetrun(args, tmp_path, timeout=30)
    assert result.returncode == 2 and result.stdout == ""
    assert len(result.stderr.strip().splitlines()) == 1 and message in result.stderr, result.stderr
    assert not (tmp_path / "log").exists()


def folder_contents(folder):
    return sorted((str(path.relative_to(folder)), path.is_dir() or path.read_bytes())
                  for path in folder.rglob("*"))


NOT_IPV4 = "is not a valid IPv4 address: write four numbers 0-255 without leading zeros, like 10.0.0.1"
NOT_A_NAME = ("is not a valid hostname: use letters, digits and '-' between dots (at most 63 each, "
              "not starting or ending with '-')")
UNWRITABLE_LOG = "pass a folder you can write to as --log_dir"


@pytest.mark.parametrize("args, message", [
    # --log_dir: a file in the way, or a place nobody may create a folder
    (["--log_dir", "taken", TRAIN], "--log_dir taken: taken is a file, not a folder: move it away, or pass "
                                    "another --log_dir"),
    (["--log_dir", "taken/logs", TRAIN], "--log_dir taken/logs: taken is a file, not a folder: move it away, "
                                         "or pass another --log_dir"),
    (["--log_dir", "/sys/fleetlite-logs", TRAIN],
     f"--log_dir /sys/fleetlite-logs: cannot create /sys/fleetlite-logs (Operation not permitted): {UNWRITABLE_LOG}"),
    # the script
    (["folder"], "script folder is a directory, not a file: pass the training script (the .py file) to run"),
    (["folder/"], "script folder/ is a directory, not a file: pass the training script (the .py file) to run"),
    # --ips: every host an address or a name that resolves
    (["--ips", "10.0.0", TRAIN], f"--ips: host 1 '10.0.0' {NOT_IPV4}"),
    (["--ips", "127.0.0.1,10.0.0.300", "--host", "127.0.0.1", TRAIN], f"--ips: host 2 '10.0.0.300' {NOT_IPV4}"),
    (["--ips", "127.0.0.1:6170", TRAIN], "--ips: host 1 '127.0.0.1:6170' has a port: --ips lists hosts "
                                         "only; rank 0's store port is --start_port"),
    (["--ips", "::1,127.0.0.1", "--host", "127.0.0.1", TRAIN],
     "--ips: host 1 '::1' is an IPv6 address: fleetrun builds IPv4 endpoints (host:port) only; list the host "
     "by its IPv4 address, or by a name that resolves to one"),
    (["--ips", "node 1", TRAIN], "--ips: host 1 'node 1' contains a space: separate hosts with commas only"),
    (["--ips", "127.0.0.1,node_2", TRAIN], f"--ips: host 2 'node_2' {NOT_A_NAME}"),
    (["--ips", "127.0.0.1,,127.0.0.2", TRAIN], "--ips='127.0.0.1,,127.0.0.2': item 2 of the "
                                               "comma-separated list is empty: remove the extra comma"),
    (["--ips", "127.0.0.1,", TRAIN], "--ips='127.0.0.1,': item 2 of the comma-separated list is empty: "
                                     "remove the extra comma"),
    (["--ips", ",127.0.0.1", TRAIN], "--ips=',127.0.0.1': item 1 of the comma-separated list is empty: "
                                     "remove the extra comma"),
    (["--ips", "127.0.0.1,localhost,LOCALHOST.", "--host", "127.0.0.1", TRAIN],
     "--ips lists localhost twice (positions 2 and 3) (as localhost and LOCALHOST.): list each host "
     "once; --nproc_per_node or --gpus sets its workers"),
])
def test_bad_input_is_refused_before_anything_starts_with_the_cause_and_the_fix(tmp_path, args, message):
    (tmp_path / "taken").write_text("a file, not a folder")
    (tmp_path / "folder").mkdir()
    before = folder_contents(tmp_path)
    result = fleetrun(args, tmp_path, timeout=30)
    assert result.returncode == 2 and result.stdout == "", result.stderr
    assert result.stderr == f"fleetrun: error: {message}\n"
    assert folder_contents(tmp_path) == before     # no log folder, no worker log: nothing started


@pytest.mark.parametrize("log_dir, message", [
    ("read-only/logs", f"--log_dir read-only/logs: cannot create read-only/logs (Permission denied): {UNWRITABLE_LOG}"),
    ("read-only", f"--log_dir read-only: the folder is not writable (permission denied): {UNWRITABLE_LOG}"),
])
def test_a_log_dir_the_user_may_not_write_is_refused_before_anything_starts(tmp_path, log_dir, message):
    (tmp_path / "read-only").mkdir(mode=0o555)
    result = fleetrun(["--log_dir", log_dir, TRAIN], tmp_path, timeout=30, prefix=without_root_override())
    assert (result.returncode, result.stdout, result.stderr) == (2, "", f"fleetrun: error: {message}\n")
    assert [path.name for path in tmp_path.rglob("*")] == ["read-only"]


def test_a_host_name_that_does_not_resolve_is_refused_by_name(tmp_path):
    result = fleetrun(["--ips", "127.0.0.1,no-such-host.invalid", "--host", "127.0.0.1", TRAIN], tmp_path,
                      timeout=30)
    assert result.returncode == 2 and result.stdout == ""
    assert re.fullmatch(r"fleetrun: error: --ips: host 'no-such-host\.invalid' does not resolve \(.+\): "
                        r"fix the name, or list the host by its IP address\n", result.stderr), result.stderr
    assert list(tmp_path.iterdir()) == []


def test_explain_runs_the_script_once_as_rank_0_of_the_planned_job(tmp_path):
    result = fleetrun(["--explain", "--nproc_per_node", "2", os.path.join(SCRIPTS, "print_topology.py")],
                      tmp_path, timeout=30)
    assert result.returncode == 0, result.stderr
    assert re.fullmatch(r"explain=1 rank=0 world=2 pid=\d+\n", result.stdout)
    assert not (tmp_path / "log").exists()
