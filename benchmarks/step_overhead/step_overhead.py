"""Benchmark (b): data-parallel overhead of one training step (MLP 64-512-512-10, SGD).

    .venv/bin/python -m benchmarks.step_overhead.step_overhead [--rounds 9] [--json out.json]

For each framework, D = t(2 processes x B/2) / t(1 process x B/2), global batch B = 256, 20 steps
per sample, everything interleaved in one run. D = 1 is perfect scaling of the per-rank work; the
target is D(fleetlite) <= the best peer's D.
"""
import statistics

from benchmarks.harness.runner import measure, print_table, protocol_parser, publish

FRAMEWORKS = ["fleetlite", "paddle_dataparallel", "torch_ddp"]
GLOBAL_BATCH = 256


def main():
    args = protocol_parser(__doc__.splitlines()[0]).parse_args()
    half = str(GLOBAL_BATCH // 2)
    medians, foreign = measure([(f"{name}:{world}proc{'s' * (world > 1)}",
                                 ["benchmarks.step_overhead.step_worker", name, half], world)
                                for name in FRAMEWORKS for world in (2, 1)], args)
    rows = []
    for name in FRAMEWORKS:
        two, one = medians[f"{name}:2procs"], medians[f"{name}:1proc"]
        paired = [a / b for a, b in zip(two, one)]
        rows.append({"framework": name, "t2": statistics.median(two), "t1": statistics.median(one),
                     "D": statistics.median(paired), "D_min": min(paired), "D_max": max(paired),
                     "samples_per_s_2procs": GLOBAL_BATCH * 20 / statistics.median(two) * 1000})
    print_table(f"Training step overhead, MLP 64-512-512-10, global batch {GLOBAL_BATCH}, "
                f"{args.rounds} rounds; foreign CPU load {foreign:.0%}", rows,
                [("framework", "framework", "{}"), ("t2", "t 2 procs x B/2 (ms/20 steps)", "{:.1f}"),
                 ("t1", "t 1 proc x B/2", "{:.1f}"), ("D", "D = t2/t1", "{:.2f}"),
                 ("D_min", "D min", "{:.2f}"), ("D_max", "D max", "{:.2f}"),
                 ("samples_per_s_2procs", "samples/s 2 procs", "{:.0f}")])
    best_peer = min((r for r in rows if r["framework"] != "fleetlite"), key=lambda r: r["D"])
    mine = next(r for r in rows if r["framework"] == "fleetlite")
    ratios = {"D_fleetlite": mine["D"], "best_peer": best_peer["framework"], "D_best_peer": best_peer["D"],
              "D_fleetlite_vs_best_peer": mine["D"] / best_peer["D"]}
    publish(rows, ratios, foreign, medians, args.json)


if __name__ == "__main__":
    main()
