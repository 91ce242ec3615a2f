"""Benchmark (a): gradient sync on ResNet-50's 161 parameter shapes, 2 processes over gloo.

    .venv/bin/python -m benchmarks.gradsync.gradsync [--rounds 9] [--json out.json] [--only NAME ...]

Contenders, interleaved in one run (default set: a few minutes): fleetlite's copy-free buckets
at 16/32/64 MiB and its shipped CPU preset (configs/cpu_gloo.yaml), the concat/split buckets of
before at 4 MiB (the previous preset), one flat all-reduce of a pre-packed buffer (the limit),
Paddle dygraph DataParallel and PyTorch DDP with their defaults. More with --only:
fleetlite_<N>mb, fleetlite_concat_<N>mb, fleetlite_unfused (each may end in _loss_scaled: the
1/N on the loss gradient instead of in the pack), paddle_static_per_tensor, torch_flat.
Prints medians, each contender's ratio to the flat limit, DDP's time over each copy-free
contender's (above 1: fleetlite is faster) and the in-place count of the copy-free buckets.

A contender name may end in +VARIANT to start its workers with extra environment variables
(read at process start): +malloc sets glibc's malloc tunables, +naive_best_fit and
+system_allocator Paddle's allocator flags (docs/performance.md, what was tried).
"""
import statistics

from benchmarks.harness.runner import measure, print_table, protocol_parser, publish, summary

CONTENDERS = ["paddle_flat_limit", "fleetlite_cpu_preset", "fleetlite_concat_4mb", "fleetlite_16mb",
              "fleetlite_32mb", "fleetlite_64mb", "paddle_dataparallel", "torch_ddp"]
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


def is_copy_free(name):
    return name.startswith("fleetlite_") and not name.startswith(("fleetlite_concat_", "fleetlite_unfused"))


def main():
    parser = protocol_parser(__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, help="a subset of contenders")
    args = parser.parse_args()
    names = args.only or CONTENDERS
    facts = {}
    medians, foreign = measure([contender(name) for name in names], args, facts)
    limit = statistics.median(medians["paddle_flat_limit"]) if "paddle_flat_limit" in medians else None
    rows = []
    for name in names:
        row = {"contender": name, **summary(medians[name])}
        row["vs_limit"] = row["median_ms"] / limit if limit else None
        if "torch_ddp" in medians and name.startswith("fleetlite_"):
            row["ddp_over_it"] = statistics.median(medians["torch_ddp"]) / row["median_ms"]
        counts = (facts.get(name) or [None])[0]
        if counts:
            row["in_place"] = f"{counts['packed_in_place']}/{counts['packed_in_place'] + counts['packed_copied']}"
        rows.append(row)
    print_table(f"Gradient sync, ResNet-50 shapes (161 tensors, 97.5 MiB), 2 procs, {args.rounds} rounds; "
                f"foreign CPU load {foreign:.0%}", rows,
                [("contender", "contender", "{}"), ("median_ms", "median ms", "{:.1f}"),
                 ("min_ms", "min", "{:.1f}"), ("max_ms", "max", "{:.1f}"), ("vs_limit", "÷ flat limit", "{:.2f}"),
                 ("ddp_over_it", "DDP ÷ it", "{:.2f}"), ("in_place", "members in place (rank 0)", "{}")])
    ratios = {}
    copy_free = [r for r in rows if is_copy_free(r["contender"])]
    best = min(copy_free, key=lambda r: r["median_ms"]) if copy_free else None
    if best:
        ratios["best_copy_free"] = best["contender"]
        ratios["best_copy_free_vs_flat_limit"] = best["vs_limit"]
        for peer in PEERS:
            if peer in medians:
                ratios[f"{peer}_vs_best_copy_free"] = statistics.median(medians[peer]) / best["median_ms"]
        for other in ("fleetlite_concat_4mb", "fleetlite_unfused"):
            if other in medians:
                ratios[f"{other}_vs_best_copy_free"] = statistics.median(medians[other]) / best["median_ms"]
    for row in copy_free:
        ratios[f"{row['contender']}_vs_flat_limit"] = row["vs_limit"]
    publish(rows, ratios, foreign, medians, args.json)


if __name__ == "__main__":
    main()
