"""The answer a run ends with: per scenario of the plan, its verdict, its points of lowest and
highest fit time, its runs counted by status."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from suite.record import results
from suite.record.results import FIT_S
from suite.report import points, stats, verdicts
from suite.run.progress import BEFORE_FLOOR, WIDTH, cut_middle, fit_line, shorten, wrapped
from suite.run.runner import count_key, counts_text
from suite.spec.plan import RunSpec


def closing_lines(results_dir: Path, folders: list[Path], specs: list[RunSpec]) -> list[str]:
    """The answer a run ends with, per scenario of the plan: its verdict, its points of lowest and
    highest fit time, its runs counted by status. Drawn from the result files of the plan's runs in ``folders``
    (those done before included), grouped as the report groups them."""
    wanted = {(s.fingerprint, s.repetition) for s in specs}
    loaded = [
        (p, r)
        for f in folders
        if f.is_dir()
        for p, r in results.load_folder(f)
        if (r.fingerprint, int(r.spec.get("repetition", 0))) in wanted
    ]
    shown = points.group_views(results_dir, loaded)
    machines = len({v.machine for v in shown}) > 1
    # The plan's points with no result on file (a spent --budget, a plan that stopped early, a result
    # kept elsewhere for want of room): said once per scenario, after its views, or alone where none
    # of its points has a result.
    found = {r.fingerprint for _, r in loaded}
    missing: dict[str, dict[str, str]] = {}
    for s in specs:
        if s.fingerprint not in found:
            missing.setdefault(s.scenario, {})[s.fingerprint] = s.point_label
    last = {v.scenario: i for i, v in enumerate(shown)}  # a pool's views of one scenario: one per machine
    out: list[str] = []
    for i, v in enumerate(shown):
        out += _scenario_lines(v, machines)
        if last[v.scenario] == i:
            out += _not_run(v.scenario, missing.pop(v.scenario, {}), alone=False)
    for scenario, labels in missing.items():
        out += _not_run(scenario, labels, alone=True)
    return out


def _not_run(scenario: str, labels: dict[str, str], alone: bool) -> list[str]:
    """'  no result on file: 2 points of the plan: [hidden=[16]], [hidden=[32]]' (on a line of the
    scenario's own, named first, where none of its points has one)."""
    if not labels:
        return []
    n = len(labels)
    said = f"{n} point{'' if n == 1 else 's'} of the plan: " + ", ".join(f"[{label}]" for label in labels.values())
    first = f"{cut_middle(scenario, BEFORE_FLOOR * 2)}: no result on file: " if alone else "  no result on file: "
    return wrapped(said, first, "    ")


def _scenario_lines(view: points.ScenarioView, machine: bool) -> list[str]:
    runs = [r for p in view.points for r in p.runs]
    name = view.scenario + (f" on {view.machine}" if machine else "")
    npoints = f"{len(view.points)} point{'' if len(view.points) == 1 else 's'}"
    counts = f", {npoints}: {counts_text(Counter(count_key(r) for r in runs))}"
    if len(name) + len(counts) > WIDTH:  # a long name gives way, in its middle, before the counts
        name = cut_middle(name, max(BEFORE_FLOOR, WIDTH - len(counts)))
    out = [shorten(name + counts, WIDTH)]
    out += wrapped(verdicts.verdict(view), "  verdict: ", "    ")
    # (geometric mean, label, fit times) of each point above the gate: the page's table's figure.
    fitted = [(p.label, fits) for p in view.points if p.passes_gate and (fits := p.values(FIT_S))]
    timed = sorted(((stats.geometric_mean(fits), label, fits) for label, fits in fitted), key=lambda t: t[0])
    if not timed:  # where no run was ok at all, the counts above say so (all skipped, or failed)
        ran = any(p.ok_runs for p in view.points)
        return [*out, "  no point ran ok above the accuracy gate: no fit time to show"] if ran else out
    if len(timed) == 1:
        return [*out, _fit_line("only point timed", *timed[0])]
    # Lowest and highest, not fastest and slowest: the verdict alone says which differences its
    # intervals bear out, and two points a hair apart on one run each are not one faster.
    return [*out, _fit_line("lowest fit time", *timed[0]), _fit_line("highest fit time", *timed[-1])]


def _fit_line(what: str, mean: float, label: str, fits: list[float]) -> str:
    """'  lowest fit time: [width=100, device=cpu] 0.41 s (geo. mean of 3 runs, 0.39-0.44 s)'."""
    spread = f"geo. mean of {len(fits)} runs, {min(fits):.2f}-{max(fits):.2f} s" if len(fits) > 1 else "1 run"
    return fit_line(f"  {what}: ", label, f" {mean:.2f} s ({spread})")
