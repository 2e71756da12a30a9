"""``suite check``: the plan, point by point: whether it runs here (or is skipped, or done), and how long."""

from __future__ import annotations

import argparse
import dataclasses
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from suite import backends
from suite.backends.base import is_pool
from suite.cli.common import (
    UsageError,
    backend_options,
    check_backend_flags,
    display_path,
    make_plan,
    refuse_without_data,
)
from suite.environment import datasets, host_facts
from suite.record import results, saving
from suite.report import reasons
from suite.run import results_folder, runner
from suite.run.progress import duration_text, runs_text
from suite.safe.console import fitted
from suite.safe.markdown import one_line
from suite.spec import plan
from suite.spec.settings import AUTO

HEADERS = ["point", "device", "reps", "fingerprint", "plan here", "estimate"]
PLAN_HERE, DEVICE = HEADERS.index("plan here"), HEADERS.index("device")
SKIPPED = "skipped"  # a point's plan when the backend skips it here: said below its scenario's table


def _refused(
    specs: list[plan.RunSpec],
    args: argparse.Namespace,
    backend: Any,
    folder: Path,
    rows: list[tuple[str, list[Any]]],
    total: _Totals,
) -> str | None:
    """What ``run`` would refuse before anything runs, if anything; the rows then say "run refuses"
    where they said "will run"."""
    try:
        refuse_without_data([s for s in specs if backend.skip_reason(s) is None], args)
        refused = saving.unwritable_here(folder)
    except UsageError as exc:
        refused = str(exc)
    if refused:
        total.refused = True
        for _, row in rows:  # "will run 2 of 3 (...)" -> "run refuses 2 of 3 (...) (below)"
            if row[PLAN_HERE].startswith("will run"):
                row[PLAN_HERE] = row[PLAN_HERE].replace("will run", "run refuses", 1) + " (below)"
    return refused


def _pool_note(backend: Any) -> str:
    slots = sum(float(n.get("Resources", {}).get("suite_slot", 0)) for n in backend.nodes() if n.get("Alive"))
    return (
        f"on {backend.where}: the estimate adds the runs up; up to {slots:g} run at once (suite_slot), "
        "and a node may still skip a point its engine or TensorFlow cannot run (no GPU runtime)"
    )


def cmd_check(args: argparse.Namespace) -> int:
    """The plan, point by point: whether it runs on this machine (or is skipped, or done), and for how long.

    The backend is the one ``run`` would use (``--backend``, or what ``auto`` picks here); earlier
    results come from this machine's folder under ``--results``, as ``run`` would resume from.
    """
    made = make_plan(args)
    specs = made.specs
    check_backend_flags(args)
    machine = args.machine or host_facts.machine_name()
    folder = results_folder.machine_dir(args.results, machine)
    backend, chosen = _check_backend(args)
    pooled = is_pool(backend)
    try:
        folders, on_file = _on_file(backend, args.results, folder)
        # As run resumes: a pool's run is done once a node made it ok, whatever else is on file.
        latest = results_folder.ok_first_by_run if pooled else results.latest_by_run
        done = {} if args.fresh else latest(on_file)
        walls = results_folder.wall_times(on_file)
        points: dict[tuple[str, str], list[plan.RunSpec]] = {}
        # repeats: auto: a point whose first stage is on file has its count; the others show its range.
        counts = runner.auto_counts(specs, done)
        extra = runner.second_stage(specs, done)
        for s in specs + extra:
            points.setdefault((s.scenario, s.point_label), []).append(s)
        rows: list[tuple[str, list[Any]]] = []  # (scenario, its row) for each point that runs or is done here
        # scenario -> short reason -> (runs left, "" or "(1 of 3 ok on file)") per point skipped here
        skipped: dict[str, dict[str, list[tuple[list[plan.RunSpec], str]]]] = {}
        total = _Totals()
        open_auto: list[int] = []  # per auto point without its count yet: the runs it may add
        skips: dict[str, str | None] = {}  # fingerprint -> why the backend skips the point here
        for (scenario, label), runs in points.items():
            first = runs[0]
            skips[first.fingerprint] = skip = backend.skip_reason(first)
            status, estimate = _point_plan(runs, skip, done, walls.get(first.fingerprint), total)
            if status.startswith(SKIPPED):
                by_reason = skipped.setdefault(scenario, {})
                left = [s for s in runs if not _ok_on_file(s, done)]
                by_reason.setdefault(reasons.short_reason(skip or ""), []).append((left, status[len(SKIPPED) :]))
            else:
                rows.append(
                    (scenario, [label, first.device, _reps(runs, counts), first.fingerprint[:12], status, estimate])
                )
            rule = (first.report.get("repeats") or {}).get(AUTO)
            if rule and first.fingerprint not in counts and skip is None:
                open_auto.append(int(rule["max_repeats"]) - len(runs))
        refused = _refused(specs, args, backend, folder, rows, total)
        pool_note, split, budget = None, [], ""
        if pooled:
            from suite.backends.ray_cluster.placement import split_auto_points

            pool_note = _pool_note(backend)
            split = split_auto_points(specs, backend.nodes(), backend.gpu_model)
        if args.budget and pooled:  # how many start depends on how many nodes take runs at once
            budget = (
                f"--budget {args.budget[0]}: no run starts on a node once it has passed; the runs still "
                "queued then wait for the next run"
            )
        elif args.budget:
            budget = _budget_line(args.budget, specs + extra, skips, done, walls)
    finally:
        backend.close()
    _print_plan(list(points), rows, skipped, total.skip_reasons)
    print()
    whole = dataclasses.replace(made, specs=specs + extra, counted=not open_auto)
    for line in whole.lines(args.select):
        _say(line)
    shown = ", ".join(str(display_path(f)) for f in folders) or "none yet"  # a pool that knows no folder yet
    if folders and not any(f.is_dir() for f in folders):
        shown += " (none yet)"
    _say(f"backend: {chosen}; earlier results: {shown}")
    _say(total.text())
    if budget:
        _say(budget + ("; auto's further runs start only while it lasts" if open_auto else ""))
    if open_auto:
        n = len(open_auto)
        _say(
            f"repeats: auto: {n} point{'s' if n != 1 else ''} without a count yet: each runs its first stage, "
            f"then more as that stage's spread asks, up to {runs_text(sum(open_auto))} more in all"
        )
    if pool_note:
        _say(pool_note)
    for line in split:
        _say(f"warning: {line}")
    for line in _data_lines(whole.specs):
        _say(line)
    if refused:
        _say(f"run would refuse this plan: {refused}")
    return 0


def _say(text: str) -> None:
    """A line of the plan's summary, within the console's width (a path is never split)."""
    print("\n".join(fitted(text, 2)))


def _print_plan(
    points: list[tuple[str, str]],
    rows: list[tuple[str, list[Any]]],
    skipped: dict[str, dict[str, list[tuple[list[plan.RunSpec], str]]]],
    skip_reasons: dict[str, None],
) -> None:
    """Per scenario, a table of the points that run or are done here, then its skipped points, one
    line per reason with the points named below it (as ``run`` says them, so that a plan of many GPU
    points on a CPU machine stays short); then each skip reason in full that was said without its
    bracketed detail. Escaped: a reason may quote a Ray node's label, a label a variant's name."""
    from tabulate import tabulate

    cut: set[str] = set()
    for i, scenario in enumerate(dict.fromkeys(s for s, _ in points)):
        n = sum(1 for s, _ in points if s == scenario)
        print(("\n" if i else "") + f"{one_line(scenario)}, {n} point{'s' if n != 1 else ''}:")
        # Each cell on one line, its "|" escaped: a variant's name may hold either and split the row.
        cells = [[one_line(c).replace("|", "\\|") for c in row] for s, row in rows if s == scenario]
        # The device has a column where a point's label does not name it.
        in_label = all(f"device={row[DEVICE]}" in row[0].split(", ") for row in cells)
        headers = [h for h in HEADERS if not (in_label and h == "device")]
        cells = [[c for c, h in zip(row, HEADERS, strict=True) if h in headers] for row in cells]
        if cells:
            print(tabulate(cells, headers=headers, tablefmt="github", disable_numparse=True))
        for reason, group in (skipped.get(scenario) or {}).items():
            line = runner.skip_line([spec for left, _ in group for spec in left], reason)
            print(one_line(line))
            if not line.endswith(reason):
                cut.add(reason)  # said in part: said in full below
            named = "; ".join(one_line(left[0].point_label) + also for left, also in group)
            _say(f"  {named}")
    for reason in skip_reasons:
        if reasons.short_reason(reason) != reason or reason in cut:
            _say(f"skipped, in full: {one_line(reason)}")


def _budget_line(
    budget: tuple[str, float],
    order: list[plan.RunSpec],
    skips: dict[str, str | None],
    done: dict[tuple[str, int], results.RunResult],
    walls: dict[str, list[float]],
) -> str:
    """``--budget``: how many of the runs that will run start before it is spent, as ``run`` starts
    them: in the plan's order, none once the budget has passed. Each run takes its point's estimate
    (the median of its earlier ok runs' wall times), or its timeout_s where none is on file: an upper
    bound, so then more may start."""
    given, seconds = budget
    todo = [s for s in order if skips[s.fingerprint] is None and not _ok_on_file(s, done)]
    elapsed, started, bound = 0.0, 0, False
    for spec in todo:
        if elapsed >= seconds:
            break
        started += 1
        known = walls.get(spec.fingerprint)
        elapsed += statistics.median(known) if known else spec.timeout_s
        bound = bound or not known
    if not todo:
        return ""
    if started == len(todo):
        every = "the one run starts" if started == 1 else f"all {started} runs start"
        return f"--budget {given}: by these estimates, {every} within it"
    return (
        f"--budget {given}: by these estimates, {started} of the {runs_text(len(todo))} "
        f"{'starts' if started == 1 else 'start'} within it, {len(todo) - started} wait for the next run"
        + (" (runs with no earlier result counted at their timeout_s: more may start)" if bound else "")
    )


def _on_file(backend: Any, results_dir: Path, folder: Path) -> tuple[list[Path], list[results.RunResult]]:
    """The folders ``run`` resumes from and the results in them: this machine's, or for a pool every
    node's folder, with the results a node of the pool made (``counts_as_done``)."""
    if is_pool(backend):
        found = results_folder.pool_on_file(results_dir, backend.counts_as_done)
        return results_folder.result_folders(results_dir), found
    return [folder], results_folder.on_file(folder)


def _data_lines(specs: list[plan.RunSpec]) -> list[str]:
    """A line per data identity the plan's runs use: how many runs, the identity, and its note."""
    data: dict[str, tuple[int, str]] = {}
    for s in specs:
        identity = s.config["data"]["identity"]
        key = ", ".join(f"{k} {v}" for k, v in datasets.fingerprinted(identity).items())
        data[key] = (data.get(key, (0, ""))[0] + 1, identity.get("note", ""))
    return [f"data for {runs_text(n)}: {key} ({note})" for key, (n, note) in data.items()]


def _check_backend(args: argparse.Namespace) -> tuple[Any, str]:
    """The backend ``run`` would use, and how it was chosen; for asking which points it would skip."""
    opts = backend_options(args)
    name, why = args.backend, "--backend"
    if name == backends.AUTO:
        name, why = backends.choose(opts)
        why = f"auto: {why}"
    return backends.make(name, opts), f"{name} ({why})"


@dataclass
class _Totals:
    """The plan on this machine, added up: counts of runs and the time they are expected to take."""

    run: int = 0
    skipped: int = 0
    done: int = 0
    known_s: float = 0.0  # from earlier results
    unknown: int = 0  # runs without an earlier result
    bound_s: float = 0.0  # their timeouts, added up
    refused: bool = False  # run would refuse the plan (said below the totals)
    skip_reasons: dict[str, None] = field(default_factory=dict)  # of the rows that say "skipped", in order

    def text(self) -> str:
        verb = "would run, but run refuses the plan (below)" if self.refused else "will run"
        counts = f"{runs_text(self.run)} {verb}, {self.skipped} skipped, {self.done} already done (ok on file)"
        if not self.run:
            return f"here: {counts}; nothing to run"
        parts = []
        if self.run > self.unknown:
            parts.append(f"about {duration_text(self.known_s)} from earlier results")
        if self.unknown:
            parts.append(
                f"at most {duration_text(self.bound_s)} for {runs_text(self.unknown)} without an earlier result "
                "(timeout_s each)"
            )
        return f"here: {counts}; estimated time: " + " + ".join(parts)


def _reps(runs: list[plan.RunSpec], counts: dict[str, int]) -> str:
    """The runs a point takes: its fixed count; for ``repeats: auto``, its count where its first stage
    is on file ("7 (auto)"), else the range ("4-10 (auto)")."""
    rule = (runs[0].report.get("repeats") or {}).get(AUTO)
    if not rule:
        return str(len(runs))
    if runs[0].fingerprint in counts:
        return f"{counts[runs[0].fingerprint]} (auto)"
    return f"{rule['first']}-{rule['max_repeats']} (auto)"


def _ok_on_file(spec: plan.RunSpec, done: dict[tuple[str, int], results.RunResult]) -> bool:
    """Whether ``run`` finds this run done: its newest result on file is ok."""
    earlier = done.get((spec.fingerprint, spec.repetition))
    return earlier is not None and earlier.ok


def _point_plan(
    runs: list[plan.RunSpec],
    skip: str | None,
    done: dict[tuple[str, int], results.RunResult],
    walls: list[float] | None,
    total: _Totals,
) -> tuple[str, str]:
    """(what run does with this point here, how long it takes), as run would: ok on file is done,
    then the backend's skip rule, then run. The estimate is the median wall time of the point's
    earlier ok runs (same fingerprint) per run, else its timeout as an upper bound."""
    ok = sum(1 for s in runs if _ok_on_file(s, done))
    left = len(runs) - ok
    total.done += ok
    if left == 0:
        return "done (ok on file)", "-"
    also = f" ({ok} of {len(runs)} ok on file)" if ok else ""
    if skip is not None:
        total.skipped += left
        total.skip_reasons.setdefault(skip)
        return f"{SKIPPED}{also}", "-"
    total.run += left
    status = "will run" if not ok else f"will run {left} of {len(runs)} ({ok} ok on file)"
    if walls:
        each = statistics.median(walls)
        total.known_s += left * each
        times = f"{left} x {duration_text(each)}, " if left > 1 else ""
        return status, f"~{duration_text(left * each)} ({times}median of {len(walls)})"
    total.unknown += left
    total.bound_s += left * runs[0].timeout_s
    per = f"{left} x " if left > 1 else ""
    return status, f"<= {duration_text(left * runs[0].timeout_s)} ({per}timeout_s)"
