"""Summaries of repeated timings: median with min-max, stability flags, bootstrap intervals on ratios.

numpy only. Everything is deterministic (fixed seed), so a report regenerated from the same
results is the same bytes.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

SPREAD_LIMIT = 0.10  # (max - min) / median above this: the point is flagged unstable
BOOTSTRAP_SAMPLES = 4000
SEED = 20171107  # any fixed value; the date of the four-GPU question


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
    """The first repetition (cold caches, first compile of the image) far from the rest."""
    if len(values) < 3:
        return False
    rest = np.median(values[1:])
    return bool(abs(values[0] - rest) > SPREAD_LIMIT * rest and not min(values[1:]) <= values[0] <= max(values[1:]))


@dataclass(frozen=True)
class Ratio:
    value: float  # median(numerator) / median(denominator)
    low: float | None  # bootstrap percentile interval; None when either side has one sample
    high: float | None

    @property
    def significant(self) -> bool | None:
        """False when the interval contains 1 (no detectable difference); None without an interval."""
        if self.low is None or self.high is None:
            return None
        return not (self.low <= 1.0 <= self.high)

    def text(self, unit: str = "x") -> str:
        base = f"{self.value:.2f}{unit}"
        if self.low is None:
            return f"{base} (one run per side: no interval)"
        tail = "" if self.significant else ", not significant"
        return f"{base} (95% CI {self.low:.2f}-{self.high:.2f}{tail})"


def ratio(numerator: list[float], denominator: list[float], level: float = 0.95) -> Ratio:
    """Ratio of medians with a percentile bootstrap interval, each side resampled independently."""
    num, den = np.asarray(numerator, float), np.asarray(denominator, float)
    value = float(np.median(num) / np.median(den))
    if len(num) < 2 or len(den) < 2:
        return Ratio(value, None, None)
    rng = np.random.default_rng(SEED)
    num_b = np.median(rng.choice(num, (BOOTSTRAP_SAMPLES, len(num))), axis=1)
    den_b = np.median(rng.choice(den, (BOOTSTRAP_SAMPLES, len(den))), axis=1)
    alpha = (1 - level) / 2
    low, high = np.quantile(num_b / den_b, [alpha, 1 - alpha])
    return Ratio(value, float(low), float(high))
