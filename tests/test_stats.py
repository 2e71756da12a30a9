"""Statistics: summaries, stability flags, and the bootstrap interval against known answers."""

from __future__ import annotations

import numpy as np
import pytest

from suite import stats


def test_summary_median_min_max_and_spread_flag() -> None:
    s = stats.summarize([10.0, 11.0, 12.5])
    assert (s.n, s.median, s.low, s.high) == (3, 11.0, 10.0, 12.5)
    assert s.spread == pytest.approx(2.5 / 11) and s.unstable
    assert not stats.summarize([10.0, 10.2, 10.4]).unstable
    assert not stats.summarize([10.0]).unstable, "one sample has no spread to judge"
    assert stats.summarize([]) is None


def test_first_repetition_outlier() -> None:
    assert stats.first_is_outlier([14.0, 10.0, 10.1, 9.9])
    assert not stats.first_is_outlier([10.05, 10.0, 10.1, 9.9])
    assert not stats.first_is_outlier([14.0, 10.0]), "needs a rest to compare with"


def test_ratio_without_interval_for_single_runs() -> None:
    r = stats.ratio([2.0], [1.0])
    assert r.value == 2.0 and r.low is None and r.significant is None
    assert "no interval" in r.text()


def test_bootstrap_interval_covers_the_true_ratio() -> None:
    # Two samples whose population medians differ by exactly 2x: over many draws the 95% interval
    # must contain 2 about 95% of the time (a known answer for a percentile bootstrap, within slack).
    rng = np.random.default_rng(7)
    hits = 0
    trials = 200
    for _ in range(trials):
        a = 2.0 * (1 + 0.05 * rng.standard_normal(15))
        b = 1.0 * (1 + 0.05 * rng.standard_normal(15))
        r = stats.ratio(list(a), list(b))
        hits += r.low <= 2.0 <= r.high
    assert 0.85 <= hits / trials <= 1.0


def test_interval_containing_one_is_not_significant() -> None:
    r = stats.ratio([1.00, 1.05, 0.97, 1.02], [1.01, 0.99, 1.04, 0.98])
    assert r.low < 1 < r.high and r.significant is False
    assert "not significant" in r.text()
    clear = stats.ratio([2.0, 2.1, 1.9, 2.05], [1.0, 1.02, 0.98, 1.01])
    assert clear.significant is True and "not significant" not in clear.text()


def test_bootstrap_is_deterministic() -> None:
    a, b = [1.0, 1.3, 0.9, 1.1], [0.5, 0.6, 0.55, 0.52]
    assert stats.ratio(a, b) == stats.ratio(a, b)
