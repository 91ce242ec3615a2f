"""fleetrun's parts one at a time: pre-flight rules, ports, worker records, the failure report,
supervision with stand-in processes, the console tee and the worker bootstrap."""
import io
import json
import os
import re
import socket
import subprocess
import sys
import time

import pytest

from fleetlite.errors import LaunchError
from fleetlite.interprocess import tcp_ports
from fleetlite.runtime import collective_waits
from fleetlite.launcher import ports
from fleetlite.launcher.collective_stall import Stall, StallWatch, find_stall, format_stall
from fleetlite.launcher.failure_report import WorkerEnd, diagnose, exit_code, format_report
from fleetlite.launcher.log_tee import LogTee
from fleetlite.launcher.preflight import (check_devices, check_hosts, find_this_host, prepare_log_dir,
                                         visible_gpu_count)
from fleetlite.launcher.supervisor import StopRequest, stop_processes, watch
from fleetlite.launcher.worker_records import (CollectiveWait, ErrorRecord, Progress, ProgressWriter,
                                               read_error, read_progress, write_error)

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(__file__)), "launcher_scripts")

# --- pre-flight ------------------------------------------------------------------------------


def test_this_host_is_found_by_address_hostname_or_flag():
    assert find_this_host(("10.0.0.9", "10.0.0.1"), None, {"10.0.0.1"}, "node") == "10.0.0.1"
    assert find_this_host(("a", "node"), None, set(), "node") == "node"
    assert find_this_host(("10.0.0.1", "127.0.0.2"), None, set(), "node") == "127.0.0.2"  # 127/8 is local
    assert find_this_host(("127.0.0.1", "127.0.0.2"), "127.0.0.2", set(), "node") == "127.0.0.2"


@pytest.mark.parametrize("ips, host, message", [
    (("10.0.0.8", "10.0.0.9"), None, "this host .* is not in --ips 10.0.0.8,10.0.0.9"),
    (("127.0.0.1", "127.0.0.2"), None, "several hosts in --ips are this machine .* pass --host"),
    (("127.0.0.1",), "127.0.0.3", "--host 127.0.0.3 is not in --ips 127.0.0.1"),
])
def test_this_host_errors(ips, host, message):
    with pytest.raises(LaunchError, match=message):
        find_this_host(ips, host, {"10.0.0.1"}, "node")


NOT_IPV4 = "is not a valid IPv4 address: write four numbers 0-255 without leading zeros, like 10.0.0.1"
IPV6 = ("an IPv6 address: fleetrun builds IPv4 endpoints (host:port) only; list the host by its IPv4 address, "
        "or by a name that resolves to one")
NOT_A_NAME = ("is not a valid hostname: use letters, digits and '-' between dots (at most 63 each, "
              "not starting or ending with '-')")


@pytest.mark.parametrize("hosts, message", [
    (("10.0.0",), f"host 1 '10.0.0' {NOT_IPV4}"),
    (("127.0.0.1", "10.1"), f"host 2 '10.1' {NOT_IPV4}"),
    (("10.0.0.256",), f"host 1 '10.0.0.256' {NOT_IPV4}"),
    (("010.0.0.1",), f"host 1 '010.0.0.1' {NOT_IPV4}"),
    (("10.0.0.1.5",), f"host 1 '10.0.0.1.5' {NOT_IPV4}"),
    (("12345",), f"host 1 '12345' {NOT_IPV4}"),
    (("10.0.0.1:6170",), "host 1 '10.0.0.1:6170' has a port: --ips lists hosts only; rank 0's store "
                         "port is --start_port"),
    (("node1:",), "host 1 'node1:' has a port: --ips lists hosts only; rank 0's store port is --start_port"),
    (("10.0.0.1", "fe80::1"), f"host 2 'fe80::1' is {IPV6}"),
    (("::1",), f"host 1 '::1' is {IPV6}"),
    (("2001:db8::7",), f"host 1 '2001:db8::7' is {IPV6}"),
    (("[::1]",), f"host 1 '[::1]' looks like {IPV6}"),
    (("fe80::1::2",), f"host 1 'fe80::1::2' looks like {IPV6}"),
    (("node 1",), "host 1 'node 1' contains a space: separate hosts with commas only"),
    (("node\t1",), "host 1 'node\\t1' contains a space: separate hosts with commas only"),
    (("node_1",), f"host 1 'node_1' {NOT_A_NAME}"),
    (("node;rm",), f"host 1 'node;rm' {NOT_A_NAME}"),
    (("-node",), f"host 1 '-node' {NOT_A_NAME}"),
    (("node-",), f"host 1 'node-' {NOT_A_NAME}"),
    (("a..b",), f"host 1 'a..b' {NOT_A_NAME}"),
    (("x" * 64,), f"host 1 '{'x' * 64}' {NOT_A_NAME}"),
    (("nodé",), f"host 1 'nodé' {NOT_A_NAME}"),
    (("node.42",), "host 1 'node.42' is not a valid hostname: its last part is all digits"),
])
def test_malformed_hosts_are_refused_without_a_lookup(hosts, message):
    looked_up = []
    with pytest.raises(LaunchError) as refused:
        check_hosts(hosts, lookup=looked_up.append)
    assert str(refused.value) == f"--ips: {message}" and looked_up == []


def test_only_names_are_looked_up_and_addresses_are_taken_as_written():
    looked_up = []
    check_hosts(("10.0.0.1", "node-1", "Node-2.example.", "localhost"), lookup=looked_up.append)
    assert sorted(looked_up) == ["Node-2.example.", "localhost", "node-1"]


def test_names_that_do_not_resolve_are_refused_by_name():
    with pytest.raises(LaunchError) as refused:
        check_hosts(("127.0.0.1", "localhost", "no-such-host.invalid"))
    assert re.fullmatch(r"--ips: host 'no-such-host\.invalid' does not resolve \(.+\): fix the name, or "
                        r"list the host by its IP address", str(refused.value)), refused.value


def test_a_lookup_that_hangs_is_refused_at_the_deadline():
    began = time.monotonic()
    with pytest.raises(LaunchError) as refused:
        check_hosts(("slow-dns",), lookup=lambda name: time.sleep(5), timeout=0.2)
    assert time.monotonic() - began < 2
    assert str(refused.value) == ("--ips: host 'slow-dns' does not resolve (no answer within 0.2 s): fix "
                                  "the name, or list the host by its IP address")


def test_the_log_folder_is_made_unless_something_is_in_the_way(tmp_path):
    prepare_log_dir(str(tmp_path / "a" / "b"))
    assert (tmp_path / "a" / "b").is_dir()
    (tmp_path / "file").write_text("keep")
    (tmp_path / "dangling").symlink_to(tmp_path / "gone")
    cases = [
        (tmp_path / "file", f"{tmp_path / 'file'} is a file, not a folder"),
        (tmp_path / "file" / "logs", f"{tmp_path / 'file'} is a file, not a folder"),
        (tmp_path / "dangling", f"{tmp_path / 'dangling'} is a file, not a folder"),
    ]
    for log_dir, why in cases:
        with pytest.raises(LaunchError) as refused:
            prepare_log_dir(str(log_dir))
        assert str(refused.value) == f"--log_dir {log_dir}: {why}: move it away, or pass another --log_dir"
    assert (tmp_path / "file").read_text() == "keep" and not (tmp_path / "gone").exists()


def test_gpu_ids_are_checked_against_the_visible_devices():
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": "3,5"}) == 2
    assert visible_gpu_count({"CUDA_VISIBLE_DEVICES": ""}) == 0
    check_devices((0, 1), 2, {})
    check_devices(None, 0, {})
    with pytest.raises(LaunchError, match="no visible GPU.*--nproc_per_node"):
        check_devices((0,), 0, {})
    with pytest.raises(LaunchError, match="device 2 but this host has 2 visible GPUs, ids 0..1 "
                                          r"\(ids are relative to CUDA_VISIBLE_DEVICES=3,5\)"):
        check_devices((0, 2), 2, {"CUDA_VISIBLE_DEVICES": "3,5"})


# --- ports -----------------------------------------------------------------------------------

TCP_TABLE = """\
  sl  local_address rem_address   st tx_queue rx_queue tr tm->when retrnsmt   uid  timeout inode
   0: 00000000:181A 00000000:0000 0A 00000000:00000000 00:00000000 00000000     0        0 1 1
   1: 0100007F:181B 0100007F:C670 01 00000000:00000000 00:00000000 00000000     0        0 2 3
   2: 0100007F:181C 0100007F:C674 06 00000000:00000000 00:00000000 00000000     0        0 0 2
"""


@pytest.fixture
def tcp_table(tmp_path):
    path = tmp_path / "tcp"
    path.write_text(TCP_TABLE)
    return (str(path), str(tmp_path / "no_tcp6"))


def test_ports_in_use_come_from_the_tcp_table_not_time_wait(tcp_table):
    assert tcp_ports.parse_tcp_table(TCP_TABLE) == [(6170, "0A"), (6171, "01"), (6172, "06")]
    assert tcp_ports.ports_in_use(tcp_table) == {6170, 6171}
    assert tcp_ports.is_listening(6170, tcp_table) and not tcp_ports.is_listening(6171, tcp_table)


def test_a_reserved_port_is_exclusive_until_released(tmp_path, tcp_table):
    first = ports.reserve_port(6180, "job-a", "pick another", str(tmp_path), tcp_table)
    with pytest.raises(LaunchError, match=f"port 6180 .* reserved by a running fleetrun "
                                          f"\\(pid {os.getpid()} job job-a\\): pick another"):
        ports.reserve_port(6180, "job-b", "pick another", str(tmp_path), tcp_table)
    with pytest.raises(LaunchError, match="port 6170 .* already in use on this host: pick another"):
        ports.reserve_port(6170, "job-b", "pick another", str(tmp_path), tcp_table)
    first.release()
    ports.reserve_port(6180, "job-b", "pick another", str(tmp_path), tcp_table).release()


def test_two_jobs_picking_free_ports_get_different_ones(tmp_path, tcp_table):
    first = ports.reserve_free_port(6170, "a", str(tmp_path), tcp_table)
    second = ports.reserve_free_port(6170, "b", str(tmp_path), tcp_table)
    assert (first.port, second.port) == (6172, 6173)  # 6170-6171 in use, 6172 only in TIME_WAIT


def test_wait_until_listening_sees_a_real_listener_and_has_a_deadline():
    with socket.socket() as server:
        server.bind(("127.0.0.1", 0))
        port = server.getsockname()[1]
        assert not tcp_ports.wait_until_listening(port, timeout=0.1)
        server.listen()
        assert tcp_ports.wait_until_listening(port, timeout=5)


# --- worker records --------------------------------------------------------------------------


def test_error_and_progress_records_round_trip(tmp_path):
    error_file, progress_file = tmp_path / "e.json", tmp_path / "p"
    assert read_error(error_file) is None and read_progress(progress_file) is None
    write_error(error_file, ValueError("boom"), "Traceback ...\nValueError: boom\n")
    record = read_error(error_file)
    assert (record.exception, record.message, record.traceback) == \
        ("ValueError", "boom", "Traceback ...\nValueError: boom\n")
    progress = ProgressWriter(str(progress_file))
    for _ in range(12):
        progress.enter_step()
    assert read_progress(progress_file).steps == 12


def test_the_progress_record_says_which_fleet_collective_the_worker_waits_in(tmp_path):
    progress_file = tmp_path / "p"
    progress = ProgressWriter(str(progress_file))
    progress.enter_step()
    collective_waits.listen(progress)
    try:
        with collective_waits.waiting_in("fleet.util.barrier"):
            wait = read_progress(progress_file).collective
            line = sys._getframe().f_lineno - 2                        # the `with` line: the caller
        with collective_waits.waiting_in("fleet.util.all_reduce"):
            second = read_progress(progress_file).collective
    finally:
        collective_waits.listen(None)
    assert (wait.kind, wait.sequence, wait.where) == ("fleet.util.barrier", 1, f"test_launcher_parts.py:{line}")
    assert (second.kind, second.sequence) == ("fleet.util.all_reduce", 2)
    assert read_progress(progress_file) == Progress(1, read_progress(progress_file).time, None)   # left it
    progress.enter_collective("fleet.util.barrier", "\u00e9" * 500)      # a long, escaped caller still fits
    assert read_progress(progress_file).collective.where == "\u00e9" * 100


def waiting(kind, sequence, since, where="train.py:1"):
    return CollectiveWait(kind, sequence, where, since)


def test_ranks_waiting_past_the_deadline_in_different_collectives_are_a_stall():
    barrier, reduce = waiting("fleet.util.barrier", 3, 100.0, "train.py:45"), waiting("fleet.util.all_reduce", 3, 101.0,
                                                                                     "train.py:42")
    assert find_stall({0: reduce, 1: barrier}, now=111.5, deadline=10) == Stall(((0, reduce), (1, barrier)), 10.5)
    assert find_stall({0: reduce, 1: barrier}, now=110.5, deadline=10) is None      # rank 0: only 9.5 s
    assert find_stall({0: barrier, 1: barrier}, now=200, deadline=10) is None       # the same call: waiting
    assert find_stall({0: barrier, 1: None}, now=200, deadline=10) is None          # rank 1 is still working
    later = waiting("fleet.util.barrier", 4, 100.0)                                 # the same call, once more
    assert find_stall({0: barrier, 1: later}, now=200, deadline=10).seconds == 100
    assert format_stall(find_stall({0: reduce, 1: barrier, 2: None}, now=111, deadline=10)) == [
        "fleetrun: root cause: rank 0 waits in fleet.util.all_reduce (called from train.py:42, its fleet "
        "collective #3) while rank 1 waits in fleet.util.barrier (called from train.py:45, its fleet collective "
        "#3), for 10 s: the ranks called different collectives; call the same collectives in the same order on "
        "every rank (fleetrun stopped the job after its stall deadline, --collective_stall_timeout)"]


def test_the_stall_watch_reads_the_progress_records_and_a_deadline_of_0_never_fires(tmp_path):
    files = {rank: str(tmp_path / f"p{rank}") for rank in (0, 1)}
    writers = {rank: ProgressWriter(path) for rank, path in files.items()}
    writers[0].enter_collective("fleet.util.all_reduce", "t.py:1")
    writers[1].enter_collective("fleet.util.barrier", "t.py:2")
    assert StallWatch(files, 10, clock=lambda: time.time() + 5).check() is None
    assert StallWatch(files, 0, clock=lambda: time.time() + 1e6).check() is None
    found = StallWatch(files, 10, clock=lambda: time.time() + 11).check()
    assert [rank for rank, _ in found.waits] == [0, 1]


# --- failure report --------------------------------------------------------------------------

PEER_GONE = ErrorRecord("RuntimeError", "[/paddle/third_party/gloo/gloo/transport/tcp/pair.cc:576] "
                        "Read error [127.0.0.1]:1: Connection reset by peer", "Traceback\n...", 10.5)
TIMED_OUT = ErrorRecord("RuntimeError", "std::exception", "Traceback\n...", 40.0)
BOOM = ErrorRecord("ValueError", "boom", "Traceback (most recent call last):\nValueError: boom\n", 10.2)


def end(rank, returncode, time_seen, **fields):
    return WorkerEnd(name=f"rank {rank}", host="127.0.0.1", pid=100 + rank, rank=rank,
                     returncode=returncode, time=time_seen, log_path=f"log/workerlog.{rank}", **fields)


def test_the_root_cause_is_the_earliest_failure_that_is_not_a_victim():
    ends = [end(0, 1, 10.6, error=PEER_GONE), end(1, 1, 10.6, error=BOOM, log_tail=("step 3",)),
            end(2, -15, 10.7, stopped=True), end(3, 1, 11.0, stopped=True, error=PEER_GONE)]
    diagnosis = diagnose(ends)
    assert diagnosis.root.rank == 1
    assert [e.rank for e in diagnosis.victims] == [0, 3] and [e.rank for e in diagnosis.stopped] == [2]
    assert exit_code(diagnosis) == 1
    report = "\n".join(format_report(diagnosis, now=12.0))
    assert report.count("ValueError: boom") == 2  # the summary line and the traceback's last line
    assert report.splitlines()[0] == "fleetrun: root cause: rank 1 on 127.0.0.1 (pid 101) exited with code 1"
    assert "last 1 lines of log/workerlog.1:\n    step 3" in report
    assert "victims (a collective failed because a peer was gone): rank 0 (RuntimeError: " in report
    assert "stopped by fleetrun: rank 2" in report


def test_a_rank_killed_by_a_signal_exits_as_the_shell_would():
    diagnosis = diagnose([end(0, 1, 3.0, error=PEER_GONE), end(1, -9, 2.9)])
    assert diagnosis.root.rank == 1 and exit_code(diagnosis) == 137
    assert format_report(diagnosis, now=4.0)[0].endswith("was killed by SIGKILL")


def test_a_timeout_with_no_other_failure_names_the_ranks_that_were_behind():
    ends = [end(0, 1, 40.1, error=TIMED_OUT, progress=Progress(11, 10.0)),
            end(1, -15, 40.2, stopped=True, progress=Progress(10, 9.5)),
            end(2, -15, 40.2, stopped=True, progress=Progress(11, 10.0))]
    diagnosis = diagnose(ends)
    assert diagnosis.root.rank == 0 and [e.rank for e in diagnosis.behind] == [1]
    report = "\n".join(format_report(diagnosis, now=40.5))
    assert "after a collective failed; no rank on this host failed on its own" in report
    assert ("likely cause, ranks that had not reached the collective rank 0 waited in: "
            "rank 1 (entered 10 of 11 steps, the last 31.0 s ago)") in report


def test_a_teed_root_cause_points_at_its_output_instead_of_repeating_it():
    diagnosis = diagnose([end(0, 1, 1.0, error=BOOM, teed=True, log_tail=("x",))])
    report = "\n".join(format_report(diagnosis, now=2.0))
    assert "its output, traceback included, is above (the lines prefixed [rank 0])" in report
    assert "Traceback" not in report and "last 1 lines" not in report


def test_ranks_fleetrun_stopped_are_listed_in_rank_order_whatever_order_they_ended_in():
    ends = [end(0, 1, 10.0, error=BOOM), end(3, -15, 10.1, stopped=True), end(1, -15, 10.3, stopped=True),
            end(2, -15, 10.2, stopped=True)]
    assert [e.rank for e in diagnose(ends).stopped] == [1, 2, 3]


def test_a_job_stopped_from_outside_blames_no_victim():
    ends = [end(0, 1, 1.0, error=PEER_GONE), end(1, -15, 1.1, stopped=True)]
    diagnosis = diagnose(ends, blame_victims=False)
    assert diagnosis.root is None and [e.rank for e in diagnosis.victims] == [0]
    assert exit_code(diagnosis, stop_signum=15) == 143
    assert exit_code(diagnose([end(0, 0, 1.0)])) == 0


# --- supervision, with stand-in processes ----------------------------------------------------


class StandIn:
    """A process that ends with `code` after `polls` polls, or, once terminated, after
    `term_polls` (None: ignores SIGTERM, dies on kill)."""

    def __init__(self, name, code=None, polls=0, term_polls=0):
        self.name, self.code, self.polls, self.term_polls = name, code, polls, term_polls
        self.signals, self.returncode = [], None

    def poll(self):
        if self.returncode is None:
            self.polls -= 1
            if self.code is not None and self.polls < 0:
                self.returncode = self.code
            if "TERM" in self.signals and self.term_polls is not None:
                self.term_polls -= 1
                if self.term_polls < 0:
                    self.returncode = -15
            if "KILL" in self.signals:
                self.returncode = -9
        return self.returncode

    def terminate(self):
        self.signals.append("TERM")

    def kill(self):
        self.signals.append("KILL")


def test_watch_returns_at_the_first_failure_and_stop_escalates_to_kill():
    ok, failing = StandIn("ok", code=0, polls=1), StandIn("failing", code=1, polls=2)
    polite, stubborn = StandIn("polite", term_polls=1), StandIn("stubborn", term_polls=None)
    stop = StopRequest()
    ended = watch([ok, failing, polite, stubborn], stop, poll_interval=0.001)
    assert [(e.process.name, e.returncode, e.stopped) for e in ended] == [("ok", 0, False), ("failing", 1, False)]
    started = time.monotonic()
    ended = stop_processes([polite, stubborn], stop, grace=0.2, kill_wait=1.0, poll_interval=0.001)
    assert 0.2 <= time.monotonic() - started < 1.0
    assert [(e.process.name, e.returncode, e.stopped) for e in ended] == \
        [("polite", -15, True), ("stubborn", -9, True)]
    assert stubborn.signals == ["TERM", "KILL"]


def test_watch_returns_when_all_succeed_or_a_stop_is_requested():
    assert [e.returncode for e in watch([StandIn("a", 0), StandIn("b", 0, polls=3)], StopRequest(),
                                        poll_interval=0.001)] == [0, 0]
    stop = StopRequest()
    stop.request(2)
    assert watch([StandIn("running")], stop) == [] and stop.reason == "SIGINT"
    checks = []
    assert watch([StandIn("waiting")], StopRequest(), poll_interval=0.001,
                 stalled=lambda: checks.append(1) or len(checks) == 3) == [] and len(checks) == 3


def test_a_second_stop_request_skips_the_grace_period():
    stop = StopRequest()
    stop.request(2)
    stop.request(2)
    started = time.monotonic()
    stop_processes([StandIn("stubborn", term_polls=None)], stop, grace=30, poll_interval=0.001)
    assert time.monotonic() - started < 1


# --- console tee -----------------------------------------------------------------------------


def test_the_tee_prefixes_whole_lines_and_flushes_an_unterminated_last_line(tmp_path):
    log = tmp_path / "workerlog.0"
    log.write_bytes(b"before start\n")
    console = io.BytesIO()
    tee = LogTee(str(log), log.stat().st_size, "[rank 0] ", console, poll_interval=0.01).start()
    with open(log, "ab") as out:
        out.write("héllo\nwor".encode())
        out.flush()
        time.sleep(0.05)
        out.write(b"ld\nlast")
    tee.stop()
    assert console.getvalue().decode() == "[rank 0] héllo\n[rank 0] world\n[rank 0] last\n"


# --- the worker bootstrap --------------------------------------------------------------------


def test_bootstrap_records_the_scripts_traceback_without_its_own_frames(tmp_path):
    error_file = tmp_path / "error.json"
    result = subprocess.run(
        [sys.executable, "-m", "fleetlite.launcher.bootstrap", os.path.join(SCRIPTS, "raises.py"), "x"],
        env={**os.environ, "FLEETLITE_ERROR_FILE": str(error_file)},
        capture_output=True, text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr.startswith("Traceback (most recent call last):\n  File \"" + SCRIPTS)
    assert "runpy" not in result.stderr and "bootstrap" not in result.stderr
    record = json.loads(error_file.read_text())
    assert (record["exception"], record["message"], record["traceback"]) == \
        ("KeyError", "'argument x'", result.stderr)


def test_closing_a_worker_returns_only_once_its_whole_process_group_is_gone(monkeypatch):
    from fleetlite.launcher import transport
    group = subprocess.Popen(["sh", "-c", "sleep 60 & sleep 60"], start_new_session=True)
    try:
        wait_until = time.monotonic() + 5
        while len(transport._live_members(group.pid)) < 2 and time.monotonic() < wait_until:
            time.sleep(0.01)
        assert len(transport._live_members(group.pid)) >= 2      # the shell and its sleeps
        looks = []
        real_live_members = transport._live_members

        def slow_to_die(pgid):   # as on a loaded machine: the killed group lingers for a few looks
            looks.append(pgid)
            return [group.pid] if len(looks) < 4 else real_live_members(pgid)
        monkeypatch.setattr(transport, "_live_members", slow_to_die)
        transport.Process("rank 0", "127.0.0.1", group).close()
        assert len(looks) >= 4 and real_live_members(group.pid) == []
    finally:
        group.kill()
        group.wait(timeout=5)
