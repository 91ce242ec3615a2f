"""Benchmark: bytes on the wire per training step, dense all-reduce vs top-k and local SGD, counted and predicted.

    .venv/bin/python -m benchmarks.topk.topk_wire_bytes [--quick] [--exchanges dense topk_0.01 localsgd_4 ...] [--json out.json]

Needs root and iproute2: each exchange (an entry of topk_contenders.EXCHANGES) trains an MLP
(--layers, default 1024-2048-1024-10: 4.2 M parameters) on 2 ranks inside its own network
namespace, so that namespace's loopback counter counts only its ranks' traffic. Per round, for
every exchange in turn: read the counter, run --steps training steps (no barriers between them),
read it again; bytes per step = the difference / steps, after --warmup rounds that absorb
start-up and rendezvous traffic. The table gives the median over the rounds, the formula's
prediction (topk_contenders: gloo's ring all-reduce and ring all-gather), measured / predicted,
and dense / this exchange. Where namespaces cannot be made, it says why and exits cleanly.
"""
import statistics
import sys

from benchmarks.harness import network_namespace
from benchmarks.harness.runner import LoadCheck, print_table, protocol_parser, publish, publish_skipped
from benchmarks.topk.topk_contenders import exchange

WORLD = 2
DEFAULT = ["dense", "topk_0.01", "topk_0.001"]
QUICK_LAYERS = "256,1024,512,10"


def bytes_per_step(group, namespace, steps):
    before = namespace.loopback_bytes()
    group.ask({"op": "measure", "reps": steps, "sync": False})
    return (namespace.loopback_bytes() - before) / steps


def main():
    parser = protocol_parser(__doc__.splitlines()[0])
    parser.set_defaults(rounds=5, warmup=1)
    parser.add_argument("--exchanges", nargs="+", default=DEFAULT)
    parser.add_argument("--layers", default="1024,2048,1024,10", help="the MLP's widths, comma-separated")
    parser.add_argument("--batch", type=int, default=32, help="rows per rank")
    parser.add_argument("--steps", type=int, default=4, help="training steps per round (a multiple of local SGD's k)")
    parser.add_argument("--quick", action="store_true", help=f"a {QUICK_LAYERS} MLP, 2 rounds of 4 steps (< 1 minute)")
    args = parser.parse_args()
    if args.quick:
        args.layers, args.rounds, args.warmup, args.steps = QUICK_LAYERS, 2, 1, 4
    reason = network_namespace.unavailable()
    if reason:
        return publish_skipped(reason, args.json)
    contenders = [(name, ["benchmarks.topk.topk_exchange_worker", exchange(name).name, args.layers, str(args.batch)])
                  for name in args.exchanges]
    with network_namespace.isolated_groups(contenders, WORLD) as started:
        load = LoadCheck([p.pid for group, _ in started for p in group.processes])
        measured = {name: [] for name in args.exchanges}
        for round_index in range(args.warmup + args.rounds):
            for group, namespace in started:
                value = bytes_per_step(group, namespace, args.steps)
                if round_index >= args.warmup:
                    measured[group.name].append(value)
        foreign = load.foreign_share()
        facts = {group.name: group.ask({"op": "info"})[0]["info"] for group, _ in started}
    report(args, measured, facts, foreign)


def report(args, measured, facts, foreign):
    dense = statistics.median(measured["dense"]) if "dense" in measured else None
    rows = []
    for name, values in measured.items():
        per_rank = facts[name]["predicted_bytes_per_rank"]
        predicted = per_rank * WORLD if per_rank is not None else None
        value = statistics.median(values)
        rows.append({"exchange": name, "bytes_per_step": value, "min": min(values), "max": max(values),
                     "predicted": predicted, "measured_over_predicted": value / predicted if predicted else None,
                     "dense_over_this": dense / value if dense else None})
    parameters = facts[args.exchanges[0]]["parameters"]
    print_table(f"Bytes on loopback per training step, {WORLD} ranks, both directions, MLP {args.layers} "
                f"({parameters:,} parameters), {args.rounds} rounds of {args.steps} steps; foreign CPU load "
                f"{foreign:.0%}", rows,
                [("exchange", "exchange", "{}"), ("bytes_per_step", "bytes/step", "{:,.0f}"),
                 ("predicted", "formula", "{:,.0f}"), ("measured_over_predicted", "measured/formula", "{:.3f}"),
                 ("dense_over_this", "dense/this", "{:.1f}"), ("min", "min", "{:,.0f}"), ("max", "max", "{:,.0f}")])
    ratios = {"parameters": parameters}
    for row in rows:
        if row["exchange"] != "dense" and row["dense_over_this"]:
            ratios[f"dense_over_{row['exchange']}"] = row["dense_over_this"]
        if row["measured_over_predicted"]:
            ratios[f"{row['exchange']}_measured_over_formula"] = row["measured_over_predicted"]
    publish(rows, ratios, foreign, measured, args.json)


if __name__ == "__main__":
    sys.exit(main())
