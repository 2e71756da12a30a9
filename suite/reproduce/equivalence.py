"""The verdict on one point: the rerun/original ratio of fit times tested for equivalence (TOST)
within a tolerance, and how many reruns an inconclusive one would need."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from suite.report import stats

# "reproduced" is decided as equivalence conventionally is: two one-sided tests at 5% each (TOST),
# that is the 90% interval of the ratio inside 1 +- tolerance. Each one-sided test keeps its 5%
# error: a rerun whose true ratio lies on a bound of the band (or beyond) is called reproduced
# at most 5% of the time. Asking the 95% interval to fit would test at 2.5% a side and call a
# perfect reproduction inconclusive far more often (benchmarks/reproduce_power.py measures both).
EQUIVALENCE_LEVEL = 0.90
# The default tolerance, +-10%: a shift of more than that (another driver, a throttled machine, a
# changed default) is what a reader of a published number cares about. Measured with
# benchmarks/reproduce_power.py (2000 seeded pairs per case, log-normal noise, equal runs per
# side): a perfect reproduction is called reproduced 100% of the time at 2% noise per run and 5
# runs a side, 75% at 5% noise and 5 runs (99% at 10 runs; 31% at 3), 7% at 10% noise and 5 runs
# (41% at 10); a true shift onto the bound, 1.10, is called reproduced 1-5% of the time, and a true
# 20% shift never more than 0.2%, called "differs" 66% of the time at 5% noise and 5 runs. A wider
# default would confirm more noisy reruns by promising less; the inconclusive verdict says instead
# how many reruns (--repeats) would settle it, and reruns default to the original's count so a
# reproduction costs what the original did.
DEFAULT_TOLERANCE_PCT = 10.0
REPEATS_CAP = 50  # the most reruns an "inconclusive" verdict suggests; beyond, it says "more repetitions"


REPRODUCED, DIFFERS, INCONCLUSIVE, NOT_REPRODUCED = "reproduced", "differs", "inconclusive", "not reproduced"
RERUN, ORIGINAL = "the rerun", "the original"


@dataclass(frozen=True)
class Verdict:
    kind: str  # REPRODUCED, DIFFERS, INCONCLUSIVE, NOT_REPRODUCED
    text: str
    ratio: stats.Ratio | None = None  # with its 95% interval, the one "differs" is decided on
    repeats_needed: int | None = None
    equivalence: stats.Ratio | None = None  # the same ratio with its 90% interval, the one "reproduced" is decided on


def verdict(
    original: list[float],
    rerun: list[float],
    tolerance: float,
    failures: list[str] | None = None,
    below_gate: list[str] | None = None,
    runs: int | None = None,
    original_first: int | None = None,
) -> Verdict:
    """The verdict on one point from its original and rerun fit times (seconds).

    tolerance: a fraction (0.10 for +-10%). failures: one line per rerun that did not end ok;
    below_gate: one line per ok rerun below the accuracy gate every original run reached (its fit
    time is in ``rerun``); any of either makes the point not reproduced, whatever the other reruns
    measured. runs: how many reruns there were (default: the fit times given plus the failures).
    original_first: the original's first stage where it ran under ``repeats: auto`` (its variance
    is that stage's: ``stats.ratio``'s ``first``); the reruns are a fixed count.

    "reproduced" is two one-sided tests at 5% each (TOST): the 90% interval lies inside
    1 +- tolerance. "differs" needs the 95% interval wholly outside it. See EQUIVALENCE_LEVEL.
    """
    failures, below_gate = list(failures or []), list(below_gate or [])
    if failures or below_gate:
        return _failed_reruns(original, rerun, failures, below_gate, runs, original_first)
    if not rerun:
        return Verdict(NOT_REPRODUCED, "not reproduced: no rerun recorded a fit time")
    r = stats.ratio(rerun, original, first=(None, original_first))
    eq = stats.ratio(rerun, original, EQUIVALENCE_LEVEL, first=(None, original_first))
    pct = tolerance_text(tolerance)
    if r.low is None or r.high is None or eq.low is None or eq.high is None:
        if len(original) < stats.MIN_RUNS_FOR_INTERVAL:
            return Verdict(
                INCONCLUSIVE,
                f"inconclusive: the original has {len(original)} run(s), and an interval needs "
                f"{stats.MIN_RUNS_FOR_INTERVAL} on each side; more reruns cannot make up for it: {said(r)}",
                r,
                equivalence=eq,
            )
        needed = repeats_needed(original, rerun, tolerance, original_first)
        how = (
            f"rerun with --repeats {needed}"
            if needed
            else f"rerun with --repeats {stats.MIN_RUNS_FOR_INTERVAL} or more"
        )
        return Verdict(INCONCLUSIVE, f"inconclusive: {said(r)}; {how}", r, needed, eq)
    low, high = 1.0 - tolerance, 1.0 + tolerance
    kind = decision(r.low, r.high, eq.low, eq.high, tolerance)
    if kind == REPRODUCED:
        # X: the largest distance from 1 of rerun/original's 90% interval, the time's shift at most.
        within = math.ceil(round(max(abs(eq.low - 1.0), abs(eq.high - 1.0)) * 100, 9))
        return Verdict(REPRODUCED, f"reproduced within {within}%: {said(eq)}", r, equivalence=eq)
    if kind == DIFFERS:
        return Verdict(DIFFERS, f"differs: {said(r)}, the whole interval outside +-{pct}", r, None, eq)
    # Undecided. Shown is the interval that would decide it: the 90% one where the ratio lies
    # inside the band (it could yet be called reproduced), the 95% one where it lies outside.
    inside = low <= r.value <= high
    shown = eq if inside else r
    shown_width = eq.high - eq.low if inside else r.high - r.low
    width = "is wider than" if shown_width > high - low else "straddles"
    needed = repeats_needed(original, rerun, tolerance, original_first)
    if needed is not None:
        how = f"rerun with --repeats {needed} (an estimate from the spread observed)"
    elif _original_limits(original, rerun, tolerance, original_first):
        how = (
            f"the original's {len(original)} runs alone leave the interval too wide: more repetitions of the "
            "original are needed, not only of the rerun"
        )
    else:
        how = "rerun with more repetitions (the observed ratio sits too close to a bound to say how many)"
    return Verdict(INCONCLUSIVE, f"inconclusive: {said(shown)}: the interval {width} +-{pct}; {how}", r, needed, eq)


def _failed_reruns(
    original: list[float],
    rerun: list[float],
    failures: list[str],
    below_gate: list[str],
    runs: int | None,
    original_first: int | None,
) -> Verdict:
    """Not reproduced: some reruns did not run ok or fell below the gate (``verdict``'s arguments)."""
    n = runs if runs is not None else len(rerun) + len(failures)
    # Of the reruns that ran, for the table.
    shown = stats.ratio(rerun, original, first=(None, original_first)) if rerun else None
    if failures and below_gate:
        what = (
            f"{len(failures) + len(below_gate)} of {n} reruns failed or fell below the accuracy gate "
            f"({len(failures)} did not run ok, {len(below_gate)} below the gate)"
        )
    elif failures:
        what = f"{len(failures)} of {n} reruns did not run ok"
    else:
        what = f"{len(below_gate)} of {n} reruns fell below the accuracy gate"
    return Verdict(NOT_REPRODUCED, f"not reproduced: {what} ({(failures + below_gate)[0]})", shown)


def said(r: stats.Ratio) -> str:
    """rerun/original in the one wording of ratios, of the rerun against the original:
    "the rerun is 1.10x slower than the original (95% CI 1.05-1.16)"."""
    return r.inverse().text(RERUN, ORIGINAL)


def decision(low95: float, high95: float, low90: float, high90: float, tolerance: float) -> str:
    """The rule on a ratio's intervals, apart from any wording: REPRODUCED when the 90% interval
    lies inside [1 - tolerance, 1 + tolerance] (two one-sided tests at 5%), DIFFERS when the 95%
    interval lies wholly outside it (its low bound above 1 + tolerance, or its high bound below
    1 - tolerance), else INCONCLUSIVE."""
    low, high = 1.0 - tolerance, 1.0 + tolerance
    if low <= low90 and high90 <= high:
        return REPRODUCED
    if low95 > high or high95 < low:
        return DIFFERS
    return INCONCLUSIVE


def tolerance_text(tolerance: float) -> str:
    return f"{tolerance * 100:g}%"


def _log_parts(
    original: list[float], rerun: list[float], first: int | None = None
) -> tuple[float, float, float, int, int] | None:
    """(difference of mean log times, original's and rerun's variance of log times, original n, the
    original runs its variance is from: ``first`` of them for ``repeats: auto``, else all); the rerun's
    variance is the original's where it has a single run. None below 2 original runs."""
    lo, lr = np.log(np.asarray(original, float)), np.log(np.asarray(rerun, float))
    if len(lo) < 2:
        return None
    k = len(lo) if first is None else min(first, len(lo))
    var_o = float(lo[:k].var(ddof=1))
    var_r = float(lr.var(ddof=1)) if len(lr) >= 2 else var_o
    return float(lr.mean() - lo.mean()), var_o, var_r, len(lo), k


def _half_width(
    var_o: float, n: int, var_r: float, m: float, level: float = stats.LEVEL, k: int | None = None
) -> float:
    """The Welch interval's half-width at ``level`` on log times for n original and m rerun runs
    (the original's variance from ``k`` of them, default n)."""
    return float(stats.welch_half_width(var_o, n, var_r, m, level, k))


def _distance(diff: float, tolerance: float) -> tuple[float, float]:
    """How far the observed log ratio is from the nearest bound of the tolerance band, and the
    level of the interval that must clear it: inside the band the 90% one (to be called
    reproduced), outside the 95% one (to be called different)."""
    lo, hi = math.log(1 - tolerance), math.log(1 + tolerance)
    if lo <= diff <= hi:
        return min(diff - lo, hi - diff), EQUIVALENCE_LEVEL
    return (diff - hi if diff > hi else lo - diff), stats.LEVEL


def repeats_needed(
    original: list[float], rerun: list[float], tolerance: float, original_first: int | None = None
) -> int | None:
    """The fewest reruns (at most REPEATS_CAP) whose deciding interval (90% where the ratio lies
    inside the band, 95% outside) would no longer cross a bound of the tolerance band, if the ratio
    and both spreads stayed as observed; None when no number would (the ratio sits on a bound, or
    the original's own runs leave the interval too wide) or the original has too few runs to
    estimate from."""
    parts = _log_parts(original, rerun, original_first)
    if parts is None or len(original) < stats.MIN_RUNS_FOR_INTERVAL:
        return None
    diff, var_o, var_r, n, k = parts
    d, level = _distance(diff, tolerance)
    if d <= 0:
        return None
    for m in range(stats.MIN_RUNS_FOR_INTERVAL, REPEATS_CAP + 1):
        if _half_width(var_o, n, var_r, m, level, k) < d:
            return m
    return None


def _original_limits(
    original: list[float], rerun: list[float], tolerance: float, original_first: int | None = None
) -> bool:
    """Whether even endless reruns would leave the interval crossing a bound: the original's spread decides."""
    parts = _log_parts(original, rerun, original_first)
    if parts is None:
        return True
    diff, var_o, var_r, n, k = parts
    d, level = _distance(diff, tolerance)
    return d > 0 and _half_width(var_o, n, var_r, 1e9, level, k) >= d
