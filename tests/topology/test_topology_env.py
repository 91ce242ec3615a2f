"""Topology values and the launcher -> worker environment contract, as whole tables."""
import pytest

from fleetlite.topology import env_contract
from fleetlite.topology.env_contract import read_topology, worker_env
from fleetlite.errors import TopologyError
from fleetlite.topology.topology import Topology


def _read(env):
    warnings = []
    return read_topology(env, warn=warnings.append), warnings


def test_no_environment_means_one_process():
    topology, warnings = _read({})
    assert (topology.rank, topology.world_size, topology.device, topology.backend) == (0, 1, "cpu", "gloo")
    assert warnings == []


def test_grid_of_4_nodes_by_8_gpus():
    topology = Topology.grid(32, node_count=4, rank=27, device="gpu")
    assert (topology.local_rank, topology.local_size, topology.node_rank, topology.node_count) == (3, 8, 3, 4)
    assert topology.endpoints[27] == "127.0.0.4:6073" and topology.master == "127.0.0.1:6070"
    assert topology.node_ranks() == list(range(24, 32)) and topology.device_id == 3
    assert topology.backend == "nccl" and topology.is_uniform


def test_grid_rejects_uneven_nodes():
    with pytest.raises(TopologyError, match=r"10 % 4 = 2"):
        Topology.grid(10, node_count=4)


@pytest.mark.parametrize("kwargs, words", [
    (dict(rank=2, world_size=2, endpoints=["a:1", "a:2"]), "rank 2 is not in [0, 2)"),
    (dict(world_size=2, endpoints=["a:1"]), "1 endpoints for a world of 2"),
    (dict(device="tpu"), "device 'tpu'"),
    (dict(local_rank=1, local_size=1), "local rank 1"),
])
def test_impossible_topologies_are_errors(kwargs, words):
    with pytest.raises(TopologyError) as info:
        Topology(**kwargs)
    assert words in str(info.value)


@pytest.mark.parametrize("topology", [
    Topology.grid(2, rank=1),
    Topology.grid(32, node_count=4, rank=13, device="gpu"),
    Topology.grid(4, node_count=2, rank=3),
])
def test_worker_env_reads_back_as_the_same_topology(topology):
    env = worker_env(topology, job_id="j", restart_count=2, error_file="/tmp/e")
    assert _read(env) == (topology, [])
    assert env["FLEETLITE_RESTART_COUNT"] == "2" and env["PADDLE_JOB_ID"] == "j"


def test_paddle_variables_full_table():
    env = {"PADDLE_TRAINER_ID": "3", "PADDLE_TRAINERS_NUM": "4",
           "PADDLE_TRAINER_ENDPOINTS": "10.0.0.1:6070,10.0.0.1:6071,10.0.0.2:6070,10.0.0.2:6071",
           "PADDLE_CURRENT_ENDPOINT": "10.0.0.2:6071", "FLAGS_selected_gpus": "1"}
    topology, _ = _read(env)
    assert (topology.rank, topology.local_rank, topology.local_size, topology.node_rank,
            topology.node_count, topology.device, topology.device_id) == (3, 1, 2, 1, 2, "gpu", 1)


def test_world_size_from_the_endpoints_when_trainers_num_is_unset():
    """Paddle's collective role maker counts the endpoints (Paddle's own fleet unit tests set no
    PADDLE_TRAINERS_NUM)."""
    topology, _ = _read({"PADDLE_TRAINER_ID": "1", "PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:36001,127.0.0.1:36002"})
    assert (topology.rank, topology.world_size, topology.endpoints) == (1, 2, ("127.0.0.1:36001", "127.0.0.1:36002"))


def test_endpoints_without_a_trainer_id_are_rank_0_of_the_endpoints():
    """As Paddle: the rank defaults to 0 and the endpoints still make the job."""
    env = {"PADDLE_TRAINER_ENDPOINTS": "127.0.0.1:36001,127.0.0.1:36002,127.0.0.1:36003"}
    topology, _ = _read(env)
    assert (topology.rank, topology.world_size) == (0, 3)
    assert list(topology.endpoints) == env["PADDLE_TRAINER_ENDPOINTS"].split(",")
    assert env_contract.describes_a_job(env)


def test_a_trainer_id_alone_is_one_process_at_rank_0_and_an_error_above():
    topology, _ = _read({"PADDLE_TRAINER_ID": "0"})
    assert topology.world_size == 1
    with pytest.raises(TopologyError) as info:
        _read({"PADDLE_TRAINER_ID": "1"})
    assert str(info.value) == ("PADDLE_TRAINER_ID=1 but neither PADDLE_TRAINERS_NUM nor PADDLE_TRAINER_ENDPOINTS "
                               "says how many ranks the job has: export one of them")


@pytest.mark.parametrize("env, words", [
    ({"PADDLE_TRAINER_ID": "2", "PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ENDPOINTS": "a:1,a:2"},
     "PADDLE_TRAINER_ID=2 is not in [0, PADDLE_TRAINERS_NUM=2)"),
    ({"PADDLE_TRAINER_ID": "0", "PADDLE_TRAINERS_NUM": "3", "PADDLE_TRAINER_ENDPOINTS": "a:1,a:2"},
     "lists 2 endpoints but PADDLE_TRAINERS_NUM=3"),
    ({"PADDLE_TRAINER_ID": "1", "PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ENDPOINTS": "a:1,a:2",
      "PADDLE_CURRENT_ENDPOINT": "a:1"}, "the rank and the endpoint list disagree"),
    ({"PADDLE_TRAINER_ID": "one", "PADDLE_TRAINERS_NUM": "2"}, "PADDLE_TRAINER_ID='one'"),
    ({"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
      "OMPI_COMM_WORLD_LOCAL_SIZE": "2"}, "export PADDLE_MASTER=host:port"),
])
def test_contradictory_or_incomplete_environments_are_errors(env, words):
    with pytest.raises(TopologyError) as info:
        _read(env)
    assert words in str(info.value)


def test_open_mpi_table():
    env = {"OMPI_COMM_WORLD_RANK": "5", "OMPI_COMM_WORLD_SIZE": "8", "OMPI_COMM_WORLD_LOCAL_RANK": "1",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "4", "MASTER_ADDR": "node0", "MASTER_PORT": "29500"}
    topology, _ = _read(env)
    assert (topology.rank, topology.world_size, topology.local_rank, topology.node_rank,
            topology.node_count, topology.master) == (5, 8, 1, 1, 2, "node0:29500")


def test_slurm_table():
    env = {"SLURM_PROCID": "6", "SLURM_NTASKS": "8", "SLURM_NNODES": "2", "SLURM_LOCALID": "2",
           "SLURM_NODEID": "1", "PADDLE_MASTER": "node0:6070"}
    topology, _ = _read(env)
    assert (topology.rank, topology.local_rank, topology.local_size, topology.node_rank) == (6, 2, 4, 1)


def test_precedence_is_stated_when_sources_disagree():
    env = {"PADDLE_TRAINER_ID": "1", "PADDLE_TRAINERS_NUM": "2", "PADDLE_TRAINER_ENDPOINTS": "a:1,a:2",
           "SLURM_PROCID": "0", "SLURM_NTASKS": "1", "PADDLE_MASTER": "a:1"}
    topology, warnings = _read(env)
    assert topology.rank == 1
    assert len(warnings) == 1 and "taken from fleetrun" in warnings[0] and "SLURM_PROCID=0" in warnings[0]


def test_agreeing_sources_stay_quiet():
    env = {"PADDLE_TRAINER_ID": "0", "PADDLE_TRAINERS_NUM": "1", "SLURM_PROCID": "0", "SLURM_NTASKS": "1"}
    assert _read(env)[1] == []
