"""Fleet's eager loop, `loss.backward(); opt.step(); opt.clear_grad()`, trained data parallel.

`fleet.distributed_model(model)` wraps the model, in a job of more than one rank, in Paddle's
own `paddle.DataParallel` on fleetlite's process group, sized by the strategy's fusion knobs
(as Paddle's Fleet does): its reducer all-reduces and averages the gradients during backward, and
its construction broadcasts rank 0's parameters. A knob that DataParallel honours, or whose value
changes nothing here, is accepted; every other knob needs fleetlite's compiler, which this loop
never runs, so `opt.step()` refuses a strategy that sets one, naming fleet.train_step, instead of
dropping it. A step on a model that nothing synchronises would train unsynchronised copies on a
job of several ranks: the first step compares every parameter and gradient across the ranks
(whoever wrapped the model: distributed_model, paddle.DataParallel, or a script's own
all-reduce) and refuses if they differ.
"""
import numpy as np
import paddle
import paddle.distributed as dist

from fleetlite.errors import DygraphError
from fleetlite.runtime.collective_waits import waiting_in

# Knobs (or whole sections) the eager loop honours through paddle.DataParallel, or that do not
# touch training. scale_gradient moves the 1/N of the mean, not the mean: the reducer averages.
EAGER_KNOBS = ("fuse_all_reduce_ops", "fuse_grad_size_in_MB", "last_comm_group_size_MB", "find_unused_parameters",
               "strict", "split_data", "data_configs", "gradient_scale_configs.scale_gradient")
# Knobs whose value changes nothing in the eager loop: field -> f(value, topology).
CHANGES_NOTHING = {
    "fuse_grad_size_in_TFLOPS": lambda value, topology: value == 0,       # no count limit: DataParallel has none
    "sync_nccl_allreduce": lambda value, topology: topology.device == "cpu",   # gloo all-reduces are synchronous
}
TRAIN_STEP = "train with step = fleet.train_step(model, loss_fn, opt) (docs/dygraph.md)"
EAGER_PRESET = "or leave it out of the eager loop's strategy (configs/default.yaml; on CPU configs/cpu_gloo.yaml)"
SYNC_TOLERANCE = 1e-6   # relative: synchronised values are equal on every rank, up to summation order
EXPLAINED = ("fleetlite: this script trains by Fleet's eager loop (loss.backward(); opt.step()) on paddle.DataParallel: "
             "there is no program to compile, and only the fusion knobs apply; fleet.train_step compiles every knob")

FUSION = ("fuse_all_reduce_ops", "fuse_grad_size_in_MB", "last_comm_group_size_MB", "find_unused_parameters")

# Each parameter a DataParallel of distributed_model reduces carries its FUSION values under this
# attribute: a mark that lives and dies with the parameter (an id() could be reused by another).
SYNCHRONISED_WITH = "_fleetlite_synchronised_with"


def wrap(model, strategy, topology):
    """`model` as data parallel for the eager loop (the model itself on one rank)."""
    if topology.world_size == 1 or isinstance(model, paddle.DataParallel):
        return model
    bucket_mb = strategy.fuse_grad_size_in_MB if strategy.fuse_all_reduce_ops else 0   # 0: one gradient per all-reduce
    wrapped = paddle.DataParallel(model, comm_buffer_size=bucket_mb,
                                  last_comm_buffer_size=strategy.last_comm_group_size_MB,
                                  find_unused_parameters=strategy.find_unused_parameters)
    fusion = tuple(getattr(strategy, field) for field in FUSION)
    for param in model.parameters():
        setattr(param, SYNCHRONISED_WITH, fusion)
    return wrapped


def check_step(optimizer, strategy, topology, wrapped_only=True):
    """Raise DygraphError unless an eager `optimizer.step()` trains as `strategy` asks
    (`wrapped_only`: and, on several ranks, on parameters and gradients every rank shares).
    On several ranks this is a collective: every rank calls it, at its first step."""
    compiled = sorted(field for field, value in strategy.non_default().items()
                      if not _honoured(field, value, topology))
    if compiled:
        raise DygraphError(f"strategy.{compiled[0]} needs fleetlite's compiler, which the eager loop "
                           f"(loss.backward(); opt.step()) does not run: {TRAIN_STEP}, {EAGER_PRESET}")
    if topology.world_size > 1 and wrapped_only:
        parameters = optimizer_parameters(optimizer)
        # Only what the step updates: buffers such as batch norm's running statistics are each
        # rank's own under paddle.DataParallel (SyncBatchNorm aside).
        _check_synchronised([param for param in parameters if not param.stop_gradient], topology)
        _check_fusion(parameters, strategy)


def optimizer_parameters(optimizer):
    """Every parameter `optimizer` updates, those of parameter groups (parameters=[{"params": ...}]) included."""
    groups = optimizer._param_groups or ()
    return [param for group in groups for param in (group["params"] if isinstance(group, dict) else [group])]


def _honoured(field, value, topology):
    """Whether the eager loop does what `field: value` asks (EAGER_KNOBS, CHANGES_NOTHING, data-parallel hybrid_configs)."""
    section = field.split(".")[0]
    if field in EAGER_KNOBS or section in EAGER_KNOBS:
        return True
    if section == "hybrid_configs":
        return _data_parallel_only(field, value, topology)
    return field in CHANGES_NOTHING and CHANGES_NOTHING[field](value, topology)


def _data_parallel_only(field, value, topology):
    """hybrid_configs that describe data parallelism over the whole job (PaddleNLP-style scripts
    set dp_degree) change nothing here: every other degree must stay 1."""
    name = field.rsplit(".", 1)[-1]
    if name == "dp_degree":
        return value in (-1, topology.world_size)
    return not name.endswith("_degree") or value == 1


def _fingerprints(tensors):
    """(sum, sum of squares) in float64 of each tensor (zeros for a missing gradient)."""
    rows = []
    for tensor in tensors:
        values = np.zeros(0) if tensor is None else tensor.numpy().astype(np.float64)
        rows.append((values.sum(), np.square(values).sum()))
    return np.asarray(rows, dtype=np.float64).reshape(-1, 2)


def _check_synchronised(parameters, topology):
    """Refuse unless every parameter and gradient has the same fingerprint on every rank."""
    local = np.concatenate([_fingerprints(parameters), _fingerprints([param.grad for param in parameters])], axis=1)
    with waiting_in("opt.step (the first step compares the ranks' parameters)"):
        highest, lowest = paddle.to_tensor(local), paddle.to_tensor(local)
        dist.all_reduce(highest, op=dist.ReduceOp.MAX)
        dist.all_reduce(lowest, op=dist.ReduceOp.MIN)
    highest, lowest = highest.numpy(), lowest.numpy()
    with np.errstate(invalid="ignore"):   # a non-finite gradient is the loss scaler's business, not this check's
        differs = np.abs(highest - lowest) > SYNC_TOLERANCE * np.maximum(np.abs(highest), np.abs(lowest))
    if differs.any():
        index, column = np.argwhere(differs)[0]
        what = "value" if column < 2 else "gradient"
        raise DygraphError(f"opt.step() on {topology.world_size} ranks would train unsynchronised copies: the "
                           f"{what} of {parameters[index].name} differs between the ranks; wrap the model before "
                           f"training with model = fleet.distributed_model(model) (or paddle.DataParallel(model)) "
                           f"and call the wrapper, or {TRAIN_STEP}")


def _check_fusion(parameters, strategy):
    """A DataParallel of distributed_model built with fleet.init's strategy must match the
    optimizer's (a paddle.DataParallel the script built keeps the sizes the script gave it)."""
    wrapped_with = next((getattr(param, SYNCHRONISED_WITH) for param in parameters
                         if hasattr(param, SYNCHRONISED_WITH)), None)
    if wrapped_with is None:
        return
    for field, used in zip(FUSION, wrapped_with):
        if getattr(strategy, field) != used:
            raise DygraphError(f"fleet.distributed_model built paddle.DataParallel with {field}={used} (fleet.init's "
                               f"strategy) but the optimizer's strategy has {getattr(strategy, field)}: pass the "
                               f"strategy to fleet.init(strategy=...) so both use it")
