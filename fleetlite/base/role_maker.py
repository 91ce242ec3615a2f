"""Fleet's role makers for collective training: where `fleet.init(role)` learns the topology.

Fleet scripts pass one of these to `fleet.init`; fleetlite maps them onto its `Topology`:
- `PaddleCloudRoleMaker(is_collective=True)` reads the environment fleetrun (or mpirun, or
  srun) sets, exactly as `fleet.init(is_collective=True)` does;
- `UserDefinedRoleMaker(is_collective=True, current_id=..., worker_endpoints=[...],
  role=Role.WORKER, worker_num=...)` states the topology in the script: current_id is the
  rank, worker_endpoints the ranks' host:port in rank order (the first hosts the rendezvous
  store), worker_num their count. When a launcher also describes the job, the two must agree.
fleetlite trains collectively only: a parameter-server role (a server, heter worker or
coordinator, server endpoints, or `is_collective=False`) is an error naming the fix.
"""
import abc

from fleetlite.topology import env_contract
from fleetlite.errors import FleetliteError, StrategyConflictError, TopologyError

__all__ = ["Role", "RoleMakerBase", "PaddleCloudRoleMaker", "UserDefinedRoleMaker"]


class Role:
    """Fleet's role numbers; a collective job has workers only."""
    WORKER = 1
    SERVER = 2
    HETER_WORKER = 3
    ALL = 4
    COORDINATOR = 5


_ROLE_NAMES = {value: f"Role.{name}" for name, value in vars(Role).items() if name.isupper()}


def _collective_only(maker, is_collective):
    if not is_collective:
        raise StrategyConflictError(
            f"{maker}(is_collective=False) asks for parameter-server training, which fleetlite "
            f"does not support", fix=f"pass {maker}(is_collective=True)")


class RoleMakerBase(abc.ABC):
    """What `fleet.init(role_maker)` needs from a role maker: this process's Topology."""

    @abc.abstractmethod
    def topology(self, environ):
        ...


class PaddleCloudRoleMaker(RoleMakerBase):
    """The topology from the launcher's environment (fleetrun, Open MPI or Slurm).

    `init_gloo` is accepted and has no effect: fleetlite always brings up a CPU-capable
    process group (gloo on CPU). Fleet's gloo rendezvous settings (`path`, `http.*`,
    `dfs.*`, `store.prefix`) configure a rendezvous fleetlite does not use: they are errors.
    """

    def __init__(self, is_collective=False, init_gloo=False, **kwargs):
        _collective_only(type(self).__name__, is_collective)
        if kwargs:
            raise FleetliteError(
                f"{type(self).__name__} options {', '.join(sorted(kwargs))} configure Paddle's gloo "
                f"rendezvous, which fleetlite does not use (its process group rendezvous at rank 0's "
                f"endpoint): remove them")
        self.is_collective = True

    def topology(self, environ):
        return env_contract.read_topology(environ)


class UserDefinedRoleMaker(RoleMakerBase):
    """The topology stated by the script; checked against the launcher's, when there is one."""

    def __init__(self, is_collective=False, init_gloo=False, current_id=0, role=Role.WORKER,
                 worker_num=0, worker_endpoints=None, server_endpoints=None):
        name = type(self).__name__
        _collective_only(name, is_collective)
        if role != Role.WORKER:
            raise StrategyConflictError(
                f"{name}(role={_ROLE_NAMES.get(role, repr(role))}) is a parameter-server role; "
                f"fleetlite trains collectively, where every process is a worker",
                fix="pass role=Role.WORKER")
        if server_endpoints:
            raise StrategyConflictError(
                f"{name}(server_endpoints=...) describes parameter servers, which a collective job "
                f"does not have", fix="remove server_endpoints")
        if not worker_endpoints:
            raise TopologyError(f"{name} needs worker_endpoints: every rank's host:port, in rank order "
                                f"(the first hosts the rendezvous store)")
        self.is_collective = True
        self.current_id = current_id
        self.worker_endpoints = list(worker_endpoints)
        if worker_num and worker_num != len(self.worker_endpoints):
            raise TopologyError(f"{name}(worker_num={worker_num}) but worker_endpoints lists "
                                f"{len(self.worker_endpoints)} endpoints: they must match")

    def topology(self, environ):
        stated = {env_contract.TRAINER_ID: str(self.current_id),
                  env_contract.TRAINERS_NUM: str(len(self.worker_endpoints)),
                  env_contract.TRAINER_ENDPOINTS: ",".join(self.worker_endpoints)}
        device_only = {name: environ[name] for name in (env_contract.BACKEND, env_contract.SELECTED_GPUS)
                       if name in environ}
        declared = env_contract.read_topology({**device_only, **stated})
        if not env_contract.describes_a_job(environ):
            return declared
        launched = env_contract.read_topology(environ, warn=lambda line: None)
        if _placement(launched, environ) != _placement(declared, environ):
            raise TopologyError(
                f"{type(self).__name__} says rank {declared.rank} of {list(declared.endpoints)}, but "
                f"the launcher started this process as rank {launched.rank} of {list(launched.endpoints)}: "
                f"build the role maker from the launcher's variables (current_id=int(os.environ"
                f"['{env_contract.TRAINER_ID}']), worker_endpoints=os.environ['{env_contract.TRAINER_ENDPOINTS}']"
                f".split(',')), or use PaddleCloudRoleMaker(is_collective=True), which reads them")
        return declared


def _placement(topology, environ):
    """What a launcher decides about a rank: its number, the job's size, and (fleetrun's own
    variable; mpirun and srun give no endpoints) every rank's endpoint."""
    endpoints = topology.endpoints if env_contract.TRAINER_ENDPOINTS in environ else None
    return topology.rank, topology.world_size, endpoints
