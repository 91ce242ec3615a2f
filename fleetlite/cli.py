"""The `fleetlite` command: inspect and convert strategy files (and explain compiles).

Bad input ends with one line naming the cause and the fix, and exit status 2; never a traceback.
"""
import argparse
import sys

from fleetlite.strategy import files as strategy_files
from fleetlite.errors import FleetliteError
from fleetlite.strategy.distributed_strategy import DistributedStrategy
from fleetlite.topology.topology import Topology

def validate(args):
    """Each file: one error line (exit 2 if any), or ok and the knobs compile will skip."""
    failed = False
    for path in args.files:
        try:
            strategy = DistributedStrategy.load(path, allow_empty=args.allow_empty)
            try:
                strategy.validate()
                from fleetlite.compile.compiler import check_knobs  # imports Paddle: only once the file is good
                _, _, skipped = check_knobs(strategy)
            except FleetliteError as exc:
                raise strategy_files.in_file(path, exc) from None
        except FleetliteError as exc:
            print(f"fleetlite: error: {exc}", file=sys.stderr)
            failed = True
            continue
        print(f"{path}: ok" + (f"; compile will skip {len(skipped)} knob(s) no pass acts on:" if skipped else ""))
        for knob, reason in skipped:
            print(f"  {knob}: {reason}")
    return 2 if failed else 0


def show(args):
    strategy = DistributedStrategy.load(args.file).validate()
    print(f"{args.file}:")
    print(strategy)


def diff(args):
    left, right = DistributedStrategy.load(args.left), DistributedStrategy.load(args.right)
    differences = left.diff(right)
    if not differences:
        print("no differences")
        return 0
    width = max(len(field) for field, _, _ in differences)
    print(f"{'field'.ljust(width)}  {args.left}  ->  {args.right}")
    for field, a, b in differences:
        print(f"{field.ljust(width)}  {a!r}  ->  {b!r}")
    return 1


def convert(args):
    strategy = DistributedStrategy.load(args.source).validate()
    strategy.save(args.destination)
    print(f"wrote {args.destination}")


def explain(args):
    strategy = DistributedStrategy.load(args.strategy) if args.strategy else DistributedStrategy()
    topology = Topology.grid(args.world, args.nodes, rank=args.rank, device=args.device)
    from fleetlite.paddle_compat import quiet_warnings as paddle_noise
    with paddle_noise.importing_paddle():     # Paddle is imported only once the input is good
        from fleetlite.runtime.explain_strategy import explain as compile_report
        from fleetlite.compile import mixed_precision
    with mixed_precision.explaining():
        report = compile_report(strategy, topology, args.model)
    print(report.to_json() if args.json else report.table())


def plot(args):
    from fleetlite.launcher.timeline_plot import plot as draw
    print(f"wrote {draw(args.trace, args.output)}")


def build_parser():
    parser = argparse.ArgumentParser(prog="fleetlite", description=__doc__.splitlines()[0])
    top = parser.add_subparsers(dest="group", required=True)
    group = top.add_parser("strategy", help="validate, show, diff or convert strategy files")
    sub = group.add_subparsers(dest="command", required=True)
    v = sub.add_parser("validate", help="check files against the schema and the compile-time rules")
    v.add_argument("files", nargs="+")
    v.add_argument("--allow-empty", action="store_true",
                   help="accept a file that sets no field (a strategy at all defaults)")
    v.set_defaults(handler=validate)
    s = sub.add_parser("show", help="print the fields that differ from the defaults")
    s.add_argument("file")
    s.set_defaults(handler=show)
    d = sub.add_parser("diff", help="list the fields that differ (exit 1 if any)")
    d.add_argument("left")
    d.add_argument("right")
    d.set_defaults(handler=diff)
    c = sub.add_parser("convert", help="prototxt <-> YAML, by the file suffixes")
    c.add_argument("source")
    c.add_argument("destination")
    c.set_defaults(handler=convert)
    e = top.add_parser("explain", help="print what compiling a strategy does, for any topology, without training")
    e.add_argument("--strategy", help="a .yaml or .prototxt strategy file (default: every field at its default)")
    e.add_argument("--world", type=int, default=1, help="number of ranks")
    e.add_argument("--nodes", type=int, default=1, help="number of nodes (ranks spread evenly)")
    e.add_argument("--rank", type=int, default=0, help="the rank whose program is shown")
    e.add_argument("--device", choices=("cpu", "gpu"), default="cpu")
    e.add_argument("--model", choices=("mlp", "resnet50"), default="mlp")
    e.add_argument("--json", action="store_true", help="print the report as JSON")
    e.set_defaults(handler=explain)
    p = top.add_parser("plot", help="draw a fleetrun --timeline trace: per-rank time breakdown and step times (PNG)")
    p.add_argument("trace", help="the trace fleetrun --timeline wrote")
    p.add_argument("-o", "--output", required=True, help="the picture to write (.png)")
    p.set_defaults(handler=plot)
    top.add_parser("run", add_help=False, help="the launcher, with fleetrun's flags: "
                   "fleetlite run --nproc_per_node 2 train.py (a name PaddlePaddle does not install)")
    top.add_parser("tune", add_help=False, help="fleetrun --tune: time short trials of the job and write the "
                   "fastest communication knobs into --strategy_file (docs/tuning.md)")
    return parser


def main(argv=None):
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv[:1] in (["run"], ["tune"]):   # everything after `run` is fleetrun's, --help included
        from fleetlite import tuning
        from fleetlite.launcher.main import main as fleetrun
        if argv[0] == "run":
            return fleetrun(argv[1:], prog="fleetlite run", tune=tuning.tune)
        return fleetrun(["--tune", *argv[1:]], prog="fleetlite tune", tune=tuning.tune)
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args) or 0
    except FleetliteError as exc:
        print(f"fleetlite: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
