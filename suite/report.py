"""Results -> Markdown. A pure function of the result files: same files, same bytes.

One page per scenario (``<scenario>.md``) with a section per machine, and an index
(``README.md``). Tables through tabulate's ``github`` format; every cell is escaped.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

from tabulate import tabulate

from suite import plots, stats, verdicts
from suite.plan import parse_device
from suite.views import ACCURACY_GATE, Point, ScenarioView, load_views

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
    "speedup vs baseline",
    "test accuracy",
    "notes",
]


def cell(value: Any) -> str:
    """Text safe inside a Markdown table cell."""
    return str(value).replace("\\", "\\\\").replace("|", "\\|").replace("\r", " ").replace("\n", " ").strip()


def _num(value: float | None, fmt: str = ".2f") -> str:
    return "-" if value is None else format(value, fmt)


def _row(view: ScenarioView, p: Point) -> list[str]:
    fit = p.summary("timing", "fit_s")
    steady = p.summary("timing", "steady_epoch_s")
    eps = p.summary("timing", "steady_examples_per_s")
    first = p.summary("timing", "first_epoch_overhead_s")
    notes = []
    if fit and fit.unstable:
        notes.append(f"unstable: fit times spread {fit.spread:.0%}")
    if stats.first_is_outlier(p.values("timing", "fit_s")):
        notes.append("first repetition an outlier")
    if p.ok_runs and not p.passes_gate:
        notes.append(f"below the accuracy gate ({ACCURACY_GATE:.0%}): excluded from the verdict")
    if steady and first and first.median > 2 * steady.median:
        notes.append("first epoch much slower (tracing/compilation)")
    base = view.baseline_for(p)
    if base is None or base is p:
        speed = "baseline" if base is p else "-"
    elif fit and base.summary("timing", "fit_s"):
        speed = stats.ratio(base.values("timing", "fit_s"), p.values("timing", "fit_s")).text()
    else:
        speed = "-"
    steady_text = f"{steady.median:.3f} ({steady.low:.3f}-{steady.high:.3f})" if steady else "-"
    return [
        p.label,
        p.status,
        f"{len(p.ok_runs)}/{len(p.runs)}",
        _num(fit.median if fit else None),
        steady_text,
        _num(eps.median if eps else None, ",.0f"),
        _num(first.median if first else None),
        _step_overhead(p),
        _flops(p),
        speed,
        _num(p.accuracy, ".3f"),
        "; ".join(notes),
    ]


def _step_overhead(p: Point) -> str:
    """'X of Y': the near-empty model's step time against this model's, in ms."""
    step, floor = p.summary("timing", "step_s"), p.summary("timing", "step_floor_s")
    if not (step and floor):
        return "-"
    return f"{floor.median * 1e3:.2f} of {step.median * 1e3:.2f} ({min(1.0, floor.median / step.median):.0%})"


def peak_of(run: Any) -> float | None:
    """The calibrated float32 peak of the device set: per-device peak x GPUs (CPUs share one peak)."""
    peak = run.work.get("peak") or {}
    if not peak.get("flops_per_s"):
        return None
    kind, count = parse_device(str(run.spec["config"]["device"]))
    return peak["flops_per_s"] * (count if kind == "gpu" else 1)


def _flops(p: Point) -> str:
    achieved = p.summary("work", "achieved_flops_per_s")
    if not achieved:
        return "-"
    peaks = [peak_of(r) for r in p.ok_runs if peak_of(r)]
    share = f" ({achieved.median / peaks[0]:.1%})" if peaks else ""
    return f"{achieved.median / 1e9:,.1f}{share}"


def _environment(view: ScenarioView) -> list[str]:
    r = view.newest
    env, run = r.environment, r.run
    host, versions = env.get("host", {}), env.get("versions", {})
    gpus = env.get("gpus_driver") or []
    gpu_text = ", ".join(f"{g['name']} ({g['memory_mib']} MiB, driver {g['driver']})" for g in gpus) or "none seen"
    sources = sorted({p.ok_runs[0].quality.get("data_source", "?") for p in view.points if p.ok_runs})
    lines = [
        f"- Machine: `{cell(view.machine)}`, backend `{cell(run.get('backend', '?'))}`"
        + (f", image `{cell(run['image'])}`" if run.get("image") else ""),
        f"- CPU: {cell(host.get('cpu_model', '?'))}, {host.get('cpu_count', '?')} logical cores",
        f"- GPUs: {cell(gpu_text)}",
        f"- Python {cell(host.get('python', '?'))}, TensorFlow {cell(versions.get('tensorflow', '-'))}, "
        f"Keras {cell(versions.get('keras', '?'))} (backend {cell(versions.get('keras_backend', '?'))}), "
        f"CUDA/cuDNN built for: {cell(versions.get('tf_cuda_build') or '-')}"
        f"/{cell(versions.get('tf_cudnn_build') or '-')}",
        f"- Data: {cell(', '.join(sources) or 'no run completed')}",
    ]
    if "synthetic" in sources:
        detail = next(p.ok_runs[0].quality.get("data_detail", "") for p in view.points if p.ok_runs)
        lines.append(f"- **The data was synthetic** (MNIST's shapes, not its digits): {cell(detail)}")
    if view.smoke:
        lines.append(
            "- **Smoke size**: fewer samples and epochs than the scenario; a check that it runs, not a measurement"
        )
    lines += [f"- Also on file: {cell(o)}" for o in view.other_sizes]
    return lines


def _failures(view: ScenarioView) -> list[str]:
    out = []
    for p in view.points:
        for r in p.runs:
            if not r.ok:
                msg = r.message.splitlines()[0] if r.message else ""
                out.append(f"- [{cell(p.label)}] repetition {r.spec.get('repetition', 0)}: `{r.status}`: {cell(msg)}")
    return out


def _reproduce(view: ScenarioView) -> str:
    spec, run = view.spec, view.newest.run
    parts = ["python -m suite run", spec.get("scenario_file", f"scenarios/{view.scenario}.yaml")]
    parts.append(f"--backend {run.get('backend', 'local')}")
    if view.smoke:
        parts.append("--smoke")
    return " ".join(parts) + " && python -m suite report"


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
        lines += ["", cell(description)]
    for view in views:
        rows = [_row(view, p) for p in view.points]
        lines += ["", f"## On `{cell(view.machine)}`", "", "### Environment", "", *_environment(view)]
        lines += ["", "### Results", "", tabulate(rows, headers=HEADERS, tablefmt="github", disable_numparse=True)]
        if plot_name(view) in plotted:
            lines += ["", f"![{cell(view.scenario)} on {cell(view.machine)}]({plot_name(view)})"]
        lines += [
            "",
            "Fit time is the whole `model.fit` (the figure the original questions compared); the steady "
            "epoch leaves out the first epoch, which holds tracing and compilation. Fixed cost per step is "
            "the step time of a one-unit model trained the same way (same data, batch, device and settings) "
            "against this model's: the part of each step that is not arithmetic. GFLOP/s counts the dense "
            "layers' training FLOPs (3 x forward); the peak is a float32 matmul timed in the same process "
            "and device set. Speedup is the baseline's median fit time over this point's, with a bootstrap "
            "95% interval.",
        ]
        failures = _failures(view)
        if failures:
            lines += ["", "### Failures and skips", "", *failures]
        lines += ["", "### Reproduce", "", f"`{_reproduce(view)}`"]
    return "\n".join(lines) + "\n"


def render_index(by_scenario: dict[str, list[ScenarioView]]) -> str:
    rows = []
    for name, views in sorted(by_scenario.items()):
        for view in views:
            rows.append([f"[{cell(name)}]({name}.md)", cell(view.machine), cell(verdicts.verdict(view))])
    table = tabulate(rows, headers=["scenario", "machine", "verdict"], tablefmt="github", disable_numparse=True)
    return (
        "# Reports\n\nGenerated by `python -m suite report` from the result files under `results/` "
        "(one folder per machine). Regenerating from the same files gives the same bytes. "
        "[hardware.md](hardware.md) sets the machines side by side.\n\n" + table + "\n"
    )


def write_reports(results_dir: Path, out_dir: Path, reference: str | None = None) -> list[Path]:
    """Scenario pages, their plots, the index and the hardware comparison; returns the paths written."""
    from suite import compare  # compare renders with this module's cell()

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
