"""One-line answers computed from the data, chosen by name (the scenario's ``report.verdict``).

Only points that ran ``ok`` on every repetition and pass the accuracy gate take part; each
sentence says what it could not compare and why, rather than guessing.
"""

from __future__ import annotations

from collections.abc import Callable

from suite import stats
from suite.plan import axis_name, parse_device
from suite.views import ACCURACY_GATE, Point, ScenarioView


def _usable(p: Point | None) -> bool:
    return p is not None and p.passes_gate and len(p.ok_runs) == len(p.runs)


def _fit(p: Point) -> list[float]:
    return p.values("timing", "fit_s")


def _why_not(view: ScenarioView, device_prefix: str) -> str:
    """Why points of a device kind could not be compared: a skip, the accuracy gate, or failures."""
    points = [p for p in view.points if p.device.startswith(device_prefix)]
    for p in points:
        if p.runs[0].status == "skipped":
            return p.runs[0].message
    gated = [p.label for p in points if p.ok_runs and not p.passes_gate]
    if gated:
        return f"{len(gated)} point(s) stayed below the accuracy gate ({ACCURACY_GATE:.0%} test accuracy)"
    failed = sorted({r.status for p in points for r in p.runs if not r.ok})
    return f"runs ended {', '.join(failed)}" if failed else ""


def _name(axis: str | None, value: object) -> str:
    return f"{axis_name(axis) if axis else 'point'} {value}"


def gpu_crossover(view: ScenarioView) -> str:
    """From which point along the size axis (in matrix order) the GPU trains faster than the CPU."""
    axis = view.size_axis
    rows = []  # (value along the axis, GPU speedup = CPU fit / GPU fit), in matrix order
    for cpu in view.points:
        if cpu.device != "cpu" or not _usable(cpu):
            continue
        gpu = view.point(**{**cpu.coords, "device": "gpu"})
        if _usable(gpu):
            rows.append((cpu.coords.get(axis), stats.ratio(_fit(cpu), _fit(gpu))))
    if not rows:
        why = _why_not(view, "gpu") or "no GPU point ran ok"
        cpu_fits = [(p.coords.get(axis), p.summary("timing", "fit_s")) for p in view.points if p.device == "cpu"]
        cpu_fits = [(v, s) for v, s in cpu_fits if s]
        span = (
            f" CPU fit time: {cpu_fits[0][1].median:.2f} s at {_name(axis, cpu_fits[0][0])} to "
            f"{cpu_fits[-1][1].median:.2f} s at {_name(axis, cpu_fits[-1][0])}."
            if cpu_fits
            else ""
        )
        return f"No CPU-GPU comparison on this machine: GPU points did not run ({why}).{span}"
    wins = [i for i, (_, r) in enumerate(rows) if r.value > 1 and r.significant is not False]
    if not wins:
        value, best = max(rows, key=lambda vr: vr[1].value)
        return f"The GPU is never faster than the CPU here; closest at {_name(axis, value)}: GPU speedup {best.text()}."
    first = wins[0]
    value, at_first = rows[first]
    tail = "" if wins == list(range(first, len(rows))) else " (though not at every point after it)"
    if first == 0:
        where = _name(axis, value)
        return f"The GPU is faster at every point measured{tail}; at {where}: GPU speedup {at_first.text()}."
    return f"The GPU is faster from {_name(axis, value)} on{tail}: GPU speedup {at_first.text()}."


def device_count(device: str) -> int:
    return parse_device(device)[1]


def scaling(view: ScenarioView) -> str:
    """Speedup and efficiency of N devices against the baseline device set, for each batch mode."""
    base_device = str(view.spec.get("report", {}).get("baseline", {}).get("device", "gpu:1"))
    base_kind = parse_device(base_device)[0]
    parts = []
    for mode in sorted({p.coords.get("training.batch_mode", "global") for p in view.points}):
        same_mode = [p for p in view.points if p.coords.get("training.batch_mode", mode) == mode]
        one = next((p for p in same_mode if p.device == base_device), None)
        if not _usable(one):
            continue
        items = []
        for p in same_mode:
            n = device_count(p.device) / device_count(base_device)
            if p is one or not _usable(p):
                continue
            r = stats.ratio(_fit(one), _fit(p))
            items.append(f"{p.device} {r.text()}, efficiency {r.value / n:.0%}")
        batch = one.runs[0].spec["config"]["training"]["batch_size"]
        label = {"global": f"batch {batch} split across devices", "per_replica": f"{batch} per device"}.get(mode, mode)
        if items:
            parts.append(f"{label}: " + "; ".join(items))
    if not parts:
        why = _why_not(view, base_kind) or "fewer than two device counts ran ok"
        return f"No multi-{base_kind.upper()} comparison on this machine: {why}."
    return f"Speedup over {base_device} (total fit time): " + " | ".join(parts) + "." + _batch_mode_effect(view)


def _batch_mode_effect(view: ScenarioView) -> str:
    """At the most devices measured in both modes: does a per-device batch change the picture?"""
    both = [
        (device_count(g.device), g, p)  # (devices, split-batch point, per-device-batch point)
        for g in view.points
        if g.coords.get("training.batch_mode") == "global"
        for p in [view.point(**{**g.coords, "training.batch_mode": "per_replica"})]
        if _usable(g) and _usable(p) and device_count(g.device) > 1
    ]
    if not both:
        return ""
    n, split, per = max(both, key=lambda t: t[0])
    r = stats.ratio(_fit(split), _fit(per))
    return f" On {per.device}, the per-device batch instead of the split one: speedup {r.text()}."


def knobs(view: ScenarioView) -> str:
    """Which single setting helps most against the default, and by how much."""
    best: tuple[float, str, stats.Ratio] | None = None
    for p in view.points:
        base = view.baseline_for(p)
        if p is base or not (_usable(p) and _usable(base)):
            continue
        r = stats.ratio(_fit(base), _fit(p))
        if r.significant is not False and (best is None or r.value > best[0]):
            best = (r.value, p.label, r)
    if best is None:
        why = _why_not(view, "") or "no variant ran ok beside its default"
        return f"No setting could be compared on this machine: {why}."
    if best[0] <= 1:
        return f"No setting beats the default; the closest is {best[1]}: {best[2].text()}."
    return f"Biggest gain: {best[1]}, {best[2].text()} faster than the default at the same batch size."


def none(view: ScenarioView) -> str:
    ok = sum(1 for p in view.points if p.ok_runs)
    return f"{ok} of {len(view.points)} points ran ok."


VERDICTS: dict[str, Callable[[ScenarioView], str]] = {
    "gpu_crossover": gpu_crossover,
    "scaling": scaling,
    "knobs": knobs,
    "none": none,
}


def verdict(view: ScenarioView) -> str:
    return VERDICTS[view.spec.get("report", {}).get("verdict", "none")](view)
