"""PNG plots beside the reports, one per scenario and machine, chosen by the scenario's verdict kind.

Agg backend, fixed size and DPI, no metadata (matplotlib otherwise stamps its version): the same
results give the same bytes.
"""

from __future__ import annotations

import io
from collections.abc import Callable

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

from suite import stats  # noqa: E402
from suite.plan import axis_name  # noqa: E402
from suite.verdicts import device_count  # noqa: E402
from suite.views import Point, ScenarioView  # noqa: E402

SIZE, DPI = (7.0, 4.2), 100


def _fit(p: Point | None) -> list[float]:
    return p.values("timing", "fit_s") if p else []


def crossover(view: ScenarioView, ax: plt.Axes) -> bool:
    """Steady epoch time against the size axis, one line per device."""
    axis = view.size_axis
    devices = sorted({p.device for p in view.points})
    drawn = False
    for device in devices:
        pts = [p for p in view.points if p.device == device and p.ok_runs]
        if not pts:
            continue
        xs = list(range(len(pts)))
        sums = [p.summary("timing", "steady_epoch_s") for p in pts]
        ys = [s.median for s in sums]
        errors = [[s.median - s.low for s in sums], [s.high - s.median for s in sums]]
        ax.errorbar(
            xs,
            ys,
            yerr=errors,
            marker="o",
            capsize=3,
            label=device,
        )
        ax.set_xticks(xs, [str(p.coords.get(axis)) for p in pts])
        drawn = True
    ax.set_xlabel(axis_name(axis) if axis else "point")
    ax.set_ylabel("steady-state epoch (s), median, min-max")
    return drawn


def speedup(view: ScenarioView, ax: plt.Axes) -> bool:
    """Speedup over the baseline device set against device count, one line per batch mode, and ideal."""
    base_device = str(view.spec.get("report", {}).get("baseline", {}).get("device", "gpu:1"))
    counts = sorted({device_count(p.device) for p in view.points})
    drawn = False
    for mode in sorted({p.coords.get("training.batch_mode", "global") for p in view.points}):
        same_mode = [p for p in view.points if p.coords.get("training.batch_mode", mode) == mode]
        one = next((p for p in same_mode if p.device == base_device and p.ok_runs), None)
        pts = [p for p in same_mode if p.ok_runs] if one else []
        if pts:
            xs = [device_count(p.device) for p in pts]
            ax.plot(xs, [stats.ratio(_fit(one), _fit(p)).value for p in pts], marker="o", label=f"batch mode {mode}")
            drawn = True
    base_n = device_count(base_device)
    ax.plot(counts, [c / base_n for c in counts], linestyle="--", color="grey", label="ideal")
    ax.set_xticks(counts)
    ax.set_xlabel(f"devices ({base_device.partition(':')[0]})")
    ax.set_ylabel(f"speedup over {base_device} (fit time)")
    return drawn


def knob_bars(view: ScenarioView, ax: plt.Axes) -> bool:
    """Speedup of each variant over the default at the same other coordinates, as bars."""
    labels, values = [], []
    for p in view.points:
        base = view.baseline_for(p)
        if base is None or base is p or not (p.ok_runs and base.ok_runs):
            continue
        labels.append(p.label)
        values.append(stats.ratio(_fit(base), _fit(p)).value)
    if not values:
        return False
    ax.barh(range(len(values)), values)
    ax.set_yticks(range(len(values)), labels, fontsize=7)
    ax.axvline(1.0, color="grey", linestyle="--")
    ax.set_xlabel("speedup over the default (fit time)")
    return True


PLOTS: dict[str, Callable[[ScenarioView, plt.Axes], bool]] = {
    "gpu_crossover": crossover,
    "scaling": speedup,
    "knobs": knob_bars,
}


def render(view: ScenarioView) -> bytes | None:
    """PNG bytes, or None when the verdict kind has no plot or nothing ran ok."""
    draw = PLOTS.get(view.spec.get("report", {}).get("verdict", "none"))
    if draw is None:
        return None
    fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
    try:
        if not draw(view, ax):
            return None
        ax.set_title(f"{view.scenario} on {view.machine}" + (" (smoke size)" if view.smoke else ""), fontsize=10)
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=8)
        fig.tight_layout()
        buf = io.BytesIO()
        fig.savefig(buf, format="png", metadata={"Software": None})
        return buf.getvalue()
    finally:
        plt.close(fig)
