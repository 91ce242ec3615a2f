"""Benchmark: training-step time across two hosts on a slow link, flat exchanges vs their two-level forms.

    .venv/bin/python -m benchmarks.multihost.two_node_steps [--rate 1gbit] [--layers 1024,2048,1024,10]
                                                            [--density 0.01] [--pairs hierarchical_topk]
                                                            [--rounds 5] [--json out.json]

Needs root, iproute2 (tc's tbf) and openssh (namespace_cluster). 2 hosts x 2 ranks; every host's
link limited to RATE each way (Cluster.limit_link), the hosts' loopbacks (the traffic inside a
node) at full speed. Contenders, interleaved round after round (harness protocol), all started
before the first round: hierarchical all-reduce and dense all-reduce, hierarchical top-k and
one-level top-k at DENSITY (topk_contenders; --pairs picks one pair), each rank training the MLP on
its own batch. A sample is the slowest rank's step after a barrier. Ratios: each two-level
exchange's step time over its flat form's (below 1: the two-level form is faster).
Where a cluster or tc cannot be used, it says why and exits cleanly.
"""
import statistics

from benchmarks.harness import namespace_cluster, network_namespace
from benchmarks.harness.runner import LoadCheck, print_table, protocol_parser, publish, publish_skipped, run_interleaved
from benchmarks.multihost.multihost import PER_HOST, WORKER_PORT, ClusterWorkers, flat_and_two_level
from benchmarks.topk.topk_contenders import exchange

HOSTS = 2
PAIRS = {"hierarchical_allreduce": "dense", "hierarchical_topk": "topk"}   # two-level form: its flat form


def measure(cluster, args):
    """{key: [round medians]} and the foreign CPU share, every exchange's ranks started side by side."""
    groups = []
    chosen = {key for pair in args.pairs for key in (pair, PAIRS[pair])}
    try:
        for index, (key, name) in enumerate(flat_and_two_level(args.density).items()):
            if key not in chosen:
                continue
            argv = ["benchmarks.topk.topk_exchange_worker", exchange(name).name, args.layers, str(args.batch)]
            groups.append(ClusterWorkers(key, argv, cluster, PER_HOST, port=WORKER_PORT + 10 * index))
        load = LoadCheck([process.pid for group in groups for process in group.processes])
        return run_interleaved(groups, args.rounds, args.warmup, args.reps), load.foreign_share()
    finally:
        for group in groups:
            group.close()


def main():
    parser = protocol_parser(__doc__.splitlines()[0])
    parser.set_defaults(rounds=5, warmup=1, reps=2)
    parser.add_argument("--rate", default="1gbit", help="each host's link, each way (tc's units)")
    parser.add_argument("--layers", default="1024,2048,1024,10", help="the MLP's widths, comma-separated")
    parser.add_argument("--batch", type=int, default=32, help="rows per rank")
    parser.add_argument("--density", type=float, default=0.01, help="one of topk_contenders' densities")
    parser.add_argument("--pairs", nargs="+", default=list(PAIRS), choices=list(PAIRS),
                        help="the two-level exchanges measured, each beside its flat form")
    args = parser.parse_args()
    try:
        network_namespace.rate_bytes(args.rate)
    except ValueError as error:
        parser.error(f"--rate: {error}")
    reason = namespace_cluster.unavailable() or network_namespace.shaping_unavailable()
    if reason:
        return publish_skipped(reason, args.json)
    with namespace_cluster.Cluster(HOSTS) as cluster:
        for host in cluster.hosts:
            cluster.limit_link(host, args.rate)
        medians, foreign = measure(cluster, args)
    median = {key: statistics.median(values) for key, values in medians.items()}
    rows = [{"exchange": key, "median_ms": median[key], "min_ms": min(values), "max_ms": max(values)}
            for key, values in medians.items()]
    ratios = {f"{two_level}_over_{PAIRS[two_level]}": median[two_level] / median[PAIRS[two_level]]
              for two_level in args.pairs}
    print_table(f"Training step (wall time), {HOSTS} hosts x {PER_HOST} ranks, each link {args.rate} each way, MLP "
                f"{args.layers}, batch {args.batch} per rank, density {args.density:g}, {args.rounds} rounds; "
                f"foreign CPU load {foreign:.0%}", rows,
                [("exchange", "exchange", "{}"), ("median_ms", "median ms", "{:.1f}"), ("min_ms", "min", "{:.1f}"),
                 ("max_ms", "max", "{:.1f}")])
    publish(rows, ratios, foreign, medians, args.json)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
