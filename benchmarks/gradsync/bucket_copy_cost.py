"""Benchmark (a'): what fusion's copies cost, in one process, with no communication at all.

    .venv/bin/python -m benchmarks.gradsync.bucket_copy_cost

For ResNet-50's 161 gradient shapes, packed into buckets of 1..64 MiB by fleetlite's own bucket
rule: time per run of concat -> scale_ -> split -> reshape (what a fused all-reduce adds around
the collective), and minor page faults per run (a fresh bucket buffer is a fresh allocation).
Explains why small buckets win on CPU (docs/performance.md).
"""
import json
import math
import resource
import statistics
import time
from pathlib import Path

import paddle

from fleetlite.strategies.fuse_all_reduce import plan_buckets

SHAPES_FILE = Path(__file__).parents[1] / "harness" / "resnet50_shapes.json"
SHAPES = [tuple(s) for s in json.loads(SHAPES_FILE.read_text())["shapes"]]
MiB = 1 << 20


def bucket_program(size_mb):
    """Parameters stand in for gradients (ready order = reverse creation order)."""
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        tensors = [paddle.static.create_parameter(list(s), "float32") for s in SHAPES][::-1]
        sizes = [math.prod(t.shape) * 4 for t in tensors]
        plan = plan_buckets(sizes, ["float32"] * len(sizes), size_mb * MiB, 0, 0)
        outputs = []
        for members in plan:
            if len(members) == 1:
                outputs.append(paddle._C_ops.scale_(tensors[members[0]], 0.5, 0.0, True))
                continue
            packed = paddle.concat([paddle.reshape(tensors[i], [-1]) for i in members])
            scaled = paddle._C_ops.scale_(packed, 0.5, 0.0, True)
            parts = paddle.split(scaled, [math.prod(tensors[i].shape) for i in members])
            outputs += [paddle.reshape(p, tensors[i].shape) for p, i in zip(parts, members)]
        fetch = paddle.add_n([o.sum() for o in outputs])
    return main, startup, fetch, plan


def main():
    paddle.enable_static()
    paddle.base.core.set_num_threads(1)
    exe = paddle.static.Executor(paddle.CPUPlace())
    print("bucket MiB  buckets  copied MiB  ms/run  page faults/run")
    for size_mb in (1, 2, 4, 8, 16, 32, 64):
        program, startup, fetch, plan = bucket_program(size_mb)
        exe.run(startup)
        for _ in range(2):
            exe.run(program, fetch_list=[fetch])
        times, faults = [], resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(5):
            started = time.perf_counter()
            exe.run(program, fetch_list=[fetch])
            times.append((time.perf_counter() - started) * 1000)
        faults = (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults) // 5
        copied = sum(math.prod(SHAPES[len(SHAPES) - 1 - i]) * 4 for b in plan if len(b) > 1 for i in b) / MiB
        print(f"{size_mb:<10}  {len(plan):<7}  {copied:<10.1f}  {statistics.median(times):<6.1f}  {faults}")


if __name__ == "__main__":
    main()
