"""Results -> Markdown. A pure function of the result files: same files, same bytes.

One page per scenario (``<scenario>.md``) with a section per machine, and an index
(``README.md``). Tables through tabulate's ``github`` format; every cell is escaped.
"""

from __future__ import annotations

import json
import shlex
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import quote

from tabulate import tabulate

from suite import compare, export, plots, provenance, stats, verdicts
from suite.markdown import cell, code, paragraph
from suite.plan import override_flag
from suite.results import (
    DATA_DETAIL,
    DATA_SOURCE,
    ENV_GPUS,
    ENV_HOST,
    ENV_VERSIONS,
    FLOPS_COUNTED,
    RUN_BACKEND,
    RUN_IMAGE,
)
from suite.select import expression_for, select_views
from suite.views import Point, ScenarioView, load_views

__all__ = ["cell", "render_index", "render_scenario", "write_reports"]

HEADERS = [
    "point",
    "status",
    "runs",
    "fit time, median (s)",
    "steady epoch, median (min-max) (s)",
    "examples/s",
    "first-epoch overhead (s)",
    "fixed cost per step (ms)",
    "GFLOP/s (% of peak)",
    "GPU busy %",
    "peak memory",
    "speedup vs baseline",
    "test accuracy",
    "notes",
]


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def _row(view: ScenarioView, p: Point) -> list[str]:
    """The table row: the figures ``export`` computes, formatted (so the JSON and CSV say the same)."""
    return [cell(c) for c in _cells(export.point_figures(view, p))]


def _cells(f: export.PointFigures) -> list[str]:
    ratio = export.ratio_of(f)
    speed = "baseline" if f.is_baseline else ratio.text() if ratio else "-"
    steady = (
        f"{f.steady_epoch_s_median:.3f} ({f.steady_epoch_s_min:.3f}-{f.steady_epoch_s_max:.3f})"
        if f.steady_epoch_s_median is not None
        else "-"
    )
    return [
        f.point,
        f.status,
        f"{f.runs_ok}/{f.runs_total}",
        _num(f.fit_s_median),
        steady,
        _num(f.steady_examples_per_s_median, ",.0f"),
        _first_epoch(f.first_epoch_overhead_s_median),
        _step_overhead(f),
        _flops(f),
        _gpu_busy(f),
        _peak_memory(f),
        speed,
        _num(f.test_accuracy_min, ".3f"),
        "; ".join(f.notes),
    ]


def _first_epoch(first: float | None) -> str:
    """The first epoch's time beyond a steady one; below zero it is noise, and says so."""
    if first is None:
        return "-"
    return f"{first:.2f}" if first >= 0 else f"{first:.2f} (noise: none measurable)"


def _step_overhead(f: export.PointFigures) -> str:
    """'X of Y (Z%)': the model with every width 1, trained the same way, against this model's step, in ms."""
    step, floor = f.step_s_median, f.step_floor_s_median
    if step is None or floor is None:
        return "-"
    text = f"{floor * 1e3:.2f} of {step * 1e3:.2f}"
    if floor >= step:
        return f"{text} (at or above the step time: all fixed cost, within noise)"
    return f"{text} ({f.fixed_cost_fraction:.0%})"


peak_of = export.peak_of


def _flops(f: export.PointFigures) -> str:
    achieved, share = f.achieved_flops_per_s_median, f.peak_fraction
    if achieved is None:
        return "-"
    text = f"{achieved / 1e9:,.1f}"
    if share is None:
        return text
    flag = ": above the measured peak, check the calibration" if share > 1 else ""
    return f"{text} ({share:.1%}{flag})"


NOT_MEASURED = "not measured"


def _gpu_busy(f: export.PointFigures) -> str:
    """The mean GPU utilization over the steady epochs; "not measured" for CPU points and old results."""
    if not f.runs_ok:
        return "-"
    return NOT_MEASURED if f.gpu_busy_percent is None else f"{f.gpu_busy_percent:.0f}%"


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f} GiB"


def _peak_memory(f: export.PointFigures) -> str:
    """Peak host memory of the run (process tree or container), and of one GPU where sampled."""
    if not f.runs_ok:
        return "-"
    host, gpu = f.peak_memory_bytes, f.peak_gpu_memory_bytes
    if host is None and gpu is None:
        return NOT_MEASURED
    text = gib(host) if host is not None else NOT_MEASURED
    return text + (f" (GPU {gib(gpu)})" if gpu is not None else "")


def _environment(view: ScenarioView) -> list[str]:
    r = view.newest
    env, run = r.environment, r.run
    host, versions = env.get(ENV_HOST.key, {}), env.get(ENV_VERSIONS.key, {})
    lines = [
        f"- Machine: {code(view.machine)}, backend {code(run.get(RUN_BACKEND.key, '?'))}"
        + (f", image {code(run[RUN_IMAGE.key])}" if run.get(RUN_IMAGE.key) else ""),
        f"- CPU: {cell(host.get('cpu_model', '?'))}, {cell(host.get('cpu_count', '?'))} logical cores",
        f"- GPUs: {cell(_gpu_text(view))}",
        f"- Python {cell(host.get('python', '?'))}, TensorFlow {cell(versions.get('tensorflow', '-'))}, "
        f"Keras {cell(versions.get('keras', '?'))} (backend {cell(versions.get('keras_backend', '?'))}), "
        f"CUDA/cuDNN built for: {cell(versions.get('tf_cuda_build') or '-')}"
        f"/{cell(versions.get('tf_cudnn_build') or '-')}",
        *_provenance_lines(view),
    ]
    sources = sorted({p.ok_runs[0].quality.get(DATA_SOURCE.key, "?") for p in view.points if p.ok_runs})
    lines.append(f"- Data: {cell(', '.join(sources) or 'no run completed')}")
    if "synthetic" in sources:
        detail = next(p.ok_runs[0].quality.get(DATA_DETAIL.key, "") for p in view.points if p.ok_runs)
        lines.append(f"- **The data was synthetic** (MNIST's shapes, not its digits): {cell(detail)}")
    if view.smoke:
        lines.append(
            "- **Smoke size**: fewer samples and epochs than the scenario; a check that it runs, not a measurement"
        )
    lines += _overrides_lines(view)
    lines += [f"- Also on file: {cell(o)}" for o in view.other_sizes]
    return lines


def _provenance_lines(view: ScenarioView) -> list[str]:
    """The suite revision, environment lock and image the page's runs came from: one value each, or
    every value with its number of runs when the runs do not all share it (never the newest alone)."""
    runs = view.provenance_runs
    sections = [provenance.of_result(r.provenance, r.run) for r in runs]
    suites = [provenance.suite_text(s.get("suite"), markdown=True, paths=5) for s in sections]
    lines = [
        _provenance_line("Suite revision", "suite revisions", suites),
        _provenance_line("Environment lock", "environment locks", [_lock_md(s.get("environment")) for s in sections]),
    ]
    changed = [text for s in sections if (text := provenance.changed_during_run_text(s, markdown=True))]
    if changed:
        lines.append(_changed_line(changed, len(sections)))
    images = [_image_md(s["image"], r.run) for s, r in zip(sections, runs, strict=True) if s.get("image")]
    if images:
        lines.append(_provenance_line("Image", "images", images))
    return lines


def _changed_line(at_end: list[str], total: int) -> str:
    """Local runs whose checkout changed between their launch and their end: the suite revision
    line gives their code at launch; they may have imported some of the code at their end."""
    n = f"{len(at_end)} of {total} run{'s' if total != 1 else ''}"
    ends = "; ".join(dict.fromkeys(at_end))
    return f"- **The suite's code changed while {n} ran** (above: the code at launch); at the end: {ends}"


def _provenance_line(label: str, plural: str, values: list[str]) -> str:
    counts: dict[str, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    if len(counts) == 1:
        return f"- {label}: {values[0]}"
    listed = "; ".join(f"{v} ({n} run{'s' if n != 1 else ''})" for v, n in sorted(counts.items(), key=lambda c: -c[1]))
    return f"- {label}: runs on this page came from {len(counts)} {plural}: {listed}"


def _lock_md(environment: dict[str, Any] | None) -> str:
    if not environment:
        return "not recorded"
    differences = environment.get("lock_differences") or []
    lock_file, sha = environment.get("lock_file"), environment.get("lock_sha256")
    if not (lock_file and sha):
        why = provenance.no_lock_reason(differences)
        return "not from a lock" + (f" ({cell(why)})" if why else "")
    text = f"{code(lock_file)} (sha256 {code(provenance.short(sha))})"
    if environment.get("matches_lock") is False:
        text += f"; installed packages differ from the lock: {cell('; '.join(differences))}"
    elif environment.get("matches_lock") is None and differences:
        text += f"; not checked against it: {cell('; '.join(differences))}"
    return text


def _image_md(image: dict[str, Any], run: dict[str, Any]) -> str:
    """ID, digest, recipe hash and base. An image the engine knows no registry digest of (RepoDigests
    empty: built on the engine, never pushed or pulled) says so; a record made before runs recorded
    the digests says that instead. The base: one recipe built on another base is another image
    (other OS libraries, another Python build)."""
    recipe, digest = image.get("recipe_hash"), image.get("digest")
    digest_text = code(digest) if digest else provenance.digest_text(image, run)
    return (
        f"ID {code(provenance.short(image.get('id')))}, digest {digest_text}, recipe "
        + (code(provenance.short(recipe)) if recipe else "not recorded (built before images carried one)")
        + f", base: {provenance.base_text(image, markdown=True)}"
    )


def _override_groups(view: ScenarioView) -> list[tuple[dict[str, Any], list[Point]]]:
    """The ``--set`` overrides the shown points ran with, each with its points, in the page's order
    (a point's repetitions share one fingerprint, so one config: its first run speaks for it)."""
    groups: dict[str, tuple[dict[str, Any], list[Point]]] = {}
    for p in view.points:
        overrides = dict(p.runs[0].spec.get("overrides") or {}) if p.runs else {}
        groups.setdefault(json.dumps(overrides, sort_keys=True), (overrides, []))[1].append(p)
    return list(groups.values())


def _set_flags(overrides: dict[str, Any]) -> str:
    return " ".join(code(f"--set {override_flag(k, v)}") for k, v in overrides.items())


def _overrides_lines(view: ScenarioView) -> list[str]:
    """What ``run --set`` changed from the scenario file; nothing when every point ran as the file says."""
    groups = _override_groups(view)
    if len(groups) == 1:
        overrides = groups[0][0]
        return [f"- Changed from the scenario file (every point): {_set_flags(overrides)}"] if overrides else []
    lines = []
    for overrides, points in groups:
        labels = "; ".join(p.label for p in points)
        if overrides:
            lines.append(f"- Changed from the scenario file for {cell(labels)}: {_set_flags(overrides)}")
        else:
            lines.append(f"- As the scenario file says (no `--set`) for {cell(labels)}")
    return lines


def _gpu_text(view: ScenarioView) -> str:
    """The GPUs the GPU points ran on, from those runs' own records; never a CPU run's view."""
    seen: dict[str, None] = {}
    for r in view.gpu_runs:
        for g in ENV_GPUS.of(r) or []:
            seen[f"{g.get('name')} ({g.get('memory_mib')} MiB, driver {g.get('driver')})"] = None
    if seen:
        return ", ".join(seen)
    if any(p.device.startswith("gpu") for p in view.points):
        return "none: no GPU point ran"
    return "none used (no GPU point in this scenario)"


def _failures(view: ScenarioView) -> list[str]:
    out = []
    for p in view.points:
        for r in p.runs:
            if not r.ok:
                msg = r.message.splitlines()[0] if r.message else ""
                rep = r.spec.get("repetition", 0)
                out.append(f"- {cell(p.label)}, repetition {cell(rep)}: {code(r.status)}: {cell(msg)}")
    return out


REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RESULTS = Path("reports") / "results"  # what ``run --results`` and ``report --results`` default to


def _folder_text(results_dir: Path | None) -> str | None:
    """The results folder as a command names it: relative to the repository's top when inside it
    (commands run there, and a page must not depend on where this checkout lies); None for the default."""
    if results_dir is None:
        return None
    path = Path(results_dir)
    try:
        path = path.resolve().relative_to(REPO_ROOT)
    except (OSError, ValueError):
        pass
    return None if path == DEFAULT_RESULTS else str(path)


def _repeats(view: ScenarioView) -> int:
    """How many repetitions the runs recorded: the most any shown point has (a point whose later
    repetitions did not finish has fewer files, not a smaller ``--repeats``)."""
    return max((int(r.spec.get("repetition", 0)) + 1 for p in view.points for r in p.runs), default=1)


def _takes_every_point(view: ScenarioView) -> bool:
    """Whether the page's points are every point its scenario file has at this size: then ``run``
    needs no ``-k``. False when the file cannot be read or has other points (the runs were chosen
    with ``run -k``, which the results do not record, or the file changed since)."""
    from suite import plan, scenario

    name = view.spec.get("scenario_file")
    if not name:
        return False
    try:
        specs = plan.expand(scenario.load(REPO_ROOT / name), smoke=view.smoke, repeats=1)
    except Exception:  # noqa: BLE001 - any unreadable or invalid file: name the points instead
        return False
    return {s.point_label for s in specs} == {p.label for p in view.points}


def _reproduce(view: ScenarioView, results_dir: Path | None = None) -> str:
    """The commands that measure the shown points again, as they were measured, and remake the page.

    Every recorded choice that changes what runs is carried: the backend, the smoke size, the
    number of repetitions, the ``--set`` overrides (points run with different ones get a ``run``
    each), and the points: ``-k`` naming them when they are not every point of the scenario file
    (a page cut with ``report -k`` repeats that ``-k``). The results folder and the machine's name
    are carried too, so ``report`` reads what ``run`` wrote, as the page was made. On a machine
    whose folder already holds these results, ``run`` skips every point that has an ok result: the
    reproduce command (``_check``) is the one that measures them again there and compares.
    """
    spec, run = view.spec, view.newest.run
    folder = _folder_text(results_dir)
    base = ["python -m suite run", shlex.quote(spec.get("scenario_file", f"scenarios/{view.scenario}.yaml"))]
    base.append(f"--backend {shlex.quote(str(run.get(RUN_BACKEND.key, 'local')))}")
    if view.smoke:
        base.append("--smoke")
    base.append(f"--repeats {_repeats(view)}")
    if folder:
        base.append(f"--results {shlex.quote(folder)}")
    base.append(f"--machine {shlex.quote(view.machine)}")
    selection = getattr(view, "selection", None)  # suite.select.SelectedView: the page was cut with -k
    groups = _override_groups(view) or [({}, [])]
    every = _takes_every_point(view)
    commands = []
    for overrides, points in groups:
        parts = list(base)
        if len(groups) > 1:
            parts.append(f"-k {shlex.quote(expression_for([(p.coords, p.label) for p in points]))}")
        elif selection:
            parts.append(f"-k {shlex.quote(selection)}")
        elif not every and view.points:
            parts.append(f"-k {shlex.quote(expression_for([(p.coords, p.label) for p in view.points]))}")
        parts += [f"--set {shlex.quote(override_flag(k, v))}" for k, v in overrides.items()]
        commands.append(" ".join(parts))
    again = "python -m suite report" + (f" --results {shlex.quote(folder)}" if folder else "")
    again += f" -k {shlex.quote(selection)}" if selection else ""
    return " && ".join([*commands, again])


def _check(view: ScenarioView, results_dir: Path | None) -> str:
    """The command that reruns this machine's results of the scenario here and says whether each
    point's time came out again (``suite reproduce``, docs/reproduce.md)."""
    folder = Path(_folder_text(results_dir) or DEFAULT_RESULTS) / view.machine / view.scenario
    selection = getattr(view, "selection", None)
    return f"python -m suite reproduce {shlex.quote(str(folder))}" + (
        f" -k {shlex.quote(selection)}" if selection else ""
    )


def _method(views: list[ScenarioView]) -> str:
    """How every column is computed, with the FLOP count as the results themselves record it."""
    runs = [r for view in views for p in view.points for r in p.ok_runs]
    counted = sorted({str(r.work[FLOPS_COUNTED.key]) for r in runs if FLOPS_COUNTED.key in r.work})
    flops = "; ".join(counted) or "not recorded"
    return (
        "*Fit time*: the whole `model.fit`, the figure the original questions "
        "compared; median over repetitions, each a fresh process or container. *Steady epoch*: each run's "
        "median epoch after the first, median (min-max) over repetitions; *examples/s* follows from it. "
        "*First-epoch overhead*: the first epoch's time beyond a steady one (tracing, compilation); below "
        "zero it is noise. *Fixed cost per step*: the step time of the same model with its arithmetic taken "
        "away (an MLP with every hidden width 1, a CNN with one filter per conv layer and a dense width of 1), "
        "trained the same way (depth, kernel size, pooling, activation, dropout, optimizer, data, batch, "
        "steps_per_execution, dtype policy, devices; median of 3 epochs after a first), against this model's "
        "step: the part of each step that is not arithmetic. *GFLOP/s*: steady examples/s times the FLOPs per "
        f"example counted as {cell(flops)}. *% of peak*: against one device's peak times the number of GPUs: a "
        "chain of square matmuls in the run's compute dtype (median of 7 batches), timed inside the first run of "
        "each `suite run` "
        "with the same backend, image, device kind, dtype and thread setting, and used for the later runs with "
        "that key; float32 on NVIDIA GPUs from Ampere on may run as TF32, which the result records. "
        f"*Speedup*: the baseline's fit time over this point's, the {cell(stats.METHOD)}: the geometric means, "
        "not the medians shown (they agree under log-normal noise and part when one repetition is far off); "
        '"not significant" when the interval holds 1, and no difference that is not significant is called a gain. '
        "*GPU busy %*: the share of time the run's GPUs were executing a kernel (NVML's utilization, sampled at "
        "5 Hz on the machine the GPUs are in, through NVML or nvidia-smi), averaged over the steady epochs (the "
        "fit after its first epoch, as the worker's progress lines mark it; the whole fit when that holds "
        "under 5 samples; never the whole run, so a result without a fit window has none) and over the run's "
        "GPUs, then the "
        "plain mean across repetitions (a share of time: equal runs weigh equally); busy is not the same as "
        "fully used, a single small kernel counts; each reading covers a trailing window of up to a second "
        "(by product), so the window's edges blur by that much. *Peak memory*: the largest over repetitions "
        "of each run's "
        "peak host memory: for a local run the worker's process tree (summed resident memory sampled at 5 Hz, "
        "or the kernel's high-water mark of its largest process if higher), for a container the engine's "
        "memory usage less inactive file cache, as `docker stats` shows it (the engine "
        "reports about once a second, so a shorter spike can be missed; it leaves out most of the mapped "
        "libraries a local run's resident memory "
        "counts, so the two "
        "backends' figures are not comparable); in brackets the most memory used on one GPU, the device as a "
        'whole. "not measured": the '
        "result has no such samples (a CPU point for GPU busy, a result recorded before telemetry)."
    )


def plot_name(view: ScenarioView) -> str:
    return f"{view.scenario}.{view.machine}.png"


def render_scenario(
    views: list[ScenarioView], plotted: frozenset[str] = frozenset(), results_dir: Path | None = None
) -> str:
    """The scenario page; ``plotted`` names the PNG files written beside it, to link."""
    first = views[0]
    spec = first.spec
    lines = [f"# {cell(first.scenario)}", "", f"**Question:** {cell(spec.get('question', ''))}", ""]
    for view in views:
        lines.append(f"- **Verdict ({cell(view.machine)}):** {cell(verdicts.verdict(view))}")
    description = spec.get("report", {}).get("description")
    if description:
        lines += ["", paragraph(description)]
    for view in views:
        rows = [_row(view, p) for p in view.points]
        lines += ["", f"## On {code(view.machine)}", "", "### Environment", "", *_environment(view)]
        lines += ["", "### Results", "", tabulate(rows, headers=HEADERS, tablefmt="github", disable_numparse=True)]
        if plot_name(view) in plotted:
            alt = f"{cell(view.scenario)} on {cell(view.machine)}"
            lines += ["", f"![{alt}]({quote(plot_name(view))})"]
        failures = _failures(view)
        if failures:
            lines += ["", "### Failures and skips", "", *failures]
        lines += ["", "### Reproduce", "", code(_reproduce(view, results_dir))]
        lines += ["", f"To check these numbers: {code(_check(view, results_dir))}"]
    lines += ["", "## How each column is computed", "", _method(views)]
    return "\n".join(lines) + "\n"


def render_index(by_scenario: dict[str, list[ScenarioView]]) -> str:
    rows = []
    for name, views in sorted(by_scenario.items()):
        for view in views:
            rows.append([f"[{cell(name)}]({quote(name)}.md)", cell(view.machine), cell(verdicts.verdict(view))])
    table = tabulate(rows, headers=["scenario", "machine", "verdict"], tablefmt="github", disable_numparse=True)
    return (
        "# Reports\n\nGenerated by `python -m suite report` from the result files under `results/` "
        "(one folder per machine). Regenerating from the same files gives the same bytes. "
        "[hardware.md](hardware.md) sets the machines side by side.\n\n" + table + "\n"
    )


def write_reports(
    results_dir: Path, out_dir: Path, reference: str | None = None, select: str | None = None
) -> list[Path]:
    """Scenario pages, their plots, the index and the hardware comparison; returns the paths written.

    ``select``: a ``-k`` expression; only the points it takes are shown, and each page says so.
    """
    by_scenario: dict[str, list[ScenarioView]] = defaultdict(list)
    for view in select_views(load_views(results_dir), select):
        by_scenario[view.scenario].append(view)
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for name, views in sorted(by_scenario.items()):
        plotted = set()
        for view in views:
            png = plots.render(view)
            if png is not None:
                written.append(_write(out_dir / plot_name(view), png))
                plotted.add(plot_name(view))
        written.append(_write(out_dir / f"{name}.md", render_scenario(views, frozenset(plotted), results_dir)))
    written.append(_write(out_dir / "README.md", render_index(by_scenario)))
    all_views = [v for views in by_scenario.values() for v in views]
    written.append(_write(out_dir / "hardware.md", compare.render(all_views, reference)))
    return written


def _write(path: Path, content: str | bytes) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    tmp.replace(path)
    return path
