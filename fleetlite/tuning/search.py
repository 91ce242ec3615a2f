"""The tuner's decisions, as pure functions of the timings recorded so far.

A config is a tuple of (field, value) pairs, one per searched knob, in the space's order. The
search is coordinate descent from the starting strategy: each untried value of each knob, with
every other knob at the best config measured so far, until no candidate is left or the budget
only fits the repeats. Then the best two configs run once more: the spread between the runs of
one config is the noise, and a config beats the start only by more than that noise.
"""
import statistics
from dataclasses import dataclass
from typing import Optional, Tuple

MIN_NOISE = 0.02          # never trust a gain below 2 %, however quiet the repeats were
EARLY_STOP_MARGIN = 0.25  # a trial this much slower than the best so far is stopped...
EARLY_STOP_STEPS = 3      # ...once it has timed this many steps
REPEATED = 2              # how many of the best configs run twice


@dataclass(frozen=True)
class TrialResult:
    config: Tuple[Tuple[str, object], ...]
    step_ms: Tuple[float, ...]        # per timed step, the slowest rank's time
    sync_ms: Optional[float]          # sync cost left in a step (None: not measured)
    seconds: float                    # wall time the trial took, start-up included
    stopped: Optional[str] = None     # why it was cut short (its timings are not trusted)

    @property
    def median_ms(self):
        return statistics.median(self.step_ms) if self.step_ms else None

    @property
    def complete(self):
        return self.stopped is None and bool(self.step_ms)


@dataclass(frozen=True)
class NextTrial:
    config: Tuple[Tuple[str, object], ...]
    allowance_s: float      # stop it when it runs longer
    repeat: bool


@dataclass(frozen=True)
class Decision:
    winner: Tuple[Tuple[str, object], ...]
    start_ms: float
    winner_ms: float
    gain: float             # start time / winner time - 1 (0.10: 10 % faster)
    noise: float            # the largest relative spread between repeats of one config
    kept_start: bool
    reason: str
    repeated: int = 0       # how many configs ran more than once (0: noise is the floor)


def start_config(knobs, values):
    """The config of the starting strategy; `values` maps field -> its value there."""
    return tuple((knob.field, values[knob.field]) for knob in knobs)


def with_value(config, field, value):
    return tuple((f, value if f == field else v) for f, v in config)


def _runs(results):
    runs = {}
    for result in results:
        if result.complete:
            runs.setdefault(result.config, []).append(result.median_ms)
    return runs


def _score(medians):
    return statistics.median(medians)


def ranking(results):
    """Configs with a complete run, fastest first (a config's score: the median of its runs)."""
    runs = _runs(results)
    return sorted(runs, key=lambda config: _score(runs[config]))


def _sweep_candidates(knobs, best):
    for knob in knobs:
        for value in knob.values:
            yield with_value(best, knob.field, value)


def next_trial(knobs, start, results, budget_s, spent_s):
    """The next trial to run, or None when the search is over.

    Budget: a trial is started only if the longest trial so far fits in what is left; during the
    sweep, room for the repeats is kept back."""
    left = budget_s - spent_s
    if not results:
        return NextTrial(start, left / 2, repeat=False) if left > 0 else None
    estimate = max(r.seconds for r in results)
    ranked = ranking(results)
    if not ranked:
        return None
    tried = {r.config for r in results}
    best = ranked[0]
    to_repeat = [c for c in ranked[:REPEATED] if len(_runs(results)[c]) < 2]
    reserve = estimate * len(to_repeat)
    if left - reserve >= estimate:
        for candidate in _sweep_candidates(knobs, best):
            if candidate not in tried:
                return NextTrial(candidate, left - reserve, repeat=False)
    if to_repeat and left >= estimate:
        return NextTrial(to_repeat[0], left, repeat=True)
    return None


def stop_early(step_ms, best_ms, margin=EARLY_STOP_MARGIN, min_steps=EARLY_STOP_STEPS):
    """Why a running trial should be stopped (its median is far behind the best), or None."""
    if best_ms is None or len(step_ms) < min_steps:
        return None
    median = statistics.median(step_ms)
    if median > best_ms * (1 + margin):
        return f"{median:.1f} ms/step after {len(step_ms)} steps, over {1 + margin:.2f}x the best ({best_ms:.1f})"
    return None


def best_ms(results):
    ranked = ranking(results)
    return _score(_runs(results)[ranked[0]]) if ranked else None


def decide(start, results, min_noise=MIN_NOISE):
    """The winner, or the start when no config beats it by more than the noise."""
    runs = _runs(results)
    if start not in runs:
        raise ValueError("the starting strategy has no complete trial: nothing to compare against")
    spreads = [(max(m) - min(m)) / _score(m) for m in runs.values() if len(m) > 1]
    noise = max([min_noise, *spreads])
    best = ranking(results)[0]
    start_ms, best_ms_ = _score(runs[start]), _score(runs[best])
    gain = start_ms / best_ms_ - 1
    if best == start:
        return Decision(start, start_ms, start_ms, 0.0, noise, True, "the starting strategy was the fastest",
                        len(spreads))
    if gain <= noise:
        return Decision(start, start_ms, best_ms_, gain, noise, True,
                        f"the best config is {gain:.1%} faster, within the noise ({noise:.1%}): "
                        f"the starting strategy is kept", len(spreads))
    return Decision(best, start_ms, best_ms_, gain, noise, False,
                    f"{gain:.1%} faster than the starting strategy (noise {noise:.1%})", len(spreads))
