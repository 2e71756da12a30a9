"""Short answers computed from the data, chosen by name (the scenario's ``report.verdict``).

A verdict is the answer first, then at most one sentence of reason (``Verdict.text``: at most two
sentences, about 300 characters); the points it could not compare are kept apart
(``Verdict.not_compared``), for a section of their own below it, grouped by reason.

Only points that ran ``ok`` on every repetition and pass the accuracy gate take part. Rules every
sentence keeps, tested over generated inputs in tests/test_verdicts.py:

- a difference is called a gain, a win or "faster" only when its interval excludes 1
  (``Ratio.faster``); otherwise the sentence says there is no measurable difference;
- every point that could not be compared is named, with the reason (in ``not_compared``); a point trained on other data
  than the one it is compared with (``config.data.identity``: source and sha256) is not compared,
  nor one measured with other settings (``--set``, or a config that differs beyond the matrix
  coordinates that tell the two points apart);
- how busy the GPU was is said only where the results carry GPU telemetry, and a GPU busy less than
  ``FED_BUSY_PERCENT`` of the time is said to have been idle between kernels most of the time (what
  utilization shows; not why);
- the scaling verdict names the most devices compared per batch mode (the table has every count).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeGuard

from suite.record.results import FIT_S, STATUS_SKIPPED
from suite.report import stats
from suite.report.points import Point, ScenarioView, fit_ratio, gate_text, leaves
from suite.report.reasons import merged_reasons
from suite.spec.plan import axis_name, override_flag, parse_device

# Below this share of time executing kernels, the GPU was idle between kernels most of the time.
# Utilization alone does not say why (a step too small, the input pipeline, synchronisation).
FED_BUSY_PERCENT = 50.0


@dataclass(frozen=True)
class Verdict:
    answer: str  # one sentence: the answer to the scenario's question on this machine
    reason: str = ""  # at most one sentence: why, or the one qualification that matters most
    not_compared: tuple[tuple[str, str], ...] = ()  # (point, why it took no part), in the view's order

    @property
    def text(self) -> str:
        return f"{self.answer} {self.reason}".strip()

    @property
    def first_sentence(self) -> str:
        return self.answer

    def not_compared_by_reason(self) -> list[tuple[str, list[str]]]:
        """(reason, the points it kept out), reasons in the order they first appear."""
        grouped: dict[str, list[str]] = {}
        for name, why in self.not_compared:
            grouped.setdefault(why, []).append(name)
        return list(grouped.items())


def usable(p: Point | None) -> TypeGuard[Point]:
    return p is not None and p.passes_gate and len(p.ok_runs) == len(p.runs)


def _fit(p: Point) -> list[float]:
    return p.values(FIT_S)


def why_unusable(p: Point | None) -> str:
    """Why a point takes no part in a verdict: not in the plan, skipped, failed, or below the gate."""
    if p is None:
        return "not in the results"
    failed = _failed(p)
    if failed:
        return failed
    if any(not r.ok for r in p.runs):
        return STATUS_SKIPPED
    if not p.passes_gate:
        return gate_text(p.accuracy).partition(":")[0]
    return ""


def _failed(p: Point) -> str:
    """The statuses a point's failed runs ended with ('error, timeout'); '' where none failed."""
    return ", ".join(sorted({r.status for r in p.runs if not r.ok and r.status != STATUS_SKIPPED}))


def _predicate(p: Point | None) -> str:
    """``why_unusable`` after a point's name: 'is skipped', 'failed (error)', 'is below the accuracy gate'."""
    why = why_unusable(p)
    return f"failed ({why})" if p is not None and _failed(p) else f"is {why}"


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


def _overrides_text(overrides: dict[str, object]) -> str:
    return "--set " + " ".join(override_flag(k, v) for k, v in sorted(overrides.items())) if overrides else "no --set"


def other_settings(p: Point, base: Point, also: tuple[str, ...] = ()) -> str:
    """'' when two points were measured with the same settings, except for the matrix coordinates
    that tell them apart (and the config paths ``also`` names), else why they are not compared:
    other ``--set`` overrides, or a config that differs elsewhere (the scenario changed between
    their runs)."""
    if not p.runs or not base.runs:
        return ""
    mine, theirs = p.runs[0].spec, base.runs[0].spec
    skip = {k for k in (*p.coords, *base.coords, *also) if k != "variant"}
    set_mine = {k: v for k, v in (mine.get("overrides") or {}).items() if _measured(k, set())}
    set_theirs = {k: v for k, v in (theirs.get("overrides") or {}).items() if _measured(k, set())}
    if set_mine != set_theirs:
        return f"other settings ({_overrides_text(set_mine)}, against {_overrides_text(set_theirs)})"
    if p.coords.get("variant") != base.coords.get("variant"):
        return ""  # a variant sets paths its results do not name: the overrides are all that can be compared
    config_mine, config_theirs = leaves(mine.get("config") or {}), leaves(theirs.get("config") or {})
    differs = [
        f"{path} {config_mine.get(path)} against {config_theirs.get(path)}"
        for path in sorted(set(config_mine) | set(config_theirs))
        if _measured(path, skip) and config_mine.get(path) != config_theirs.get(path)
    ]
    return f"other settings ({'; '.join(differs)})" if differs else ""


def not_comparable(p: Point, base: Point) -> str:
    """'' when two usable points may be compared, else why not: other data or other settings."""
    return other_data(p, base) or other_settings(p, base)


# Config paths that may differ between two machines' runs of one point, which ``compare`` and
# hardware.md set side by side: the image (a version against another is a question they answer, and
# the facts below the table name it), the GPU model a pool placed it on, and where the data lies.
MACHINE_SETTINGS = ("image", "gpu_model", "data.data_dir")


def not_comparable_across_machines(p: Point, base: Point) -> str:
    """``not_comparable`` for one point on two machines: other data where both record which (a
    result made before records named their data says nothing either way: compared, its "data" fact
    not recorded), or other settings but those MACHINE_SETTINGS names."""
    if None not in (data_identity(p), data_identity(base)) and (differs := other_data(p, base)):
        return differs
    return other_settings(p, base, MACHINE_SETTINGS)


def _skip_reason(points: list[Point]) -> str:
    """The short recorded reason of the first skipped point, to say why a whole device kind is
    missing. Where it is a GPU count this machine lacks, every count the skipped points need with
    the same rest is said: "needs 1, 2 or 4 GPU(s); this machine has no GPU"."""
    messages = [r.message for p in points for r in p.runs if r.status == STATUS_SKIPPED and r.message]
    return next(iter(merged_reasons(messages)), "")


def _name(axis: str | None, value: object) -> str:
    return f"{axis_name(axis) if axis else 'point'} {value}"


def _missing_count(points: list[Point], kind: str = "") -> str:
    """' (12 GPU points skipped)' for the points of a kind that took no part, by their status."""
    statuses: dict[str, int] = {}
    for p in points:
        if not usable(p):
            failed = _failed(p)
            why = f"failed: {failed}" if failed else why_unusable(p)  # no parentheses inside the count's own
            statuses[why] = statuses.get(why, 0) + 1
    if not statuses:
        return ""
    kind = f"{kind} " if kind else ""
    return " (" + "; ".join(f"{n} {kind}point{'s' if n != 1 else ''} {why}" for why, n in statuses.items()) + ")"


def gpu_crossover(view: ScenarioView) -> Verdict:
    """Along the size axis (matrix order): from which point the GPU trains measurably faster."""
    axis = view.size_axis

    def along(p: Point) -> Any:  # the point's value along the size axis
        return None if axis is None else p.coords.get(axis)

    rows: list[tuple[object, stats.Ratio]] = []  # (value along the axis, CPU fit / GPU fit)
    busy: list[tuple[object, float | None]] = []  # (value along the axis, GPU busy % of that row's GPU point)
    missing: list[tuple[str, str]] = []
    gpu_points = [p for p in view.points if parse_device(p.device)[0] == "gpu"]
    gpu_device = next((p.device for p in gpu_points if parse_device(p.device)[1] == 1), "gpu")
    cpus = [p for p in view.points if p.device == "cpu"]
    if all(_numeric(along(p)) for p in cpus):
        cpus.sort(key=along)  # along the axis by value, whatever the YAML's order
    paired = set()
    for cpu in cpus:
        value = along(cpu)
        gpu = view.point({**cpu.coords, "device": gpu_device})
        paired.add(id(gpu))
        if usable(cpu) and usable(gpu) and (differs := not_comparable(gpu, cpu)):
            missing.append((_name(axis, value), f"GPU: {differs} (CPU)"))
            continue
        if usable(cpu) and usable(gpu):
            rows.append((value, fit_ratio(cpu, gpu)))
            busy.append((value, gpu.gpu_busy if gpu is not None else None))
            continue
        why = [f"{side}: {why_unusable(p)}" for side, p in (("CPU", cpu), ("GPU", gpu)) if not usable(p)]
        missing.append((_name(axis, value), "; ".join(why)))
    missing += [
        (_name(axis, along(p)), f"GPU: no CPU point to compare with ({p.device})")
        for p in gpu_points
        if id(p) not in paired and parse_device(p.device)[1] == 1
    ]
    left = tuple(missing)
    if not rows:
        # A plan of one side (-k, --set device=...) has no pair to speak of.
        pairs = "no CPU and GPU pair ran ok on every repetition" if cpus else "no CPU point among these runs"
        reason = (_skip_reason(gpu_points) or pairs) if gpu_points else "no GPU point among these runs"
        # Only CPU points that could take part (every run ok, above the gate): a fast broken run is no end of the span.
        cpu_fits = [(along(p), stats.geometric_mean(_fit(p))) for p in cpus if usable(p) and _fit(p)]
        ends = cpu_fits[:1] if len(cpu_fits) == 1 else [cpu_fits[0], cpu_fits[-1]] if cpu_fits else []
        times = ", ".join(f"{t:.2f} s at {_name(axis, v)}" for v, t in ends)  # the ends of the axis, not a range
        span = f"CPU fit time: {times}." if ends else ""
        answer = f"No CPU-GPU comparison on this machine: {reason}{_missing_count(gpu_points, 'GPU')}."
        return Verdict(answer, span, left)
    reason = _busy_along(axis, busy)
    wins = [i for i, (_, r) in enumerate(rows) if r.faster]
    if not wins:
        value, best = max(rows, key=lambda vr: vr[1].value)
        return Verdict(
            f"The GPU is not measurably faster than the CPU at any {axis_name(axis) if axis else 'point'} "
            f"compared; at {_name(axis, value)} the GPU is {best.text()}.",
            reason,
            left,
        )
    first = wins[0]
    value, at_first = rows[first]
    after = [
        f"{_name(axis, v)}: {'slower' if r.significant else 'no measurable difference'}"
        for i, (v, r) in enumerate(rows)
        if i > first and i not in wins
    ]
    exceptions = f" (except at {'; '.join(after)})" if after else ""
    where = f"at {_name(axis, value)} and beyond" if first == 0 else f"from {_name(axis, value)} on"
    return Verdict(
        f"The GPU trains faster than the CPU {where}{exceptions}: at {_name(axis, value)} it is {at_first.text()}.",
        reason,
        left,
    )


def _busy_text(percent: float, where: str) -> str:
    idle = " (idle between kernels most of the time)" if percent < FED_BUSY_PERCENT else ""
    return f"{percent:.0f}% of the time {where}{idle}"


def _busy_along(axis: str | None, busy: list[tuple[object, float | None]]) -> str:
    """'GPU busy 18% of the time at width 100: ...; 85% of the time at width 2000.' for the first and
    last compared points that carry GPU telemetry; '' when none does."""
    measured = [(v, b) for v, b in busy if b is not None]
    if not measured:
        return ""
    ends = [measured[0]] if len(measured) == 1 else [measured[0], measured[-1]]
    return "GPU busy " + "; ".join(_busy_text(b, f"at {_name(axis, v)}") for v, b in ends) + "."


def _numeric(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def device_count(device: str) -> int:
    return parse_device(device)[1]


def scaling(view: ScenarioView) -> Verdict:
    """Speedup and efficiency of N devices against the baseline device set, for each batch mode."""
    base_device = str(view.spec.get("report", {}).get("baseline", {}).get("device", "gpu:1"))
    base_kind = parse_device(base_device)[0]
    parts, missing, busy = [], [], ""
    for mode in sorted({p.coords.get("training.batch_mode", "global") for p in view.points}):
        same_mode = [p for p in view.points if p.coords.get("training.batch_mode", mode) == mode]
        one = next((p for p in same_mode if p.device == base_device), None)
        if not usable(one):
            why = why_unusable(one)
            # A point that cannot be used itself says so; one that could says its baseline could not.
            missing += [(p.label, why_unusable(p) if not usable(p) else f"baseline {why}") for p in same_mode]
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
            r = fit_ratio(one, p)
            items.append((device_count(p.device), f"{p.device} is {r.text()}, efficiency {r.value / n:.0%}"))
            compared.append(p)
        batch = one.runs[0].spec["config"]["training"]["batch_size"]
        label = {"global": f"batch {batch} split across devices", "per_replica": f"{batch} per device"}.get(mode, mode)
        if items:
            # The most devices compared answer the question; the table has every count.
            parts.append(f"with {label}, " + max(items)[1])
            busy = busy or _busy_across([one, *compared])
    if not parts:
        base_points = [p for p in view.points if parse_device(p.device)[0] == base_kind]
        why = _skip_reason(base_points) or "fewer than two device counts ran ok on every repetition"
        return Verdict(
            f"No multi-{base_kind.upper()} comparison on this machine: {why}{_missing_count(view.points)}.",
            "",
            tuple(missing),
        )
    answer = f"Against {base_device} (total fit time): " + "; ".join(parts) + "."
    return Verdict(answer, busy or _batch_mode_effect(view), tuple(missing))


def _busy_across(points: list[Point]) -> str:
    """'GPU busy 85% of the time on gpu:1; 20% of the time on gpu:4: ...' for the device sets with GPU
    telemetry (each the mean over its GPUs); '' when none has any."""
    measured = [(p.device, b) for p in points if (b := p.gpu_busy) is not None]
    if not measured:
        return ""
    return "GPU busy " + "; ".join(_busy_text(b, f"on {device}") for device, b in measured) + "."


def _batch_mode_effect(view: ScenarioView) -> str:
    """At the most devices measured in both modes: does a per-device batch change the picture?"""
    both = [
        (device_count(g.device), g, p)  # (devices, split-batch point, per-device-batch point)
        for g in view.points
        if g.coords.get("training.batch_mode") == "global"
        for p in [view.point({**g.coords, "training.batch_mode": "per_replica"})]
        if usable(g) and usable(p) and device_count(g.device) > 1 and not not_comparable(g, p)
    ]
    if not both:
        return ""
    n, split, per = max(both, key=lambda t: t[0])
    r = fit_ratio(split, per)
    return f"On {per.device}, the per-device batch against the split one is {r.text()}."


def knobs(view: ScenarioView) -> Verdict:
    """Which single setting helps most against the default, and by how much, if any measurably does."""
    compared: list[tuple[str, stats.Ratio]] = []
    missing: list[tuple[str, str]] = []
    for p in view.points:
        base = view.baseline_for(p)
        if p is base:
            if not usable(p):  # a default no setting can be compared with: a point not compared
                missing.append((p.label, why_unusable(p)))
            continue
        if usable(p) and usable(base) and (differs := not_comparable(p, base)):
            missing.append((p.label, f"{differs} (its default)"))
        elif usable(p) and usable(base):
            compared.append((p.label, fit_ratio(base, p)))
        else:
            why = why_unusable(p) if not usable(p) else f"its default {why_unusable(base)}"
            missing.append((p.label, why))
    left = tuple(missing)
    if not compared:
        why = _skip_reason(view.points) or "no setting ran ok beside its default on every repetition"
        return Verdict(f"No setting could be compared on this machine: {why}{_missing_count(view.points)}.", "", left)
    slower = [label for label, r in compared if r.significant and r.value < 1]
    slow = f"Measurably slower: {_some(slower)}." if slower else ""
    gains = [(label, r) for label, r in compared if r.faster]
    if gains:
        label, r = max(gains, key=lambda lr: lr[1].value)
        return Verdict(f"Biggest gain: {label}, {r.text()} than the default with everything else equal.", slow, left)
    # Nothing measurably faster: name the comparison closest to a gain, significant or not.
    label, r = max(compared, key=lambda lr: lr[1].value)
    return Verdict(f"No setting is measurably faster than the default; the closest: {label}, {r.text()}.", slow, left)


def _some(labels: list[str], limit: int = 3) -> str:
    """Up to ``limit`` labels, then how many more (the table has them all)."""
    shown = "; ".join(labels[:limit])
    return shown + (f" and {len(labels) - limit} more (see the table)" if len(labels) > limit else "")


def none(view: ScenarioView) -> Verdict:
    """A sweep of the user's own: its fastest point against the baseline (``report.baseline``, else
    the first point in matrix order), with its interval, or that no point differs measurably."""
    base = _generic_baseline(view)
    if len(view.points) == 1 and usable(base):
        fits = _fit(view.points[0])
        took = f"trained in {stats.geometric_mean(fits):.2f} s" if fits else "no fit time recorded"
        return Verdict(f"One point, nothing to compare it with: {view.points[0].label} {took}.")
    if base is None or not usable(base):
        missing = tuple((p.label, why_unusable(p)) for p in view.points if not usable(p))
        if view.points and all(r.status == STATUS_SKIPPED for p in view.points for r in p.runs):
            # Nothing ran: why (a GPU this machine lacks), with the count, as the other verdicts say it.
            why = _skip_reason(view.points) or "every point was skipped"
            return Verdict(f"No comparison on this machine: {why}{_missing_count(view.points)}.", "", missing)
        why = f"the baseline {base.label} {_predicate(base)}" if base is not None else "no point ran ok"
        good = sum(1 for p in view.points if usable(p))
        count = f"{good} of {len(view.points)} points ran ok above the accuracy gate." if len(view.points) > 1 else ""
        return Verdict(f"No comparison on this machine: {why}.", count, missing)
    compared: list[tuple[Point, stats.Ratio]] = []
    missing_list: list[tuple[str, str]] = []
    for p in view.points:
        if p is base:
            continue
        if not usable(p):
            missing_list.append((p.label, why_unusable(p)))
        elif differs := not_comparable(p, base):
            missing_list.append((p.label, f"{differs}, against the baseline"))
        else:
            compared.append((p, fit_ratio(base, p)))
    left = tuple(missing_list)
    if not compared:
        return Verdict(f"No point could be compared with the baseline {base.label} on this machine.", "", left)
    fastest, r = max(compared, key=lambda pr: pr[1].value)
    slower = [p.label for p, q in compared if q.significant and q.value < 1]
    slow = f"Measurably slower than the baseline: {_some(slower)}." if slower else ""
    if r.faster:
        return Verdict(f"Fastest: {fastest.label}, {r.text()} than the baseline {base.label}.", slow, left)
    if len(slower) == len(compared):
        return Verdict(
            f"The baseline {base.label} is measurably the fastest; the closest, {fastest.label}, is {r.text()}.",
            "",
            left,
        )
    if all(q.significant is False for _, q in compared):
        what = "No point differs measurably from"
    else:
        what = "No point is measurably faster than"
    return Verdict(f"{what} the baseline {base.label}; the closest: {fastest.label}, {r.text()}.", slow, left)


def _generic_baseline(view: ScenarioView) -> Point | None:
    """``report.baseline`` where the scenario names one that exists, else the first point."""
    named = view.spec.get("report", {}).get("baseline") or {}
    if named and view.points:
        found = view.point({**view.points[0].coords, **named})
        if found is not None:
            return found
    return view.points[0] if view.points else None


VERDICTS: dict[str, Callable[[ScenarioView], Verdict]] = {
    "gpu_crossover": gpu_crossover,
    "scaling": scaling,
    "knobs": knobs,
    "none": none,
}


def judge(view: ScenarioView) -> Verdict:
    """The scenario's verdict on this view, as its parts."""
    return VERDICTS[view.spec.get("report", {}).get("verdict", "none")](view)


def verdict(view: ScenarioView) -> str:
    """The verdict's text: the answer and at most one reason, two sentences at most."""
    return judge(view).text
