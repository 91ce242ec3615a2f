"""fleetlite: strategy-driven data-parallel training for PaddlePaddle static programs.

`import fleetlite as fleet` in place of `paddle.distributed.fleet` for collective training.
"""
import sys

from fleetlite.paddle_compat.version_check import require_paddle3

require_paddle3()

from fleetlite.errors import (CompileError, FleetliteError, StrategyConflictError,  # noqa: E402
                              StrategyError, StrategyFileError, TopologyError, UnknownFieldError)
from fleetlite.strategy import pass_registry  # noqa: E402
from fleetlite.version import __version__  # noqa: E402

# Names that load on first use, so that fleetrun and each worker's bootstrap (which import this
# package) start without them: the strategy schema (protobuf, YAML) and the role makers cost a
# few tenths of a second, the training API imports Paddle (about a second).
_LAZY = {"DistributedStrategy": "fleetlite.strategy.distributed_strategy",
         "BuildStrategy": "fleetlite.strategy.distributed_strategy",
         "ExecutionStrategy": "fleetlite.strategy.distributed_strategy", "Topology": "fleetlite.topology.topology",
         "PaddleCloudRoleMaker": "fleetlite.base.role_maker", "Role": "fleetlite.base.role_maker",
         "UserDefinedRoleMaker": "fleetlite.base.role_maker",
         "fp16_guard": "fleetlite.compile.mixed_precision"}   # as paddle.static.amp.fp16_guard
# Public modules by their documented name (`fleet.topk.mstopk(x, k)`), wherever their file lives.
_MODULES = {"topk": "fleetlite.topk"}
_API = ("init", "distributed_optimizer", "DistributedOptimizer", "worker_index", "worker_num",
        "is_first_worker", "worker_endpoints", "local_rank", "local_size", "node_num",
        "barrier_worker", "rank", "nranks", "world_size", "rank_in_node", "util", "all_reduce",
        "is_worker", "is_server", "server_num", "server_endpoints", "init_worker", "stop_worker",
        "save_persistables", "save_inference_model", "save", "load_model", "minimize",
        "distributed_model", "train_step", "distributed_scaler", "get_hybrid_communicate_group",
        "report_progress")


def _registered_passes():
    """The pass registry, imported on first use: it imports Paddle (held: its ccache warning)."""
    from fleetlite.paddle_compat import quiet_warnings
    with quiet_warnings.importing_paddle():
        from fleetlite import strategies
    return strategies


# The passes sit above the rooms that run them (validate, compile): this face hands them down.
pass_registry.hand_in(_registered_passes)


def __getattr__(name):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    if name in _MODULES:
        import importlib
        return importlib.import_module(_MODULES[name])
    if name in _API:
        from fleetlite import api
        return getattr(api, name)
    if name == "fleet":              # `from paddle.distributed.fleet import fleet` style
        return sys.modules[__name__]
    if name == "data":               # fleet.data.loader(...) without a separate import
        import fleetlite.data
        return fleetlite.data
    from fleetlite.fleet_surface import UNSUPPORTED, missing
    if name in UNSUPPORTED:
        raise missing(name)
    raise AttributeError(f"module 'fleetlite' has no attribute '{name}'")
