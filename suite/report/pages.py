"""Results -> Markdown. A pure function of the result files: same files, same bytes.

One page per scenario (``<scenario>.md``) with a section per machine, and an index
(``README.md``). Tables through tabulate's ``github`` format; every cell is escaped.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
from collections import defaultdict
from pathlib import Path
from urllib.parse import quote

from tabulate import tabulate

from suite import paths
from suite.record.results import RunResult
from suite.report import compare, environment_section, figures, plots, rerun, verdicts, writing
from suite.report.environment_section import set_flags
from suite.report.points import Point, ScenarioView, group_views, load_views, select_views
from suite.report.up_to_date import ScenarioFiles
from suite.safe.markdown import cell, code, paragraph

__all__ = ["cell", "render_index", "render_scenario", "write_reports"]

# The table that answers the question, and the one that says where the time goes. Column meanings
# and how each figure is computed: docs/reading-a-report.md (every page links to it).
ANSWER_HEADERS = [
    "point",
    "runs ok",
    "fit time (s), geo. mean (min-max)",
    "steady epoch (s), median (min-max)",
    "vs baseline (fit time)",
    "test accuracy",
]
COST_HEADERS = [
    "point",
    "examples/s",
    "first-epoch overhead (s)",
    "fixed cost per step (ms)",
    "GFLOP/s (% of peak)",
    "GPU busy",
    "peak memory",
]
METHOD_PAGE = "docs/reading-a-report.md"  # relative to the repository's top


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def _span(mid: float | None, low: float | None, high: float | None, fmt: str, runs: int) -> str:
    """The figure with the range of its ``runs``; one run has no range to show."""
    if mid is None:
        return "-"
    return f"{mid:{fmt}} (1 run)" if runs == 1 else f"{mid:{fmt}} ({low:{fmt}}-{high:{fmt}})"


def point_row(view: ScenarioView, p: Point) -> dict[str, str]:
    """A point's cells in both tables, by column, and its notes: the figures ``figures`` computes,
    formatted (so the JSON and CSV say the same)."""
    f = figures.point_figures(view, p)
    return {
        **dict(zip(ANSWER_HEADERS, _answer_cells(f), strict=True)),
        **dict(zip(COST_HEADERS, _cost_cells(f), strict=True)),
        "notes": "; ".join(f.notes),
    }


def _answer_cells(f: figures.PointFigures) -> list[str]:
    ratio = figures.ratio_of(f)
    speed = "baseline" if f.is_baseline else ratio.text() if ratio else "-"
    return [
        f.point,
        f"{f.runs_ok}/{f.runs_total}",
        _span(f.fit_s_geomean, f.fit_s_min, f.fit_s_max, ".2f", f.runs_timed),
        _span(f.steady_epoch_s_median, f.steady_epoch_s_min, f.steady_epoch_s_max, ".3f", f.runs_ok),
        speed,
        _num(f.test_accuracy_min, ".3f"),
    ]


def _cost_cells(f: figures.PointFigures) -> list[str]:
    return [
        f.point,
        _num(f.steady_examples_per_s_median, ",.0f"),
        _first_epoch(f.first_epoch_overhead_s_median),
        _step_overhead(f),
        _flops(f),
        _gpu_busy(f),
        _peak_memory(f),
    ]


def _first_epoch(first: float | None) -> str:
    """The first epoch's time beyond a steady one; below zero it is noise, and says so."""
    if first is None:
        return "-"
    return f"{first:.2f}" if first >= 0 else f"{first:.2f} (noise: none measurable)"


def _step_overhead(f: figures.PointFigures) -> str:
    """'X of Y (Z%)': the model with every width 1, trained the same way, against this model's step, in ms."""
    step, floor = f.step_s_median, f.step_floor_s_median
    if step is None or floor is None:
        return "-"
    text = f"{floor * 1e3:.2f} of {step * 1e3:.2f}"
    if floor >= step:
        return f"{text} (all fixed cost, within noise)"
    return f"{text} ({f.fixed_cost_fraction:.0%})"


peak_of = figures.peak_of


def _flops(f: figures.PointFigures) -> str:
    achieved, share = f.achieved_flops_per_s_median, f.peak_fraction
    if achieved is None:
        return "-"
    text = f"{achieved / 1e9:,.1f}"
    if share is None:
        return text
    flag = ": above the measured peak, check the calibration" if share > 1 else ""
    return f"{text} ({share:.1%}{flag})"


NOT_MEASURED = "-"


def _gpu_busy(f: figures.PointFigures) -> str:
    """The mean GPU utilization over the steady epochs; "-" for CPU points and old results."""
    return NOT_MEASURED if f.gpu_busy_percent is None else f"{f.gpu_busy_percent:.0f}%"


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f} GiB"


def _peak_memory(f: figures.PointFigures) -> str:
    """Peak host memory of the run (process tree or container), and of one GPU where sampled."""
    host, gpu = f.peak_memory_bytes, f.peak_gpu_memory_bytes
    if host is None and gpu is None:
        return NOT_MEASURED
    text = gib(host) if host is not None else NOT_MEASURED
    return text + (f" (GPU {gib(gpu)})" if gpu is not None else "")


def _failures(view: ScenarioView) -> list[str]:
    """Runs that did not end ok, one line per status and reason (the full reason, once), with
    how many runs of which points it holds."""
    grouped: dict[tuple[str, str], list[tuple[str, int]]] = {}
    for p in view.points:
        for r in p.runs:
            if not r.ok:
                msg = r.message.splitlines()[0] if r.message else ""
                grouped.setdefault((r.status, msg), []).append((p.label, int(r.spec.get("repetition", 0))))
    out = []
    for (status, msg), runs in grouped.items():
        labels = list(dict.fromkeys(label for label, _ in runs))
        where = f"{len(runs)} run{'s' if len(runs) != 1 else ''} of {_points_text(labels)}"
        out.append(f"- {code(status)}, {cell(where)}" + (f": {cell(msg)}" if msg else ""))
    return out


def _points_text(labels: list[str], limit: int = 8, noun: str = "points") -> str:
    """'width=100, device=gpu' or '3 points (a; b; c)', the list cut after ``limit`` with the count."""
    if len(labels) == 1:
        return labels[0]
    shown = "; ".join(labels[:limit]) + (f"; and {len(labels) - limit} more" if len(labels) > limit else "")
    return f"{len(labels)} {noun} ({shown})"


def _not_compared(view: ScenarioView, verdict: verdicts.Verdict) -> list[str]:
    """A line per reason, its points named as Skips and failures names them (the first few, and how
    many more); the JSON export lists every one. A verdict that compares pairs along a size axis
    names each pair by its size ("width 100": the CPU and the GPU point there): those are counted
    as comparisons, not as points."""
    labels = {p.label for p in view.points}
    return [
        f"- {cell(_points_text(names, noun='points' if set(names) <= labels else 'comparisons'))}: {cell(why)}"
        for why, names in verdict.not_compared_by_reason()
    ]


def _left_out(view: ScenarioView, results_dir: Path | None) -> list[str]:
    """Runs of the shown points measured with other settings: named, never merged into a row."""
    folder = Path(rerun.folder_text(results_dir) or rerun.DEFAULT_RESULTS)
    return [
        f"- {cell(x.label)}: {x.runs} run{'s' if x.runs != 1 else ''} with other settings ({cell(x.differences)}); "
        f"the newest: {code('python -m suite show ' + shlex.quote(str(folder / x.example)))}"
        for x in view.left_out
    ]


def _notes(figs: list[figures.PointFigures], view: ScenarioView) -> list[str]:
    """A line per point that has notes (instability, the accuracy gate, load), below the table."""
    return [f"- {cell(f.point)}: {cell('; '.join(f.notes))}" for f in figs if f.notes]


def plot_name(view: ScenarioView) -> str:
    """``<scenario>.<machine>.png``; a view of ``--set`` runs adds a hash of its overrides."""
    if not view.overrides:
        return f"{view.scenario}.{view.machine}.png"
    digest = hashlib.sha256(json.dumps(view.overrides, sort_keys=True).encode()).hexdigest()[:8]
    return f"{view.scenario}.{view.machine}.set-{digest}.png"


# Beside a verdict drawn from smoke-size runs, where a reader meets it before the page's caveat: a
# check that the scenario runs, whose numbers are not a measurement of the scenario's job.
SMOKE_TAG = ", smoke size"


def view_title(view: ScenarioView) -> str:
    """'On `box`', or 'On `box`, with `--set x=1`' for a view of runs with overrides."""
    return f"On {code(view.machine)}" + (f", with {set_flags(view.overrides)}" if view.overrides else "")


def _table(headers: list[str], rows: list[list[str]]) -> str:
    return tabulate([[cell(c) for c in row] for row in rows], headers=headers, tablefmt="github", disable_numparse=True)


SPEED = ANSWER_HEADERS.index("vs baseline (fit time)")


def _answer_table(figs: list[figures.PointFigures], idle: int) -> list[str]:
    """The table that answers the question, a row for each of ``figs`` (the points that ran; ``idle``
    more did not). A ``vs baseline`` column without a ratio in it (each point that ran is a
    baseline, as on a machine where only the CPU points ran) is left out, and the line below the
    table says why."""
    rows = [_answer_cells(f) for f in figs]
    if any(row[SPEED] not in ("baseline", "-") for row in rows):
        return [_table(ANSWER_HEADERS, rows)]
    headers = [h for i, h in enumerate(ANSWER_HEADERS) if i != SPEED]
    lines = [_table(headers, [[c for i, c in enumerate(row) if i != SPEED] for row in rows]), ""]
    if not all(f.is_baseline for f in figs):
        why = "no point that ran here could be compared with its baseline"
    elif idle:
        who, them = ("every point that ran here", "them") if len(figs) > 1 else ("the one point that ran here", "it")
        why = f"{who} is a baseline, and no point compared with {them} has an ok run (see Skips and failures)"
    else:
        why = (
            "every point here is a baseline, with no other point to compare with them"
            if len(figs) > 1
            else "its one point is the baseline, with no other point to compare with it"
        )
    return [*lines, f"No ratio to a baseline: {why}."]


def _cost_table(figs: list[figures.PointFigures]) -> list[str]:
    """Where the time goes; a column no row measured is left out and named below the table."""
    rows = [_cost_cells(f) for f in figs]
    keep = [i for i in range(len(COST_HEADERS)) if i == 0 or any(row[i] != "-" for row in rows)]
    dropped = [COST_HEADERS[i] for i in range(len(COST_HEADERS)) if i not in keep]
    lines = [_table([COST_HEADERS[i] for i in keep], [[row[i] for i in keep] for row in rows])]
    if dropped:
        lines += ["", f"Not measured for any point here: {', '.join(dropped)}."]
    return lines


def render_scenario(
    views: list[ScenarioView],
    plotted: frozenset[str] = frozenset(),
    results_dir: Path | None = None,
    method_link: str = METHOD_PAGE,
    scenario_files: ScenarioFiles | None = None,
) -> str:
    """The scenario page; ``plotted`` names the PNG files written beside it, to link;
    ``method_link``: where the column definitions are, as a link from the page; ``scenario_files``:
    the scenario files as this report reads them (default: read for this page)."""
    files = scenario_files or ScenarioFiles()
    first = views[0]
    spec = first.spec
    judged = [verdicts.judge(view) for view in views]
    lines = [f"# {cell(first.scenario)}", "", f"**Question:** {cell(spec.get('question', ''))}", ""]
    for view, verdict in zip(views, judged, strict=True):
        lines.append(f"- **{view_title(view)}{SMOKE_TAG if view.smoke else ''}:** {cell(verdict.text)}")
    description = spec.get("report", {}).get("description")
    if description:
        lines += ["", paragraph(description)]
    lines += ["", f"What each column means and how it is computed: [reading a report]({quote(method_link)})."]
    for view, verdict in zip(views, judged, strict=True):
        figs = [figures.point_figures(view, p) for p in view.points]
        ran = [f for f in figs if f.runs_ok]
        lines += ["", f"## {view_title(view)}", ""]
        if said := environment_section.caveat(view):
            lines += [said, ""]
        if view.overrides:
            lines += [
                f"These runs changed the scenario file's settings with {set_flags(view.overrides)}: "
                "they are shown apart from the runs without it, and never compared with them.",
                "",
            ]
        lines.append("### Results")
        if ran:
            lines += ["", *_answer_table(ran, len(figs) - len(ran))]
            notes = _notes(ran, view)
            if notes:
                lines += ["", "Notes:", "", *notes]
        idle = len(figs) - len(ran)
        if idle:
            lines += ["", f"{idle} of {len(figs)} points have no ok run: see Skips and failures below."]
        if plot_name(view) in plotted:
            alt = f"{cell(view.scenario)} on {cell(view.machine)}"
            lines += ["", f"![{alt}]({quote(plot_name(view))})"]
        if ran:
            lines += ["", "### Where the time goes", "", *_cost_table(ran)]
        # Where no point ran, each is under Skips and failures with its reason: the list adds nothing.
        not_compared = _not_compared(view, verdict) if ran else []
        if not_compared:
            lines += ["", "### Not compared", "", *not_compared]
        failures = _failures(view)
        if failures:
            lines += ["", "### Skips and failures", "", *failures]
        left_out = _left_out(view, results_dir)
        if left_out:
            lines += [
                "",
                "### Not shown: runs under other settings",
                "",
                "Each point shows its newest settings; these runs of the same points were measured otherwise:",
                "",
                *left_out,
            ]
        lines += ["", "### Environment", "", *environment_section.environment_lines(view, files)]
        lines += ["", "### Reproduce", "", code(rerun.run_commands(view, results_dir, files))]
        if ran:  # a page of skips and failures only has no number to check
            lines += ["", f"To check these numbers: {code(rerun.check_command(view, results_dir))}"]
    return "\n".join(lines) + "\n"


def results_where(results_dir: Path | None, out_dir: Path | None) -> str:
    """The results folder as the index names it: relative to the index where inside its folder
    (``results/`` for the default), else as a command names it (report/rerun)."""
    if results_dir is None or out_dir is None:
        return "results/"
    inside = os.path.relpath(os.path.realpath(results_dir), os.path.realpath(out_dir))
    if inside != ".." and not inside.startswith("../"):
        return f"{Path(inside).as_posix()}/"
    return f"{rerun.folder_text(results_dir) or rerun.DEFAULT_RESULTS}/"


def render_index(
    by_scenario: dict[str, list[ScenarioView]],
    selection: str | None = None,
    results_dir: Path | None = None,
    out_dir: Path | None = None,
) -> str:
    rows = []
    for name, views in sorted(by_scenario.items()):
        for view in views:
            machine = cell(view.machine) + (f" ({set_flags(view.overrides, in_table=True)})" if view.overrides else "")
            machine += SMOKE_TAG if view.smoke else ""
            answer = verdicts.judge(view).first_sentence
            rows.append([f"[{cell(name)}]({quote(name)}.md)", machine, cell(answer)])
    table = tabulate(rows, headers=["scenario", "machine", "verdict"], tablefmt="github", disable_numparse=True)
    if selection is not None:
        head = (
            f"# Reports: the points {code('-k ' + selection)} takes\n\nGenerated by `python -m suite report -k`; the "
            "full pages are one folder up, untouched by this cut.\n\n"
        )
    else:
        head = (
            "# Reports\n\nGenerated by `python -m suite report` from the result files under "
            f"{code(results_where(results_dir, out_dir))} "
            "(one folder per machine). Regenerating from the same files gives the same bytes. "
            "[hardware.md](hardware.md) sets the machines side by side.\n\n"
        )
    return head + table + "\n"


class UnknownReference(ValueError):
    """``--reference`` names no machine of the results."""


def selected_dir(out_dir: Path) -> Path:
    """Where ``report -k`` writes its pages and exports: a folder of their own inside ``--out``."""
    return out_dir / "selected"


def write_reports(
    results_dir: Path,
    out_dir: Path,
    reference: str | None = None,
    select: str | None = None,
    loaded: list[tuple[Path, RunResult]] | None = None,
    scenario_files: ScenarioFiles | None = None,
) -> list[writing.Wrote]:
    """Scenario pages, their plots, the index and the hardware comparison; returns each file written,
    with the sha256 of its bytes.

    ``select``: a ``-k`` expression; only the points it takes are shown, each page and the index say
    so, and no ``hardware.md`` is written. ``report -k`` writes such a cut into ``selected_dir``
    (``--out``/selected), never over the full report's pages and index. ``loaded``: the files of
    ``results_dir`` as already read (``results.load_folder``). ``scenario_files``: where the pages
    read the scenario files the results name, each once (report/up_to_date keeps what they held).
    """
    by_scenario: dict[str, list[ScenarioView]] = defaultdict(list)
    every = load_views(results_dir) if loaded is None else group_views(results_dir, loaded)
    machines = sorted({v.machine for v in every})
    if reference is not None and reference not in machines:
        raise UnknownReference(
            f"--reference {reference!r}: no such machine in {results_dir}; machines: {', '.join(machines) or 'none'}"
        )
    for view in select_views(every, select):
        by_scenario[view.scenario].append(view)
    out_dir.mkdir(parents=True, exist_ok=True)
    method_link = _method_link(out_dir)
    written = []
    for name, views in sorted(by_scenario.items()):
        plotted = set()
        for view in views:
            png = plots.render(view)
            if png is not None:
                written.append(writing.write(out_dir / plot_name(view), png))
                plotted.add(plot_name(view))
        page = render_scenario(views, frozenset(plotted), results_dir, method_link, scenario_files)
        written.append(writing.write(out_dir / f"{name}.md", page))
    written.append(writing.write(out_dir / "README.md", render_index(by_scenario, select, results_dir, out_dir)))
    if select is None:
        # Machines side by side on the scenario files' own settings: --set runs are not another machine.
        plain = [v for views in by_scenario.values() for v in views if not v.overrides]
        written.append(writing.write(out_dir / "hardware.md", compare.render(plain, reference)))
    return written


def _method_link(out_dir: Path) -> str:
    """The column definitions' page as a link from ``out_dir``: relative inside this checkout (pages
    published in ``reports/`` link to ``../docs/...``), else the page's path in the repository (an
    installed suite has no docs beside it)."""
    if paths.CHECKOUT is None:
        return METHOD_PAGE
    try:
        out_dir.resolve().relative_to(paths.CHECKOUT)
    except (OSError, ValueError):
        return METHOD_PAGE  # a folder outside the checkout: a link into it would name where it lies
    return Path(os.path.relpath(paths.CHECKOUT / METHOD_PAGE, out_dir.resolve())).as_posix()
