"""Every strategy pass fleetlite knows, registered explicitly (no scanning).

The compiler instantiates the passes in REGISTRY whose knob is on and orders them by phase
and their declared before/after edges; the position in this list only breaks ties.
"""
from fleetlite.strategies.amp import Amp, AmpLossScaling
from fleetlite.errors import StrategyConflictError
from fleetlite.strategy.knob_accounting import refuse_unimplemented, unclaimed_under_strict
from fleetlite.compile.pass_contract import check_combination, required_skipped, strict_refusal
from fleetlite.strategies.build_strategy_fusions import OpFusion
from fleetlite.strategies.comm_rings import CommRings
from fleetlite.strategies.copy_free_buckets import CopyFreeBuckets
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
from fleetlite.strategies.lamb import Lamb
from fleetlite.strategies.lars import Lars
from fleetlite.strategies.localsgd import LocalSgd
from fleetlite.strategies.adaptive_localsgd import AdaptiveLocalSgd
from fleetlite.strategies.pto import Pto
from fleetlite.strategies.recompute import Recompute
from fleetlite.strategies.scale_gradient import ScaleGradient
from fleetlite.strategies.sync_batch_norm import SyncBatchNorm
from fleetlite.strategies.sync_nccl_allreduce import SyncNcclAllReduce
from fleetlite.strategies.topk_exchange import TopkExchange

REGISTRY = (
    DataParallel,
    FuseAllReduce,
    CommRings,
    HierarchicalAllReduce,
    GlooLowering,
    CopyFreeBuckets,
    SyncNcclAllReduce,
    Amp,
    AmpLossScaling,
    Fp16AllReduce,
    SyncBatchNorm,
    Recompute,
    GradientMerge,
    GradientMergeUpdate,
    Lamb,
    Pto,
    Lars,
    LocalSgd,
    AdaptiveLocalSgd,
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


def check_strategy(strategy, topology):
    """What the passes require of a strategy, run by validate() (fleet.init, `fleetlite strategy
    validate`, distributed_optimizer) rather than first at minimize: each pass's own cross-field
    rules, the passes' requires and conflicts, the knobs no pass implements (errors, never skips),
    and strict's refusals that need no program. Conflicts come first: two knobs that cannot go
    together is the news, whatever else is wrong."""
    check_combination([p for p in (cls(strategy) for cls in REGISTRY) if p.enabled()])
    for cls in REGISTRY:
        cls.check_strategy(strategy, topology)
    refuse_unimplemented(strategy, {field for cls in REGISTRY for field in cls.reads})
    _check_strict(strategy, topology)


def _check_strict(strategy, topology):
    """Under strict, at validate() rather than first at minimize: a requested knob no pass reads,
    and a requested pass that does nothing on the declared topology whatever the program (pto on
    one rank, cuDNN flags on CPU, ...). Passes whose reason needs the program are left to compile."""
    if not strategy.strict:
        return
    passes = [cls(strategy) for cls in REGISTRY]
    unclaimed_under_strict(strategy, {field for p in passes for field in p.reads})
    if topology is None:
        return
    requested, skipped = set(strategy.non_default()), {}
    for current in passes:
        if not current.enabled():
            continue
        reason = required_skipped(current, skipped)
        if reason is None and current.decides_without_program:
            reason = current.applicable(topology, None)
        if reason is None:
            continue
        if requested & set(current.reads):
            raise StrategyConflictError(strict_refusal(current, reason), field=current.switched_on_by(), value=True)
        skipped[current.name] = reason
