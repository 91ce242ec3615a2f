"""fleetrun's pure half: flags + environment -> LaunchSpec -> the whole table of WorkerSlots."""
import pytest

from fleetlite import env_contract
from fleetlite.errors import LaunchError
from fleetlite.launcher.plan import job_port, pinned_port, plan_workers
from fleetlite.launcher.spec import LaunchSpec, follower_argv, parse_launch_spec
from fleetlite.topology import Topology

FOUR_HOSTS = ("10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4")


def table(slots):
    return [(s.rank, s.local_rank, s.host, s.device, s.endpoint, s.log_path) for s in slots]


def rows(text):
    """A table written as text: rank local host device endpoint log, one worker a line."""
    return [(int(r), int(l), h, d, e, log) for r, l, h, d, e, log in (line.split() for line in
                                                                    text.strip().splitlines())]


# --- spec: flags, environment, precedence -------------------------------------------------

def test_flags_and_script_arguments_pass_through():
    spec = parse_launch_spec(["--ips", "10.0.0.1,10.0.0.2", "--gpus", "0,1", "--log_dir", "out",
                              "--start_port", "7000", "--max_restarts", "2", "--job_id", "j1",
                              "train.py", "--lr", "0.1", "--gpus", "9"], {})
    assert (spec.ips, spec.devices, spec.log_dir, spec.start_port, spec.max_restarts, spec.job_id) == \
        (("10.0.0.1", "10.0.0.2"), (0, 1), "out", 7000, 2, "j1")
    assert (spec.script, spec.script_args) == ("train.py", ("--lr", "0.1", "--gpus", "9"))
    assert spec.notes == ()


def test_defaults():
    spec = parse_launch_spec(["train.py"], {})
    assert spec == LaunchSpec(script="train.py")


def test_precedence_flag_over_environment_over_default_and_each_override_is_noted():
    environ = {"PADDLE_NPROC_PER_NODE": "4", "PADDLE_LOG_DIR": "env_logs", "PADDLE_JOB_ID": "same"}
    spec = parse_launch_spec(["--nproc_per_node", "2", "--job_id", "same", "t.py"], environ)
    assert (spec.nproc_per_node, spec.log_dir, spec.job_id) == (2, "env_logs", "same")
    assert spec.notes == (
        "--nproc_per_node=2 (flag) overrides PADDLE_NPROC_PER_NODE=4 (environment)",
        "--log_dir=env_logs taken from the environment (PADDLE_LOG_DIR)",
    )


@pytest.mark.parametrize("argv, environ, named", [
    (["--start_port", "abc", "t.py"], {}, "--start_port='abc'"),
    (["--start_port", "80", "t.py"], {}, "[1024, 65535]"),
    (["t.py"], {"PADDLE_START_PORT": "x"}, "PADDLE_START_PORT='x'"),
    (["--gpus", "0,a", "t.py"], {}, "--devices='0,a'"),
    (["--gpus", "0,,1", "t.py"], {}, "empty"),
    (["--master", "10.0.0.1", "t.py"], {}, "host:port"),
    (["--nproc_per_node", "-1", "t.py"], {}, "negative"),
    (["--collective_stall_timeout", "-1", "t.py"], {}, "0 or more"),
    (["t.py"], {"FLEETLITE_COLLECTIVE_STALL_TIMEOUT": "soon"}, "FLEETLITE_COLLECTIVE_STALL_TIMEOUT='soon'"),
    (["--no_such_flag", "t.py"], {}, "--no_such_flag"),
    ([], {}, "script"),
])
def test_bad_values_name_their_source(argv, environ, named):
    with pytest.raises(LaunchError, match=named.replace("[", r"\[").replace("]", r"\]")):
        parse_launch_spec(argv, environ)


def test_the_ssh_follower_command_line_reproduces_the_spec_with_host_and_port_pinned():
    spec = parse_launch_spec(["--ips", "a,b", "t.py", "--x"],
                             {"PADDLE_DEVICES": "0,1", "PADDLE_MAX_RESTART": "1",
                              "FLEETLITE_COLLECTIVE_STALL_TIMEOUT": "4.5"})
    follower = parse_launch_spec(follower_argv(spec, "b", 7001), {})
    assert (follower.ips, follower.host, follower.start_port, follower.devices, follower.max_restarts,
            follower.collective_stall_timeout, follower.script, follower.script_args, follower.follow_stdin) == \
        (("a", "b"), "b", 7001, (0, 1), 1, 4.5, "t.py", ("--x",), True)


# --- plan: whole tables ----------------------------------------------------------------------

FOUR_BY_EIGHT = rows("""
0  0 10.0.0.1 gpu:0 10.0.0.1:6070 log/workerlog.0@10.0.0.1
1  1 10.0.0.1 gpu:1 10.0.0.1:6071 log/workerlog.1@10.0.0.1
2  2 10.0.0.1 gpu:2 10.0.0.1:6072 log/workerlog.2@10.0.0.1
3  3 10.0.0.1 gpu:3 10.0.0.1:6073 log/workerlog.3@10.0.0.1
4  4 10.0.0.1 gpu:4 10.0.0.1:6074 log/workerlog.4@10.0.0.1
5  5 10.0.0.1 gpu:5 10.0.0.1:6075 log/workerlog.5@10.0.0.1
6  6 10.0.0.1 gpu:6 10.0.0.1:6076 log/workerlog.6@10.0.0.1
7  7 10.0.0.1 gpu:7 10.0.0.1:6077 log/workerlog.7@10.0.0.1
8  0 10.0.0.2 gpu:0 10.0.0.2:6070 log/workerlog.8@10.0.0.2
9  1 10.0.0.2 gpu:1 10.0.0.2:6071 log/workerlog.9@10.0.0.2
10 2 10.0.0.2 gpu:2 10.0.0.2:6072 log/workerlog.10@10.0.0.2
11 3 10.0.0.2 gpu:3 10.0.0.2:6073 log/workerlog.11@10.0.0.2
12 4 10.0.0.2 gpu:4 10.0.0.2:6074 log/workerlog.12@10.0.0.2
13 5 10.0.0.2 gpu:5 10.0.0.2:6075 log/workerlog.13@10.0.0.2
14 6 10.0.0.2 gpu:6 10.0.0.2:6076 log/workerlog.14@10.0.0.2
15 7 10.0.0.2 gpu:7 10.0.0.2:6077 log/workerlog.15@10.0.0.2
16 0 10.0.0.3 gpu:0 10.0.0.3:6070 log/workerlog.16@10.0.0.3
17 1 10.0.0.3 gpu:1 10.0.0.3:6071 log/workerlog.17@10.0.0.3
18 2 10.0.0.3 gpu:2 10.0.0.3:6072 log/workerlog.18@10.0.0.3
19 3 10.0.0.3 gpu:3 10.0.0.3:6073 log/workerlog.19@10.0.0.3
20 4 10.0.0.3 gpu:4 10.0.0.3:6074 log/workerlog.20@10.0.0.3
21 5 10.0.0.3 gpu:5 10.0.0.3:6075 log/workerlog.21@10.0.0.3
22 6 10.0.0.3 gpu:6 10.0.0.3:6076 log/workerlog.22@10.0.0.3
23 7 10.0.0.3 gpu:7 10.0.0.3:6077 log/workerlog.23@10.0.0.3
24 0 10.0.0.4 gpu:0 10.0.0.4:6070 log/workerlog.24@10.0.0.4
25 1 10.0.0.4 gpu:1 10.0.0.4:6071 log/workerlog.25@10.0.0.4
26 2 10.0.0.4 gpu:2 10.0.0.4:6072 log/workerlog.26@10.0.0.4
27 3 10.0.0.4 gpu:3 10.0.0.4:6073 log/workerlog.27@10.0.0.4
28 4 10.0.0.4 gpu:4 10.0.0.4:6074 log/workerlog.28@10.0.0.4
29 5 10.0.0.4 gpu:5 10.0.0.4:6075 log/workerlog.29@10.0.0.4
30 6 10.0.0.4 gpu:6 10.0.0.4:6076 log/workerlog.30@10.0.0.4
31 7 10.0.0.4 gpu:7 10.0.0.4:6077 log/workerlog.31@10.0.0.4
""")


def test_four_hosts_by_eight_gpus():
    spec = LaunchSpec(script="train.py", ips=FOUR_HOSTS, devices=tuple(range(8)))
    slots = plan_workers(spec, 6070, {})
    assert table(slots) == FOUR_BY_EIGHT
    rank27 = slots[27].env
    assert (rank27["PADDLE_TRAINER_ID"], rank27["PADDLE_TRAINERS_NUM"], rank27["PADDLE_RANK_IN_NODE"],
            rank27["PADDLE_LOCAL_SIZE"], rank27["PADDLE_NNODES"], rank27["FLEETLITE_NODE_RANK"],
            rank27["FLAGS_selected_gpus"], rank27["PADDLE_DISTRI_BACKEND"], rank27["PADDLE_MASTER"],
            rank27["PADDLE_CURRENT_ENDPOINT"]) == \
        ("27", "32", "3", "8", "4", "3", "3", "nccl", "10.0.0.1:6070", "10.0.0.4:6073")
    assert "OMP_NUM_THREADS" not in rank27  # thread defaults are for CPU workers


def test_every_slot_environment_reads_back_as_its_topology():
    spec = LaunchSpec(script="train.py", ips=FOUR_HOSTS, devices=tuple(range(8)))
    endpoints = [row[4] for row in FOUR_BY_EIGHT]
    for slot in plan_workers(spec, 6070, {}):
        assert env_contract.read_topology(slot.env) == Topology(
            rank=slot.rank, world_size=32, local_rank=slot.local_rank, local_size=8,
            node_rank=slot.rank // 8, node_count=4, endpoints=endpoints, device="gpu",
            device_id=slot.local_rank)


def test_cpu_two_processes():
    spec = LaunchSpec(script="train.py", nproc_per_node=2, log_dir="logs", job_id="j")
    slots = plan_workers(spec, 7000, {"PATH": "/bin", "PADDLE_TRAINER_ID": "9", "KMP_BLOCKTIME": "200",
                                      "MALLOC_TRIM_THRESHOLD_": "0"}, attempt=1)
    assert table(slots) == rows("""
        0 0 127.0.0.1 cpu 127.0.0.1:7000 logs/workerlog.0
        1 1 127.0.0.1 cpu 127.0.0.1:7001 logs/workerlog.1
    """)
    env = slots[1].env
    assert (env["PATH"], env["PADDLE_TRAINER_ID"], env["PADDLE_DISTRI_BACKEND"], env["PADDLE_JOB_ID"],
            env["FLEETLITE_RESTART_COUNT"], env["OMP_NUM_THREADS"], env["KMP_BLOCKTIME"],
            env["GLOG_minloglevel"]) == \
        ("/bin", "1", "gloo", "j", "1", "1", "200", "1")  # the contract beats the inherited env; defaults lose
    assert (env["MALLOC_MMAP_THRESHOLD_"], env["MALLOC_TRIM_THRESHOLD_"]) == ("33554432", "0")
    assert (slots[1].error_file, slots[1].progress_file) == \
        ("logs/.fleetlite/rank1.error.json", "logs/.fleetlite/rank1.progress")
    assert "FLAGS_selected_gpus" not in env


@pytest.mark.parametrize("spec, message", [
    (LaunchSpec(script="t.py", ips=("a", "b", "a")), "lists a twice (positions 1 and 3)"),
    (LaunchSpec(script="t.py", ips=("Node-a", "b", "node-A.")), "lists Node-a twice (positions 1 and 3) "
                                                                 "(as Node-a and node-A.)"),
    (LaunchSpec(script="t.py", ips=("fe80::1", "fe80:0::1")), "lists fe80::1 twice (positions 1 and 2) "
                                                              "(as fe80::1 and fe80:0::1)"),
    (LaunchSpec(script="t.py", devices=(0, 1, 1)), "device 1 more than once"),
    (LaunchSpec(script="t.py", devices=(0, -2)), "got -2"),
    (LaunchSpec(script="t.py", devices=()), "no device"),
    (LaunchSpec(script="t.py", devices=(0, 1), nproc_per_node=4), "--nproc_per_node 4 but --gpus lists 2"),
    (LaunchSpec(script="t.py", nproc_per_node=0), "at least one worker"),
    (LaunchSpec(script="t.py", ips=("a", "b"), master="b:7000"), "not on the first host"),
])
def test_impossible_plans_are_errors(spec, message):
    with pytest.raises(LaunchError, match=message.replace("(", r"\(").replace(")", r"\)")):
        plan_workers(spec, 7000, {})


def test_ports_past_65535_are_an_error():
    with pytest.raises(LaunchError, match="past 65535"):
        plan_workers(LaunchSpec(script="t.py", nproc_per_node=4), 65534, {})


def test_pinned_port_comes_from_start_port_or_master_and_they_must_agree():
    assert pinned_port(LaunchSpec(script="t.py")) is None
    assert pinned_port(LaunchSpec(script="t.py", start_port=7000)) == 7000
    assert pinned_port(LaunchSpec(script="t.py", master="127.0.0.1:7100")) == 7100
    with pytest.raises(LaunchError, match="disagree"):
        pinned_port(LaunchSpec(script="t.py", master="127.0.0.1:7100", start_port=7000))


def test_the_job_port_is_stable_and_below_the_ephemeral_range():
    assert job_port("default") == job_port("default") != job_port("other")
    assert all(1024 < job_port(name) < 32768 for name in ("default", "a", "b" * 100))
