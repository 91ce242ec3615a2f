"""Benchmark (a): gradient sync on ResNet-50's 161 parameter shapes, 2 processes over gloo.

    .venv/bin/python -m benchmarks.gradsync.gradsync [--rounds 9] [--json out.json]

Contenders, interleaved in one run: fleetlite unfused (one all-reduce per gradient), fused at
4/16/32/64 MiB, and the shipped CPU preset (configs/cpu_gloo.yaml: 4 MiB + scale_gradient); raw static all_reduce_ per tensor; one flat all-reduce of a pre-packed buffer
(the limit); Paddle dygraph DataParallel and PyTorch DDP with their defaults; torch's flat
all-reduce. Prints medians and the ratios the targets are stated in.

A contender name may end in +VARIANT to start its workers with extra environment variables
(read at process start): +malloc sets glibc's malloc tunables, +naive_best_fit and
+system_allocator Paddle's allocator flags (docs/performance.md, what was tried).
"""
import statistics

from benchmarks.harness.runner import measure, print_table, protocol_parser, publish, summary

CONTENDERS = ["paddle_flat_limit", "torch_flat", "fleetlite_unfused", "fleetlite_cpu_preset", "fleetlite_4mb",
              "fleetlite_16mb",
              "fleetlite_32mb", "fleetlite_64mb", "paddle_static_per_tensor", "paddle_dataparallel",
              "torch_ddp"]
PEERS = ["paddle_dataparallel", "torch_ddp", "paddle_static_per_tensor"]
VARIANTS = {
    "malloc": {"MALLOC_MMAP_THRESHOLD_": "33554432", "MALLOC_TRIM_THRESHOLD_": "4294967296"},
    "naive_best_fit": {"FLAGS_allocator_strategy": "naive_best_fit"},
    "system_allocator": {"FLAGS_use_system_allocator": "1"},
}


def contender(name):
    """(name, worker argv, world, extra env) for a contender name, with its +variant if any."""
    base, _, variant = name.partition("+")
    if variant and variant not in VARIANTS:
        raise SystemExit(f"unknown variant +{variant}: use one of {', '.join('+' + v for v in VARIANTS)}")
    return name, ["benchmarks.gradsync.gradsync_worker", base], 2, VARIANTS.get(variant)


def main():
    parser = protocol_parser(__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="a subset of contenders")
    args = parser.parse_args()
    names = args.only or CONTENDERS
    medians, foreign = measure([contender(name) for name in names], args)
    limit = statistics.median(medians["paddle_flat_limit"]) if "paddle_flat_limit" in medians else None
    rows = []
    for name in names:
        row = {"contender": name, **summary(medians[name])}
        row["vs_limit"] = row["median_ms"] / limit if limit else None
        rows.append(row)
    fused = [r for r in rows if r["contender"].startswith("fleetlite_") and "unfused" not in r["contender"]]
    best = min(fused, key=lambda r: r["median_ms"]) if fused else None
    print_table(f"Gradient sync, ResNet-50 shapes (161 tensors, 97.5 MiB), 2 procs, {args.rounds} rounds; "
                f"foreign CPU load {foreign:.0%}", rows,
                [("contender", "contender", "{}"), ("median_ms", "median ms", "{:.1f}"),
                 ("min_ms", "min", "{:.1f}"), ("max_ms", "max", "{:.1f}"), ("vs_limit", "÷ flat limit", "{:.2f}")])
    ratios = {}
    if best:
        ratios["best_fleetlite"] = best["contender"]
        ratios["best_fused_vs_flat_limit"] = best["vs_limit"]
        for peer in PEERS:
            if peer in medians:
                ratios[f"{peer}_vs_best_fused"] = statistics.median(medians[peer]) / best["median_ms"]
        if "fleetlite_unfused" in medians:
            ratios["unfused_vs_best_fused"] = statistics.median(medians["fleetlite_unfused"]) / best["median_ms"]
    publish(rows, ratios, foreign, medians, args.json)


if __name__ == "__main__":
    main()
