"""`fleetlite plot TRACE -o OUT.png`: a `fleetrun --timeline` trace as a picture.

Left, per rank, a stacked bar of where a step's time goes on average: compute, each collective
kind (all_reduce, all_gather...), the top-k selection and exchange, the optimizer update, and
the host time before the step; right, each rank's step time, step by step. The first step is
left out, as in fleetrun's summary (it builds the executor's plan). Events nested in
another (a top-k exchange's all_gathers) count once, in the outer one. matplotlib is an optional
dependency (`pip install 'fleetlite[plot]'`), imported only here.
"""
import json

from fleetlite.errors import FleetliteError

ORDER = ("compute", "all_reduce", "all_gather", "reduce_scatter", "broadcast", "topk", "optimizer", "host")
COLORS = {"compute": "#4c72b0", "all_reduce": "#dd8452", "all_gather": "#c44e52", "reduce_scatter": "#8172b3",
          "broadcast": "#937860", "topk": "#55a868", "optimizer": "#da8bc3", "host": "#8c8c8c"}


def read_trace(path):
    try:
        with open(path) as source:
            trace = json.load(source)
        return [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise FleetliteError(f"{path} is no fleetrun --timeline trace ({error}): write one with "
                             f"fleetrun --timeline {path} train.py") from None


def breakdown(events):
    """({rank: {category: mean seconds per step}}, {rank: [step seconds]})."""
    totals, steps = {}, {}
    for rank in sorted({e["pid"] for e in events}):
        track = sorted((e for e in events if e["pid"] == rank), key=lambda e: (e["ts"], -e["dur"]))
        step_events = [e for e in track if e["cat"] == "step"]
        steps[rank] = [e["dur"] / 1e6 for e in step_events[1:]]
        warm_up_end = step_events[0]["ts"] + step_events[0]["dur"] if step_events else float("inf")
        sums, outer_end = {}, float("-inf")
        for event in track:
            if event["cat"] == "step" or event["ts"] < warm_up_end:
                continue
            if event["ts"] + event["dur"] <= outer_end:      # inside the event before it: counted there
                continue
            outer_end = event["ts"] + event["dur"]
            sums[event["cat"]] = sums.get(event["cat"], 0.0) + event["dur"] / 1e6
        count = max(len(steps[rank]), 1)
        totals[rank] = {category: seconds / count for category, seconds in sums.items()}
    return totals, steps


def plot(trace_path, out_path):
    try:
        import matplotlib
        matplotlib.use("Agg")
        from matplotlib import pyplot
    except ImportError:
        raise FleetliteError("fleetlite plot needs matplotlib: pip install 'fleetlite[plot]'") from None
    totals, steps = breakdown(read_trace(trace_path))
    if not steps:
        raise FleetliteError(f"{trace_path} holds no steps: was it written by fleetrun --timeline?")
    ranks = sorted(totals)
    figure, (bars, series) = pyplot.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [1, 2]})
    categories = [c for c in ORDER if any(c in totals[r] for r in ranks)]
    categories += sorted({c for r in ranks for c in totals[r]} - set(categories))
    bottom = [0.0] * len(ranks)
    for category in categories:
        heights = [totals[rank].get(category, 0.0) * 1000 for rank in ranks]
        bars.bar([f"rank {rank}" for rank in ranks], heights, bottom=bottom, label=category,
                 color=COLORS.get(category))
        bottom = [b + h for b, h in zip(bottom, heights)]
    bars.set_ylabel("ms per step (mean)")
    bars.set_title("where a step's time goes")
    bars.legend(fontsize="small")
    for rank in ranks:
        series.plot(range(1, len(steps[rank]) + 1), [s * 1000 for s in steps[rank]], marker=".", label=f"rank {rank}")
    series.set_xlabel("step")
    series.set_ylabel("step time (ms)")
    series.set_title("step time per rank")
    series.legend(fontsize="small")
    figure.tight_layout()
    figure.savefig(out_path, dpi=80)
    pyplot.close(figure)
    return out_path
