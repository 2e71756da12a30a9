"""How long does ``suite report`` take over many result files? A timed run of the real command.

The result files of ``--from`` (a scenario's folder of real results; default: the width fixture's)
are copied as repetitions r0, r1, ... of their points until ``--files`` files exist, in a temp
folder. Then ``python -m suite report`` of each given checkout (``--suite``, default this one) runs
on them ``--rounds`` times, the checkouts alternating within each round so that the machine's
noise falls on all alike, each with a cache folder of its own (``SUITE_CACHE_DIR``) whose first
report, cache empty, is timed apart. Each round times two reports per checkout: one into a new
folder (every page written: the results changed since the last report) and one more into the same
folder from the same files (unchanged: nothing to rewrite). Prints each checkout's median and
range of wall time and median CPU time (user and system) in seconds, its first report's wall time,
each later checkout's wall times against the first one's (the ratio of geometric means with the 95%
Welch interval every report prints), and whether each checkout wrote the same bytes as the last one.

    python benchmarks/report_scale.py [--files 10200] [--rounds 3] [--from DIR] [--samples N] [--suite DIR ...]

Results with telemetry (``tests/fixtures/rich/box/mnist_mlp_width``, or those of a run on this
machine after ``./run_all.sh --smoke``) are about five times larger than the fixtures, and slower to
read; a run of minutes records up to 600 samples per metric (``--samples 600``), five times more again.
"""

from __future__ import annotations

import argparse
import filecmp
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from suite.report import stats  # noqa: E402  (the interval every report prints)

FIXTURE = REPO / "tests" / "fixtures" / "results" / "fixture-local" / "fx_width"


def make_results(source: Path, files: int, out: Path, samples: int = 0) -> int:
    """``files`` result files under ``out/bench/<scenario>/``, each a real one as another repetition.
    ``samples``: each telemetry series made that long (its samples repeated, a step on in time), as
    a run of ``samples`` / 5 Hz seconds or more records it (suite.telemetry keeps at most 600)."""
    records = [json.loads(p.read_text(encoding="utf-8")) for p in sorted(source.glob("*.json"))]
    if not records:
        raise SystemExit(f"error: no result files in {source}")
    for record in records:
        for metric in (record.get("telemetry") or {}).get("metrics") or []:
            series = metric.get("series")
            if samples and series and series["t"]:
                n, step = len(series["t"]), series["t"][-1] + 0.2  # the next lap starts a sample on
                series["t"] = [round(series["t"][i % n] + step * (i // n), 3) for i in range(samples)]
                series["v"] = [series["v"][i % n] for i in range(samples)]
    by_point = {r["spec"]["fingerprint"]: r for r in records}
    folder = out / "bench" / records[0]["spec"]["scenario"]
    folder.mkdir(parents=True)
    made, repetition = 0, 0
    while made < files:
        for fingerprint, record in by_point.items():
            if made == files:
                break
            record["spec"]["repetition"] = repetition
            # As the suite writes a record (record/saving): the size and layout of a real file.
            text = json.dumps(record, indent=1, sort_keys=True) + "\n"
            (folder / f"{fingerprint[:12]}-r{repetition}.json").write_text(text, encoding="utf-8")
            made += 1
        repetition += 1
    return made


def timed_report(suite: Path, results: Path, out: Path, cache: Path) -> tuple[float, float]:
    """The wall time and the CPU time (user and system, of the report's process) of one report."""
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "suite", "report", "--results", str(results), "--out", str(out)],
        cwd=suite,
        # Bytecode written and read, as for an installed package or a checkout run twice: a caller's
        # PYTHONDONTWRITEBYTECODE would add compiling the suite (0.1 s) to every timed report.
        env={k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
        | {"PYTHONPATH": str(suite), "SUITE_CACHE_DIR": str(cache)},
        check=True,
        capture_output=True,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - used.ru_utime) + (after.ru_stime - used.ru_stime)


def _times(times: list[tuple[float, float]]) -> str:
    walls, cpus = [w for w, _ in times], [c for _, c in times]
    return f"{statistics.median(walls):.2f} s ({min(walls):.2f}-{max(walls):.2f}), CPU {statistics.median(cpus):.2f} s"


def same_pages(a: Path, b: Path) -> bool:
    cmp = filecmp.dircmp(a, b)
    return not (cmp.left_only or cmp.right_only or filecmp.cmpfiles(a, b, cmp.common_files, shallow=False)[1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--files", type=int, default=10200)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--from", dest="source", type=Path, default=FIXTURE, help="a folder of one scenario's results")
    p.add_argument(
        "--samples", type=int, default=0, help="each telemetry series this long (600: a run of 2 minutes or more)"
    )
    p.add_argument("--suite", type=Path, action="append", help="a checkout to time (repeatable; default: this one)")
    args = p.parse_args()
    suites = [s.resolve() for s in args.suite or [REPO]]
    with tempfile.TemporaryDirectory(prefix="report-scale-") as tmp:
        made = make_results(args.source, args.files, Path(tmp) / "results", args.samples)
        size = sum(p.stat().st_size for p in (Path(tmp) / "results").rglob("*.json"))
        # Each checkout its own, empty cache folder: its first report is the cold one (every file
        # checked, every plot drawn), the rounds after it the warm ones.
        cold = {
            s: timed_report(s, Path(tmp) / "results", Path(tmp) / f"out{i}", Path(tmp) / f"cache{i}")
            for i, s in enumerate(suites)
        }
        # Each round, each checkout: a report into a folder of its own that is new (every page
        # written), then one more into the folder it wrote before from the same files (unchanged).
        written: dict[Path, list[tuple[float, float]]] = {s: [] for s in suites}
        unchanged: dict[Path, list[tuple[float, float]]] = {s: [] for s in suites}
        for n in range(args.rounds):
            for i, suite in enumerate(suites):
                out, cache = Path(tmp) / f"out{i}-{n}", Path(tmp) / f"cache{i}"
                written[suite].append(timed_report(suite, Path(tmp) / "results", out, cache))
                unchanged[suite].append(timed_report(suite, Path(tmp) / "results", out, cache))
        # Each checkout's pages against the last one's: an older checkout may write other pages by
        # design; a faster one that is meant to write the same bytes must.
        last = Path(tmp) / f"out{len(suites) - 1}"
        same = {s: same_pages(Path(tmp) / f"out{i}", last) for i, s in enumerate(suites[:-1])}
    print(
        f"suite report over {made:,} result files of {size / made / 1000:.1f} kB on average, "
        f"{args.rounds} rounds after a first one with an empty cache"
    )
    print("  wall time: median (range); CPU time of the report's process: median")
    for suite in suites:
        print(
            f"  {suite}: pages written: {_times(written[suite])}; results unchanged since: "
            f"{_times(unchanged[suite])}; first, cache empty: {cold[suite][0]:.2f} s"
        )
        if suite != suites[0]:
            for what, times in (("pages written", written), ("unchanged", unchanged)):
                r = stats.ratio([w for w, _ in times[suite]], [w for w, _ in times[suites[0]]])
                interval = f" ({stats.LEVEL:.0%} interval {r.low:.2f}-{r.high:.2f})" if r.low is not None else ""
                print(f"    {what}: wall time x{r.value:.2f} of {suites[0]}'s{interval}")
    for suite, equal in same.items():
        print(f"  {suite}: pages the same as {suites[-1]}'s: {'yes' if equal else 'no'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
