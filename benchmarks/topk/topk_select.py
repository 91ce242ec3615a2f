"""Benchmark: top-k selection by magnitude on one CPU thread, MSTopK against exact selection.

    .venv/bin/python -m benchmarks.topk.topk_select [--sizes 1 4 16 25] [--densities 0.001 0.01] [--json out.json]

Per size (millions of float32 elements, a Gaussian gradient) and density, every contender runs
once per round, in turn, for --rounds rounds after --warmup discarded ones; the tables show the
median round's wall time and, since the machine is shared, its CPU time (this process's, all
threads; every contender runs on one thread):
- mstopk_static: fleetlite.compression.topk_select.mstopk built into a static program, as the topk pass builds it
  on a CPU: the compiled kernel (the gradient lives in the scope, as a training step's gradient
  does; the run fetches the k values and indices);
- mstopk_eager: the same function, the same kernel, called on an eager tensor;
- ops_static: mstopk with implementation="ops", the Paddle-op composition that GPUs (and CPUs
  without a C++ compiler) run, in a static program, for reference;
- numpy_argpartition: numpy.argpartition(|g|, n - k) (|g| included);
- paddle_topk: paddle.topk(|g|, k), eager;
- torch_topk: torch.topk(|g|, k) (the `bench` extra installs torch; skipped without it);
- stream: numpy.abs(g, out=buffer), one streaming pass over |g|, the floor of any method that
  reads every element.
Recall is the share of MSTopK's k elements whose |g| reaches the exact k-th largest |g|. The
ratios line gives, at the largest size and smallest density, MSTopK (static) against each
contender; the issue's targets there are >= 5x argpartition, >= 20x paddle.topk, recall >= 0.95
and within 3x of the stream. The foreign CPU share and the load average say how busy the machine
was meanwhile.
"""
import os
import statistics
import time

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("GLOG_minloglevel", "2")

import numpy as np  # noqa: E402
import paddle  # noqa: E402

from fleetlite.compression import topk_select as topk  # noqa: E402
from benchmarks.harness.runner import LoadCheck, print_table, protocol_parser, publish  # noqa: E402

try:
    import torch
except ImportError:
    torch = None

CLOCKS = {"": time.perf_counter, "_cpu": time.process_time}     # row key suffix: wall, CPU time


def static_mstopk(gradient, k, implementation):
    """A run of a static program holding MSTopK of a gradient that lives in the scope."""
    paddle.enable_static()
    main, startup = paddle.static.Program(), paddle.static.Program()
    with paddle.static.program_guard(main, startup):
        x = paddle.static.create_parameter([gradient.size], "float32", name="gradient")
        values, indices = topk.mstopk(x, k, name="gradient", implementation=implementation)
    scope = paddle.static.Scope()
    exe = paddle.static.Executor(paddle.CPUPlace())
    with paddle.static.scope_guard(scope):
        exe.run(startup)
        scope.find_var("gradient").get_tensor().set(gradient, paddle.CPUPlace())
    paddle.disable_static()

    def run():
        paddle.enable_static()
        try:
            with paddle.static.scope_guard(scope):
                return exe.run(main, fetch_list=[values, indices])[1]
        finally:
            paddle.disable_static()
    return run


def contenders(gradient, k):
    n = gradient.size
    tensor = paddle.to_tensor(gradient)
    buffer = np.empty_like(gradient)
    found = {
        "mstopk_static": static_mstopk(gradient, k, "kernel"),
        "mstopk_eager": lambda: topk.mstopk(tensor, k, implementation="kernel")[1],
        "ops_static": static_mstopk(gradient, k, "ops"),
        "numpy_argpartition": lambda: np.argpartition(np.abs(gradient), n - k)[n - k:],
        "paddle_topk": lambda: paddle.topk(paddle.abs(tensor), k)[1],
        "stream": lambda: np.abs(gradient, out=buffer),
    }
    if torch is not None:
        torch.set_num_threads(1)
        as_torch = torch.from_numpy(gradient)
        found["torch_topk"] = lambda: torch.topk(torch.abs(as_torch), k)[1]
    return found


def recall(gradient, indices, k):
    kth = np.partition(np.abs(gradient), gradient.size - k)[gradient.size - k]
    return np.count_nonzero(np.abs(gradient[indices]) >= kth) / k


def measure_case(size, density, args):
    gradient = np.random.default_rng(size).standard_normal(size).astype("float32")
    k = max(1, int(size * density))
    runs = contenders(gradient, k)
    rounds = {f"{name}{clock}": [] for name in runs for clock in CLOCKS}
    for round_index in range(args.warmup + args.rounds):
        for name, run in runs.items():
            started = {clock: read() for clock, read in CLOCKS.items()}
            run()
            if round_index >= args.warmup:
                for clock, read in CLOCKS.items():
                    rounds[f"{name}{clock}"].append((read() - started[clock]) * 1000)
    row = {"elements": size, "density": density, "k": k,
           "recall": recall(gradient, np.asarray(runs["mstopk_static"]()), k)}
    row.update({name: statistics.median(times) for name, times in rounds.items()})
    return row, rounds


def main():
    parser = protocol_parser(__doc__.splitlines()[0])
    parser.set_defaults(rounds=5, warmup=1)
    parser.add_argument("--sizes", type=float, nargs="+", default=[1, 4, 16, 25], help="millions of elements")
    parser.add_argument("--densities", type=float, nargs="+", default=[0.001, 0.01])
    args = parser.parse_args()
    paddle.base.core.set_num_threads(1)
    load = LoadCheck([])
    load_before = os.getloadavg()[0]
    rows, medians = [], {}
    for size in args.sizes:
        for density in args.densities:
            row, rounds = measure_case(int(size * 1_000_000), density, args)
            rows.append(row)
            medians[f"{size:g}M@{density:g}"] = rounds
    names = [n for n in ("mstopk_static", "mstopk_eager", "ops_static", "numpy_argpartition", "paddle_topk",
                         "torch_topk", "stream") if n in rows[0]]
    case = [("elements", "elements", "{:,}"), ("density", "density", "{:g}"), ("k", "k", "{:,}")]
    for clock, what in (("", "wall"), ("_cpu", "CPU")):
        print_table(f"top-k selection, median {what} ms per call (1 thread)", rows,
                    case + [(n + clock, n, "{:.1f}") for n in names] + [("recall", "recall", "{:.4f}")])
    headline = max(rows, key=lambda r: (r["elements"], -r["density"]))
    ratios = {"case": f"{headline['elements']:,} elements @ {headline['density']:g}",
              "recall": headline["recall"]}
    for clock in CLOCKS:
        ratios.update({f"{n}_over_mstopk{clock}": headline[n + clock] / headline["mstopk_static" + clock]
                       for n in names if n != "mstopk_static"})
    foreign = load.foreign_share()
    print(f"foreign CPU share during the run: {foreign:.0%} of the machine; load average {load_before:.1f} before, "
          f"{os.getloadavg()[0]:.1f} after ({os.cpu_count()} CPUs)")
    publish(rows, ratios, foreign, medians, args.json)


if __name__ == "__main__":
    main()
