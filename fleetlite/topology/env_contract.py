"""The launcher -> worker environment contract, shared by both sides.

`fleetrun` writes a worker's environment with `worker_env`; the worker reads its Topology back
with `read_topology`. Jobs started by other schedulers work too: Open MPI (`mpirun`) and Slurm
(`srun`) variables are read when fleetrun's are absent. Under srun nothing is exported by hand:
rank 0's store is on the step's first host at a port derived from the job and step ids, and each
rank's endpoint is on its own host. Open MPI names no hosts: rank 0's store comes from
PADDLE_MASTER, and each rank's own endpoint is exchanged through the store (docs/clusters.md).

Paddle's variables are read by Paddle's own rules (its collective role maker): the rank is
PADDLE_TRAINER_ID (0 when unset), the world is PADDLE_TRAINERS_NUM or else the number of
PADDLE_TRAINER_ENDPOINTS (either variable marks a job), one process when neither is set.

Precedence (one rule): fleetrun/Paddle variables > Open MPI > Slurm. The first source that
defines a rank is used; if a later source also defines one and disagrees, one line says which
was used and why. (Open MPI ranks beat Slurm's because `mpirun` inside an allocation inherits
the batch step's SLURM_PROCID, which is the same for every process.)
"""
import sys

from fleetlite.errors import TopologyError
from fleetlite.topology import slurm_variables
from fleetlite.topology.topology import Topology

TRAINER_ID = "PADDLE_TRAINER_ID"
TRAINERS_NUM = "PADDLE_TRAINERS_NUM"
TRAINER_ENDPOINTS = "PADDLE_TRAINER_ENDPOINTS"
CURRENT_ENDPOINT = "PADDLE_CURRENT_ENDPOINT"
MASTER = "PADDLE_MASTER"
RANK_IN_NODE = "PADDLE_RANK_IN_NODE"
LOCAL_SIZE = "PADDLE_LOCAL_SIZE"
NNODES = "PADDLE_NNODES"
SELECTED_GPUS = "FLAGS_selected_gpus"
BACKEND = "PADDLE_DISTRI_BACKEND"
JOB_ID = "PADDLE_JOB_ID"
# fleetlite's own additions to the contract
NODE_RANK = "FLEETLITE_NODE_RANK"
RESTART_COUNT = "FLEETLITE_RESTART_COUNT"
ERROR_FILE = "FLEETLITE_ERROR_FILE"
PROGRESS_FILE = "FLEETLITE_PROGRESS_FILE"
# Where the worker writes its step records at its end (launcher/step_records.py), and "1" when
# `fleetrun --timeline` asks for each step's events too (the compiler then instruments them).
STEPS_FILE = "FLEETLITE_STEPS_FILE"
STEP_EVENTS = "FLEETLITE_STEP_EVENTS"
# The pid of the fleetrun that started this worker: the worker dies with it (PR_SET_PDEATHSIG)
# and exits at once if it was already gone when the worker started.
LAUNCHER_PID = "FLEETLITE_LAUNCHER_PID"
# Set to "1" by `fleetrun --explain`: the fleet API must not bring up a process group; it compiles
# for read_topology(os.environ) (rank 0 of the planned job), prints the CompileReport, and exits 0.
EXPLAIN_ONLY = "FLEETLITE_EXPLAIN_ONLY"
# A random secret each host's fleetrun draws once per job and gives its workers (restarts keep
# it): part of the names of what they share on the node (the memory sample store), so no other
# job, and no other user, can compute them.
NODE_SECRET = "FLEETLITE_NODE_SECRET"


def worker_env(topology, job_id="default", restart_count=0, error_file=None, progress_file=None, steps_file=None,
               step_events=False):
    """The variables that make a worker see `topology` (Paddle's names plus fleetlite's)."""
    env = {
        TRAINER_ID: str(topology.rank),
        TRAINERS_NUM: str(topology.world_size),
        TRAINER_ENDPOINTS: ",".join(topology.endpoints),
        CURRENT_ENDPOINT: topology.endpoints[topology.rank],
        MASTER: topology.master,
        RANK_IN_NODE: str(topology.local_rank),
        LOCAL_SIZE: str(topology.local_size),
        NNODES: str(topology.node_count),
        NODE_RANK: str(topology.node_rank),
        BACKEND: topology.backend,
        JOB_ID: job_id,
        RESTART_COUNT: str(restart_count),
    }
    if topology.device == "gpu":
        env[SELECTED_GPUS] = str(topology.device_id)
    if error_file:
        env[ERROR_FILE] = str(error_file)
    if progress_file:
        env[PROGRESS_FILE] = str(progress_file)
    if steps_file:
        env[STEPS_FILE] = str(steps_file)
    if step_events:
        env[STEP_EVENTS] = "1"
    return env


def _int(environ, name, source):
    raw = environ[name]
    try:
        return int(raw)
    except ValueError:
        raise TopologyError(f"{name}={raw!r} ({source}) is not an integer") from None


def _device(environ):
    backend = environ.get(BACKEND, "").lower()
    if backend in ("nccl", "gloo"):
        return ("gpu" if backend == "nccl" else "cpu"), _gpu_id(environ)
    if environ.get(SELECTED_GPUS):
        return "gpu", _gpu_id(environ)
    return "cpu", None


def _gpu_id(environ):
    ids = environ.get(SELECTED_GPUS, "")
    return int(ids.split(",")[0]) if ids else None


def _from_paddle(environ):
    rank = _int(environ, TRAINER_ID, "fleetrun") if TRAINER_ID in environ else 0
    endpoints = [e for e in environ.get(TRAINER_ENDPOINTS, "").split(",") if e]
    if TRAINERS_NUM in environ:
        world = _int(environ, TRAINERS_NUM, "fleetrun")
    elif endpoints:
        world = len(endpoints)
    elif rank == 0:
        world = 1
    else:
        raise TopologyError(f"{TRAINER_ID}={rank} but neither {TRAINERS_NUM} nor {TRAINER_ENDPOINTS} "
                            f"says how many ranks the job has: export one of them")
    if not endpoints:
        master = environ.get(MASTER, "127.0.0.1:6070")
        endpoints = [master] * world
    if len(endpoints) != world:
        raise TopologyError(f"{TRAINER_ENDPOINTS} lists {len(endpoints)} endpoints but "
                            f"{TRAINERS_NUM}={world}: they must match")
    if not 0 <= rank < world:
        raise TopologyError(f"{TRAINER_ID}={rank} is not in [0, {TRAINERS_NUM}={world})")
    current = environ.get(CURRENT_ENDPOINT)
    if current and current != endpoints[rank]:
        raise TopologyError(f"{CURRENT_ENDPOINT}={current} but {TRAINER_ENDPOINTS}[{rank}]="
                            f"{endpoints[rank]}: the rank and the endpoint list disagree")
    hosts = list(dict.fromkeys(e.rsplit(":", 1)[0] for e in endpoints))
    my_host = endpoints[rank].rsplit(":", 1)[0]
    same_host = [r for r, e in enumerate(endpoints) if e.rsplit(":", 1)[0] == my_host]
    local_size = _int(environ, LOCAL_SIZE, "fleetrun") if LOCAL_SIZE in environ else len(same_host)
    local_rank = _int(environ, RANK_IN_NODE, "fleetrun") if RANK_IN_NODE in environ else same_host.index(rank)
    node_count = _int(environ, NNODES, "fleetrun") if NNODES in environ else len(hosts)
    node_rank = _int(environ, NODE_RANK, "fleetrun") if NODE_RANK in environ else hosts.index(my_host)
    return dict(rank=rank, world_size=world, local_rank=local_rank, local_size=local_size,
                node_rank=node_rank, node_count=node_count, endpoints=endpoints)


def _explicit_master(environ):
    master = environ.get(MASTER)
    if not master and environ.get("MASTER_ADDR"):
        master = f"{environ['MASTER_ADDR']}:{environ.get('MASTER_PORT', '6070')}"
    return master


def _endpoints(master, hosts_of_ranks, local_ranks):
    """Each rank's endpoint: its own host, the master's port plus its local rank (as fleetrun's);
    rank 0's is the master itself."""
    port = int(master.rsplit(":", 1)[1])
    return [master] + [f"{hosts_of_ranks[r]}:{port + local_ranks[r]}" for r in range(1, len(hosts_of_ranks))]


def _from_mpi(environ):
    """Open MPI says each rank's place but not its host, nor where rank 0 is: the master comes from
    the environment (`mpirun -x PADDLE_MASTER=host:port`), and each rank's own endpoint is
    exchanged through the store when the process group comes up (endpoints_from_store)."""
    rank = _int(environ, "OMPI_COMM_WORLD_RANK", "Open MPI")
    world = _int(environ, "OMPI_COMM_WORLD_SIZE", "Open MPI")
    local_rank = _int(environ, "OMPI_COMM_WORLD_LOCAL_RANK", "Open MPI")
    local_size = _int(environ, "OMPI_COMM_WORLD_LOCAL_SIZE", "Open MPI")
    master = _explicit_master(environ)
    if not master:
        raise TopologyError(f"Open MPI gives ranks but no rendezvous address: export "
                            f"{MASTER}=host:port (or MASTER_ADDR and MASTER_PORT) for rank 0's store, "
                            f"e.g. mpirun -x {MASTER}=<first host>:29500")
    host = master.rsplit(":", 1)[0]
    return dict(rank=rank, world_size=world, local_rank=local_rank, local_size=local_size,
                node_rank=rank // local_size, node_count=max(1, world // local_size),
                endpoints=_endpoints(master, [host] * world, list(range(world))),
                endpoints_from_store=world > 1)


def _slurm_hosts(environ):
    """The step's hosts, from its hostlist; None when Slurm does not say them."""
    nodelist = next((environ[n] for n in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                     if environ.get(n)), None)
    return slurm_variables.expand_hostlist(nodelist) if nodelist else None


def _slurm_layout(environ, hosts, world):
    """(host of each rank, local rank of each rank, tasks of each host) under Slurm's default block
    distribution; None when Slurm does not say the tasks per host or distributes otherwise."""
    tasks = environ.get("SLURM_STEP_TASKS_PER_NODE") or environ.get("SLURM_TASKS_PER_NODE")
    if not hosts or not tasks or not environ.get("SLURM_DISTRIBUTION", "block").startswith("block"):
        return None
    counts = slurm_variables.expand_tasks_per_node(tasks)
    if len(hosts) != len(counts) or sum(counts) != world:
        raise TopologyError(f"Slurm's step spans {len(hosts)} hosts ({', '.join(hosts)}) with tasks per "
                            f"node {tasks} ({sum(counts)} tasks on {len(counts)} hosts), but "
                            f"SLURM_NTASKS={world}: run the script with srun inside the allocation")
    hosts_of_ranks = [host for host, count in zip(hosts, counts) for _ in range(count)]
    local_ranks = [local for count in counts for local in range(count)]
    return hosts_of_ranks, local_ranks, counts


def _slurm_step_port(environ):
    step = environ.get("SLURM_STEP_ID", "")
    return slurm_variables.rendezvous_port(_int(environ, "SLURM_JOB_ID", "Slurm"),
                                           int(step) if step.isdigit() else 0)


def _from_slurm(environ):
    """Slurm says each rank's host (the step's hostlist and tasks per node), so rank 0's store is
    on the first host, at a port derived from the job and step ids: nothing is exported by hand.
    Under a distribution other than block each rank's endpoint comes from the store."""
    rank = _int(environ, "SLURM_PROCID", "Slurm")
    world = _int(environ, "SLURM_NTASKS", "Slurm")
    node_count = _int(environ, "SLURM_NNODES", "Slurm") if "SLURM_NNODES" in environ else 1
    local_rank = _int(environ, "SLURM_LOCALID", "Slurm") if "SLURM_LOCALID" in environ else 0
    node_rank = _int(environ, "SLURM_NODEID", "Slurm") if "SLURM_NODEID" in environ else 0
    hosts = _slurm_hosts(environ)
    master = _explicit_master(environ)
    if not master and hosts and "SLURM_JOB_ID" in environ:
        master = f"{hosts[0]}:{_slurm_step_port(environ)}"
    if not master:
        raise TopologyError(f"Slurm gives ranks but no rendezvous address: run the script with srun "
                            f"(which sets SLURM_JOB_ID and SLURM_STEP_NODELIST), or export "
                            f"{MASTER}=host:port (or MASTER_ADDR and MASTER_PORT) for rank 0's store")
    layout = _slurm_layout(environ, hosts, world)
    if layout is None:
        return dict(rank=rank, world_size=world, local_rank=local_rank,
                    local_size=max(1, world // node_count), node_rank=node_rank, node_count=node_count,
                    endpoints=_endpoints(master, [master.rsplit(":", 1)[0]] * world, list(range(world))),
                    endpoints_from_store=world > 1)
    hosts_of_ranks, local_ranks, counts = layout
    return dict(rank=rank, world_size=world, local_rank=local_rank, local_size=counts[node_rank],
                node_rank=node_rank, node_count=len(counts),
                endpoints=_endpoints(master, hosts_of_ranks, local_ranks))


def source_of(environ):
    """Which launcher set this process's place in the job ('fleetrun', 'Open MPI', 'Slurm'), or None."""
    present = _present(environ)
    return present[0][0] if present else None


SOURCES = (  # (name, its rank variable, other variables that mark it present, reader), in precedence order
    ("fleetrun", TRAINER_ID, (TRAINER_ENDPOINTS,), _from_paddle),
    ("Open MPI", "OMPI_COMM_WORLD_RANK", (), _from_mpi),
    ("Slurm", "SLURM_PROCID", (), _from_slurm),
)


def _present(environ):
    return [(name, marker, reader) for name, marker, also, reader in SOURCES
            if any(variable in environ for variable in (marker,) + also)]


def describes_a_job(environ):
    """Whether a launcher (fleetrun, Open MPI or Slurm) set this process's place in a job."""
    return bool(_present(environ))


def read_topology(environ, warn=None):
    """This process's Topology from an environment mapping; rank 0 of 1 when no source is set."""
    warn = warn or (lambda line: print(line, file=sys.stderr))
    present = _present(environ)
    device, device_id = _device(environ)
    if not present:
        return Topology(device=device, device_id=device_id if device == "gpu" else None)
    name, marker, reader = present[0]
    fields = reader(environ)
    for other, other_marker, _ in present[1:]:
        if environ[other_marker] != str(fields["rank"]):
            warn(f"fleetlite: rank {fields['rank']} taken from {name} ({marker}); {other} says "
                 f"{other_marker}={environ[other_marker]} and was ignored (precedence: "
                 f"fleetrun > Open MPI > Slurm)")
    if device == "gpu" and device_id is None:
        device_id = fields["local_rank"]
    return Topology(device=device, device_id=device_id, **fields)
