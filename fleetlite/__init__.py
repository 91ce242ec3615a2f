"""fleetlite: strategy-driven data-parallel training for PaddlePaddle static programs.

`import fleetlite as fleet` in place of `paddle.distributed.fleet` for collective training.
"""
from fleetlite.paddle_check import require_paddle3

require_paddle3()

from fleetlite.errors import (CompileError, FleetliteError, StrategyConflictError,  # noqa: E402
                              StrategyError, StrategyFileError, TopologyError, UnknownFieldError)
from fleetlite.strategy import BuildStrategy, DistributedStrategy, ExecutionStrategy  # noqa: E402
from fleetlite.topology import Topology  # noqa: E402
from fleetlite.version import __version__  # noqa: E402
