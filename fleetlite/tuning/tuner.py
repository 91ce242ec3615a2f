"""`fleetrun --tune` / `fleetlite tune`: search, print the table, write the winner.

The launch flags are the job's own; each trial is that job, run for a few timed steps (trials),
with the knob values the search picks (search, over space). Everything a trial writes lives
under <log_dir>/tune/trial-<n>/.
"""
import statistics
import sys
import time
from pathlib import Path

from fleetlite import schema
from fleetlite.launcher.plan import check_spec
from fleetlite.launcher.preflight import run_preflight
from fleetlite.strategy import DistributedStrategy
from fleetlite.tuning import search, space, strategy_writer
from fleetlite.tuning.trials import check_tunable, run_trial


def job_shape(spec, fields):
    """The job as the space's rules see it; `fields`: the starting strategy, flattened."""
    devices = check_spec(spec)
    return space.JobShape(device="cpu" if devices[0] is None else "gpu",
                          world_size=len(devices) * len(spec.ips), node_count=len(spec.ips),
                          switched_on=frozenset(field for field, value in fields.items() if value is True))


def spelled(config):
    return ", ".join(f"{field}={value}" for field, value in config)


def describe(config, start):
    """What a config changes from the start (the start itself is spelled out)."""
    changed = [(field, value) for (field, value), (_, first) in zip(config, start) if value != first]
    return spelled(changed) if changed else f"start: {spelled(config)}"


def table(start, results, decision):
    """The measured table (one row per trial, in the order they ran) and the verdict."""
    reference = decision.start_ms if decision else None
    rows = [("#", "config", "step ms", "min-max", "sync ms", "vs start", "s", "note")]
    seen = set()
    for number, result in enumerate(results, 1):
        median = result.median_ms
        note = result.stopped or ("repeat" if result.config in seen else "")
        seen.add(result.config)
        rows.append((str(number), describe(result.config, start),
                     f"{median:.1f}" if median is not None else "-",
                     f"{min(result.step_ms):.1f}-{max(result.step_ms):.1f}" if result.step_ms else "-",
                     f"{result.sync_ms:.1f}" if result.sync_ms is not None else "-",
                     f"{reference / median:.2f}x" if reference and median else "-",
                     f"{result.seconds:.1f}", note))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in rows]


def verdict(decision, start):
    if decision.kept_start:
        return f"kept the starting strategy: {decision.reason}"
    return (f"winner: {describe(decision.winner, start)}, {decision.winner_ms:.1f} ms/step against "
            f"{decision.start_ms:.1f} ({decision.reason})")


def tune(spec, environ, stop, out=None):
    out = out or sys.stderr
    options = spec.tune
    check_tunable(spec)
    fields = schema.flatten(DistributedStrategy.load(options.strategy_file).validate().to_dict(False))
    strategy_writer.check_writable(options.strategy_file)
    checked = run_preflight(spec, environ)   # what each trial's preflight would refuse, refused now
    if checked.reservation:
        checked.reservation.release()
    knobs, skipped = space.searched_knobs(job_shape(spec, fields))

    def say(line):
        print(f"fleetrun --tune: {line}", file=out, flush=True)

    for field, why in skipped:
        say(f"not searching {field}: {why}")
    start = search.start_config(knobs, fields)
    say(f"searching {', '.join(k.field for k in knobs)} from {spelled(start)} "
        f"within {options.budget_s:g} s; trials in {Path(spec.log_dir) / 'tune'}")
    began, results = time.monotonic(), []
    while not stop.is_set():
        step = search.next_trial(knobs, start, results, options.budget_s, time.monotonic() - began)
        if step is None:
            break
        directory = Path(spec.log_dir) / "tune" / f"trial-{len(results) + 1}"
        result = run_trial(spec, environ, step.config, directory, step.allowance_s,
                           None if step.repeat else search.best_ms(results), stop)
        results.append(result)
        timing = f"{result.median_ms:.1f} ms/step" if result.step_ms else "no timed step"
        say(f"trial {len(results)}: {describe(result.config, start)}: {timing}"
            + (f" ({result.stopped})" if result.stopped else "") + f", {result.seconds:.1f} s")
        if len(results) == 1 and not result.complete:
            say(f"the starting strategy's trial did not complete ({result.stopped}): nothing to compare "
                f"against; see {directory}")
            return 1
    if stop.is_set():
        say(f"stopped by {stop.reason} after {len(results)} trials: {options.strategy_file} left unchanged")
        return 128 + stop.signum
    if not results:
        say("no trial fits in the budget: raise --budget")
        return 1
    decision = search.decide(start, results)
    noise = (f"spread between repeats (noise): {decision.noise:.1%}" if decision.repeated else
             f"no config ran twice within the budget: noise taken as the {decision.noise:.1%} floor")
    lines = table(start, results, decision) + [verdict(decision, start), noise]
    for line in lines:
        print(line, file=out)
    changed = tuple(pair for pair, first in zip(decision.winner, start) if pair != first)
    strategy_writer.write_winner(options.strategy_file, changed,
                                 [f"fleetlite tune, {time.strftime('%Y-%m-%d %H:%M')}, "
                                  f"{len(results)} trials in {time.monotonic() - began:.0f} s", *lines])
    say(f"wrote {options.strategy_file}")
    return 0
