"""Fleet's eager loop, `loss.backward(); opt.step(); opt.clear_grad()`, trained data parallel.

`fleet.distributed_model(model)` wraps the model, in a job of more than one rank, in Paddle's
own `paddle.DataParallel` on fleetlite's process group, sized by the strategy's fusion knobs
(as Paddle's Fleet does): its reducer all-reduces and averages the gradients during backward, and
its construction broadcasts rank 0's parameters. Every other knob needs fleetlite's compiler,
which this loop never runs, so `opt.step()` refuses a strategy that sets one, naming
fleet.train_step, instead of dropping it. A step on parameters that no distributed_model
wrapped would train unsynchronised copies of the model on a job of several ranks: refused too.
"""
import paddle

from fleetlite.errors import DygraphError

# Knobs the eager loop honours (through paddle.DataParallel) or that do not touch training
# (hybrid_configs: validate lets through only the dp-only topology, which is what it trains).
EAGER_KNOBS = ("fuse_all_reduce_ops", "fuse_grad_size_in_MB", "last_comm_group_size_MB", "find_unused_parameters",
               "strict", "split_data", "data_configs", "hybrid_configs")
TRAIN_STEP = "train with step = fleet.train_step(model, loss_fn, opt) (docs/dygraph.md)"
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
    (`wrapped_only`: and, on several ranks, only parameters distributed_model wrapped)."""
    compiled = sorted(field for field in strategy.non_default() if field.split(".")[0] not in EAGER_KNOBS)
    if compiled:
        raise DygraphError(f"strategy.{compiled[0]} needs fleetlite's compiler, which the eager loop "
                           f"(loss.backward(); opt.step()) does not run: {TRAIN_STEP}")
    if topology.world_size > 1 and wrapped_only:
        unsynchronised = [param.name for param in optimizer._parameter_list or ()
                          if not isinstance(param, dict) and not hasattr(param, SYNCHRONISED_WITH)]
        if not unsynchronised:
            _check_fusion(optimizer, strategy)
        else:
            raise DygraphError(f"opt.step() on {topology.world_size} ranks would train unsynchronised copies: "
                               f"{unsynchronised[0]} is not in a model wrapped by model = fleet.distributed_model(model) "
                               f"before training; wrap it, or {TRAIN_STEP}")


def _check_fusion(optimizer, strategy):
    wrapped_with = getattr(optimizer._parameter_list[0], SYNCHRONISED_WITH)
    for field, used in zip(FUSION, wrapped_with):
        if getattr(strategy, field) != used:
            raise DygraphError(f"fleet.distributed_model built paddle.DataParallel with {field}={used} (fleet.init's "
                               f"strategy) but the optimizer's strategy has {getattr(strategy, field)}: pass the "
                               f"strategy to fleet.init(strategy=...) so both use it")
