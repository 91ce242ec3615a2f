"""Benchmark: peak memory and step time of a deep MLP with and without recompute (one process each).

    .venv/bin/python -m benchmarks.memory.recompute [--layers 16 --width 128 --batch 4096 --every 4] [--json out.json]

Each configuration runs in its own child process (benchmarks/memory/recompute_worker.py), the two
interleaved round by round. Memory is Paddle's CPU allocator statistics (bytes allocated, peak of
one training step); the activations' share is the peak less what the process holds before the
step (parameters, the batch), and the RSS high-water mark of each child is reported beside it.
Ratios: A = activations with recompute / without (target <= 0.6), T = step time with / without
(target <= 1.4), paired per round.
"""
import statistics

from benchmarks.harness.runner import measure, print_table, protocol_parser, publish

MB = 1024 * 1024
CONFIGS = ("plain", "recompute")


def main():
    parser = protocol_parser(__doc__.splitlines()[0])
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--width", type=int, default=128)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--every", type=int, default=4, help="a checkpoint every this many blocks")
    args = parser.parse_args()
    shape = [str(args.layers), str(args.width), str(args.batch), str(args.every)]
    facts = {}
    medians, foreign = measure([(config, ["benchmarks.memory.recompute_worker", config, *shape], 1)
                                for config in CONFIGS], args, facts)
    memory = {config: facts[config][0] for config in CONFIGS}
    rows = [{"config": config, "step_ms": statistics.median(medians[config]),
             "peak_MB": memory[config]["peak_allocated"] / MB, "activations_MB": memory[config]["activations"] / MB,
             "held_MB": memory[config]["held_before_step"] / MB, "max_rss_MB": memory[config]["max_rss_kib"] / 1024,
             "recomputed_ops": memory[config]["recomputed_ops"]} for config in CONFIGS]
    paired = [r / p for r, p in zip(medians["recompute"], medians["plain"])]
    ratios = {"A_activations": memory["recompute"]["activations"] / memory["plain"]["activations"],
              "peak": memory["recompute"]["peak_allocated"] / memory["plain"]["peak_allocated"],
              "T_step_time": statistics.median(paired), "T_min": min(paired), "T_max": max(paired)}
    print_table(f"recompute on a {args.layers}-block MLP (width {args.width}, batch {args.batch}, a checkpoint every "
                f"{args.every} blocks), 1 process, {args.rounds} rounds; foreign CPU load {foreign:.0%}", rows,
                [("config", "config", "{}"), ("step_ms", "step (ms)", "{:.1f}"), ("peak_MB", "peak (MB)", "{:.1f}"),
                 ("held_MB", "held before (MB)", "{:.1f}"), ("activations_MB", "activations (MB)", "{:.1f}"),
                 ("max_rss_MB", "max RSS (MB)", "{:.0f}"), ("recomputed_ops", "recomputed ops", "{}")])
    publish(rows, ratios, foreign, medians, args.json)


if __name__ == "__main__":
    main()
