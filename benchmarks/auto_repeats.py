"""Repetitions that stop when the answer is known: stopping rules in simulated plans, against a
fixed 5 runs a point. Which rule keeps the printed interval's level?

A plan is a baseline and three points whose true speed-ups over it are 1.0, 1.05 and 1.3, each run
timed with log-normal noise (a point's own sigma on the log scale). The rules:

- fixed 5: every point runs 5 times; the suite's Welch interval over every run.
- narrow, padded: sequential. Every point runs 3 times, then each round gives one more run to every
  point still open (in a comparison with the baseline whose rule says "not yet"), below the cap
  (``--cap``). narrow stops when the printed Welch interval's half-width on the log ratio is at most
  ``--precision``; padded pads its squared standard error by precision**2 / (n_a * n_b) and takes
  the t quantile at min(n_a, n_b) - 1 degrees of freedom (Chow and Robbins' n**-1 term, Ann. Math.
  Statist. 36, 1965, in the target's units). Both print the Welch interval over every run.
- two-stage, all-run interval: the suite's two-stage counts (``stats.two_stage_count``: each point's
  count from the variance of its first 4 runs), with the Welch interval over every run printed.
- two-stage: the same counts, and the interval the rule is made for (``stats.ratio`` with ``first``):
  means from every run, variances from the first stage alone (Stein's construction, Ann. Math.
  Statist. 16, 1945), so the count, a function of the first-stage spreads, carries no information
  about the printed interval's error.

The ratios and their 95% intervals are read against the truth:

- runs: the mean number of runs a point took (fixed: 5);
- coverage: how often the printed 95% interval holds the true ratio (a 95% claim: 93-97%), the
  three true ratios' lowest;
- half: the median half-width of the printed interval on the log scale;
- wrong: how often the verdict's wording is wrong: a difference claimed where there is none (1.0),
  or the wrong direction claimed (1.05, 1.3), the highest of the three;
- none found: how often a true difference is said to be not significant (1.05, 1.3).

    python benchmarks/auto_repeats.py [--trials 4000] [--seed 20261204] [--precision 0.03] [--cap 10]

Deterministic for a seed. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from suite.report import stats  # noqa: E402

TRUE_RATIOS = (1.0, 1.05, 1.3)  # the baseline's time over each point's
FIXED = 5
FIRST = stats.MIN_RUNS_FOR_INTERVAL


@dataclass(frozen=True)
class Case:
    name: str
    baseline_sigma: float
    point_sigma: float


CASES = (
    Case("1% everywhere", 0.01, 0.01),
    Case("2% everywhere", 0.02, 0.02),
    Case("5% everywhere", 0.05, 0.05),
    Case("10% everywhere", 0.10, 0.10),
    Case("baseline 1%, points 3%", 0.01, 0.03),
    Case("baseline 1%, points 5%", 0.01, 0.05),
    Case("baseline 0.5%, points 5%", 0.005, 0.05),
    Case("baseline 5%, points 1%", 0.05, 0.01),
    Case("baseline 2%, points 10%", 0.02, 0.10),
)


@dataclass(frozen=True)
class Outcome:
    """Per true ratio (columns of TRUE_RATIOS): what the printed comparisons said, over the trials."""

    runs: float  # mean runs per point, the baseline's included
    coverage: np.ndarray
    half: np.ndarray
    wrong: np.ndarray
    none_found: np.ndarray


def _means_and_vars(cum: np.ndarray, cum2: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Mean and sample variance of the first ``n`` runs, from cumulative sums over the runs axis."""
    idx = (n - 1)[..., None]
    total = np.take_along_axis(cum, idx, -1)[..., 0]
    total2 = np.take_along_axis(cum2, idx, -1)[..., 0]
    mean = total / n
    return mean, np.maximum(total2 - n * mean**2, 0.0) / (n - 1)


def _t(level: float, dof: Any) -> Any:
    from scipy import stats as sps

    return sps.t.ppf(0.5 + level / 2, dof)


def narrow(var_a: Any, n_a: Any, var_b: Any, n_b: Any, precision: float) -> Any:
    return stats.welch_half_width(var_a, n_a, var_b, n_b) <= precision


def padded(var_a: Any, n_a: Any, var_b: Any, n_b: Any, precision: float) -> Any:
    se2 = var_a / n_a + var_b / n_b + precision**2 / (n_a * n_b)
    return _t(stats.LEVEL, np.minimum(n_a, n_b) - 1) * np.sqrt(se2) <= precision


SEQUENTIAL = {"narrow": narrow, "padded": padded}
RULES = ("fixed", "narrow", "padded", "two-stage, all-run interval", "two-stage")


def simulate(case: Case, trials: int, rng: np.random.Generator, precision: float, cap: int, rule: str) -> Outcome:
    points = 1 + len(TRUE_RATIOS)  # the baseline first
    sigma = np.array([case.baseline_sigma] + [case.point_sigma] * len(TRUE_RATIOS))
    mu = np.array([0.0] + [-np.log(r) for r in TRUE_RATIOS])  # log time: faster is lower
    width = FIXED if rule == "fixed" else cap
    logs = rng.normal(mu[:, None], sigma[:, None], (trials, points, width))
    cum, cum2 = np.cumsum(logs, -1), np.cumsum(logs**2, -1)
    n = np.full((trials, points), FIXED if rule == "fixed" else FIRST)
    if rule.startswith("two-stage"):
        stage_one = logs[..., : stats.FIRST_STAGE].var(-1, ddof=1)
        n = stats.two_stage_count(stage_one, precision, cap)
    while (decide := SEQUENTIAL.get(rule)) is not None:
        _, var = _means_and_vars(cum, cum2, n)
        met = decide(var[:, :1], n[:, :1], var[:, 1:], n[:, 1:], precision)  # (trials, comparisons)
        open_points = np.concatenate([~met.all(1, keepdims=True), ~met], 1) & (n < cap)
        if not open_points.any():
            break
        n = n + open_points
    mean, var = _means_and_vars(cum, cum2, n)
    diff = mean[:, :1] - mean[:, 1:]  # log of the baseline's time over the point's
    if rule == "two-stage":
        first = stats.FIRST_STAGE  # the variances of the first stage, over every run's count
        half = stats.welch_half_width(stage_one[:, :1], n[:, :1], stage_one[:, 1:], n[:, 1:], stats.LEVEL, first, first)
    else:
        half = stats.welch_half_width(var[:, :1], n[:, :1], var[:, 1:], n[:, 1:])
    truth = np.log(np.array(TRUE_RATIOS))
    significant = np.abs(diff) > half
    claims_up = significant & (diff > 0)
    claims_down = significant & (diff < 0)
    wrong = np.where(truth == 0, significant, np.where(truth > 0, claims_down, claims_up))
    return Outcome(
        runs=float(n.mean()),
        coverage=(np.abs(diff - truth) <= half).mean(0),
        half=np.median(half, 0),
        wrong=wrong.mean(0),
        none_found=np.where(truth != 0, ~significant, False).mean(0),
    )


def table(trials: int, seed: int, precision: float, cap: int) -> str:
    rng = np.random.default_rng(seed)
    head = (
        "| noise | rule | runs/point | coverage at 1.0 / 1.05 / 1.3 | half-width | wrong verdict | "
        "no difference found at 1.05 / 1.3 |"
    )
    lines = [head, "|" + "---|" * 7]
    for case in CASES:
        for rule in RULES:
            o = simulate(case, trials, rng, precision, cap, rule)
            lines.append(
                f"| {case.name} | {f'fixed {FIXED}' if rule == 'fixed' else rule} | {o.runs:.2f} | "
                + " / ".join(f"{c:.3f}" for c in o.coverage)
                + f" | {np.median(o.half):.3f} | {o.wrong.max():.3f} | "
                + " / ".join(f"{x:.2f}" for x in o.none_found[1:])
                + " |"
            )
    return "\n".join(lines)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trials", type=int, default=4000)
    p.add_argument("--seed", type=int, default=20261204)
    p.add_argument("--precision", type=float, default=0.03, help="target half-width on the log scale")
    p.add_argument("--cap", type=int, default=10)
    args = p.parse_args()
    print(f"{args.trials} simulated plans per row, seed {args.seed}, precision {args.precision:g}, cap {args.cap}\n")
    print(table(args.trials, args.seed, args.precision, args.cap))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
