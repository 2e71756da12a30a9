"""One-line answers computed from the data, chosen by name (the scenario's ``report.verdict``).

Only points that ran ``ok`` on every repetition and pass the accuracy gate take part. Rules every
sentence keeps, tested over generated inputs in tests/test_verdicts.py:

- a difference is called a gain, a win or "faster" only when its interval excludes 1
  (``Ratio.faster``); otherwise the sentence says there is no measurable difference;
- every point that could not be compared is named, with the reason; a point trained on other data
  than the one it is compared with (``config.data.identity``: source and sha256) is not compared,
  nor one measured with other settings (``--set``, or a config that differs beyond the matrix
  coordinates that tell the two points apart);
- how busy the GPU was is said only where the results carry GPU telemetry, and a GPU busy less than
  ``FED_BUSY_PERCENT`` of the time is said to have been idle between kernels most of the time (what
  utilization shows; not why).
"""

from __future__ import annotations

from collections.abc import Callable

from suite import stats
from suite.plan import axis_name, override_flag, parse_device
from suite.results import FIT_S, STATUS_SKIPPED
from suite.views import ACCURACY_GATE, Point, ScenarioView

# Below this share of time executing kernels, the GPU was idle between kernels most of the time.
# Utilization alone does not say why (a step too small, the input pipeline, synchronisation).
FED_BUSY_PERCENT = 50.0


def usable(p: Point | None) -> bool:
    return p is not None and p.passes_gate and len(p.ok_runs) == len(p.runs)


def _fit(p: Point) -> list[float]:
    return p.values(FIT_S)


def why_unusable(p: Point | None) -> str:
    """Why a point takes no part in a verdict: not in the plan, skipped, failed, or below the gate."""
    if p is None:
        return "not in the results"
    statuses = sorted({r.status for r in p.runs if not r.ok})
    if statuses == [STATUS_SKIPPED]:
        return STATUS_SKIPPED
    if statuses:
        return ", ".join(statuses)
    if not p.passes_gate:
        return f"below the accuracy gate ({ACCURACY_GATE:.0%})"
    return ""


def data_identity(p: Point) -> tuple[str | None, str | None] | None:
    """The data a point trained on, as its fingerprint sees it: (source, sha256) of the spec's
    ``config.data.identity``; None for a record without one."""
    identity = ((p.runs[0].spec.get("config") or {}).get("data") or {}).get("identity") if p.runs else None
    if not isinstance(identity, dict):
        return None
    return identity.get("source"), identity.get("sha256")


def _data_text(identity: tuple[str | None, str | None] | None) -> str:
    if identity is None:
        return "not recorded"
    source, sha = identity
    return f"{source} sha256 {sha[:12]}" if sha else str(source)


def other_data(p: Point, base: Point) -> str:
    """'' when two points trained on the same data, else why they are not compared."""
    mine, theirs = data_identity(p), data_identity(base)
    if mine == theirs:
        return ""
    return f"trained on other data: {_data_text(mine)}, against {_data_text(theirs)}"


# Config paths that do not change what is measured: how long a run may take, and the data's identity
# (the data itself is ``other_data``'s to compare).
NOT_MEASURED = ("timeout_s", "data.identity")


def _measured(path: str, skip: set[str]) -> bool:
    return not any(path == s or path.startswith(s + ".") for s in (*NOT_MEASURED, *skip))


def _leaves(value: object, prefix: str = "") -> dict[str, object]:
    """A config as dotted path -> value (lists indexed: model.filters.0); {} stays a leaf."""
    if isinstance(value, dict) and value:
        return {k: v for key, item in value.items() for k, v in _leaves(item, f"{prefix}{key}.").items()}
    if isinstance(value, list) and value:
        return {k: v for i, item in enumerate(value) for k, v in _leaves(item, f"{prefix}{i}.").items()}
    return {prefix[:-1]: value}


def _overrides_text(overrides: dict[str, object]) -> str:
    return "--set " + " ".join(override_flag(k, v) for k, v in sorted(overrides.items())) if overrides else "no --set"


def other_settings(p: Point, base: Point) -> str:
    """'' when two points were measured with the same settings, except for the matrix coordinates
    that tell them apart, else why they are not compared: other ``--set`` overrides, or a config
    that differs elsewhere (the scenario changed between their runs)."""
    if not p.runs or not base.runs:
        return ""
    mine, theirs = p.runs[0].spec, base.runs[0].spec
    skip = {k for k in (*p.coords, *base.coords) if k != "variant"}
    set_mine = {k: v for k, v in (mine.get("overrides") or {}).items() if _measured(k, set())}
    set_theirs = {k: v for k, v in (theirs.get("overrides") or {}).items() if _measured(k, set())}
    if set_mine != set_theirs:
        return f"other settings ({_overrides_text(set_mine)}, against {_overrides_text(set_theirs)})"
    if p.coords.get("variant") != base.coords.get("variant"):
        return ""  # a variant sets paths its results do not name: the overrides are all that can be compared
    config_mine, config_theirs = _leaves(mine.get("config") or {}), _leaves(theirs.get("config") or {})
    differs = [
        f"{path} {config_mine.get(path)} against {config_theirs.get(path)}"
        for path in sorted(set(config_mine) | set(config_theirs))
        if _measured(path, skip) and config_mine.get(path) != config_theirs.get(path)
    ]
    return f"other settings ({'; '.join(differs)})" if differs else ""


def not_comparable(p: Point, base: Point) -> str:
    """'' when two usable points may be compared, else why not: other data or other settings."""
    return other_data(p, base) or other_settings(p, base)


def _skip_reason(points: list[Point]) -> str:
    """The recorded reason of the first skipped point, to say why a whole device kind is missing."""
    for p in points:
        for r in p.runs:
            if r.status == STATUS_SKIPPED and r.message:
                return r.message
    return ""


def _not_compared(items: list[tuple[str, str]]) -> str:
    """' Not compared: width 100, width 250 (GPU: skipped); width 2000 (GPU: timeout).' or ''."""
    if not items:
        return ""
    by_reason: dict[str, list[str]] = {}
    for name, why in items:
        by_reason.setdefault(why, []).append(name)
    return " Not compared: " + "; ".join(f"{', '.join(names)} ({why})" for why, names in by_reason.items()) + "."


def _name(axis: str | None, value: object) -> str:
    return f"{axis_name(axis) if axis else 'point'} {value}"


def gpu_crossover(view: ScenarioView) -> str:
    """Along the size axis (matrix order): from which point the GPU trains measurably faster."""
    axis = view.size_axis
    rows: list[tuple[object, stats.Ratio]] = []  # (value along the axis, CPU fit / GPU fit)
    busy: list[tuple[object, float | None]] = []  # (value along the axis, GPU busy % of that row's GPU point)
    missing: list[tuple[str, str]] = []
    gpu_points = [p for p in view.points if parse_device(p.device)[0] == "gpu"]
    gpu_device = next((p.device for p in gpu_points if parse_device(p.device)[1] == 1), "gpu")
    cpus = [p for p in view.points if p.device == "cpu"]
    if all(_numeric(p.coords.get(axis)) for p in cpus):
        cpus.sort(key=lambda p: p.coords.get(axis))  # along the axis by value, whatever the YAML's order
    paired = set()
    for cpu in cpus:
        value = cpu.coords.get(axis)
        gpu = view.point(**{**cpu.coords, "device": gpu_device})
        paired.add(id(gpu))
        if usable(cpu) and usable(gpu) and (differs := not_comparable(gpu, cpu)):
            missing.append((_name(axis, value), f"GPU: {differs} (CPU)"))
            continue
        if usable(cpu) and usable(gpu):
            rows.append((value, stats.ratio(_fit(cpu), _fit(gpu))))
            busy.append((value, gpu.gpu_busy if gpu is not None else None))
            continue
        why = [f"{side}: {why_unusable(p)}" for side, p in (("CPU", cpu), ("GPU", gpu)) if not usable(p)]
        missing.append((_name(axis, value), "; ".join(why)))
    missing += [
        (_name(axis, p.coords.get(axis)), f"GPU: no CPU point to compare with ({p.device})")
        for p in gpu_points
        if id(p) not in paired and parse_device(p.device)[1] == 1
    ]
    if not rows:
        reason = _skip_reason(gpu_points) or "no CPU and GPU pair ran ok on every repetition"
        cpu_fits = [(p.coords.get(axis), p.summary(FIT_S)) for p in view.points if p.device == "cpu"]
        cpu_fits = [(v, s) for v, s in cpu_fits if s]
        ends = cpu_fits[:1] if len(cpu_fits) == 1 else [cpu_fits[0], cpu_fits[-1]] if cpu_fits else []
        times = " to ".join(f"{s.median:.2f} s at {_name(axis, v)}" for v, s in ends)
        span = f" CPU fit time: {times}." if ends else ""
        return f"No CPU-GPU comparison on this machine ({reason}).{span}{_not_compared(missing)}"
    tail = _busy_along(axis, busy) + _not_compared(missing)
    wins = [i for i, (_, r) in enumerate(rows) if r.faster]
    if not wins:
        value, best = max(rows, key=lambda vr: vr[1].value)
        return (
            f"The GPU is not measurably faster than the CPU at any point compared; its best is at "
            f"{_name(axis, value)}: GPU speedup {best.text()}.{tail}"
        )
    first = wins[0]
    value, at_first = rows[first]
    after = [
        f"{_name(axis, v)}: {'slower' if r.significant else 'no measurable difference'}"
        for i, (v, r) in enumerate(rows)
        if i > first and i not in wins
    ]
    exceptions = f" (except at {'; '.join(after)})" if after else ""
    if first == 0:
        return f"The GPU is faster at {_name(axis, value)} and beyond{exceptions}: GPU speedup {at_first.text()}.{tail}"
    return f"The GPU is faster from {_name(axis, value)} on{exceptions}: GPU speedup {at_first.text()}.{tail}"


def _busy_text(percent: float, where: str, what: str = "the GPU") -> str:
    idle = f": {what} sat idle between kernels most of the time" if percent < FED_BUSY_PERCENT else ""
    return f"{percent:.0f}% of the time {where}{idle}"


def _busy_along(axis: str | None, busy: list[tuple[object, float | None]]) -> str:
    """' GPU busy 18% of the time at width 100: ...; 85% of the time at width 2000.' for the first and
    last compared points that carry GPU telemetry; '' when none does."""
    measured = [(v, b) for v, b in busy if b is not None]
    if not measured:
        return ""
    ends = [measured[0]] if len(measured) == 1 else [measured[0], measured[-1]]
    return " GPU busy " + "; ".join(_busy_text(b, f"at {_name(axis, v)}") for v, b in ends) + "."


def _numeric(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def device_count(device: str) -> int:
    return parse_device(device)[1]


def scaling(view: ScenarioView) -> str:
    """Speedup and efficiency of N devices against the baseline device set, for each batch mode."""
    base_device = str(view.spec.get("report", {}).get("baseline", {}).get("device", "gpu:1"))
    base_kind = parse_device(base_device)[0]
    parts, missing = [], []
    for mode in sorted({p.coords.get("training.batch_mode", "global") for p in view.points}):
        same_mode = [p for p in view.points if p.coords.get("training.batch_mode", mode) == mode]
        one = next((p for p in same_mode if p.device == base_device), None)
        if not usable(one):
            why = why_unusable(one)
            missing += [(p.label, why if p is one else f"baseline {why}") for p in same_mode]
            continue
        items, compared = [], []
        for p in same_mode:
            if p is one:
                continue
            if not usable(p):
                missing.append((p.label, why_unusable(p)))
                continue
            if differs := not_comparable(p, one):
                missing.append((p.label, f"{differs} ({base_device})"))
                continue
            n = device_count(p.device) / device_count(base_device)
            r = stats.ratio(_fit(one), _fit(p))
            items.append(f"{p.device} {r.text()}, efficiency {r.value / n:.0%}")
            compared.append(p)
        batch = one.runs[0].spec["config"]["training"]["batch_size"]
        label = {"global": f"batch {batch} split across devices", "per_replica": f"{batch} per device"}.get(mode, mode)
        if items:
            parts.append(f"{label}: " + "; ".join(items) + _busy_across([one, *compared]))
    if not parts:
        base_points = [p for p in view.points if parse_device(p.device)[0] == base_kind]
        why = _skip_reason(base_points) or "fewer than two device counts ran ok on every repetition"
        return f"No multi-{base_kind.upper()} comparison on this machine ({why}).{_not_compared(missing)}"
    return (
        f"Speedup over {base_device} (total fit time), "
        + ". With ".join(parts)
        + "."
        + _batch_mode_effect(view)
        + _not_compared(missing)
    )


def _busy_across(points: list[Point]) -> str:
    """' (GPU busy 85% of the time on gpu:1; 20% of the time on gpu:4: ...)' for the device sets with GPU
    telemetry (each the mean over its GPUs); '' when none has any."""
    measured = [(p.device, b) for p in points if (b := p.gpu_busy) is not None]
    if not measured:
        return ""
    texts = [
        _busy_text(b, f"on {device}", "its GPUs" if device_count(device) > 1 else "the GPU") for device, b in measured
    ]
    return " (GPU busy " + "; ".join(texts) + ")"


def _batch_mode_effect(view: ScenarioView) -> str:
    """At the most devices measured in both modes: does a per-device batch change the picture?"""
    both = [
        (device_count(g.device), g, p)  # (devices, split-batch point, per-device-batch point)
        for g in view.points
        if g.coords.get("training.batch_mode") == "global"
        for p in [view.point(**{**g.coords, "training.batch_mode": "per_replica"})]
        if usable(g) and usable(p) and device_count(g.device) > 1 and not not_comparable(g, p)
    ]
    if not both:
        return ""
    n, split, per = max(both, key=lambda t: t[0])
    r = stats.ratio(_fit(split), _fit(per))
    return f" On {per.device}, the per-device batch instead of the split one: speedup {r.text()}."


def knobs(view: ScenarioView) -> str:
    """Which single setting helps most against the default, and by how much, if any measurably does."""
    compared: list[tuple[str, stats.Ratio]] = []
    missing: list[tuple[str, str]] = []
    for p in view.points:
        base = view.baseline_for(p)
        if p is base:
            continue
        if usable(p) and usable(base) and (differs := not_comparable(p, base)):
            missing.append((p.label, f"{differs} (its default)"))
        elif usable(p) and usable(base):
            compared.append((p.label, stats.ratio(_fit(base), _fit(p))))
        else:
            why = why_unusable(p) if not usable(p) else f"its default {why_unusable(base)}"
            missing.append((p.label, why))
    tail = _not_compared(missing)
    if not compared:
        why = _skip_reason(view.points) or "no setting ran ok beside its default on every repetition"
        return f"No setting could be compared on this machine ({why}).{tail}"
    slower = [f"{label}, {r.text()}" for label, r in compared if r.significant and r.value < 1]
    slow = f" Measurably slower: {'; '.join(slower)}." if slower else ""
    gains = [(label, r) for label, r in compared if r.faster]
    if gains:
        label, r = max(gains, key=lambda lr: lr[1].value)
        return f"Biggest gain: {label}, {r.text()} faster than the default with everything else equal.{slow}{tail}"
    # Nothing measurably faster: name the comparison closest to a gain, significant or not.
    label, r = max(compared, key=lambda lr: lr[1].value)
    word = "largest" if r.value > 1 else "best"
    return f"No setting is measurably faster than the default; {word}: {label}, {r.text()}.{slow}{tail}"


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
