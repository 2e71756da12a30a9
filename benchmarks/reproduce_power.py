"""How often does ``suite reproduce`` say what is true? A seeded simulation of its verdict rule.

For each noise level (log-normal, the standard deviation of log fit times: 0.02 is about 2% per
run) and runs per side (original and rerun alike), ``--trials`` pairs of samples are drawn with
a true rerun/original ratio of 1 (a perfect reproduction), of 1 + tolerance (a shift on the
band's bound: the rule must call it reproduced at most 5% of the time) and of 1.2 (a true 20%
shift). Each pair gets the intervals ``stats.welch_log_interval`` gives (the function
``stats.ratio`` and hence the verdict use) and the verdict by ``equivalence.decision``, the rule the
command applies. For comparison, the rule before it: "reproduced" only when the 95% interval lies
inside the band.

    python benchmarks/reproduce_power.py [--trials 2000] [--seed 20261201] [--tolerance 10] [--json]
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from suite.report import stats  # noqa: E402
from suite.reproduce import equivalence  # noqa: E402

NOISES = (0.02, 0.05, 0.10)
RUNS = (3, 5, 10)
SHIFTS = (1.0, None, 1.2)  # None: on the bound, 1 + tolerance
MORE_RERUNS = ((5, 10), (5, 20))  # (original, rerun) runs: what --repeats beyond the original's count buys


def simulate(
    noise: float,
    runs: int,
    ratio: float,
    tolerance: float,
    trials: int,
    rng: np.random.Generator,
    reruns: int | None = None,
) -> dict[str, int]:
    """Verdict counts over ``trials`` pairs of ``runs`` original and ``reruns`` (default ``runs``)
    rerun times; "reproduced_95" counts what the 95%-inside rule would call reproduced."""
    original = rng.normal(0.0, noise, (trials, runs))
    rerun = rng.normal(math.log(ratio), noise, (trials, reruns or runs))
    _, lo95, hi95 = stats.welch_log_interval(rerun, original, stats.LEVEL)
    _, lo90, hi90 = stats.welch_log_interval(rerun, original, equivalence.EQUIVALENCE_LEVEL)
    counts = {equivalence.REPRODUCED: 0, equivalence.INCONCLUSIVE: 0, equivalence.DIFFERS: 0, "reproduced_95": 0}
    for a, b, c, d in zip(np.exp(lo95), np.exp(hi95), np.exp(lo90), np.exp(hi90), strict=True):
        counts[equivalence.decision(float(a), float(b), float(c), float(d), tolerance)] += 1
        at_95 = equivalence.decision(float(a), float(b), float(a), float(b), tolerance)
        counts["reproduced_95"] += at_95 == equivalence.REPRODUCED
    return counts


def measure(trials: int, seed: int, tolerance: float) -> list[dict[str, object]]:
    rng = np.random.default_rng(seed)
    rows = []
    for shift in SHIFTS:
        ratio = 1.0 + tolerance if shift is None else shift
        for noise in NOISES:
            for runs in RUNS:
                counts = simulate(noise, runs, ratio, tolerance, trials, rng)
                rows.append(
                    {"true_ratio": ratio, "noise": noise, "runs": runs, "reruns": runs, "trials": trials, **counts}
                )
    for noise in NOISES[1:]:
        for runs, reruns in MORE_RERUNS:
            counts = simulate(noise, runs, 1.0, tolerance, trials, rng, reruns)
            rows.append({"true_ratio": 1.0, "noise": noise, "runs": runs, "reruns": reruns, "trials": trials, **counts})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=2000)
    parser.add_argument("--seed", type=int, default=20261201)
    parser.add_argument("--tolerance", type=float, default=equivalence.DEFAULT_TOLERANCE_PCT, help="percent")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    rows = measure(args.trials, args.seed, args.tolerance / 100)
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print(f"tolerance +-{args.tolerance:g}%, {args.trials} trials per row, seed {args.seed}")
    print(
        "| true ratio | noise | original runs | reruns | reproduced | inconclusive | differs | reproduced (95% rule) |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        n = r["trials"]
        pct = {k: f"{100 * r[k] / n:.1f}%" for k in ("reproduced", "inconclusive", "differs", "reproduced_95")}
        print(
            f"| {r['true_ratio']:.2f} | {r['noise']:.0%} | {r['runs']} | {r['reruns']} | {pct['reproduced']} | "
            f"{pct['inconclusive']} | {pct['differs']} | {pct['reproduced_95']} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
