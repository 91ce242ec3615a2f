"""The `paddle.distributed.fleet` surface for collective training: `import fleetlite as fleet`.

    fleet.init(is_collective=True, strategy=strategy)
    optimizer = fleet.distributed_optimizer(paddle.optimizer.Momentum(0.1), strategy)
    optimizer.minimize(loss)           # backward -> compile -> apply_gradients
    exe.run(paddle.static.default_startup_program())   # parameters broadcast from rank 0

The topology comes from the environment fleetrun (or mpirun, or srun) sets; `init` brings up
the process group with deadlines (see process_group), before or after
`paddle.enable_static()`. Under `fleetrun --explain` (FLEETLITE_EXPLAIN_ONLY=1) no group is
brought up and `minimize` prints the compile report and ends the script: nothing trains.
"""
import os

import paddle

from fleetlite import process_group, steps_per_run, training_program
from fleetlite.env_contract import EXPLAIN_ONLY, read_topology
from fleetlite.errors import FleetliteError, StrategyConflictError
from fleetlite.strategy import DistributedStrategy

_job = None   # (Topology, DistributedStrategy or None) once init() ran


def init(role_maker=None, is_collective=True, strategy=None, log_level=None):
    """Read this process's place in the job and bring up the process group (bounded waits)."""
    global _job
    if role_maker is not None:
        raise FleetliteError("role makers are not supported: fleetlite reads the topology from the "
                             "environment fleetrun sets; call fleet.init(is_collective=True)")
    if not is_collective:
        raise StrategyConflictError("parameter-server training is not supported",
                                    fix="call fleet.init(is_collective=True)")
    topology = read_topology(os.environ)
    if strategy is not None:
        strategy.validate(topology)
    if not _explain_only():
        process_group.bring_up(topology, process_group.init_timeout())
    _job = (topology, strategy)


def _explain_only():
    return os.environ.get(EXPLAIN_ONLY) == "1"


def _topology():
    if _job is None:
        raise FleetliteError("fleet.init(is_collective=True) has not been called in this process")
    return _job[0]


def worker_index():
    return _topology().rank


def worker_num():
    return _topology().world_size


def is_first_worker():
    return _topology().rank == 0


def worker_endpoints(to_string=False):
    endpoints = list(_topology().endpoints)
    return ",".join(endpoints) if to_string else endpoints


def local_rank():
    return _topology().local_rank


def local_size():
    return _topology().local_size


def node_num():
    return _topology().node_count


def barrier_worker():
    """Block until every worker arrives (a no-op for one worker)."""
    _topology()
    process_group.barrier()


def distributed_optimizer(optimizer, strategy=None):
    """Wrap `optimizer` so that `minimize` trains data parallel under `strategy`."""
    topology = _topology()
    strategy = strategy or _job[1] or DistributedStrategy()
    return DistributedOptimizer(optimizer, strategy.validate(topology), topology)


class DistributedOptimizer:
    """The inner optimizer plus the data-parallel rewrite; other attributes pass through."""

    def __init__(self, optimizer, strategy, topology):
        self.inner_opt = optimizer
        self.user_defined_strategy = strategy
        self.topology = topology
        self.compile_report = None
        self._program = None        # the training program minimize() built

    def __getattr__(self, name):
        if name == "inner_opt":          # not set yet (e.g. during copy): do not recurse
            raise AttributeError(name)
        return getattr(self.inner_opt, name)

    def minimize(self, loss, startup_program=None, parameter_list=None, no_grad_set=None):
        built = training_program.build(loss, self.inner_opt, self.user_defined_strategy, self.topology,
                                       startup_program, parameter_list, no_grad_set)
        self.compile_report = built.report
        if _explain_only():
            print(built.report.table(), flush=True)
            raise SystemExit(0)
        if self.topology.device == "gpu" and self.topology.world_size > 1:
            process_group.create_nccl_rings(built.report.rings, self.topology)
        if built.report.runtime_flags:
            paddle.set_flags(built.report.runtime_flags)
        self._program = loss.block.program
        if self.topology.rank == 0:
            print(built.report.table(), flush=True)
        return built.optimize_ops, built.params_grads

    def prepare_executor(self, executor):
        """Set up `executor` for the program `minimize` built; returns it.

        With `execution_strategy.num_iteration_per_run` N > 1, each `executor.run` of that program
        then takes N batches stacked along axis 0, runs N steps and fetches N values per target
        (see steps_per_run; run the startup program before, or with another executor).
        """
        if self._program is None:
            raise FleetliteError("prepare_executor() needs the program minimize() builds: call minimize() first")
        steps = self.user_defined_strategy.execution_strategy.num_iteration_per_run
        return steps_per_run.install(executor, self._program, steps) if steps > 1 else executor
