"""The `paddle.distributed.fleet` surface for collective training: `import fleetlite as fleet`.

    fleet.init(is_collective=True, strategy=strategy)
    optimizer = fleet.distributed_optimizer(paddle.optimizer.Momentum(0.1), strategy)
    optimizer.minimize(loss)           # backward -> compile -> apply_gradients
    exe.run(paddle.static.default_startup_program())   # parameters broadcast from rank 0

The topology comes from the environment fleetrun (or mpirun, or srun) sets, or from a role
maker (fleetlite.base.role_maker); `init` brings up the process group with deadlines (see
process_group), before or after `paddle.enable_static()`: at once in dynamic mode, and in static
mode at the first call that needs the other ranks (the first run of a program with collectives,
a barrier, a `fleet.util` collective; see lazy_rendezvous), as Paddle does. Under `fleetrun --explain`
(FLEETLITE_EXPLAIN_ONLY=1) no group is brought up and `minimize` prints the compile report and
ends the script: nothing trains. docs/fleet_compatibility.md lists every Fleet name.
"""
import os
import sys

import paddle

from fleetlite.compile import bucket_views, mixed_precision
from fleetlite.base.role_maker import PaddleCloudRoleMaker, RoleMakerBase
from fleetlite.errors import FleetliteError, ForeignLauncherError, StrategyConflictError
from fleetlite.runtime import (checkpoint, distributed_scaler as scaler_vote, eager_data_parallel,
                               eager_sync_batch_norm, lazy_rendezvous, process_group, sharded_state)
from fleetlite.runtime.collective_waits import waiting_in
from fleetlite.runtime.distributed_optimizer import DistributedOptimizer, explain_only
from fleetlite.runtime.hybrid_group import HybridCommunicateGroup
from fleetlite.runtime.job_values import JobValues
from fleetlite.runtime.train_step import TrainStep
from fleetlite.runtime.training_steps import report_progress  # noqa: F401  (fleet.report_progress)
from fleetlite.strategy.distributed_strategy import DistributedStrategy
from fleetlite.topology import foreign_launcher
from fleetlite.tuning import trial_worker

_job = None   # (Topology, DistributedStrategy or None) once init() ran
_optimizer = None   # the last distributed_optimizer(), for fleet.minimize
_hybrid_group = None   # get_hybrid_communicate_group()'s, made on first use
INFERENCE_PREFIX = "model"   # save_inference_model(dirname) writes dirname/model.json and .pdiparams


def init(role_maker=None, is_collective=True, strategy=None, log_level=None):
    """Read this process's place in the job and bring up the process group (bounded waits; in
    static mode at the first call that needs the other ranks)."""
    global _job, _hybrid_group
    refusal = foreign_launcher.refusal(os.environ, foreign_launcher.parent_argv(), sys.argv)
    if refusal:
        raise ForeignLauncherError(refusal)
    if role_maker is None:
        if not is_collective:
            raise StrategyConflictError("parameter-server training is not supported",
                                        fix="call fleet.init(is_collective=True)")
        role_maker = PaddleCloudRoleMaker(is_collective=True)
    elif not isinstance(role_maker, RoleMakerBase):
        raise FleetliteError(
            f"fleet.init got a {type(role_maker).__module__}.{type(role_maker).__name__}: pass one of "
            f"fleetlite's role makers (fleet.PaddleCloudRoleMaker(is_collective=True) or "
            f"fleet.UserDefinedRoleMaker(...), with `import fleetlite as fleet`)")
    topology = role_maker.topology(os.environ)
    if explain_only():
        mixed_precision.explain_for_the_rest_of_the_process()
    if strategy is not None:
        strategy.validate(topology)
    if not explain_only() and paddle.in_dynamic_mode():
        process_group.bring_up(topology, process_group.init_timeout())
    elif not explain_only():
        process_group.defer(topology, process_group.init_timeout())
    if not explain_only():
        lazy_rendezvous.watch_executor_runs()     # also binds ring 0 back before each static run
    _job, _hybrid_group = (topology, strategy), None


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
    endpoints = list(process_group.endpoints(_topology()))
    return ",".join(endpoints) if to_string else endpoints


def get_hybrid_communicate_group():
    """Paddle's HybridCommunicateGroup for fleetlite's dp-only topology (fleet.init refuses any
    hybrid degree but dp_degree above 1): the data axis is the whole job, every other axis this
    rank alone (see runtime.hybrid_group)."""
    global _hybrid_group
    if _hybrid_group is None:
        _hybrid_group = HybridCommunicateGroup(_topology())
    return _hybrid_group


def local_rank():
    return _topology().local_rank


def local_size():
    return _topology().local_size


def node_num():
    return _topology().node_count


def barrier_worker():
    """Block until every worker arrives (a no-op for one worker)."""
    _topology()
    with waiting_in("fleet.barrier_worker"):
        process_group.barrier("fleet.barrier_worker")


rank, nranks, world_size, rank_in_node = worker_index, worker_num, worker_num, local_rank
util = JobValues(_topology)
all_reduce = util.all_reduce


def is_worker():
    """Every process of a collective job is a worker."""
    return True


def is_server():
    return False


def server_num():
    return 0


def server_endpoints(to_string=False):
    return "" if to_string else []


def init_worker(scopes=None):
    """Nothing to do in a collective job (Fleet starts parameter-server communicators here)."""


def stop_worker():
    """Nothing to do in a collective job (Fleet stops parameter-server communicators here)."""


def save_persistables(executor, dirname, main_program=None, mode=0):
    """Save every persistable variable of `main_program` (parameters, optimizer state), one file
    each, as the directory `dirname`: written by the first worker, atomically (see checkpoint);
    on the other ranks it returns at once. No collective inside, so Fleet's idiom (the first
    worker saves, then every rank calls fleet.util.barrier() before reading it) works. Under
    pto the other ranks' optimizer state is gathered first (see sharded_state), so there every
    rank must call it. `load_model` reads it back."""
    _only_full_saves(mode)
    program = main_program or paddle.static.default_main_program()
    topology = _topology()
    owners = sharded_state.state_owners(_report_of(program))
    others = {} if owners is None else sharded_state.gather(util, owners, topology.rank, paddle.static.global_scope())

    def write(staging):
        paddle.static.save_vars(executor, staging, main_program=program, vars=_training_state(program))
        sharded_state.write(staging, others)

    checkpoint.save_once(topology, dirname, write)


def _report_of(program):
    """The compile report of `program` if the last distributed optimizer built it."""
    return _optimizer.compile_report if _optimizer is not None and _optimizer._program is program else None


def load_model(path, mode=0, executor=None, main_program=None):
    """Load what `save_persistables` (or `save`) wrote at `path` into `main_program`'s variables;
    every rank calls it. `executor` defaults to one on the CPU (the values go to the global scope)."""
    _only_full_saves(mode)
    if not os.path.isdir(path):
        raise FleetliteError(f"no checkpoint directory at {path}: pass the dirname given to "
                             f"fleet.save_persistables")
    program = main_program or paddle.static.default_main_program()
    paddle.static.load_vars(executor or paddle.static.Executor(paddle.CPUPlace()), path, main_program=program,
                            vars=_training_state(program))


def _training_state(program):
    """The persistable values a checkpoint holds: parameters and optimizer state, not the
    copy-free buckets' buffers (gradients, refilled by every step)."""
    parameters, optimizer_state = paddle.static.pir_io.get_pir_parameters(program)
    return [v for v in parameters + optimizer_state if v.persistable and not bucket_views.is_bucket_state(v)]


def save_inference_model(executor, dirname, feeded_var_names, target_vars, main_program=None,
                         export_for_deployment=True, mode=0):
    """Save the program that computes `target_vars` from the inputs named `feeded_var_names`,
    pruned for inference, as the directory `dirname` (written like save_persistables). Load it
    with `paddle.static.load_inference_model(os.path.join(dirname, "model"), executor)`."""
    _only_full_saves(mode)
    if not export_for_deployment:
        raise FleetliteError("save_inference_model(export_for_deployment=False) would keep the training "
                             "program, which Paddle 3 no longer saves this way: save the training state "
                             "with fleet.save_persistables instead")
    program = main_program or paddle.static.default_main_program()
    feeds = _data_values(program, feeded_var_names)
    targets = list(target_vars) if isinstance(target_vars, (list, tuple)) else [target_vars]
    checkpoint.save_once(_topology(), dirname, lambda staging: paddle.static.save_inference_model(
        os.path.join(staging, INFERENCE_PREFIX), feeds, targets, executor, program=program))


def save(dirname, feed=(), fetch=(), mode=0):
    """Fleet's `save`: the persistables of the default main program (no feed and no fetch), or
    the inference model from `feed` (input names or values) to `fetch` (output values)."""
    executor = paddle.static.Executor(paddle.CPUPlace())   # saving reads the global scope
    if not feed and not fetch:
        return save_persistables(executor, dirname, mode=mode)
    names = [name if isinstance(name, str) else name.name for name in feed]
    return save_inference_model(executor, dirname, names, list(fetch))


def _only_full_saves(mode):
    if mode != 0:
        raise FleetliteError(f"mode={mode} selects a parameter-server table save (incremental or base); "
                             f"a collective job saves everything: use mode=0")


def _data_values(program, names):
    by_name = {op.attrs()["name"]: op.result(0) for op in program.global_block().ops
               if op.name() == "pd_op.data"}
    missing = [name for name in names if name not in by_name]
    if missing:
        raise FleetliteError(f"no input named {', '.join(map(repr, missing))} in the program; its inputs "
                             f"(paddle.static.data) are {', '.join(map(repr, sorted(by_name)))}")
    return [by_name[name] for name in names]


def distributed_optimizer(optimizer, strategy=None):
    """Wrap `optimizer` so that `minimize` trains data parallel under `strategy`."""
    global _optimizer
    topology = _topology()
    strategy = trial_worker.override(strategy or _job[1] or DistributedStrategy())
    _optimizer = DistributedOptimizer(optimizer, strategy.validate(topology), topology,
                                      after_minimize=trial_worker.install_step_timer)
    return _optimizer


def minimize(loss, startup_program=None, parameter_list=None, no_grad_set=None):
    """Fleet's `fleet.minimize`: the last `distributed_optimizer`'s minimize."""
    if _optimizer is None:
        raise FleetliteError("fleet.minimize needs fleet.distributed_optimizer(optimizer) first")
    return _optimizer.minimize(loss, startup_program, parameter_list, no_grad_set)


def distributed_model(model):
    """Fleet's `distributed_model` for dygraph scripts: the eager Layer, still usable eagerly,
    wrapped in paddle.DataParallel in a job of several ranks so that Fleet's eager loop trains data
    parallel (see runtime.eager_data_parallel); `fleet.train_step(model, loss_fn, opt)` trains it
    with every knob (docs/dygraph.md)."""
    topology = _topology()
    if explain_only():
        return model
    process_group.connect("fleet.distributed_model")
    model = eager_sync_batch_norm.swap(model, topology)     # SyncBatchNorm over the process group on CPU
    return eager_data_parallel.wrap(model, _job[1] or DistributedStrategy(), topology)


def distributed_scaler(scaler):
    """Fleet's `distributed_scaler` for dygraph AMP: `scaler` (a paddle.amp.GradScaler) with its
    found-inf flag agreed over every rank, so all ranks skip the same steps (see
    runtime.distributed_scaler and docs/dygraph.md)."""
    world_size = _topology().world_size
    return scaler_vote.agreeing_across_ranks(scaler, 1 if explain_only() else world_size)


def train_step(model, loss_fn, optimizer):
    """`step(*batch) -> loss`: one compiled data-parallel training step of the eager `model` (the
    loss is `loss_fn(model, *batch)`); see fleetlite.runtime.train_step and docs/dygraph.md."""
    if not isinstance(optimizer, DistributedOptimizer):
        optimizer = distributed_optimizer(optimizer)
    if not explain_only():
        process_group.connect("fleet.train_step")
    return TrainStep(model, loss_fn, optimizer, util)
