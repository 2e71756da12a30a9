"""Statistics: summaries, stability flags, and ratio intervals against a simulation and scipy."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats as scipy_stats

from suite.report import stats


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
    # Far from the middle of the rest, yet close to one of them: the odd one out is another run.
    assert not stats.first_is_outlier([3.58, 2.37, 3.44]) and not stats.first_is_outlier([0.715, 0.772, 0.926])
    assert stats.first_is_outlier([5.0, 3.0, 3.1, 3.05]) and stats.first_is_outlier([2.0, 3.0, 3.1, 3.05])


def test_ratio_without_interval_below_three_runs_per_side() -> None:
    for n in (1, 2):
        r = stats.ratio([2.0, 2.1][:n], [1.0, 1.01, 0.99])
        assert r.low is None and r.significant is None and not r.faster
        assert "no interval, 3 needed" in r.text() and "CI" not in r.text()


def _coverage(n: int, sigma_a: float, sigma_b: float, trials: int, rng: np.random.Generator) -> float:
    """Share of null trials (no true difference) whose interval holds 1, through the suite's own code."""
    log_a = rng.normal(0.0, sigma_a, (trials, n)) + np.log(3.0)  # any common scale: a ratio ignores it
    log_b = rng.normal(0.0, sigma_b, (trials, n)) + np.log(3.0)
    _, low, high = stats.welch_log_interval(log_a, log_b)
    return float(np.mean((low <= 0) & (0 <= high)))


@pytest.mark.parametrize("n", [3, 5, 10])
def test_interval_delivers_its_level_at_the_repetitions_used(n: int) -> None:
    # The null: equal log-normal noise on both sides, so the true ratio is 1. A 95% claim must hold
    # 1 in 93-97% of trials at every noise level; with unequal noise (one side 10x noisier) too.
    rng = np.random.default_rng(20171107 + n)
    for sigma_a, sigma_b in [(0.02, 0.02), (0.05, 0.05), (0.1, 0.1), (0.2, 0.2), (0.02, 0.2), (0.2, 0.05)]:
        cover = _coverage(n, sigma_a, sigma_b, 6000, rng)
        assert 0.93 <= cover <= 0.97, (n, sigma_a, sigma_b, cover)
    assert stats.LEVEL == 0.95 and "95% CI" in stats.ratio([1.0, 1.1, 1.2], [2.0, 2.1, 2.2]).text()


def test_the_suites_ratio_uses_that_interval() -> None:
    rng = np.random.default_rng(3)
    a, b = np.exp(rng.normal(0.3, 0.1, 5)), np.exp(rng.normal(0.0, 0.05, 4))
    r = stats.ratio(list(a), list(b))
    d, low, high = stats.welch_log_interval(np.log(a), np.log(b))
    assert (r.value, r.low, r.high) == pytest.approx((np.exp(d), np.exp(low), np.exp(high)))


def test_interval_matches_scipys_welch_test() -> None:
    # The reference: scipy's Welch t-test (ttest_ind, equal_var=False) and its confidence interval.
    rng = np.random.default_rng(11)
    for n_a, n_b in [(3, 3), (3, 5), (5, 5), (10, 4)]:
        log_a, log_b = rng.normal(0.1, 0.07, n_a), rng.normal(0.0, 0.03, n_b)
        ci = scipy_stats.ttest_ind(log_a, log_b, equal_var=False).confidence_interval(0.95)
        d, low, high = stats.welch_log_interval(log_a, log_b)
        assert (low, high) == pytest.approx((ci.low, ci.high), rel=1e-9)
        assert d == pytest.approx(log_a.mean() - log_b.mean())


def test_interval_containing_one_is_not_significant() -> None:
    r = stats.ratio([1.00, 1.05, 0.97, 1.02], [1.01, 0.99, 1.04, 0.98])
    assert r.low < 1 < r.high and r.significant is False and not r.faster and not r.slower
    assert "not significant" in r.text()
    clear = stats.ratio([2.0, 2.1, 1.9, 2.05], [1.0, 1.02, 0.98, 1.01])
    assert clear.significant is True and clear.faster and "not significant" not in clear.text()
    slower = stats.ratio([1.0, 1.02, 0.98], [2.0, 2.1, 1.9])
    assert slower.significant is True and not slower.faster and slower.slower
    assert slower.text().startswith("2.00x slower (95% CI") and clear.text().startswith("2.01x faster (95% CI")


def test_no_spread_at_all_gives_a_point_interval() -> None:
    r = stats.ratio([2.0, 2.0, 2.0], [1.0, 1.0, 1.0])
    assert (r.value, r.low, r.high) == pytest.approx((2.0, 2.0, 2.0)) and r.faster


def test_a_bound_that_excludes_one_never_prints_as_one() -> None:
    r = stats.Ratio(1.2, 1.0004, 1.44, (3, 3))
    assert r.significant and r.text() == "1.20x faster (95% CI 1.0004-1.44)"
    slower = stats.Ratio(1 / 1.2, 1 / 1.44, 1 / 1.0004, (3, 3))
    assert slower.significant and slower.text() == "1.20x slower (95% CI 1.0004-1.44)"
    assert stats.Ratio(1.0, 0.9, 1.0, (3, 3)).text() == "1.00x as fast, not significant (95% CI 0.90-1.00)"


# -- one wording for every ratio: the figure is 1 or more, the word carries the direction ---------


def test_a_measured_ratio_says_faster_or_slower_with_its_interval_mapped() -> None:
    # The baseline's times over the point's: 2.7 times the point's, so the point is 2.70x faster.
    faster = stats.Ratio(2.7, 2.41, 3.02, (5, 5))
    assert faster.text() == "2.70x faster (95% CI 2.41-3.02)"
    assert (faster.direction, faster.factor, faster.factor_interval) == ("faster", 2.7, (2.41, 3.02))
    # 1/1.35 of the other's time: 1.35x slower, the interval inverted (1/high-1/low).
    slower = stats.Ratio(1 / 1.35, 1 / 1.52, 1 / 1.20, (5, 5))
    assert slower.text() == "1.35x slower (95% CI 1.20-1.52)"
    assert slower.direction == "slower" and slower.factor == pytest.approx(1.35) and slower.slower
    assert slower.factor_interval == pytest.approx((1.20, 1.52))


def test_the_words_name_what_is_compared_with_what() -> None:
    # The rerun's time over the original's is 1.10: the original is faster, the rerun slower.
    r = stats.Ratio(1.10, 1.05, 1.16, (5, 5))
    assert r.text("the original", "the rerun") == "the original is 1.10x faster than the rerun (95% CI 1.05-1.16)"
    assert r.inverse().text("the rerun", "the original") == (
        "the rerun is 1.10x slower than the original (95% CI 1.05-1.16)"
    )
    back = r.inverse().inverse()
    assert back.runs == r.runs and (back.value, back.low, back.high) == pytest.approx((r.value, r.low, r.high))
    assert stats.Ratio(1.0, None, None, (2, 2)).words("B", "A") == "B is 1.00x as fast as A"


def test_a_ratio_whose_interval_holds_one_is_said_not_significant_in_the_estimates_direction() -> None:
    r = stats.Ratio(1.03, 0.97, 1.10, (3, 3))
    assert r.text() == "1.03x faster, not significant (95% CI 0.97-1.10)" and not r.faster
    s = stats.Ratio(1 / 1.03, 1 / 1.10, 1 / 0.97, (3, 3))
    assert s.text() == "1.03x slower, not significant (95% CI 0.97-1.10)" and not s.slower


def test_below_three_runs_the_words_say_there_is_no_interval() -> None:
    assert stats.Ratio(1.2, None, None, (2, 2)).text() == "1.20x faster (2 runs a side: no interval, 3 needed)"
    assert stats.Ratio(1 / 1.2, None, None, (5, 1)).text() == "1.20x slower (1 run on one side: no interval, 3 needed)"


def test_every_ratio_printed_is_one_or_more_and_agrees_with_the_geometric_means() -> None:
    rng = np.random.default_rng(5)
    for _ in range(200):
        a = list(np.exp(rng.normal(rng.normal(0, 0.5), 0.05, int(rng.integers(1, 6)))))
        b = list(np.exp(rng.normal(rng.normal(0, 0.5), 0.05, int(rng.integers(1, 6)))))
        r = stats.ratio(a, b)
        ga, gb = stats.geometric_mean(a), stats.geometric_mean(b)
        words = r.text("b", "a")
        factor = float(words.split("x ", 1)[0].removeprefix("b is "))
        assert factor >= 1.0 and factor == pytest.approx(max(ga, gb) / min(ga, gb), abs=0.006), words
        assert f" {'faster' if gb < ga else 'slower'} than a" in words, words
        assert ("not significant" in words) == (r.significant is False), words
        if r.significant is not None:
            low, high = (float(x) for x in words.split("CI ")[1].rstrip(")").split("-"))
            assert low <= factor <= high or abs(factor - low) < 0.006 or abs(factor - high) < 0.006, words


def _two_stage_plan(sigma_a: float, sigma_b: float, trials: int, rng: np.random.Generator) -> tuple:
    """Null trials (true ratio 1) run by the two-stage rule: each side's count from the variance of
    its first stage, the cap's worth of runs drawn and the first ``count`` taken."""
    cap = stats.MAX_REPEATS
    log_a = rng.normal(0.0, sigma_a, (trials, cap))
    log_b = rng.normal(0.0, sigma_b, (trials, cap))
    first = stats.FIRST_STAGE
    n_a = stats.two_stage_count(log_a[:, :first].var(-1, ddof=1))
    n_b = stats.two_stage_count(log_b[:, :first].var(-1, ddof=1))
    return log_a, n_a, log_b, n_b


@pytest.mark.parametrize(
    ("sigma_a", "sigma_b"), [(0.01, 0.01), (0.02, 0.02), (0.05, 0.05), (0.1, 0.1), (0.01, 0.05), (0.05, 0.005)]
)
def test_the_two_stage_interval_keeps_its_level_under_the_stopping(sigma_a: float, sigma_b: float) -> None:
    # The ratio each trial's report would print, through the suite's own stats.ratio, must hold
    # the truth in 93-97% of trials; the counts vary with each trial's first-stage spread.
    rng = np.random.default_rng(20261205)
    log_a, n_a, log_b, n_b = _two_stage_plan(sigma_a, sigma_b, 3000, rng)
    first = stats.FIRST_STAGE
    held = [
        stats.ratio(list(np.exp(a[:na])), list(np.exp(b[:nb])), first=(first, first)).significant is False
        for a, na, b, nb in zip(log_a, n_a, log_b, n_b, strict=True)
    ]
    assert 0.93 <= np.mean(held) <= 0.97, np.mean(held)


def test_the_interval_over_every_run_would_not_survive_the_same_stopping() -> None:
    # What the two-stage interval is for: with the same counts, Welch's interval over every run
    # stops on its own luck (a small first-stage spread ends the point early) and covers too little.
    rng = np.random.default_rng(20261205)
    log_a, n_a, log_b, n_b = _two_stage_plan(0.02, 0.02, 3000, rng)
    held = [
        stats.ratio(list(np.exp(a[:na])), list(np.exp(b[:nb]))).significant is False
        for a, na, b, nb in zip(log_a, n_a, log_b, n_b, strict=True)
    ]
    assert np.mean(held) < 0.93


def test_two_stage_counts_are_the_fewest_that_meet_the_precision_for_any_pair() -> None:
    rng = np.random.default_rng(7)
    first, cap = stats.FIRST_STAGE, stats.MAX_REPEATS
    assert stats.two_stage_count(0.0) == first and stats.two_stage_count(1.0) == cap
    quiet = stats.two_stage_count(rng.normal(0, 0.01, (4000, first)).var(-1, ddof=1))
    assert quiet.mean() < 5, "at 1% noise the rule takes fewer runs than a fixed 5"
    # Any two points the rule did not cap: their interval is within the precision, whatever the two
    # spreads; one more run less would not be (the count is the fewest).
    var = np.exp(rng.uniform(np.log(1e-6), np.log(2e-3), (20000, 2)))
    n = stats.two_stage_count(var)
    free = (n < cap).all(1)
    half = stats.welch_half_width(var[:, 0], n[:, 0], var[:, 1], n[:, 1], stats.LEVEL, first, first)
    assert free.sum() > 1000 and (half[free] <= stats.PRECISION + 1e-12).all()
    # The fewest runs that keep each point's own share var / n within precision**2 / (2 t**2):
    t = scipy_stats.t.ppf(0.5 + stats.LEVEL / 2, first - 1)
    share = var / n
    assert (share[n > first] * n[n > first] / (n[n > first] - 1) > stats.PRECISION**2 / (2 * t**2)).all()
    assert (share[n < cap] <= stats.PRECISION**2 / (2 * t**2) + 1e-15).all()


def test_a_two_stage_ratio_takes_means_from_every_run_and_variances_from_the_first_stage() -> None:
    first = stats.FIRST_STAGE
    a = [2.0, 2.1, 1.9, 2.05, 3.0, 1.0]  # the later runs move the mean, not the interval's spread
    b = [1.0, 1.01, 0.99, 1.0, 1.0]
    r = stats.ratio(a, b, first=(first, first))
    la, lb = np.log(a), np.log(b)
    d = la.mean() - lb.mean()
    va, vb = la[:first].var(ddof=1) / len(a), lb[:first].var(ddof=1) / len(b)
    dof = (va + vb) ** 2 / (va**2 / (first - 1) + vb**2 / (first - 1))
    half = scipy_stats.t.ppf(0.975, dof) * np.sqrt(va + vb)
    assert r.value == pytest.approx(np.exp(d))
    assert (r.low, r.high) == pytest.approx((np.exp(d - half), np.exp(d + half)))
    assert r.runs == (6, 5)
    # A side whose first stage did not finish (fewer runs than it) took no more: its count was
    # fixed, and all its runs give its variance. Both sides so: Welch's interval over every run.
    assert stats.ratio(a[:3], b[:3], first=(first, first)) == stats.ratio(a[:3], b[:3])
    assert stats.ratio(a, b, first=(None, None)) == stats.ratio(a, b)


def test_a_geometric_mean_stays_within_its_values() -> None:
    # exp(mean(log)) leaves the range by a rounding: three runs of 1e18 s gave 999999999999998592.
    assert stats.geometric_mean([1e18, 1e18, 1e18]) == 1e18
    assert np.isnan(stats.geometric_mean([])), "no value, no mean: a record whose fit_s is null"
    rng = np.random.default_rng(7)
    for _ in range(2000):
        values = list(rng.choice([1e-12, 0.3, 1.0, 7.0, 1e15, 1e18], size=int(rng.integers(1, 6))))
        assert min(values) <= stats.geometric_mean(values) <= max(values), values
