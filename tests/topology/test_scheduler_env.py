"""Slurm's and Open MPI's variables as whole tables: under srun nothing is exported by hand (rank 0's
store on the step's first host, a port from the job and step ids, each rank on its own host);
under mpirun the master is exported and each rank's endpoint comes from the store."""
import pytest

from fleetlite.errors import TopologyError
from fleetlite.topology import slurm_variables
from fleetlite.topology.env_contract import read_topology


@pytest.mark.parametrize("hostlist, hosts", [
    ("node0", ["node0"]),
    ("node[0-3,7]", ["node0", "node1", "node2", "node3", "node7"]),
    ("gpu[08-10],login", ["gpu08", "gpu09", "gpu10", "login"]),
    ("rack[1-2]-n[1-2]", ["rack1-n1", "rack1-n2", "rack2-n1", "rack2-n2"]),
    ("a,b[1,3],c", ["a", "b1", "b3", "c"]),
])
def test_slurm_hostlists_expand_like_scontrol_show_hostnames(hostlist, hosts):
    assert slurm_variables.expand_hostlist(hostlist) == hosts


@pytest.mark.parametrize("hostlist, words", [
    ("node[0-3", "'[' without its ']'"), ("node0-3]", "']' without its '['"),
    ("node[3-1]", "runs backwards"), ("node[a-b]", "not a number"), ("", "names no host")])
def test_malformed_hostlists_are_named(hostlist, words):
    with pytest.raises(TopologyError, match=words.replace("[", r"\[").replace("]", r"\]")):
        slurm_variables.expand_hostlist(hostlist)


def test_tasks_per_node_repeat_lists_expand():
    assert slurm_variables.expand_tasks_per_node("2(x3),1") == [2, 2, 2, 1]
    with pytest.raises(TopologyError, match="not N or N"):
        slurm_variables.expand_tasks_per_node("2x3")


def srun_env(rank, job_id="4242", step_id="0", nodelist="node[0-1]", tasks="2(x2)", **extra):
    local, node = rank % 2, rank // 2
    return {"SLURM_PROCID": str(rank), "SLURM_NTASKS": "4", "SLURM_NNODES": "2", "SLURM_LOCALID": str(local),
            "SLURM_NODEID": str(node), "SLURM_JOB_ID": job_id, "SLURM_STEP_ID": step_id,
            "SLURM_STEP_NODELIST": nodelist, "SLURM_STEP_TASKS_PER_NODE": tasks, **extra}


def test_srun_ranks_meet_on_the_first_host_with_nothing_exported():
    topologies = [read_topology(srun_env(rank)) for rank in range(4)]
    port = slurm_variables.rendezvous_port(4242, 0)
    assert {t.master for t in topologies} == {f"node0:{port}"}
    assert topologies[3].endpoints == (f"node0:{port}", f"node0:{port + 1}", f"node1:{port}", f"node1:{port + 1}")
    assert [(t.local_rank, t.local_size, t.node_rank, t.node_count) for t in topologies] == [
        (0, 2, 0, 2), (1, 2, 0, 2), (0, 2, 1, 2), (1, 2, 1, 2)]
    assert not any(t.endpoints_from_store for t in topologies)


def test_each_job_and_step_gets_its_own_port_below_fleetruns_and_the_ephemeral_range():
    ports = {read_topology(srun_env(0, job, step)).master for job in ("1", "2", "99999") for step in ("0", "1")}
    assert len(ports) == 6
    assert all(10000 <= int(master.rsplit(":", 1)[1]) < 20000 for master in ports)


def test_an_exported_master_wins_and_uneven_steps_keep_their_hosts():
    env = srun_env(2, nodelist="a,b", tasks="2,1", PADDLE_MASTER="a:7000")
    env.update(SLURM_NTASKS="3", SLURM_LOCALID="0", SLURM_NODEID="1")
    topology = read_topology(env)
    assert topology.endpoints == ("a:7000", "a:7001", "b:7000")
    assert (topology.local_size, topology.node_count) == (1, 2)


def test_a_cyclic_step_leaves_the_endpoints_to_the_store():
    topology = read_topology(srun_env(1, SLURM_DISTRIBUTION="cyclic"))
    assert topology.endpoints_from_store and topology.master.startswith("node0:")


def test_slurm_without_a_step_or_master_says_how_to_start():
    env = {"SLURM_PROCID": "1", "SLURM_NTASKS": "2"}
    with pytest.raises(TopologyError, match="run the script with srun"):
        read_topology(env)


def test_a_step_whose_lists_disagree_with_its_task_count_is_refused():
    with pytest.raises(TopologyError, match="SLURM_NTASKS=4"):
        read_topology(srun_env(0, tasks="3(x2)"))


def test_open_mpi_ranks_take_their_endpoints_from_the_store():
    env = {"OMPI_COMM_WORLD_RANK": "3", "OMPI_COMM_WORLD_SIZE": "4", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "2", "PADDLE_MASTER": "a:29500"}
    topology = read_topology(env)
    assert topology.endpoints_from_store and topology.master == "a:29500"
    with pytest.raises(TopologyError, match="mpirun -x PADDLE_MASTER"):
        read_topology({k: v for k, v in env.items() if k != "PADDLE_MASTER"})
