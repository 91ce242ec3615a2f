"""Benchmark: pto's Adam step (half the update + the parameter exchange) vs one rank's whole update.

    .venv/bin/python -m benchmarks.pto.pto [--rounds 5] [--json out.json]

Two models: ResNet-50's 161 parameter shapes (25.6M floats) and 400 small parameters of 256
floats. Contenders per model, 2 processes over gloo, interleaved in one run (see harness): the
whole Adam update on one rank (what every rank runs without pto), pto (this rank's half of
the update + the broadcast of every parameter from its owner), and the exchange alone as pto
builds it (broadcast) and as all_gather would (parts padded to the largest). A sample is the
slowest rank's step. pto pays where update_ms_pto < update_ms_one_rank. The crossover is
reported as `breakeven_update_cost_vs_adam`: pto's step is about half the update plus the
exchange, so it pays for an optimizer whose update costs more than that many times Adam's on the
same parameters (2 x pto's extra time / Adam's update, from the measured times); below 1, pto
already pays with Adam.
"""
import math
import statistics

from benchmarks.harness.runner import measure, print_table, protocol_parser, publish, summary
from benchmarks.pto.pto_worker import MODELS as SHAPES

MiB = 1 << 20
PARAMETER_BYTES = {model: 4 * sum(math.prod(shape) for shape in shapes) for model, shapes in SHAPES.items()}

MODELS = ("resnet50", "small_params")
CONTENDERS = ("one_rank", "pto", "exchange_broadcast", "exchange_all_gather")


def main():
    parser = protocol_parser(__doc__.splitlines()[0])
    parser.set_defaults(rounds=5, reps=3)
    parser.add_argument("--models", nargs="*", default=MODELS, choices=MODELS)
    args = parser.parse_args()
    facts, rows, ratios = {}, [], {}
    contenders = [(f"{model}/{name}", ["benchmarks.pto.pto_worker", name, model], 2)
                  for model in args.models for name in CONTENDERS]
    medians, foreign = measure(contenders, args, facts)
    for model in args.models:
        median = {name: statistics.median(medians[f"{model}/{name}"]) for name in CONTENDERS}
        for name in CONTENDERS:
            rows.append({"contender": f"{model}/{name}", **summary(medians[f"{model}/{name}"])})
        state_unsharded = max(facts[f"{model}/one_rank"])
        state_per_rank = max(facts[f"{model}/pto"])
        ratios[model] = {
            "model": model, "update_ms_one_rank": median["one_rank"], "update_ms_pto": median["pto"],
            "pto_vs_one_rank": median["pto"] / median["one_rank"],
            "exchange_ms_broadcast": median["exchange_broadcast"],
            "exchange_ms_all_gather": median["exchange_all_gather"],
            "all_gather_vs_broadcast": median["exchange_all_gather"] / median["exchange_broadcast"],
            "half_update_saved_ms": median["one_rank"] / 2, "pays": median["pto"] < median["one_rank"],
            "breakeven_update_cost_vs_adam": 2 * (median["pto"] - median["one_rank"] / 2) / median["one_rank"],
            "parameter_MiB": PARAMETER_BYTES[model] / MiB,
            "optimizer_state_bytes_per_rank": state_per_rank, "optimizer_state_bytes_unsharded": state_unsharded,
            "state_per_rank_vs_unsharded": state_per_rank / state_unsharded}
    print_table(f"Adam step, 2 procs, {args.rounds} rounds; foreign CPU load {foreign:.0%}", rows,
                [("contender", "contender", "{}"), ("median_ms", "median ms", "{:.1f}"),
                 ("min_ms", "min", "{:.1f}"), ("max_ms", "max", "{:.1f}")])
    publish(rows, ratios, foreign, medians, args.json)


if __name__ == "__main__":
    main()
