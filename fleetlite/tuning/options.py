"""The tuning flags fleetrun accepts next to its launch flags (`fleetrun --tune ...`)."""
import math
from dataclasses import dataclass

from fleetlite.errors import LaunchError

DEFAULT_BUDGET_S = 120.0
DEFAULT_STEPS = 20
DEFAULT_WARMUP = 3


@dataclass(frozen=True)
class TuneOptions:
    strategy_file: str      # where the search starts, and where the winner is written
    budget_s: float = DEFAULT_BUDGET_S
    steps: int = DEFAULT_STEPS
    warmup: int = DEFAULT_WARMUP


def add_tune_options(parser):
    group = parser.add_argument_group(
        "autotune", "with --tune, fleetrun runs short timed trials of the job over the communication "
                    "knobs instead of training, and writes the fastest into --strategy_file (docs/tuning.md)")
    group.add_argument("--tune", action="store_true", help="tune instead of training")
    group.add_argument("--strategy_file", metavar="FILE",
                       help="the .yaml or .prototxt strategy to start from and write the winner into")
    group.add_argument("--budget", type=float, metavar="SECONDS",
                       help=f"wall time for the whole search, every trial included (default {DEFAULT_BUDGET_S:g})")
    group.add_argument("--tune_steps", type=int, metavar="N",
                       help=f"training steps timed per trial (default {DEFAULT_STEPS})")
    group.add_argument("--tune_warmup", type=int, metavar="N",
                       help=f"steps run before timing starts (default {DEFAULT_WARMUP})")


def tune_options(args):
    """TuneOptions from parsed flags, or None without --tune; LaunchError on bad values."""
    given = {name: getattr(args, name) for name in ("strategy_file", "budget", "tune_steps", "tune_warmup")
             if getattr(args, name) is not None}
    if not args.tune:
        if given:
            raise LaunchError(f"--{next(iter(given))} only applies with --tune")
        return None
    if args.explain:
        raise LaunchError("--tune and --explain cannot be used together: --explain prints the compile "
                          "report and trains nothing, --tune times trials; run one, then the other")
    if "strategy_file" not in given:
        raise LaunchError("--tune needs --strategy_file FILE: the strategy file to start from and "
                          "write the winner into")
    options = TuneOptions(args.strategy_file, given.get("budget", DEFAULT_BUDGET_S),
                          given.get("tune_steps", DEFAULT_STEPS), given.get("tune_warmup", DEFAULT_WARMUP))
    if not (math.isfinite(options.budget_s) and options.budget_s > 0):
        raise LaunchError(f"--budget {options.budget_s:g} is out of range: the search needs a finite, "
                          f"positive number of seconds (e.g. --budget {DEFAULT_BUDGET_S:g})")
    if options.steps < 1 or options.warmup < 0:
        raise LaunchError(f"--tune_steps {options.steps} / --tune_warmup {options.warmup}: time at least "
                          f"one step, after zero or more warm-up steps")
    return options
