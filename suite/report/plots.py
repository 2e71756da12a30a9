"""PNG plots beside the reports, one per scenario and machine, chosen by the scenario's verdict kind.

Agg backend, fixed size and DPI, no metadata (matplotlib otherwise stamps its version): the same
results give the same bytes; painted in matplotlib's default style, whatever matplotlibrc the
machine has. A plot is first drawn on a stand-in for matplotlib's axes that keeps the calls
(``Drawing``); a plot drawn before from the same calls, by the same code, matplotlib and Pillow, is
taken from this user's cache, and only a new one imports matplotlib (half a second) to paint.
"""

from __future__ import annotations

import contextlib
import hashlib
import importlib.metadata
import io
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from suite import paths
from suite.record.results import FIT_S
from suite.report import stats
from suite.report.points import Point, ScenarioView, fit_ratio
from suite.report.verdicts import device_count
from suite.safe import bounded, whole_file
from suite.safe.markdown import plot_text
from suite.spec.plan import axis_name

SIZE, DPI = (7.0, 4.2), 100
KEPT_PLOTS = 1000  # plots kept in the cache; the least recently used go first
MAX_PNG_BYTES = 16 * bounded.MiB  # a plot is about 40 KB
_PNG_END = b"IEND\xaeB`\x82"  # the last chunk of every whole PNG


class Drawing:
    """A stand-in for matplotlib's axes: every call of the methods the plots below use is kept, in
    order, to be played on real axes (``_paint``) or to name the plot (``_key``). The plots use no
    value a call returns; any other attribute is an error, so a plot cannot read state that is not
    there."""

    METHODS = frozenset(
        {"plot", "errorbar", "barh", "axvline", "set_xscale", "set_xticks", "set_yticks", "minorticks_off"}
        | {"set_xlabel", "set_ylabel", "set_ylim"}
    )

    def __init__(self) -> None:
        self.calls: list[tuple[str, tuple, dict[str, Any]]] = []

    def __getattr__(self, name: str) -> Callable[..., None]:
        if name not in Drawing.METHODS:
            raise AttributeError(f"Drawing keeps calls of {', '.join(sorted(Drawing.METHODS))}; not {name!r}")

        def call(*args: Any, **kwargs: Any) -> None:
            self.calls.append((name, args, kwargs))

        return call


def _fit(p: Point | None) -> list[float]:
    return p.values(FIT_S) if p else []


def _fit_summary(p: Point) -> tuple[float, float, float]:
    """(geometric mean, min, max) of a point's fit times: the figure its ratios are computed from."""
    fits = _fit(p)
    return stats.geometric_mean(fits), min(fits), max(fits)


def _along(ax: Drawing, view: ScenarioView, axis: str | None, series: Callable[[Point], str]) -> bool:
    """Fit time against ``axis``, one line per ``series(point)``, each point at its own value.

    Numeric axes are placed by value (on a log scale where they span a factor of 10 or more), so a
    point missing in one series cannot shift that curve against the others; any other axis gets one
    shared slot per value. A series with no point that ran ok is named in the legend, not drawn.
    """

    def at(p: Point) -> Any:
        return None if axis is None else p.coords.get(axis)

    values: list = []  # in order, once each; by equality, as a value may be a list (model.hidden: [[512, 512], ...])
    for p in view.points:
        if at(p) not in values:
            values.append(at(p))
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in values)
    drawn = False
    for name in dict.fromkeys(series(p) for p in view.points):
        pts = [p for p in view.points if series(p) == name and _fit(p)]  # ok runs with a fit time
        if numeric:  # the line runs along the axis, not in the order the points happened to run in
            pts.sort(key=at)
        if not pts:
            ax.plot([], [], " ", label=plot_text(f"{name}: none ran ok (see the page)" if name else "none ran ok"))
            continue
        xs: list[Any] = [at(p) if numeric else values.index(at(p)) for p in pts]
        sums = [_fit_summary(p) for p in pts]
        # max(0, ...): exp(mean(log)) of equal times can round a hair outside their min-max.
        errors = [[max(0.0, g - lo) for g, lo, _ in sums], [max(0.0, hi - g) for g, _, hi in sums]]
        ax.errorbar(xs, [g for g, _, _ in sums], yerr=errors, marker="o", capsize=3, label=plot_text(name) or None)
        drawn = True
    logarithmic = numeric and max(values) / min(values) >= 10
    if numeric:
        if logarithmic:
            ax.set_xscale("log")
        ax.set_xticks(values, [plot_text(v) for v in values])
        ax.minorticks_off()
    else:
        ax.set_xticks(range(len(values)), [plot_text(v) for v in values])
    ax.set_xlabel(plot_text(axis_name(axis) if axis else "point") + (" (log scale)" if logarithmic else ""))
    ax.set_ylabel("fit time (s), geometric mean, min-max")
    ax.set_ylim(bottom=0)
    return drawn


def crossover(view: ScenarioView, ax: Drawing) -> bool:
    """Fit time (the figure the verdict compares) against the size axis, one line per device."""
    return _along(ax, view, view.size_axis, lambda p: p.device)


def sweep(view: ScenarioView, ax: Drawing) -> bool:
    """A sweep of the user's own: fit time against its first numeric axis, one line per combination
    of the other coordinates; nothing when no axis is numeric."""
    keys = list(view.points[0].coords) if view.points else []
    axis = next((k for k in keys if all(_numeric(p.coords.get(k)) for p in view.points)), None)
    if axis is None:
        return False
    others = [k for k in keys if k != axis]

    def series(p: Point) -> str:
        return ", ".join(f"{axis_name(k)}={p.coords.get(k)}" for k in others)

    return _along(ax, view, axis, series)


def _numeric(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _bars(ratios: list[stats.Ratio]) -> list[list[float]]:
    """Error bars from each ratio's interval; none (zero length) where there is no interval."""
    return [
        [r.value - r.low if r.low is not None else 0.0 for r in ratios],
        [r.high - r.value if r.high is not None else 0.0 for r in ratios],
    ]


def speedup(view: ScenarioView, ax: Drawing) -> bool:
    """Speedup over the baseline device set against device count, one line per batch mode, and ideal."""
    base_device = str(view.spec.get("report", {}).get("baseline", {}).get("device", "gpu:1"))
    counts = sorted({device_count(p.device) for p in view.points})
    drawn = False
    for mode in sorted({p.coords.get("training.batch_mode", "global") for p in view.points}):
        same_mode = [p for p in view.points if p.coords.get("training.batch_mode", mode) == mode]
        one = next((p for p in same_mode if p.device == base_device and p.ok_runs), None)
        pts = [p for p in same_mode if p.ok_runs] if one else []
        if one is not None and pts:
            xs = [device_count(p.device) for p in pts]
            # The baseline against itself is 1 by definition: no interval to draw.
            ratios = [stats.Ratio(1.0, None, None) if p is one else fit_ratio(one, p) for p in pts]
            ax.errorbar(
                xs,
                [r.value for r in ratios],
                yerr=_bars(ratios),
                marker="o",
                capsize=3,
                label=plot_text(f"batch mode {mode}"),
            )
            drawn = True
    base_n = device_count(base_device)
    ax.plot(counts, [c / base_n for c in counts], linestyle="--", color="grey", label="ideal")
    ax.set_xticks(counts)
    ax.set_xlabel(plot_text(f"devices ({base_device.partition(':')[0]})"))
    ax.set_ylabel(plot_text(f"speedup over {base_device} (fit time), 95% interval"))
    return drawn


def knob_bars(view: ScenarioView, ax: Drawing) -> bool:
    """Speedup of each variant over the default at the same other coordinates, as bars."""
    labels, ratios = [], []
    for p in view.points:
        base = view.baseline_for(p)
        if base is None or base is p or not (p.ok_runs and base.ok_runs):
            continue
        labels.append(plot_text(p.label))
        ratios.append(fit_ratio(base, p))
    if not ratios:
        return False
    ax.barh(range(len(ratios)), [r.value for r in ratios], xerr=_bars(ratios), capsize=3)
    ax.set_yticks(range(len(ratios)), labels, fontsize=7)
    ax.axvline(1.0, color="grey", linestyle="--")
    ax.set_xlabel("speedup over the default (fit time), 95% interval where 3+ runs per side")
    return True


PLOTS: dict[str, Callable[[ScenarioView, Drawing], bool]] = {
    "gpu_crossover": crossover,
    "scaling": speedup,
    "knobs": knob_bars,
    "none": sweep,
}


def render(view: ScenarioView) -> bytes | None:
    """PNG bytes, or None when the verdict kind has no plot or nothing ran ok."""
    draw = PLOTS.get(view.spec.get("report", {}).get("verdict", "none"))
    if draw is None:
        return None
    drawing = Drawing()
    if not draw(view, drawing):
        return None
    title = plot_text(f"{view.scenario} on {view.machine}" + (" (smoke size)" if view.smoke else ""))
    cache = paths.cache_dir()
    kept = cache / "plots" / f"{_key(drawing, title)}.png" if cache is not None else None
    if kept is not None:
        with contextlib.suppress(OSError):
            png = whole_file.read_kept(kept, MAX_PNG_BYTES)
            if png.startswith(b"\x89PNG\r\n\x1a\n") and png.endswith(_PNG_END):
                with contextlib.suppress(OSError):
                    os.utime(kept)  # used now: kept longer
                return png
    png = _paint(drawing, title)
    if kept is not None:
        _keep(kept, png)
    return png


def _key(drawing: Drawing, title: str) -> str:
    """What names a plot's bytes: its calls and title, this suite's code, and the versions of
    matplotlib and of Pillow, which writes the PNG (drawn in matplotlib's default style, see _paint)."""
    digest = hashlib.sha256(str(paths.code_digest()).encode())
    for package in ("matplotlib", "pillow"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            digest.update(f"{package} {importlib.metadata.version(package)}".encode())
    digest.update(repr((drawing.calls, title, SIZE, DPI)).encode())
    return digest.hexdigest()


def _paint(drawing: Drawing, title: str) -> bytes:
    """The PNG of ``drawing`` played on matplotlib's axes, under ``title`` (already made plain text)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    # matplotlib's own defaults, not a matplotlibrc of this machine's: a report's plots depend on the
    # results alone, wherever they are drawn (and a plot taken from the cache is the one drawn now).
    with plt.style.context("default"):
        fig, ax = plt.subplots(figsize=SIZE, dpi=DPI)
        try:
            for name, args, kwargs in drawing.calls:
                getattr(ax, name)(*args, **kwargs)
            ax.set_title(title, fontsize=10)
            ax.grid(True, alpha=0.3)
            if ax.get_legend_handles_labels()[0]:
                ax.legend(fontsize=8)
            fig.tight_layout()
            buf = io.BytesIO()
            fig.savefig(buf, format="png", metadata={"Software": None})
            return buf.getvalue()
        finally:
            plt.close(fig)


def _keep(path: Path, png: bytes) -> None:
    """``png`` into the cache (whole, or not at all), which keeps the KEPT_PLOTS used last; where the
    cache cannot be written, nothing is kept."""
    with contextlib.suppress(OSError):
        whole_file.keep(path, png, most=KEPT_PLOTS)
