"""The commands a page gives under its results: ``run`` to measure its points again as they were
measured (and ``report`` to remake the page), and ``reproduce`` to check them on this machine."""

from __future__ import annotations

import shlex
from pathlib import Path

from suite import paths
from suite.record.results import RUN_BACKEND
from suite.report.points import ScenarioView
from suite.report.up_to_date import ScenarioFiles, not_looked_for
from suite.spec.plan import override_flag
from suite.spec.select import expression_for
from suite.spec.settings import AUTO, MAX_REPEATS

DEFAULT_RESULTS = Path("reports") / "results"  # what ``run --results`` and ``report --results`` default to


def folder_text(results_dir: Path | None) -> str | None:
    """The results folder as a command names it: relative to the project's top when inside it (the
    checkout, or the working directory of an installed suite: commands run there, and a page must not
    depend on where the project lies); None for the default."""
    if results_dir is None:
        return None
    path = Path(results_dir)
    try:
        path = path.resolve().relative_to(paths.project_root())
    except (OSError, ValueError):
        pass
    return None if path == DEFAULT_RESULTS else str(path)


def _repeats(view: ScenarioView) -> int | str:
    """How many repetitions the runs recorded: the most any shown point has (a point whose later
    repetitions did not finish has fewer files, not a smaller ``--repeats``); ``auto`` where the
    points ran under ``repeats: auto``, whose counts come from their own first runs. At most the
    count ``run`` takes: a record's repetition may be any index up to 1e9 (not one ``run`` makes)."""
    if any(p.auto for p in view.points):
        return AUTO
    made = max((int(r.spec.get("repetition", 0)) + 1 for p in view.points for r in p.runs), default=1)
    return min(made, MAX_REPEATS)


def _takes_every_point(view: ScenarioView, files: ScenarioFiles) -> bool:
    """Whether the page's points are every point its scenario file has at this size: then ``run``
    needs no ``-k``. False when the file cannot be read or has other points (the runs were chosen
    with ``run -k``, which the results do not record, or the file changed since). Only the points'
    labels count: the data is not looked for (what this machine holds would change the page)."""
    from suite.spec import plan

    found = files.scenario(view.spec)
    if found is None:
        return False
    try:
        specs = plan.expand(found, smoke=view.smoke, repeats=1, data=not_looked_for)
    except Exception:  # noqa: BLE001 - any point the file cannot make: name the points instead
        return False
    return {s.point_label for s in specs} == {p.label for p in view.points}


def run_commands(view: ScenarioView, results_dir: Path | None = None, files: ScenarioFiles | None = None) -> str:
    """The commands that measure the shown points again, as they were measured, and remake the page.

    Every recorded choice that changes what runs is carried: the backend, the smoke size, the
    number of repetitions, the ``--set`` overrides of the view, and the points: ``-k`` naming them
    when they are not every point of the scenario file (a page cut with ``report -k`` repeats that
    ``-k``). The results folder and the machine's name are carried too, so ``report`` reads what
    ``run`` wrote, as the page was made. On a machine whose folder already holds these results,
    ``run`` skips every point that has an ok result: the reproduce command (``check_command``) is the one
    that measures them again there and compares. ``files``: the scenario files as this report read
    them (report/up_to_date); default: read here.
    """
    spec, run = view.spec, view.newest.run
    folder = folder_text(results_dir)
    # A record may hold null or "" where the suite writes a value (the shape allows it): the defaults.
    base = ["python -m suite run", shlex.quote(spec.get("scenario_file") or f"scenarios/{view.scenario}.yaml")]
    base.append(f"--backend {shlex.quote(str(run.get(RUN_BACKEND.key) or 'local'))}")
    if view.smoke:
        base.append("--smoke")
    base.append(f"--repeats {_repeats(view)}")
    if folder:
        base.append(f"--results {shlex.quote(folder)}")
    base.append(f"--machine {shlex.quote(view.machine)}")
    selection = getattr(view, "selection", None)  # points.SelectedView: the page was cut with -k
    parts = list(base)
    if selection:
        parts.append(f"-k {shlex.quote(selection)}")
    elif not _takes_every_point(view, files or ScenarioFiles()) and view.points:
        parts.append(f"-k {shlex.quote(expression_for([(p.coords, p.label) for p in view.points]))}")
    parts += [f"--set {shlex.quote(override_flag(k, v))}" for k, v in view.overrides.items()]
    again = "python -m suite report" + (f" --results {shlex.quote(folder)}" if folder else "")
    again += f" -k {shlex.quote(selection)}" if selection else ""
    return " && ".join([" ".join(parts), again])


def check_command(view: ScenarioView, results_dir: Path | None) -> str:
    """The command that reruns this machine's results of the scenario here and says whether each
    point's time came out again (``suite reproduce``, docs/reproduce.md)."""
    results = Path(folder_text(results_dir) or DEFAULT_RESULTS)
    # Where its files are: a machine's folder need not bear the machine's name.
    folders = [results / f for f in view.folders] or [results / view.machine / view.scenario]
    selection = getattr(view, "selection", None)
    return (
        "python -m suite reproduce "
        + " ".join(shlex.quote(str(f)) for f in folders)
        + (f" -k {shlex.quote(selection)}" if selection else "")
    )
