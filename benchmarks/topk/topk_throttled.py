"""Benchmark: training-step time on a throttled link, dense all-reduce vs top-k over densities.

    .venv/bin/python -m benchmarks.topk.topk_throttled [--quick] [--rates 100mbit 1gbit unshaped] [--cpu-time]
                                                       [--json out.json]

Needs root and iproute2 (tc's tbf): for each link rate, every exchange (an entry of
topk_contenders.EXCHANGES; default dense and top-k at 0.1, 0.01, 0.001) trains an MLP on 2 ranks
in a network namespace of its own whose loopback is shaped to that rate (`unshaped`: loopback at
full speed). The exchanges of one rate run interleaved, round after round (harness protocol); a
sample is the slowest rank's step, after a barrier. Shaping `lo` puts both directions on one link
of the rate (network_namespace). The workers run in fleetrun's CPU environment
(launcher/plan.py's worker_defaults: glibc's malloc tunables, KMP_BLOCKTIME=0). Per rate the
ratios give dense / this step time for each exchange and, per family of exchanges swept over
densities (topk_contenders), the largest density at which it is faster than dense. `--cpu-time`
samples each step's CPU time instead (the slowest rank's process, all threads): what each
exchange costs in computation, the part of top-k's step its selection, error feedback and
scatter make, measurable on a loaded machine where wall times are not. Where namespaces or tc
cannot be used, it says why and exits cleanly.
"""
import statistics
from collections import defaultdict

from benchmarks.harness import network_namespace
from benchmarks.harness.runner import LoadCheck, print_table, protocol_parser, publish, publish_skipped, run_interleaved
from benchmarks.topk.topk_contenders import exchange
from fleetlite.launcher.plan import worker_defaults

WORLD = 2
UNSHAPED = "unshaped"
QUICK_LAYERS = "256,1024,512,10"


def measure_rate(rate, names, args):
    """{exchange: [round medians]} and the foreign CPU share, every exchange in a namespace shaped to `rate`."""
    clock = "cpu" if args.cpu_time else "wall"
    contenders = [(name, ["benchmarks.topk.topk_exchange_worker", exchange(name).name, args.layers, str(args.batch),
                          clock]) for name in names]
    with network_namespace.isolated_groups(contenders, WORLD, None if rate == UNSHAPED else rate,
                                           worker_defaults(WORLD, cpu=True)) as started:
        groups = [group for group, _ in started]
        load = LoadCheck([p.pid for g in groups for p in g.processes])
        medians = run_interleaved(groups, args.rounds, args.warmup, args.reps)
        return medians, load.foreign_share()


def crossover(sweep, dense):
    """The largest density of {density: median step} whose step beats dense (None: none does)."""
    faster = [density for density, median in sweep.items() if median < dense]
    return max(faster) if faster else None


def main():
    parser = protocol_parser(__doc__.splitlines()[0])
    parser.set_defaults(rounds=5, warmup=1, reps=2)
    parser.add_argument("--rates", nargs="+", default=["100mbit", "1gbit", UNSHAPED])
    parser.add_argument("--exchanges", nargs="+", default=["dense", "topk_0.1", "topk_0.01", "topk_0.001"])
    parser.add_argument("--layers", default="1024,2048,1024,10", help="the MLP's widths, comma-separated")
    parser.add_argument("--batch", type=int, default=32, help="rows per rank")
    parser.add_argument("--cpu-time", action="store_true", help="sample each step's CPU time instead of its wall time")
    parser.add_argument("--quick", action="store_true",
                        help=f"a {QUICK_LAYERS} MLP at 100mbit, dense against top-k 0.01 and 0.001 (< 1 minute)")
    args = parser.parse_args()
    if args.quick:
        args.layers, args.rounds, args.warmup, args.reps = QUICK_LAYERS, 1, 1, 2
        args.rates, args.exchanges = ["100mbit"], ["dense", "topk_0.01", "topk_0.001"]
    for rate in set(args.rates) - {UNSHAPED}:
        try:
            network_namespace.rate_bytes(rate)
        except ValueError as error:
            parser.error(f"--rates: {error}")
    reason = network_namespace.unavailable() or (
        network_namespace.shaping_unavailable() if set(args.rates) - {UNSHAPED} else None)
    if reason:
        return publish_skipped(reason, args.json)
    if "dense" not in args.exchanges:
        parser.error("--exchanges must include dense: the ratios are against it")
    rows, ratios, rounds, foreign = [], {}, {}, {}
    for rate in args.rates:
        medians, foreign[rate] = measure_rate(rate, args.exchanges, args)
        rounds[rate] = medians
        dense = statistics.median(medians["dense"])
        families = defaultdict(dict)
        for name, values in medians.items():
            median = statistics.median(values)
            rows.append({"rate": rate, "exchange": name, "median_ms": median, "min_ms": min(values),
                         "max_ms": max(values), "dense_over_this": dense / median})
            if name != "dense":
                ratios[f"{rate}_dense_over_{name}"] = dense / median
            if exchange(name).family:
                families[exchange(name).family][exchange(name).density] = median
        for family, sweep in families.items():
            ratios[f"{rate}_{family}_faster_from_density"] = crossover(sweep, dense)
    print_table(f"Training step ({'CPU' if args.cpu_time else 'wall'} time) on a shaped loopback, {WORLD} ranks, MLP {args.layers}, batch {args.batch} per "
                f"rank, {args.rounds} rounds; foreign CPU load per rate "
                + ", ".join(f"{rate} {share:.0%}" for rate, share in foreign.items()), rows,
                [("rate", "link", "{}"), ("exchange", "exchange", "{}"), ("median_ms", "median ms", "{:.1f}"),
                 ("min_ms", "min", "{:.1f}"), ("max_ms", "max", "{:.1f}"), ("dense_over_this", "dense/this", "{:.2f}")])
    publish(rows, ratios, foreign, rounds, args.json)


if __name__ == "__main__":
    main()
