"""fleetrun's two ways of finding its hosts without --ips, in one process: the srun step it starts
inside a Slurm allocation, and the meeting of a PaddleJob's pods at PADDLE_MASTER (real sockets,
three "pods" as threads on loopback addresses)."""
import threading

import pytest

from fleetlite.errors import LaunchError
from fleetlite.launcher import pod_meeting, slurm_allocation
from fleetlite.launcher.spec import parse_launch_spec
from support.multiprocess import free_port

ALLOCATION = {"SLURM_JOB_NODELIST": "node[0-1]", "SLURM_JOB_ID": "7", "SLURM_NTASKS_PER_NODE": "2"}


def test_in_an_allocation_one_srun_step_starts_a_fleetrun_per_host_with_its_hosts_as_ips():
    spec = parse_launch_spec(["train.py", "--lr", "0.1"], ALLOCATION)
    assert slurm_allocation.applies(spec, ALLOCATION)
    argv, said = slurm_allocation.step_command(spec, ALLOCATION, python="/py")
    assert argv[:6] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1", "--nodelist=node[0-1]",
                        "--kill-on-bad-exit=1"]
    inner = parse_launch_spec(argv[argv.index("fleetrun") + 1:], {})
    assert (inner.ips, inner.nproc_per_node, inner.job_id, inner.script_args) == (
        ("node0", "node1"), 2, "slurm-7", ("--lr", "0.1"))
    assert '--host "$SLURMD_NODENAME"' in argv[argv.index("-c") + 1]
    assert "one fleetrun on each of its 2 hosts (node0, node1), 2 workers per host" in said


@pytest.mark.parametrize("argv, environ", [
    (["--ips", "a,b", "t.py"], ALLOCATION), (["t.py"], {**ALLOCATION, "PADDLE_IPS": "a"}),
    (["--host", "a", "t.py"], ALLOCATION), (["t.py"], {})])
def test_stated_hosts_or_no_allocation_start_fleetrun_as_usual(argv, environ):
    assert not slurm_allocation.applies(parse_launch_spec(argv, environ), environ)


def test_a_flag_beats_the_allocations_tasks_per_node_and_a_bad_count_is_named():
    spec = parse_launch_spec(["--nproc_per_node", "1", "t.py"], ALLOCATION)
    assert "--nproc_per_node 1" in " ".join(slurm_allocation.step_command(spec, ALLOCATION)[0])
    bad = {**ALLOCATION, "SLURM_NTASKS_PER_NODE": "two"}
    with pytest.raises(LaunchError, match="SLURM_NTASKS_PER_NODE='two'"):
        slurm_allocation.step_command(parse_launch_spec(["t.py"], bad), bad)


def test_paddlejob_pods_meet_at_the_master_and_list_its_address_first():
    master, pods = f"127.0.0.1:{free_port()}", ("127.0.0.3", "127.0.0.2", "127.0.0.1")
    met, failures = {}, []

    def pod(address):
        environ = {"PADDLE_MASTER": master, "PADDLE_NNODES": "3", "POD_IP": address,
                   "FLEETLITE_POD_MEETING_TIMEOUT": "20"}
        try:
            met[address] = pod_meeting.meet(parse_launch_spec(["t.py"], environ), environ)
        except Exception as exc:   # reported below, with the pod
            failures.append((address, exc))

    threads = [threading.Thread(target=pod, args=(address,)) for address in pods]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not failures
    port = int(master.rsplit(":", 1)[1])
    assert {spec.ips[0] for spec in met.values()} == {"127.0.0.1"}
    assert len({spec.ips for spec in met.values()}) == 1 and sorted(met["127.0.0.1"].ips) == sorted(pods)
    assert {spec.master for spec in met.values()} == {f"127.0.0.1:{port + 1}"}
    assert met["127.0.0.2"].host == "127.0.0.2"


def test_a_pod_without_its_address_or_the_master_is_told_what_the_paddlejob_gives():
    environ = {"PADDLE_NNODES": "2", "PADDLE_MASTER": "127.0.0.1:7000"}
    spec = parse_launch_spec(["t.py"], environ)
    assert pod_meeting.applies(spec, environ)
    with pytest.raises(LaunchError, match="POD_IP"):
        pod_meeting.meet(spec, environ)
    with pytest.raises(LaunchError, match="PADDLE_NNODES='x'"):
        pod_meeting.applies(spec, {"PADDLE_NNODES": "x"})


def test_pods_that_never_come_are_named_after_the_deadline():
    master = f"127.0.0.1:{free_port()}"
    environ = {"PADDLE_MASTER": master, "PADDLE_NNODES": "2", "POD_IP": "127.0.0.1",
               "FLEETLITE_POD_MEETING_TIMEOUT": "1"}
    with pytest.raises(LaunchError, match="not all 2 pods met"):
        pod_meeting.meet(parse_launch_spec(["t.py"], environ), environ)
