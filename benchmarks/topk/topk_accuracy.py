"""Benchmark: test accuracy and bytes per step of the digits example, dense vs top-k vs PowerSGD.

    .venv/bin/python -m benchmarks.topk.topk_accuracy [--quick] [--seeds 5] [--epochs 20] [--json out.json]

Two ranks train examples/train_digits.py's MLP and conv net once per (model, contender, seed):
- fleetlite exchanges (entries of topk_contenders.EXCHANGES): dense all-reduce, top-k with error
  feedback at density 0.01 and 0.001, and the same without error feedback (the negative control),
  all in one long-lived fleetlite job (topk_accuracy_worker.py);
- PyTorch's PowerSGD DDP hook at rank 1 and 2, and plain DDP, on the same models, data split,
  batch and optimizer, in one PyTorch job (powersgd_digits_worker.py; needs torch, which the
  `bench` extra installs; without it these rows are left out, saying so).
Each job runs in a network namespace of its own where it can (root, iproute2), so the loopback
counter gives the bytes per training step actually sent (both directions); elsewhere only the
formula's bytes are shown. The table: final test accuracy mean and standard deviation over the
seeds, the difference to the same framework's dense run in percentage points (fleetlite's when
plain DDP is not among the peers), the bytes per step (measured and formula), and dense bytes /
this.
"""
import contextlib
import importlib.util
import statistics
from collections import defaultdict

from benchmarks.harness import network_namespace
from benchmarks.harness.runner import LoadCheck, WorkerGroup, print_table, protocol_parser, publish

WORLD = 2
EXCHANGES = ["dense", "topk_0.01", "topk_0.001", "topk_0.01_no_ef", "topk_0.001_no_ef"]
PEERS = {"torch_ddp": 0, "powersgd_rank1": 1, "powersgd_rank2": 2}    # PowerSGD matrix rank (0: dense)
QUICK = {"models": ["mlp"], "epochs": 3, "seeds": 1, "exchanges": ["dense", "topk_0.001", "topk_0.001_no_ef"],
         "peers": ["powersgd_rank1"]}


@contextlib.contextmanager
def jobs(isolated, with_torch):
    """{"fleetlite": (group, namespace), "torch": ...}: each job in its own namespace if `isolated`."""
    contenders = [("fleetlite", ["benchmarks.topk.topk_accuracy_worker"])]
    if with_torch:
        contenders.append(("torch", ["benchmarks.topk.powersgd_digits_worker"]))
    if isolated:
        with network_namespace.isolated_groups(contenders, WORLD) as started:
            yield {group.name: (group, namespace) for group, namespace in started}
        return
    with contextlib.ExitStack() as stack:
        yield {name: (stack.enter_context(contextlib.closing(WorkerGroup(name, argv, world=WORLD))), None)
               for name, argv in contenders}


def summarize(results, dense_of):
    rows = []
    for (model, name), runs in results.items():
        accuracies = [100 * r["accuracy"] for r in runs]
        measured = [r["bytes_per_step"] for r in runs if r["bytes_per_step"] is not None]
        dense = results[(model, dense_of[name])]
        dense_measured = [r["bytes_per_step"] for r in dense if r["bytes_per_step"] is not None]
        row = {"model": model, "contender": name, "seeds": len(runs),
               "accuracy_mean": statistics.mean(accuracies),
               "accuracy_std": statistics.stdev(accuracies) if len(runs) > 1 else 0.0,
               "vs_dense_pp": statistics.mean(accuracies) - statistics.mean(100 * r["accuracy"] for r in dense),
               "bytes_per_step": statistics.median(measured) if measured else None,
               "formula_bytes_per_step": WORLD * runs[0]["predicted_bytes_per_rank"]
               if runs[0]["predicted_bytes_per_rank"] is not None else None,
               "steps": runs[0]["steps"]}
        if measured and dense_measured:
            row["dense_bytes_over_this"] = statistics.median(dense_measured) / row["bytes_per_step"]
        elif row["formula_bytes_per_step"]:
            row["dense_bytes_over_this"] = WORLD * dense[0]["predicted_bytes_per_rank"] / row["formula_bytes_per_step"]
        rows.append(row)
    return rows


def main():
    parser = protocol_parser(__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["mlp", "conv"])
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--exchanges", nargs="+", default=EXCHANGES)
    parser.add_argument("--peers", nargs="+", default=list(PEERS), choices=list(PEERS))
    parser.add_argument("--quick", action="store_true", help=f"{QUICK} (< 1 minute)")
    args = parser.parse_args()
    if args.quick:
        for name, value in QUICK.items():
            setattr(args, name, value)
    if "dense" not in args.exchanges:
        parser.error("--exchanges must include dense: accuracy and bytes are compared with it")
    reason = network_namespace.unavailable()
    notes = [] if reason is None else [f"bytes not measured, formula only: {reason}"]
    with_torch = bool(args.peers) and importlib.util.find_spec("torch") is not None
    if args.peers and not with_torch:
        notes.append("PyTorch peers left out: torch is not installed (pip install -e '.[bench]')")
    plan = [("fleetlite", name, {"exchange": name}) for name in args.exchanges]
    plan += [("torch", name, {"rank": PEERS[name]}) for name in args.peers if with_torch]
    dense_of = {name: "dense" if job == "fleetlite" else "torch_ddp" for job, name, _ in plan}
    if "torch_ddp" not in args.peers:
        dense_of.update({name: "dense" for job, name, _ in plan if job == "torch"})
    results = defaultdict(list)
    with jobs(reason is None, with_torch) as started:
        load = LoadCheck([p.pid for group, _ in started.values() for p in group.processes])
        for model in args.models:
            for job, name, fields in plan:
                for seed in range(args.seeds):
                    request = {"op": "train", "model": model, "seed": seed, "epochs": args.epochs,
                               "count_bytes": reason is None, **fields}
                    results[(model, name)].append(started[job][0].ask(request)[0])
                print(f"{model} {name}: accuracy "
                      + " ".join(f"{r['accuracy']:.3f}" for r in results[(model, name)]), flush=True)
        foreign = load.foreign_share()
    rows = summarize(results, dense_of)
    print_table(f"Digits, {WORLD} ranks, {args.epochs} epochs, {args.seeds} seeds: final test accuracy (%) and "
                f"bytes per training step (both directions); foreign CPU load {foreign:.0%}", rows,
                [("model", "model", "{}"), ("contender", "contender", "{}"), ("accuracy_mean", "accuracy", "{:.2f}"),
                 ("accuracy_std", "± std", "{:.2f}"), ("vs_dense_pp", "vs dense (pp)", "{:+.2f}"),
                 ("bytes_per_step", "bytes/step", "{:,.0f}"), ("formula_bytes_per_step", "formula", "{:,.0f}"),
                 ("dense_bytes_over_this", "dense/this", "{:.1f}")])
    for note in notes:
        print(note)
    ratios = {f"{row['model']}_{row['contender']}": {"accuracy_vs_dense_pp": row["vs_dense_pp"],
                                                      "dense_bytes_over_this": row.get("dense_bytes_over_this")}
              for row in rows}
    publish(rows, ratios, foreign, {f"{m}_{n}": runs for (m, n), runs in results.items()}, args.json)


if __name__ == "__main__":
    main()
