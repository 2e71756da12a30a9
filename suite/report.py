"""Results -> Markdown. A pure function of the result files: same files, same bytes.

One page per scenario (``<scenario>.md``) with a section per machine, and an index
(``README.md``). Tables through tabulate's ``github`` format; every cell is escaped.
"""

from __future__ import annotations

import shlex
from collections import defaultdict
from pathlib import Path
from typing import Any
from urllib.parse import quote

import numpy as np
from tabulate import tabulate

from suite import compare, plots, stats, verdicts
from suite.markdown import cell, code, paragraph
from suite.plan import parse_device
from suite.results import (
    ACHIEVED_FLOPS_PER_S,
    DATA_DETAIL,
    DATA_SOURCE,
    ENV_GPUS,
    ENV_HOST,
    ENV_VERSIONS,
    FIRST_EPOCH_OVERHEAD_S,
    FIT_S,
    FLOPS_COUNTED,
    PEAK,
    RUN_BACKEND,
    RUN_IMAGE,
    STEADY_EPOCH_S,
    STEADY_EXAMPLES_PER_S,
    STEADY_INCLUDES_FIRST_EPOCH,
    STEP_FLOOR_S,
    STEP_S,
)
from suite.views import ACCURACY_GATE, Point, ScenarioView, load_views

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
    fit = p.summary(FIT_S)
    steady = p.summary(STEADY_EPOCH_S)
    eps = p.summary(STEADY_EXAMPLES_PER_S)
    first = p.summary(FIRST_EPOCH_OVERHEAD_S)
    notes = []
    if fit and fit.unstable:
        notes.append(f"unstable: fit times spread {fit.spread:.0%}")
    if stats.first_is_outlier(p.values(FIT_S)):
        notes.append("first repetition an outlier")
    if p.ok_runs and not p.passes_gate:
        notes.append(f"below the accuracy gate ({ACCURACY_GATE:.0%}): excluded from the verdict")
    if any(STEADY_INCLUDES_FIRST_EPOCH.of(r) for r in p.ok_runs):
        notes.append("one epoch: the steady epoch includes tracing and compilation")
    if steady and first and first.median > 2 * steady.median:
        notes.append("first epoch much slower (tracing/compilation)")
    base = view.baseline_for(p)
    if base is None or base is p:
        speed = "baseline" if base is p else "-"
    elif fit and base.summary(FIT_S):
        speed = stats.ratio(base.values(FIT_S), p.values(FIT_S)).text()
    else:
        speed = "-"
    steady_text = f"{steady.median:.3f} ({steady.low:.3f}-{steady.high:.3f})" if steady else "-"
    row = [
        p.label,
        p.status,
        f"{len(p.ok_runs)}/{len(p.runs)}",
        _num(fit.median if fit else None),
        steady_text,
        _num(eps.median if eps else None, ",.0f"),
        _first_epoch(first),
        _step_overhead(p),
        _flops(p),
        _gpu_busy(p),
        _peak_memory(p),
        speed,
        _num(p.accuracy, ".3f"),
        "; ".join(notes),
    ]
    return [cell(c) for c in row]


def _first_epoch(first: stats.Summary | None) -> str:
    """The first epoch's time beyond a steady one; below zero it is noise, and says so."""
    if first is None:
        return "-"
    return f"{first.median:.2f}" if first.median >= 0 else f"{first.median:.2f} (noise: none measurable)"


def _step_overhead(p: Point) -> str:
    """'X of Y (Z%)': the model with every width 1, trained the same way, against this model's step, in ms."""
    step, floor = p.summary(STEP_S), p.summary(STEP_FLOOR_S)
    if not (step and floor):
        return "-"
    text = f"{floor.median * 1e3:.2f} of {step.median * 1e3:.2f}"
    if floor.median >= step.median:
        return f"{text} (at or above the step time: all fixed cost, within noise)"
    return f"{text} ({floor.median / step.median:.0%})"


def peak_of(run: Any) -> float | None:
    """The calibrated peak of the device set in the run's compute dtype: per-device peak x GPUs
    (logical CPU devices share one CPU, so one peak)."""
    peak = PEAK.of(run) or {}
    if not peak.get("flops_per_s"):
        return None
    kind, count = parse_device(str(run.spec["config"]["device"]))
    return peak["flops_per_s"] * (count if kind == "gpu" else 1)


def _flops(p: Point) -> str:
    achieved = p.summary(ACHIEVED_FLOPS_PER_S)
    if not achieved:
        return "-"
    peaks = [peak_of(r) for r in p.ok_runs if peak_of(r)]
    text = f"{achieved.median / 1e9:,.1f}"
    if not peaks:
        return text
    share = achieved.median / float(np.median(peaks))
    flag = ": above the measured peak, check the calibration" if share > 1 else ""
    return f"{text} ({share:.1%}{flag})"


NOT_MEASURED = "not measured"


def _gpu_busy(p: Point) -> str:
    """The mean GPU utilization over the steady epochs; "not measured" for CPU points and old results."""
    if not p.ok_runs:
        return "-"
    busy = p.gpu_busy
    return NOT_MEASURED if busy is None else f"{busy:.0f}%"


def gib(n_bytes: float) -> str:
    return f"{n_bytes / 2**30:.2f} GiB"


def _peak_memory(p: Point) -> str:
    """Peak host memory of the run (process tree or container), and of one GPU where sampled."""
    if not p.ok_runs:
        return "-"
    host, gpu = p.peak_memory, p.peak_gpu_memory
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
    lines += [f"- Also on file: {cell(o)}" for o in view.other_sizes]
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


def _reproduce(view: ScenarioView) -> str:
    spec, run = view.spec, view.newest.run
    parts = ["python -m suite run", shlex.quote(spec.get("scenario_file", f"scenarios/{view.scenario}.yaml"))]
    parts.append(f"--backend {shlex.quote(str(run.get(RUN_BACKEND.key, 'local')))}")
    if view.smoke:
        parts.append("--smoke")
    return " ".join(parts) + " && python -m suite report"


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
        "memory usage less inactive file cache, as `docker stats` shows it, or the engine's high-water mark "
        "where it keeps one (cgroup v1; it includes file cache; cgroup v2 gives none) if higher (the engine "
        "reports about once a second; it leaves out most of the mapped libraries a local run's resident memory "
        "counts, so the two "
        "backends' figures are not comparable); in brackets the most memory used on one GPU, the device as a "
        'whole. "not measured": the '
        "result has no such samples (a CPU point for GPU busy, a result recorded before telemetry)."
    )


def plot_name(view: ScenarioView) -> str:
    return f"{view.scenario}.{view.machine}.png"


def render_scenario(views: list[ScenarioView], plotted: frozenset[str] = frozenset()) -> str:
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
        lines += ["", "### Reproduce", "", code(_reproduce(view))]
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


def write_reports(results_dir: Path, out_dir: Path, reference: str | None = None) -> list[Path]:
    """Scenario pages, their plots, the index and the hardware comparison; returns the paths written."""
    by_scenario: dict[str, list[ScenarioView]] = defaultdict(list)
    for view in load_views(results_dir):
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
        written.append(_write(out_dir / f"{name}.md", render_scenario(views, frozenset(plotted))))
    written.append(_write(out_dir / "README.md", render_index(by_scenario)))
    all_views = [v for views in by_scenario.values() for v in views]
    written.append(_write(out_dir / "hardware.md", compare.render(all_views, reference)))
    return written


def _write(path: Path, content: str | bytes) -> Path:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(content if isinstance(content, bytes) else content.encode("utf-8"))
    tmp.replace(path)
    return path
