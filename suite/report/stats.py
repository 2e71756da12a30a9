"""Summaries of repeated timings: median with min-max, stability flags, intervals on ratios.

Ratios (the baseline's time over a point's, machine A over machine B) get a Welch t-interval on
log times: the ratio of geometric means, exp(mean(log a) - mean(log b)), with Satterthwaite's
degrees of freedom. It assumes independent repetitions (the plan interleaves them) with
log-normal noise, each side with its own spread. It is the one method whose stated level holds
at the handful of repetitions a benchmark can afford: a percentile bootstrap of a ratio of
medians, tried first, covered the truth in 67% of trials at 2 runs per side and 90% at 3
(tests/test_stats.py simulates the level at the counts the suite uses).

Below ``MIN_RUNS_FOR_INTERVAL`` per side no interval is given and nothing is called significant:
at 2 per side no interval holds 95% whatever the two spreads are (Welch covers about 97.5% when
they are equal and 94% when one is ten times the other; a pooled t covers 95% and 88%).

Deterministic (no resampling): the same results give the same bytes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from suite.spec.settings import AUTO_FIRST, AUTO_MAX_REPEATS, AUTO_PRECISION

SPREAD_LIMIT = 0.10  # (max - min) / median above this: the point is flagged unstable
LEVEL = 0.95
MIN_RUNS_FOR_INTERVAL = 3
METHOD = (
    "ratio of geometric means with a Welch t-interval on log times (assumes independent, log-normal "
    f"repetitions; none below {MIN_RUNS_FOR_INTERVAL} runs per side; a side run under repeats: auto takes its "
    "variance from its first stage alone, the two-stage interval)"
)


@dataclass(frozen=True)
class Summary:
    n: int
    median: float
    low: float
    high: float

    @property
    def spread(self) -> float:
        return (self.high - self.low) / self.median if self.median else 0.0

    @property
    def unstable(self) -> bool:
        return self.n > 1 and self.spread > SPREAD_LIMIT


def summarize(values: list[float]) -> Summary | None:
    vals = [float(v) for v in values if v is not None]
    if not vals:
        return None
    return Summary(len(vals), float(np.median(vals)), min(vals), max(vals))


def first_is_outlier(values: list[float]) -> bool:
    """The first repetition (cold caches, first compile of the image) far from every other: outside
    the range of the rest by more than SPREAD_LIMIT of their median. Far from their middle is not
    enough: of 3.58, 2.37 and 3.44 s the odd one is the second."""
    if len(values) < 3:
        return False
    rest = values[1:]
    outside = max(min(rest) - values[0], values[0] - max(rest))
    return bool(outside > SPREAD_LIMIT * np.median(rest))


FASTER, SLOWER, AS_FAST = "faster", "slower", "as fast"


def direction(value: float) -> str:
    """The word for a ratio of times, numerator over denominator, said of the denominator's side:
    above 1 the denominator took less time ("faster"), below 1 more ("slower")."""
    return FASTER if value > 1.0 else SLOWER if value < 1.0 else AS_FAST


@dataclass(frozen=True)
class Ratio:
    """A ratio of times, geometric mean of the numerator's over the denominator's.

    Every ratio in the suite divides times this way round so that one wording serves them all:
    ``text`` speaks of the denominator's side against the numerator's ("the point is 2.70x faster
    than the baseline" for the baseline's time over the point's). The figure printed is always 1 or
    more and the word carries the direction: a value of 0.37 reads "2.70x slower", its interval
    inverted with it (1/high-1/low). ``inverse`` turns a ratio round to speak of the other side.
    """

    value: float  # geometric mean of the numerator over that of the denominator
    low: float | None  # Welch interval at ``level``; None below MIN_RUNS_FOR_INTERVAL on either side
    high: float | None
    runs: tuple[int, int] = (0, 0)  # repetitions on each side: numerator, denominator
    level: float = LEVEL

    @property
    def significant(self) -> bool | None:
        """True when the interval excludes 1; False when it holds 1; None without an interval."""
        if self.low is None or self.high is None:
            return None
        return not (self.low <= 1.0 <= self.high)

    @property
    def faster(self) -> bool:
        """Measurably above 1: the only case any sentence may call a gain, a win or a speedup."""
        return self.significant is True and self.value > 1.0

    @property
    def slower(self) -> bool:
        """Measurably below 1: the only case any sentence may call a loss or a slowdown."""
        return self.significant is True and self.value < 1.0

    @property
    def direction(self) -> str:
        """ "faster", "slower" or "as fast": the denominator's side against the numerator's."""
        return direction(self.value)

    @property
    def factor(self) -> float:
        """The ratio as printed, 1 or more: the value, or its inverse where the side is slower."""
        return 1.0 / self.value if self.value < 1.0 else self.value

    @property
    def factor_interval(self) -> tuple[float, float] | None:
        """The interval of ``factor``: the value's, inverted (1/high, 1/low) where the side is slower."""
        if self.low is None or self.high is None:
            return None
        return (1.0 / self.high, 1.0 / self.low) if self.value < 1.0 else (self.low, self.high)

    def inverse(self) -> Ratio:
        """The same comparison the other way round: denominator over numerator."""
        low, high = (
            (1.0 / self.high, 1.0 / self.low) if self.low is not None and self.high is not None else (None, None)
        )
        return Ratio(1.0 / self.value, low, high, (self.runs[1], self.runs[0]), self.level)

    def interval_text(self) -> str | None:
        """ "95% CI 2.41-3.02", of ``factor``; None without an interval."""
        bounds = self.factor_interval
        if bounds is None:
            return None
        return f"{self.level:.0%} CI {bound(bounds[0])}-{bound(bounds[1])}"

    def words(self, subject: str | None = None, than: str | None = None) -> str:
        """ "2.70x faster", or with names "the rerun is 2.70x faster than the original": the
        denominator's side is the subject, the numerator's the one it is compared with."""
        said = f"{self.factor:.2f}x {self.direction}"
        if than:
            said += f" as {than}" if self.direction == AS_FAST else f" than {than}"
        return f"{subject} is {said}" if subject else said

    def text(self, subject: str | None = None, than: str | None = None) -> str:
        """The ratio in words with its interval, the one wording every page and command prints:

        - "2.70x faster (95% CI 2.41-3.02)", "1.35x slower (95% CI 1.20-1.52)": the interval
          excludes 1, a measured difference;
        - "1.03x faster, not significant (95% CI 0.97-1.10)": the interval holds 1, so no
          difference is measured; the word is the estimate's direction only;
        - "1.20x faster (2 runs a side: no interval, 3 needed)": below MIN_RUNS_FOR_INTERVAL
          runs on a side nothing is measured either.
        """
        said = self.words(subject, than)
        interval = self.interval_text()
        if interval is None:
            few = min(self.runs)
            where = "a side" if self.runs[0] == self.runs[1] else "on one side"
            return f"{said} ({few} run{'s' if few != 1 else ''} {where}: no interval, {MIN_RUNS_FOR_INTERVAL} needed)"
        tail = "" if self.significant else ", not significant"
        return f"{said}{tail} ({interval})"


def bound(x: float) -> str:
    """Two decimals, or as many more as it takes for a bound that excludes 1 not to print as 1.00."""
    for digits in range(2, 7):
        text = f"{x:.{digits}f}"
        if x == 1.0 or float(text) != 1.0:
            return text
    return f"{x:.6f}"


def geometric_mean(values: list[float]) -> float:
    """The mean a ratio divides: exp(mean(log)). Equal to the median under log-normal noise. Kept
    within the values' range, which exp and log can leave by a rounding (1e18 three times made
    999999999999998592)."""
    arr = np.asarray(values, float)
    if arr.size == 0:
        return math.nan  # no value: no mean (a record whose fit_s is null)
    return float(np.clip(np.exp(np.mean(np.log(arr))), arr.min(), arr.max()))


def welch_log_interval(
    log_a: np.ndarray, log_b: np.ndarray, level: float = LEVEL
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Difference of mean log times and its Welch interval, vectorised over leading axes.

    ``log_a`` and ``log_b`` hold repetitions on their last axis. Returns (difference, low, high);
    exponentiate for the ratio. Where both sides have no spread at all the interval is the point.
    """
    diff = log_a.mean(-1) - log_b.mean(-1)
    half = welch_half_width(log_a.var(-1, ddof=1), log_a.shape[-1], log_b.var(-1, ddof=1), log_b.shape[-1], level)
    return diff, diff - half, diff + half


def welch_half_width(
    var_a: Any, n_a: Any, var_b: Any, n_b: Any, level: float = LEVEL, k_a: Any = None, k_b: Any = None
) -> Any:
    """Half-width of the Welch interval on a difference of two means, from each side's sample
    variance and count (numbers or arrays); 0 where neither side has any spread.

    ``k_a``, ``k_b``: how many runs each variance was taken from (default: the count), which sets
    its degrees of freedom: the two-stage rule takes it from a point's first stage alone."""
    va, vb = np.asarray(var_a, float) / n_a, np.asarray(var_b, float) / n_b
    ka, kb = n_a if k_a is None else k_a, n_b if k_b is None else k_b
    se2 = va + vb
    with np.errstate(divide="ignore", invalid="ignore"):
        dof = se2**2 / (va**2 / (ka - 1) + vb**2 / (kb - 1))
    dof = np.where(se2 > 0, dof, np.inf)
    # Student's t quantile from scipy.special, which scipy.stats.t.ppf calls (the same numbers): the
    # whole of scipy.stats takes three times as long to import, and only here would it be used.
    from scipy.special import stdtrit

    return stdtrit(dof, 0.5 + level / 2) * np.sqrt(se2)


def ratio(
    numerator: list[float],
    denominator: list[float],
    level: float = LEVEL,
    first: tuple[int | None, int | None] = (None, None),
) -> Ratio:
    """Ratio of geometric means, numerator over denominator, with its interval where it holds.

    ``first``: per side, for a point run by the two-stage rule (``repeats: auto``), the length of its
    first stage: its times in run order, the first that many give its variance, every one its mean.
    None: a fixed count, the variance over every run (Welch's interval)."""
    num = np.log(np.asarray(numerator, float))
    den = np.log(np.asarray(denominator, float))
    runs = (len(num), len(den))
    value = float(np.exp(num.mean() - den.mean()))  # geometric_mean(numerator) / geometric_mean(denominator)
    if min(runs) < MIN_RUNS_FOR_INTERVAL:
        return Ratio(value, None, None, runs, level)
    k_num, k_den = (len(x) if k is None else min(k, len(x)) for k, x in zip(first, (num, den), strict=True))
    diff = float(num.mean() - den.mean())
    half = float(
        welch_half_width(num[:k_num].var(ddof=1), len(num), den[:k_den].var(ddof=1), len(den), level, k_num, k_den)
    )
    return Ratio(value, float(np.exp(diff - half)), float(np.exp(diff + half)), runs, level)


# Repetitions that stop when the answer is known: a two-stage rule in the manner of Stein (Ann. Math.
# Statist. 16, 1945). Every point runs FIRST_STAGE times; the spread of those runs alone sets how many
# runs it takes in all; the interval then takes its means from every run and its variances from the
# first stage only. Because the count is a function of first-stage spreads alone, and under normal
# noise a sample's mean is independent of its variance, the count tells the interval nothing about
# the later runs: the level survives the stopping (benchmarks/auto_repeats.py measures it, and shows
# that an interval over every run, stopped on its own width, covers as little as 89%).
FIRST_STAGE, PRECISION, MAX_REPEATS = AUTO_FIRST, AUTO_PRECISION, AUTO_MAX_REPEATS


def two_stage_count(
    var: Any, precision: float = PRECISION, cap: int = MAX_REPEATS, first: int = FIRST_STAGE, level: float = LEVEL
) -> Any:
    """Runs a point takes in all, from its first-stage variance of log times: the fewest (at least
    ``first``, at most ``cap``) that keep its share of any comparison's interval within ``precision``.

    With every point held to var / n <= precision**2 / (2 t**2), t the quantile at the fewest degrees
    of freedom a comparison can have (``first`` - 1), any two points' interval is at most
    ``precision`` wide each way, whatever the other's spread: the count needs no list of comparisons.
    """
    from scipy.special import stdtrit

    t = stdtrit(first - 1, 0.5 + level / 2)
    need = np.ceil(2 * t**2 * np.asarray(var, float) / precision**2 - 1e-9)
    return np.clip(need, first, cap).astype(int)
