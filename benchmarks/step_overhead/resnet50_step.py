"""Benchmark (a'): a real ResNet-50 training step, 2 processes over gloo vs 1 process.

    .venv/bin/python -m benchmarks.step_overhead.resnet50_step [--rounds 5] [--batch 8] [--json out.json]

paddle.vision.models.resnet50() trained by fleetlite (configs/cpu_gloo.yaml), by Paddle dygraph
DataParallel, and the same architecture by PyTorch DDP; SGD, 32x32 images, `--batch` per rank,
2 steps per sample, everything interleaved in one run. For each: t2 (2 processes), t1 (1
process, same per-rank batch), D = t2/t1 (1 = the sync costs nothing); the ratios compare the
2-process steps (peer t2 / fleetlite t2: above 1, fleetlite is faster) and give fleetlite's
in-place count (bucket members backward wrote straight into their slots, of all packed).
"""
import statistics

from benchmarks.harness.runner import measure, print_table, protocol_parser, publish

FRAMEWORKS = ["fleetlite", "paddle_dataparallel", "torch_ddp"]


def main():
    parser = protocol_parser(__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=8, help="images per rank per step")
    parser.set_defaults(rounds=5, warmup=1, reps=2)
    args = parser.parse_args()
    facts = {}
    medians, foreign = measure([(f"{name}:{world}proc{'s' * (world > 1)}", ["benchmarks.step_overhead.resnet50_worker", name,
                                 str(args.batch)], world) for name in FRAMEWORKS for world in (2, 1)], args, facts)
    rows = []
    for name in FRAMEWORKS:
        two, one = medians[f"{name}:2procs"], medians[f"{name}:1proc"]
        paired = [a / b for a, b in zip(two, one)]
        rows.append({"framework": name, "t2": statistics.median(two), "t1": statistics.median(one),
                     "D": statistics.median(paired), "D_min": min(paired), "D_max": max(paired)})
    print_table(f"ResNet-50 training step (32x32, batch {args.batch} per rank, 2 steps per sample), "
                f"{args.rounds} rounds; foreign CPU load {foreign:.0%}", rows,
                [("framework", "framework", "{}"), ("t2", "t 2 procs (ms/2 steps)", "{:.0f}"),
                 ("t1", "t 1 proc", "{:.0f}"), ("D", "D = t2/t1", "{:.2f}"), ("D_min", "D min", "{:.2f}"),
                 ("D_max", "D max", "{:.2f}")])
    mine = next(r for r in rows if r["framework"] == "fleetlite")
    ratios = {"D_fleetlite": mine["D"]}
    for row in rows:
        if row is not mine:
            ratios[f"{row['framework']}_t2_over_fleetlite_t2"] = row["t2"] / mine["t2"]
            ratios[f"D_{row['framework']}"] = row["D"]
    counts = (facts.get("fleetlite:2procs") or [None])[0]
    if counts:
        ratios["fleetlite_members_in_place"] = counts["packed_in_place"]
        ratios["fleetlite_members_packed"] = counts["packed_in_place"] + counts["packed_copied"]
        ratios["fleetlite_alias_copies"] = counts["aliased_copied"]
    publish(rows, ratios, foreign, medians, args.json)


if __name__ == "__main__":
    main()
