"""Each point's original and rerun side by side, as data (``reproduce --json``) and as text."""

from __future__ import annotations

import shlex
import textwrap
from pathlib import Path
from typing import Any

from suite.record.results import FIT_S, STEADY_EPOCH_S, TEST_ACCURACY, RunResult
from suite.report import compare, stats
from suite.report.points import ACCURACY_GATE, first_stage
from suite.reproduce.equivalence import EQUIVALENCE_LEVEL, REPRODUCED, said, tolerance_text, verdict
from suite.reproduce.originals import Original, files_text
from suite.safe.markdown import one_line

FORMAT = "keras-speed-suite/reproduce"
VERSION = 2  # 2: gate misses moved from rerun.failures to rerun.below_gate; 90% bounds


# Which way the JSON's ratio divides, in words, for whoever reads it without the docs.
RATIO_DIRECTION = (
    "rerun_over_original is the rerun's geometric mean fit time over the original's: above 1, the rerun is "
    "slower; text says it as the output does, a factor of 1 or more and the word faster or slower"
)
HARDWARE_FACTS = ("GPU model", "GPU driver", "CPU", "CPU cores")


def side(runs: list[RunResult]) -> dict[str, Any]:
    """One side of a point (original or rerun) as numbers: counts, fit and steady epoch summaries."""
    ok = [r for r in runs if r.ok]
    fit = [float(v) for r in ok if (v := FIT_S.of(r)) is not None]
    steady = [float(v) for r in ok if (v := STEADY_EPOCH_S.of(r)) is not None]
    fs, ss = stats.summarize(fit), stats.summarize(steady)
    statuses: dict[str, int] = {}
    for r in runs:
        statuses[r.status] = statuses.get(r.status, 0) + 1
    return {
        "runs": len(runs),
        "runs_ok": len(ok),
        "statuses": statuses,
        "fit_s": fit,
        "fit_s_geomean": stats.geometric_mean(fit) if fit else None,
        "fit_s_min": fs.low if fs else None,
        "fit_s_max": fs.high if fs else None,
        "steady_epoch_s_median": ss.median if ss else None,
        "steady_epoch_s_min": ss.low if ss else None,
        "steady_epoch_s_max": ss.high if ss else None,
    }


def fact_differences(original: list[RunResult], rerun: list[RunResult]) -> tuple[list[str], list[str]]:
    """(hardware lines, other fact lines): the facts ``compare`` records, where the original's ok
    runs and the reruns that reached the worker say different things."""
    ran = [r for r in rerun if r.environment]
    if not ran:
        return [], []
    hardware: list[str] = []
    other: list[str] = []
    for name, get in compare.FACTS:
        was = sorted({str(get(r)) for r in original if r.ok and r.environment})
        now = sorted({str(get(r)) for r in ran})
        if was and was != now:
            line = f"{name}: {', '.join(was)} (original) vs {', '.join(now)} (rerun)"
            (hardware if name in HARDWARE_FACTS else other).append(line)
    return hardware, other


def failure_lines(runs: list[RunResult]) -> list[str]:
    """One line per rerun that did not end ok (failed, timed out, skipped here)."""
    return [
        f"rep {r.spec.get('repetition')}: {r.status}" + (f": {r.message.splitlines()[0][:200]}" if r.message else "")
        for r in runs
        if not r.ok
    ]


def gate_lines(runs: list[RunResult], original: list[RunResult]) -> list[str]:
    """Where every original ok run reached the accuracy gate the reports hold verdicts to, one line
    per ok rerun below it: a fast broken run reproduces nothing. These runs ended ok (their fit
    times are in the rerun's sample); they are kept apart from the runs that failed."""
    was = [a for r in original if r.ok and (a := TEST_ACCURACY.of(r)) is not None]
    if not was or min(was) < ACCURACY_GATE:
        return []
    return [
        f"rep {r.spec.get('repetition')}: ok, but test accuracy {acc:.3f} is below the "
        f"{ACCURACY_GATE:.2f} gate every original run reached ({min(was):.3f} or more)"
        for r in runs
        if r.ok and (acc := TEST_ACCURACY.of(r)) is not None and acc < ACCURACY_GATE
    ]


def compare_point(
    point: Original,
    reruns: list[RunResult],
    tolerance: float,
    diffs: tuple[list[str], list[str]],
    backend: str,
) -> dict[str, Any]:
    """One point's comparison as plain data (``--json``); ``render`` formats exactly this."""
    original, again = side(point.ok_runs), side(reruns)
    failures, below_gate = failure_lines(reruns), gate_lines(reruns, point.runs)
    v = verdict(
        original["fit_s"],
        again["fit_s"],
        tolerance,
        failures,
        below_gate,
        runs=len(reruns),
        original_first=first_stage(point.runs),
    )
    eq = v.equivalence
    hardware, other = fact_differences(point.ok_runs, reruns)
    r = v.ratio
    return {
        "scenario": point.spec.get("scenario"),
        "point": point.spec.get("point_label"),
        "fingerprint": point.fingerprint,
        "machine": point.machine,
        "smoke": bool(point.spec.get("smoke")),
        "backend": backend,
        "original_files": [str(p) for p in point.files],
        "original": original,
        "superseded_files": [str(p) for p in point.superseded],
        "rerun": {**again, "failures": failures, "below_gate": below_gate, "files": []},
        "ratio": None
        if r is None
        else {
            "rerun_over_original": r.value,
            "direction": RATIO_DIRECTION,
            "text": said(r),
            "ci_low": r.low,
            "ci_high": r.high,
            "ci90_low": eq.low if eq is not None else None,
            "ci90_high": eq.high if eq is not None else None,
            "runs": list(r.runs),
        },
        "verdict": {"kind": v.kind, "text": v.text, "repeats_needed": v.repeats_needed},
        "differences": diffs[0],
        "notes": diffs[1],
        "hardware_differs": hardware,
        "other_facts_differ": other,
    }


def collect(
    compared: list[dict[str, Any]],
    tolerance: float,
    results_dir: Path,
    anyway: bool,
    inputs: list[Path] | None = None,
    left_out: list[str] | None = None,
) -> dict[str, Any]:
    """The whole comparison as plain data (``--json``, docs/reproduce.md); ``left_out``: one line per
    point of a given folder that had no ok run to compare with."""
    return {
        "format": FORMAT,
        "version": VERSION,
        "inputs": [str(p) for p in inputs or []],
        "tolerance": tolerance,
        "compared": "timing.fit_s",
        "interval": {
            "level": stats.LEVEL,
            "equivalence_level": EQUIVALENCE_LEVEL,
            "method": stats.METHOD,
            "min_runs": stats.MIN_RUNS_FOR_INTERVAL,
        },
        "anyway": anyway,
        "results_dir": str(results_dir),
        "points": compared,
        "left_out": list(left_out or []),
        "reproduced": all(p["verdict"]["kind"] == REPRODUCED for p in compared),
    }


def _range(lo: float | None, hi: float | None, mid: float | None, digits: int) -> str:
    if mid is None:
        return "-"
    return f"{mid:.{digits}f} ({lo:.{digits}f}-{hi:.{digits}f})"


def _located(line: str, point: dict[str, Any]) -> str:
    """A difference as a point shows it, naming its files where it applies to some of them only."""
    files = (point.get("difference_files") or {}).get(line) or []
    some = files and len(files) < len(point["original_files"])
    return f"  {line}" + (f" (in {files_text([Path(f) for f in files])})" if some else "")


def render(data: dict[str, Any]) -> str:
    """The comparison as text: shared differences first, then per point its table, facts and verdict."""
    from tabulate import tabulate

    points = data["points"]
    # Lines every point shares are said once, above them all; a single point's stay with it, where
    # each can name the files it applies to.
    shared = [
        d for d in (points[0]["differences"] if len(points) > 1 else []) if all(d in p["differences"] for p in points)
    ]
    lines = []
    if shared:
        lines += ["Differences from the results (--anyway ran regardless):", *[f"  {d}" for d in shared], ""]
    for p in points:
        lines.append(
            f"{p['scenario']} [{one_line(p['point'])}] "
            f"(fingerprint {p['fingerprint'][:12]}, original on {p['machine']})"
        )
        rows = []
        for name in ("original", "rerun"):
            s = p[name]
            rows.append(
                [
                    name,
                    f"{s['runs_ok']}/{s['runs']} ok",
                    _range(s["fit_s_min"], s["fit_s_max"], s["fit_s_geomean"], 3),
                    _range(s["steady_epoch_s_min"], s["steady_epoch_s_max"], s["steady_epoch_s_median"], 4),
                ]
            )
        headers = ["", "runs", "fit time (s), geometric mean (min-max)", "steady epoch (s), median (min-max)"]
        lines += [tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True)]
        if p["ratio"] is not None:
            q = p["ratio"]
            lines.append(f"fit time: {q['text']}")
        lines += [f"  failed: {f}" for f in p["rerun"]["failures"]]
        lines += [f"  below the accuracy gate: {f}" for f in p["rerun"]["below_gate"]]
        own = [_located(d, p) for d in p["differences"] if d not in shared]
        if own:
            lines.append("differences from the original (--anyway ran regardless):")
        lines += own
        lines += [_located(d, p) for d in p["notes"]]
        lines += [f"hardware differs: {h}" for h in p["hardware_differs"]]
        if p["other_facts_differ"]:
            lines += _prose("other recorded facts differ: " + "; ".join(p["other_facts_differ"]))
        lines += [f"verdict: {p['verdict']['text']}", ""]  # one line: what a reader looks for
    done = sum(p["verdict"]["kind"] == REPRODUCED for p in points)
    lines += _prose(
        f"{done} of {len(points)} point(s) reproduced within +-{tolerance_text(data['tolerance'])} "
        f"(fit time of the rerun against the original's: {stats.METHOD})"
    )
    if data.get("left_out"):
        lines.append(f"{len(data['left_out'])} point(s) of the given folders left out, no ok run to compare with:")
        lines += [f"  {line.removeprefix('left out ')}" for line in data["left_out"]]
    given = data.get("inputs") or []
    originals = given[0] if len(given) == 1 and Path(given[0]).is_dir() else "ORIGINAL_DIR"
    reruns = shlex.quote(str(data["results_dir"]))  # the commands are for copying whole
    lines += [
        f"reruns in {data['results_dir']}; their pages, or a table beside the originals:",
        f"  python -m suite report --results {reruns}",
        f"  python -m suite compare {shlex.quote(str(originals))} {reruns}",
    ]
    return "\n".join(lines) + "\n"


def _prose(text: str) -> list[str]:
    """A sentence in lines of at most 120 columns, those after the first indented (a word longer
    than that, a path, stays whole)."""
    return textwrap.wrap(text, 120, subsequent_indent="  ", break_long_words=False, break_on_hyphens=False)
