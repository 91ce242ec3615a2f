"""Benchmark: fleet.train_step against Paddle's eager DataParallel loop, both at 2 processes.

    .venv/bin/python -m benchmarks.dygraph.dygraph_step [--models mlp conv] [--rounds 9] [--json out.json]

R = t(train_step, 2 processes) / t(paddle.DataParallel eager loop, 2 processes), per model (the
step-overhead MLP 64-512-512-10, global batch 256; a conv net with batch norm on 3x32x32 images,
global batch 32), 20 SGD steps per sample, everything interleaved in one run. Target: R <= 1.
Also the first train_step call's time (trace + compile + startup + one step) on each rank.
"""
import statistics

from benchmarks.harness.runner import measure, print_table, protocol_parser, publish

CONTENDERS = ("train_step", "paddle_dataparallel")
BATCH_PER_RANK = {"mlp": 128, "conv": 16}


def main():
    parser = protocol_parser(__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", choices=sorted(BATCH_PER_RANK), default=list(BATCH_PER_RANK))
    args = parser.parse_args()
    facts = {}
    medians, foreign = measure([(f"{name}:{model}",
                                 ["benchmarks.dygraph.dygraph_step_worker", name, model, str(BATCH_PER_RANK[model])], 2)
                                for model in args.models for name in CONTENDERS], args, facts)
    rows, ratios = [], {}
    for model in args.models:
        mine, eager = medians[f"train_step:{model}"], medians[f"paddle_dataparallel:{model}"]
        paired = [a / b for a, b in zip(mine, eager)]
        first = max(rank["first_call_ms"] for rank in facts[f"train_step:{model}"])
        rows.append({"model": model, "train_step": statistics.median(mine), "eager": statistics.median(eager),
                     "R": statistics.median(paired), "R_min": min(paired), "R_max": max(paired), "first": first})
        ratios[f"R_{model}"] = statistics.median(paired)
        ratios[f"first_call_ms_{model}"] = first
    print_table(f"fleet.train_step / paddle.DataParallel eager loop, 2 processes, {args.rounds} rounds; "
                f"foreign CPU load {foreign:.0%}", rows,
                [("model", "model", "{}"), ("train_step", "train_step (ms/20 steps)", "{:.1f}"),
                 ("eager", "DataParallel eager", "{:.1f}"), ("R", "R = ratio", "{:.2f}"),
                 ("R_min", "R min", "{:.2f}"), ("R_max", "R max", "{:.2f}"),
                 ("first", "first call (ms, slowest rank)", "{:.0f}")])
    publish(rows, ratios, foreign, medians, args.json)


if __name__ == "__main__":
    main()
