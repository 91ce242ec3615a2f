"""The gradient exchanges the top-k benchmarks compare (and local SGD, which exchanges parameters instead), and the bytes each should put on the wire.

An exchange is one entry of EXCHANGES: a name, the strategy fields that select it (on top of
the CPU preset, configs/cpu_gloo.yaml) and the formula of the bytes a rank sends per step. A new
exchange (dgc was one) is one more entry; without a formula of its own its bytes are
measured but not predicted, and with a `family` and `density` it joins the throttled benchmark's
density sweep.

Formulas (W ranks, gloo, read in gloo's allreduce.cc and allgather.cc; Paddle's GlooCommContext
calls gloo::allreduce without choosing an algorithm, which is the ring):
- all-reduce of N bytes: the ring's reduce-scatter then all-gather, each rank sending W-1 of its
  W segments in each phase: 2 (W-1)/W * N per rank (N at W = 2);
- all-gather of b bytes per rank: a ring, each rank forwarding W-1 blocks: (W-1) * b per rank;
  one-level top-k all-gathers k values and k int32 indices per gradient: (W-1) * k * (4 + 4),
  and so does dgc once its schedule reached its last sparsity;
- local SGD sends no gradients: one all-reduce of the parameters every k_steps steps,
  2 (W-1)/W * (parameter bytes) / k_steps per rank and step.
The wire adds TCP/IP framing (a 66-byte header per segment of up to 64 KiB on loopback, and
acknowledgements) and gloo's message headers: small for large messages, not for a few hundred
bytes.
"""
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import fleetlite as fleet

PRESET = Path(__file__).resolve().parents[2] / "configs" / "cpu_gloo.yaml"


def allreduce_ring_bytes(payload, world):
    return 2 * (world - 1) / world * payload


def allgather_ring_bytes(payload, world):
    return (world - 1) * payload


def dense_and_one_level_topk_bytes(report, world):
    """Bytes one rank sends per step: every dense bucket all-reduced, every top-k (or dgc)
    gradient's (values, indices) all-gathered. None if the report shows a pass this formula does
    not model (the two-level exchanges: hierarchical all-reduce and hierarchical top-k)."""
    modelled = {"data_parallel", "topk", "dgc", "dgc_update", "fuse_all_reduce_ops", "gloo_lowering",
                "copy_free_buckets", "gradient_scale_configs.scale_gradient"}
    if set(report.applied) - modelled or ("topk" in report.applied and
                                          "hierarchical" in report.record("topk").details):
        return None
    sent = sum(allreduce_ring_bytes(bucket["bytes"], world) for bucket in report.buckets)
    for sparse in {"topk", "dgc"} & set(report.applied):
        sent += allgather_ring_bytes(report.record(sparse).details["sparse_bytes_per_step"], world)
    return sent


def local_sgd_bytes(report, world):
    """Bytes one rank sends per step under localsgd past begin_step: no gradient all-reduce, the
    parameters' all-reduce once every k_steps steps."""
    details = report.record("localsgd").details
    return allreduce_ring_bytes(details["bytes_per_sync"], world) / details["k_steps"]


@dataclass(frozen=True)
class Exchange:
    """`family` and `density` place a sparse exchange on a density sweep (topk_throttled.py finds,
    per family, the largest density at which it beats dense). `one_by_one` measures top-k as it ran
    before its CPU buckets: each gradient selected and exchanged on its own (the worker makes the
    topk pass take that path; a measurement switch, not a knob)."""
    name: str
    fields: dict = field(default_factory=dict)
    formula: Optional[Callable] = dense_and_one_level_topk_bytes
    family: Optional[str] = None
    density: Optional[float] = None
    one_by_one: bool = False


    def strategy(self, **more):
        """The CPU preset with this exchange's fields, then `more` (e.g. data_configs for a seed)."""
        strategy = fleet.DistributedStrategy.load(PRESET)
        for name, value in {**self.fields, **more}.items():
            setattr(strategy, name, value)
        return strategy


def topk(density, error_feedback=True, warmup_steps=0, one_by_one=False):
    suffix = ("" if error_feedback else "_no_ef") + ("_one_by_one" if one_by_one else "")
    return Exchange(f"topk_{density:g}{suffix}", {"topk": True, "topk_configs": {
        "density": density, "error_feedback": error_feedback, "warmup_steps": warmup_steps}},
        family="topk" + suffix, density=density, one_by_one=one_by_one)


def hierarchical_topk(density):
    """Top-k exchanged in two levels (strategies/topk_exchange.py); needs ranks on several nodes, so it is
    in no single-host sweep (no family). Not modelled by the formula (None)."""
    return Exchange(f"hierarchical_topk_{density:g}", {"topk": True, "topk_configs": {
        "density": density, "hierarchical": True}})


def hierarchical_allreduce():
    """Dense all-reduce in two levels (strategies/hierarchical_allreduce.py), each level on its own
    gloo group; needs several nodes (no family). Not modelled by the formula (None)."""
    return Exchange("hierarchical_allreduce", {"use_hierarchical_allreduce": True})


def dgc(sparsity):
    """Fleet's dgc at one sparsity from the first step (no dense phase, no ramp)."""
    return Exchange(f"dgc_{1 - sparsity:g}", {"dgc": True, "dgc_configs": {
        "rampup_begin_step": 0, "sparsity": [sparsity]}}, family="dgc", density=round(1 - sparsity, 6))


def localsgd(k_steps):
    """Local SGD averaging the parameters every k_steps steps (strategies/localsgd.py); measured over
    rounds of a multiple of k_steps steps, each round holds the same number of syncs."""
    return Exchange(f"localsgd_{k_steps}", {"localsgd": True, "localsgd_configs": {"k_steps": k_steps}},
                    formula=local_sgd_bytes)


DENSE = Exchange("dense")
EXCHANGES = {exchange.name: exchange for exchange in [
    DENSE,
    topk(0.1), topk(0.01), topk(0.001),
    topk(0.01, error_feedback=False), topk(0.001, error_feedback=False),
    topk(0.01, one_by_one=True), topk(0.001, one_by_one=True),
    hierarchical_topk(0.01), hierarchical_allreduce(),
    dgc(0.99), dgc(0.999),
    localsgd(2), localsgd(4),
]}


def exchange(name):
    if name not in EXCHANGES:
        raise SystemExit(f"unknown exchange {name!r}: use one of {', '.join(EXCHANGES)}")
    return EXCHANGES[name]
