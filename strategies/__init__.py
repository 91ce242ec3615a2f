"""Every strategy pass fleetlite knows, registered explicitly (no scanning).

The compiler instantiates the passes in REGISTRY whose knob is on and orders them by phase
and their declared before/after edges; the position in this list only breaks ties.
"""
from fleetlite.strategies.amp import Amp, AmpLossScaling
from fleetlite.strategies.build_strategy_fusions import OpFusion
from fleetlite.strategies.comm_rings import CommRings
from fleetlite.strategies.data_parallel import DataParallel
from fleetlite.strategies.dgc import Dgc, DgcUpdate
from fleetlite.strategies.device_flags import (ConvWorkspaceSizeLimit, CudnnBatchNormSpatialPersistent,
                                               CudnnExhaustiveSearch)
from fleetlite.strategies.execution_knobs import ExecutorThreads, InplaceReuse, SequentialExecution, StepsPerRun
from fleetlite.strategies.fp16_allreduce import Fp16AllReduce
from fleetlite.strategies.fuse_all_reduce import FuseAllReduce
from fleetlite.strategies.fuse_optimizer import FuseAllOptimizerOps
from fleetlite.strategies.gloo_lowering import GlooLowering
from fleetlite.strategies.gradient_merge import GradientMerge, GradientMergeUpdate
from fleetlite.strategies.hierarchical_allreduce import HierarchicalAllReduce
from fleetlite.strategies.pto import Pto
from fleetlite.strategies.scale_gradient import ScaleGradient
from fleetlite.strategies.sync_batch_norm import SyncBatchNorm
from fleetlite.strategies.sync_nccl_allreduce import SyncNcclAllReduce
from fleetlite.strategies.topk import TopkExchange

REGISTRY = (
    DataParallel,
    FuseAllReduce,
    CommRings,
    HierarchicalAllReduce,
    GlooLowering,
    SyncNcclAllReduce,
    Amp,
    AmpLossScaling,
    Fp16AllReduce,
    SyncBatchNorm,
    GradientMerge,
    GradientMergeUpdate,
    Pto,
    FuseAllOptimizerOps,
    OpFusion,
    ScaleGradient,
    TopkExchange,
    Dgc,
    DgcUpdate,
    ExecutorThreads,
    SequentialExecution,
    InplaceReuse,
    StepsPerRun,
    CudnnExhaustiveSearch,
    ConvWorkspaceSizeLimit,
    CudnnBatchNormSpatialPersistent,
)
