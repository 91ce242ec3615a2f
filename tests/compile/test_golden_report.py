"""The seed's ResNet-50 recipe (configs/resnet50_4x8_gpu.yaml) compiles for rank 0 of 32 GPUs on 4
nodes, in this process, into exactly the report in tests/golden/resnet50_4x8_gpu.report.txt.

Any change to what a pass does, skips or says about this job shows up here as a diff. When the
change is intended, regenerate the file and review its diff:

    .venv/bin/fleetlite explain --strategy configs/resnet50_4x8_gpu.yaml --world 32 --nodes 4 \
        --device gpu --model resnet50 > tests/golden/resnet50_4x8_gpu.report.txt

The file is produced by the CPU build of Paddle (CI's), which is why the GPU-only rewrites (AMP's
float16 casts, the op fusions) appear as skipped with that reason.
"""
from pathlib import Path

from fleetlite import DistributedStrategy, Topology
from fleetlite.runtime.explain_strategy import explain

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "resnet50_4x8_gpu.report.txt"


def test_the_resnet50_preset_compiles_for_32_gpus_into_the_golden_report():
    strategy = DistributedStrategy.load(ROOT / "configs" / "resnet50_4x8_gpu.yaml")
    report = explain(strategy, Topology.grid(32, 4, rank=0, device="gpu"), model="resnet50")
    assert report.table().splitlines() == GOLDEN.read_text().splitlines()
