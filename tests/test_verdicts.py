"""Verdict wording at its edges and over generated inputs (result records built for the purpose)."""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pytest

from suite import telemetry
from suite.record.results import FIT_S, RunResult
from suite.report import stats, verdicts
from suite.report.points import Point, ScenarioView


def _run(point: dict[str, Any], fit: float, rep: int, status: str = "ok", acc: float = 0.97) -> RunResult:
    label = ", ".join(f"{k}={v}" for k, v in point.items())
    config = {"device": point.get("device", "cpu"), "training": {"batch_size": 128}}
    return RunResult(
        status=status,
        spec={
            "scenario": "s",
            "point": point,
            "point_label": label,
            "repetition": rep,
            "config": config,
            "fingerprint": label,
            "report": {},
        },
        message="needs 1 GPU(s); this machine has no GPU" if status == "skipped" else "",
        timing={"fit_s": fit} if status == "ok" else {},
        quality={"test_accuracy": acc} if status == "ok" else {},
    )


def _view(verdict: str, baseline: dict, points: list[tuple[dict, list[float], Any]]) -> ScenarioView:
    """``points``: (coords, fit times, status: one for all runs or one per run)."""
    pts = []
    for coords, fits, status in points:
        statuses = status if isinstance(status, list) else [status] * len(fits)
        runs = [_run(coords, f, i, s) for i, (f, s) in enumerate(zip(fits, statuses, strict=True))]
        for r in runs:
            r.spec["report"].update(verdict=verdict, baseline=baseline)
        pts.append(Point(runs[0].spec["point_label"], coords, runs))
    return ScenarioView("m", "s", False, pts)


def _width(cpu: dict[int, list[float]], gpu: dict[int, list[float]], status: Any = "ok") -> ScenarioView:
    points = []
    for w in cpu:
        points.append(({"model.hidden.0": w, "device": "cpu"}, cpu[w], "ok"))
        points.append(({"model.hidden.0": w, "device": "gpu"}, gpu[w], status))
    return _view("gpu_crossover", {"device": "cpu"}, points)


MAX_VERDICT = 320  # characters: about two sentences
SENTENCE_END = re.compile(r"\.(?:\s+(?=[A-Z])|$)")


def _said(view: ScenarioView) -> str:
    """The verdict's text, then its points not compared as one sentence grouped by reason, the way
    the page's "Not compared" section lists them."""
    v = verdicts.judge(view)
    assert len(SENTENCE_END.findall(v.text)) <= 2, v.text  # the answer, then at most one reason
    assert len(v.text) <= MAX_VERDICT, v.text  # read at a glance
    groups = "; ".join(f"{', '.join(names)} ({why})" for why, names in v.not_compared_by_reason())
    return v.text + (f" Not compared: {groups}." if groups else "")


def _reps(t: float) -> list[float]:
    return [t, t * 1.02, t / 1.02]  # geometric mean exactly t


def test_gpu_never_wins() -> None:
    v = _width({100: _reps(1.0), 750: _reps(2.0)}, {100: _reps(3.0), 750: _reps(4.0)})
    text = _said(v)
    assert text.startswith(
        "The GPU is not measurably faster than the CPU at any width compared; at width 750 the GPU is 2.00x slower"
    )
    assert "Not compared" not in text


def test_gpu_wins_everywhere() -> None:
    v = _width({100: _reps(3.0), 750: _reps(9.0)}, {100: _reps(1.0), 750: _reps(1.5)})
    assert _said(v).startswith(
        "The GPU trains faster than the CPU at width 100 and beyond: at width 100 it is 3.00x faster (95% CI"
    )


def test_gpu_wins_from_a_width_on() -> None:
    v = _width(
        {100: _reps(1.0), 750: _reps(6.0), 2000: _reps(20.0)},
        {100: _reps(3.0), 750: _reps(2.0), 2000: _reps(4.0)},
    )
    assert _said(v).startswith(
        "The GPU trains faster than the CPU from width 750 on: at width 750 it is 3.00x faster (95% CI"
    )


def test_wins_then_loses_names_the_exception() -> None:
    v = _width(
        {100: _reps(1.0), 750: _reps(6.0), 2000: _reps(2.0)},
        {100: _reps(3.0), 750: _reps(2.0), 2000: _reps(4.0)},
    )
    text = _said(v)
    assert text.startswith("The GPU trains faster than the CPU from width 750 on (except at width 2000: slower)")


def test_crossover_follows_the_axis_by_value_not_the_yaml_order() -> None:
    v = _width(
        {1000: _reps(6.0), 100: _reps(1.0), 2000: _reps(20.0)},  # written out of order
        {1000: _reps(2.0), 100: _reps(3.0), 2000: _reps(4.0)},
    )
    assert _said(v).startswith(
        "The GPU trains faster than the CPU from width 1000 on: at width 1000 it is 3.00x faster"
    )


def test_crossover_pairs_gpu_1_and_names_a_gpu_point_without_a_cpu_one() -> None:
    points = [
        ({"model.hidden.0": 100, "device": "cpu"}, _reps(3.0), "ok"),
        ({"model.hidden.0": 100, "device": "gpu:1"}, _reps(1.0), "ok"),
        ({"model.hidden.0": 750, "device": "gpu:1"}, _reps(1.0), "ok"),
    ]
    text = _said(_view("gpu_crossover", {"device": "cpu"}, points))
    assert text.startswith(
        "The GPU trains faster than the CPU at width 100 and beyond: at width 100 it is 3.00x faster"
    )
    assert "Not compared: width 750 (GPU: no CPU point to compare with (gpu:1))." in text


def test_interval_containing_one_is_not_a_win() -> None:
    v = _width({100: [1.0, 1.2, 0.9]}, {100: [0.95, 1.15, 1.0]})
    text = _said(v)
    assert "not measurably faster" in text and "not significant" in text


def test_two_runs_per_side_claim_nothing() -> None:
    # 3x faster on both runs, but two runs give no interval: no win may be claimed.
    v = _width({100: [3.0, 3.1]}, {100: [1.0, 1.02]})
    text = _said(v)
    assert "not measurably faster" in text and "no interval, 3 needed" in text


def test_single_point() -> None:
    v = _width({100: _reps(3.0)}, {100: _reps(1.0)})
    assert _said(v).startswith(
        "The GPU trains faster than the CPU at width 100 and beyond: at width 100 it is 3.00x faster"
    )


def test_no_gpu_says_why() -> None:
    v = _width({100: [1.0], 750: [2.0]}, {100: [0], 750: [0]}, status="skipped")
    text = _said(v)
    assert text.startswith(
        "No CPU-GPU comparison on this machine: needs 1 GPU(s); this machine has no GPU (2 GPU points skipped)."
    )
    assert "CPU fit time: 1.00 s at width 100, 2.00 s at width 750" in text
    assert text.endswith("Not compared: width 100, width 750 (GPU: skipped).")


def test_no_gpu_with_one_cpu_point_says_its_time_once() -> None:
    v = _width({750: [1.84]}, {750: [0]}, status="skipped")
    text = _said(v)
    assert "CPU fit time: 1.84 s at width 750. Not compared" in text, text
    assert " to " not in text, text


def test_all_failed() -> None:
    v = _width({100: [1.0], 750: [2.0]}, {100: [0], 750: [0]}, status="timeout")
    text = _said(v)
    assert text.startswith("No CPU-GPU comparison on this machine: no CPU and GPU pair ran ok")
    assert "width 100, width 750 (GPU: timeout)" in text


def test_failed_and_gated_points_are_named() -> None:
    v = _width(
        {100: _reps(1.0), 750: _reps(6.0), 2000: _reps(20.0)},
        {100: _reps(3.0), 750: _reps(2.0), 2000: _reps(4.0)},
    )
    for r in v.points[3].runs:  # the GPU at 750: fast, and wrong
        r.quality["test_accuracy"] = 0.1
    v.points[5].runs[1] = _run(v.points[5].coords, 0, 1, "timeout")  # one GPU repetition at 2000 timed out
    text = _said(v)
    assert "faster from" not in text
    assert "Not compared: width 750 (GPU: below the accuracy gate (0.100 < 0.80)); width 2000 (GPU: timeout)." in text


def test_scaling_speedup_and_efficiency() -> None:
    pts = []
    for mode, fits in (("global", {1: 10.0, 2: 12.0, 4: 20.0}), ("per_replica", {1: 10.0, 2: 6.0, 4: 3.5})):
        for n, f in fits.items():
            pts.append(({"training.batch_mode": mode, "device": f"gpu:{n}"}, [f, f * 1.01, f / 1.01], "ok"))
    text = _said(_view("scaling", {"device": "gpu:1"}, pts))
    assert text.startswith(
        "Against gpu:1 (total fit time): with batch 128 split across devices, gpu:4 is 2.00x slower (95% CI"
    ), text
    assert "efficiency 12%; with 128 per device, gpu:4 is 2.86x faster (95% CI" in text and "efficiency 71%." in text
    assert "gpu:2" not in text, "the most devices compared answer the question"
    assert re.search(
        r"On gpu:4, the per-device batch against the split one is 5\.71x faster \(95% CI 5\.\d\d-5\.\d\d\)\.$", text
    )


def test_scaling_names_what_it_could_not_compare() -> None:
    pts = [
        ({"training.batch_mode": "global", "device": "gpu:1"}, _reps(10.0), "ok"),
        ({"training.batch_mode": "global", "device": "gpu:2"}, _reps(6.0), "ok"),
        ({"training.batch_mode": "global", "device": "gpu:4"}, _reps(0), "skipped"),
    ]
    text = _said(_view("scaling", {"device": "gpu:1"}, pts))
    assert text.endswith("Not compared: training.batch_mode=global, device=gpu:4 (skipped).")


def _knobs(fits: dict[str, list[float]]) -> ScenarioView:
    pts = [({"variant": name, "training.batch_size": 128}, f, "ok") for name, f in fits.items()]
    return _view("knobs", {"variant": "default"}, pts)


def test_knobs_names_the_best_setting() -> None:
    text = _said(_knobs({"default": _reps(10.0), "xla": _reps(5.0), "spe": _reps(2.5)}))
    assert text.startswith("Biggest gain: variant=spe, training.batch_size=128, 4.00x faster (95% CI")


def test_knobs_closest_is_the_near_tie_not_a_much_slower_setting() -> None:
    text = _said(_knobs({"default": _reps(10.0), "xla": _reps(30.0), "spe": [10.0, 10.4, 9.7]}))
    assert text.startswith("No setting is measurably faster than the default; the closest: variant=spe")
    assert "not significant" in text and "Measurably slower: variant=xla" in text


def test_knobs_tiny_insignificant_gain_is_not_a_gain() -> None:
    text = _said(_knobs({"default": [10.0, 10.3, 9.8], "spe": [9.9, 10.2, 9.7]}))
    assert "gain" not in text.lower()
    assert text.startswith("No setting is measurably faster than the default; the closest: variant=spe")


# -- generated inputs ---------------------------------------------------------------------------

CLAIMS = ("faster from", "faster at", "Biggest gain")


def _random_point(rng: np.random.Generator, coords: dict, center: float) -> tuple[dict, list[float], Any]:
    n = int(rng.choice([1, 2, 3, 5]))
    fits = list(center * np.exp(rng.normal(0, float(rng.choice([0.01, 0.05, 0.2])), n)))
    roll = rng.random()
    if roll < 0.1:
        return coords, fits, "skipped"
    if roll < 0.2:
        return coords, fits, ["ok"] * (n - 1) + ["timeout"]
    return coords, fits, "ok"


def _gate(view: ScenarioView, rng: np.random.Generator) -> None:
    for p in view.points:
        if p.ok_runs and rng.random() < 0.1:
            for r in p.ok_runs:
                r.quality["test_accuracy"] = 0.2


@pytest.mark.parametrize("seed", range(300))
def test_crossover_wording_holds_over_generated_inputs(seed: int) -> None:
    rng = np.random.default_rng(seed)
    widths = rng.choice([100, 250, 500, 750, 1000, 2000], int(rng.integers(1, 5)), replace=False).tolist()  # any order
    points = []
    for w in widths:
        points.append(_random_point(rng, {"model.hidden.0": w, "device": "cpu"}, 1.0))
        points.append(_random_point(rng, {"model.hidden.0": w, "device": "gpu"}, float(rng.choice([0.3, 1, 1.03, 3]))))
    view = _view("gpu_crossover", {"device": "cpu"}, points)
    _gate(view, rng)
    text = _said(view)
    ratios = {}
    for w in widths:
        cpu, gpu = (
            view.point({"model.hidden.0": w, "device": "cpu"}),
            view.point({"model.hidden.0": w, "device": "gpu"}),
        )
        if verdicts.usable(cpu) and verdicts.usable(gpu):
            ratios[w] = stats.ratio(cpu.values(FIT_S), gpu.values(FIT_S))
        else:
            assert re.search(rf"Not compared: .*width {w}\b", text), (w, text)  # every dropped point is named
    claim = re.search(r"faster than the CPU (?:from|at) width (\d+)", text)
    if claim:
        w = int(claim.group(1))
        assert ratios[w].faster, text
        assert all(not r.faster for v, r in ratios.items() if v < w), "the first measurable win is named"
        assert f"it is {ratios[w].text()}" in text
    else:
        assert not any(r.faster for r in ratios.values()), text
        assert not any(c in text for c in CLAIMS)


@pytest.mark.parametrize("seed", range(300))
def test_knobs_wording_holds_over_generated_inputs(seed: int) -> None:
    rng = np.random.default_rng(1000 + seed)
    names = ["default", *[f"v{i}" for i in range(int(rng.integers(1, 5)))]]
    points = [
        _random_point(rng, {"variant": name}, 10.0 if name == "default" else float(rng.choice([3, 9.7, 10, 10.5, 30])))
        for name in names
    ]
    view = _view("knobs", {"variant": "default"}, points)
    _gate(view, rng)
    text = _said(view)
    base = view.point({"variant": "default"})
    ratios = {}
    for p in view.points:
        if p is base:
            continue
        if verdicts.usable(p) and verdicts.usable(base):
            ratios[p.label] = stats.ratio(base.values(FIT_S), p.values(FIT_S))
        else:
            assert p.label in text.split("Not compared:")[-1], (p.label, text)
    gains = {k: r for k, r in ratios.items() if r.faster}
    if gains:
        best = max(gains, key=lambda k: gains[k].value)
        assert text.startswith(f"Biggest gain: {best}, {gains[best].text()}"), text
    else:
        assert "gain" not in text.lower() and "faster than the default with" not in text
        if ratios:
            closest = max(ratios, key=lambda k: ratios[k].value)
            assert f": {closest}, {ratios[closest].text()}" in text, text


# GPU busy: said only where GPU telemetry exists, and then for the right points


def _with_busy(view: ScenarioView, busy: dict[str, list[float]]) -> ScenarioView:
    """Give each repetition of the points labelled in ``busy`` a telemetry section with that GPU utilization."""
    for p in view.points:
        for r, pct in zip(p.runs, busy.get(p.label, []), strict=False):
            metric = {"name": telemetry.GPU_UTIL_PERCENT, "device": "GPU-a", "summary": {"steady": {"mean": pct}}}
            r.telemetry.update(metrics=[metric])
    return view


def test_crossover_says_how_busy_the_gpu_was() -> None:
    v = _width({100: _reps(1.0), 2000: _reps(20.0)}, {100: _reps(3.0), 2000: _reps(4.0)})
    _with_busy(v, {"model.hidden.0=100, device=gpu": [17.0, 18.0, 19.0], "model.hidden.0=2000, device=gpu": [85.0] * 3})
    text = _said(v)
    assert text.startswith(
        "The GPU trains faster than the CPU from width 2000 on: at width 2000 it is 5.00x faster (95% CI"
    )
    assert text.endswith(
        " GPU busy 18% of the time at width 100 (idle between kernels most of the time); 85% of the time at width 2000."
    )


def test_crossover_without_telemetry_says_nothing_about_busy() -> None:
    v = _width({100: _reps(1.0), 2000: _reps(20.0)}, {100: _reps(3.0), 2000: _reps(4.0)})
    assert "busy" not in _said(v)


def test_crossover_busy_only_for_compared_points() -> None:
    points = [
        ({"model.hidden.0": 100, "device": "cpu"}, _reps(1.0), "ok"),
        ({"model.hidden.0": 100, "device": "gpu"}, _reps(3.0), "ok"),
        ({"model.hidden.0": 2000, "device": "cpu"}, _reps(20.0), "ok"),
        ({"model.hidden.0": 2000, "device": "gpu"}, _reps(4.0), ["ok", "ok", "timeout"]),
    ]
    v = _view("gpu_crossover", {"device": "cpu"}, points)
    _with_busy(v, {"model.hidden.0=100, device=gpu": [30.0] * 3, "model.hidden.0=2000, device=gpu": [90.0] * 3})
    text = _said(v)
    assert " GPU busy 30% of the time at width 100 (idle between kernels most of the time)." in text
    assert "width 2000" not in text.split("GPU busy")[1].split("Not compared")[0]


def test_scaling_says_how_busy_each_device_set_was() -> None:
    pts = [({"device": f"gpu:{n}"}, _reps(f), "ok") for n, f in ((1, 10.0), (4, 20.0))]
    v = _with_busy(_view("scaling", {"device": "gpu:1"}, pts), {"device=gpu:1": [80.0] * 3, "device=gpu:4": [20.0] * 3})
    text = _said(v)
    assert (
        "gpu:4 is 2.00x slower (95% CI" in text
        and "efficiency 13%. GPU busy 80% of the time on gpu:1; 20% of the time on gpu:4 (idle between kernels "
        "most of the time)."
        in text
    ), text
    no_telemetry = _view("scaling", {"device": "gpu:1"}, pts)
    assert "busy" not in _said(no_telemetry)


@pytest.mark.parametrize("seed", range(200))
def test_busy_wording_holds_over_generated_inputs(seed: int) -> None:
    rng = np.random.default_rng(5000 + seed)
    widths = sorted(rng.choice([100, 250, 500, 750, 1000, 2000], int(rng.integers(1, 5)), replace=False).tolist())
    points = []
    for w in widths:
        points.append(_random_point(rng, {"model.hidden.0": w, "device": "cpu"}, 1.0))
        points.append(_random_point(rng, {"model.hidden.0": w, "device": "gpu"}, float(rng.choice([0.3, 1, 3]))))
    view = _view("gpu_crossover", {"device": "cpu"}, points)
    _gate(view, rng)
    busy = {}
    for p in view.points:
        if p.device == "gpu" and rng.random() < 0.7:
            busy[p.label] = [float(rng.uniform(0, 100)) for _ in p.runs]
    _with_busy(view, busy)
    text = _said(view)
    compared = [
        view.point({"model.hidden.0": w, "device": "gpu"})
        for w in widths
        if verdicts.usable(view.point({"model.hidden.0": w, "device": "cpu"}))
        and verdicts.usable(view.point({"model.hidden.0": w, "device": "gpu"}))
    ]
    measured = [p for p in compared if p.gpu_busy is not None]
    if not measured:
        assert "busy" not in text, text
        return
    for p in {id(q): q for q in (measured[0], measured[-1])}.values():
        said = f"{p.gpu_busy:.0f}% of the time at width {p.coords['model.hidden.0']}"
        assert said in text, (said, text)
        fed = f"{said} (idle between kernels most of the time)"
        assert (fed in text) == (p.gpu_busy < verdicts.FED_BUSY_PERCENT), text
    assert text.count("% of the time") == len({id(measured[0]), id(measured[-1])})


# Data identity: points trained on other data than their baseline are named, never compared

MNIST = {"source": "mnist.npz", "sha256": "731c5ac602752760c8e48fbffcf8c3b850d9dc2a2aedcf2cc48468fc17b673d1"}
SYNTHETIC = {"source": "synthetic"}


def _with_data(view: ScenarioView, data: dict[str, dict]) -> ScenarioView:
    """Give every run the data identity its point's label maps to (MNIST when not named)."""
    for p in view.points:
        for r in p.runs:
            r.spec["config"]["data"] = {"identity": {**data.get(p.label, MNIST), "note": "where it lay"}}
    return view


def test_crossover_does_not_compare_points_on_other_data() -> None:
    v = _width({100: _reps(3.0), 750: _reps(9.0)}, {100: _reps(1.0), 750: _reps(1.5)})
    _with_data(v, {"model.hidden.0=100, device=gpu": SYNTHETIC})
    text = _said(v)
    assert text.startswith("The GPU trains faster than the CPU at width 750 and beyond"), text
    assert text.endswith(
        "Not compared: width 100 (GPU: trained on other data: synthetic, against mnist.npz sha256 731c5ac60275 (CPU))."
    ), text


def test_the_note_beside_an_identity_does_not_count() -> None:
    v = _with_data(_width({100: _reps(3.0)}, {100: _reps(1.0)}), {})
    v.points[0].runs[0].spec["config"]["data"]["identity"]["note"] = "another path"
    assert "Not compared" not in _said(v)


def test_scaling_and_knobs_do_not_compare_points_on_other_data() -> None:
    pts = [({"device": f"gpu:{n}"}, _reps(f), "ok") for n, f in ((1, 10.0), (2, 6.0), (4, 4.0))]
    v = _with_data(_view("scaling", {"device": "gpu:1"}, pts), {"device=gpu:4": SYNTHETIC})
    text = _said(v)
    assert "gpu:2 is 1.67x faster" in text and "gpu:4 is 2.50x" not in text
    assert text.endswith(
        "Not compared: device=gpu:4 (trained on other data: synthetic, against mnist.npz sha256 731c5ac60275 (gpu:1))."
    )
    k = _with_data(
        _knobs({"default": _reps(10.0), "xla": _reps(5.0), "spe": _reps(2.5)}),
        {"variant=spe, training.batch_size=128": SYNTHETIC},
    )
    text = _said(k)
    assert text.startswith("Biggest gain: variant=xla, training.batch_size=128, 2.00x"), text
    assert "variant=spe, training.batch_size=128 (trained on other data: synthetic" in text


def _random_width_view(rng: np.random.Generator) -> ScenarioView:
    """A crossover view over 1 to 4 random widths, CPU and GPU, with random repetitions."""
    widths = rng.choice([100, 250, 500, 750, 1000, 2000], int(rng.integers(1, 5)), replace=False).tolist()
    points = []
    for w in widths:
        points.append(_random_point(rng, {"model.hidden.0": w, "device": "cpu"}, 1.0))
        points.append(_random_point(rng, {"model.hidden.0": w, "device": "gpu"}, float(rng.choice([0.3, 1, 3]))))
    return _view("gpu_crossover", {"device": "cpu"}, points)


@pytest.mark.parametrize("seed", range(100))
def test_mixed_data_is_never_compared_over_generated_inputs(seed: int) -> None:
    rng = np.random.default_rng(9000 + seed)
    view = _random_width_view(rng)
    widths = sorted({p.coords["model.hidden.0"] for p in view.points})
    data = {p.label: SYNTHETIC for p in view.points if rng.random() < 0.3}
    _with_data(view, data)
    text = _said(view)
    for w in widths:
        cpu = view.point({"model.hidden.0": w, "device": "cpu"})
        gpu = view.point({"model.hidden.0": w, "device": "gpu"})
        if data.get(cpu.label) != data.get(gpu.label):
            assert re.search(rf"Not compared: .*width {w}\b", text), (w, text)
            claim = re.search(r"faster than the CPU (?:from|at) width (\d+)", text)
            assert not claim or int(claim.group(1)) != w, text
            if verdicts.usable(cpu) and verdicts.usable(gpu):
                assert re.search(rf"width {w}\b[^;.]*trained on other data", text), (w, text)


# Settings: points measured with other --set overrides, or another config beyond their own matrix
# coordinates, are named, never compared


def _with_set(view: ScenarioView, label: str, overrides: dict[str, Any]) -> ScenarioView:
    """Give the point ``label`` the overrides, applied to its config as ``--set`` would."""
    p = view.point_by_label(label)
    assert p is not None, label
    for r in p.runs:
        r.spec["overrides"] = dict(overrides)
        for path, value in overrides.items():
            section, key = path.split(".")
            r.spec["config"].setdefault(section, {})[key] = value
    return view


def test_crossover_does_not_compare_points_measured_with_other_settings() -> None:
    # A full run, then `run -k device=gpu --set training.batch_size=1024` at width 100.
    v = _width({100: _reps(3.0), 750: _reps(9.0)}, {100: _reps(1.0), 750: _reps(1.5)})
    _with_set(v, "model.hidden.0=100, device=gpu", {"training.batch_size": 1024})
    text = _said(v)
    assert text.startswith("The GPU trains faster than the CPU at width 750 and beyond"), text
    assert text.endswith(
        "Not compared: width 100 (GPU: other settings (--set training.batch_size=1024, against no --set) (CPU))."
    ), text


def test_the_same_set_on_both_points_compares() -> None:
    v = _width({100: _reps(3.0)}, {100: _reps(1.0)})
    for p in v.points:
        _with_set(v, p.label, {"training.batch_size": 1024})
    assert "Not compared" not in _said(v)


def test_a_config_changed_beyond_the_matrix_is_not_compared() -> None:
    # No --set, but the scenario file changed between the two points' runs.
    v = _width({100: _reps(3.0)}, {100: _reps(1.0)})
    for r in v.point_by_label("model.hidden.0=100, device=gpu").runs:
        r.spec["config"]["training"]["batch_size"] = 256
    text = _said(v)
    assert text.startswith("No CPU-GPU comparison"), text
    assert "other settings (training.batch_size 256 against 128)" in text, text


def test_scaling_and_knobs_do_not_compare_points_with_other_settings() -> None:
    pts = [({"device": f"gpu:{n}"}, _reps(f), "ok") for n, f in ((1, 10.0), (2, 6.0), (4, 4.0))]
    v = _with_set(_view("scaling", {"device": "gpu:1"}, pts), "device=gpu:4", {"training.epochs": 1})
    text = _said(v)
    assert "gpu:2 is 1.67x faster" in text and "gpu:4" not in text.split("Not compared")[0], text
    why = "other settings (--set training.epochs=1, against no --set)"
    assert text.endswith(f"Not compared: device=gpu:4 ({why} (gpu:1)).")
    k = _with_set(
        _knobs({"default": _reps(10.0), "xla": _reps(5.0), "spe": _reps(2.5)}),
        "variant=spe, training.batch_size=128",
        {"training.epochs": 1},
    )
    text = _said(k)
    assert text.startswith("Biggest gain: variant=xla, training.batch_size=128, 2.00x"), text
    assert "variant=spe, training.batch_size=128 (other settings (--set training.epochs=1" in text, text


@pytest.mark.parametrize("seed", range(50))
def test_mixed_settings_are_never_compared_over_generated_inputs(seed: int) -> None:
    rng = np.random.default_rng(12000 + seed)
    view = _random_width_view(rng)
    widths = sorted({p.coords["model.hidden.0"] for p in view.points})
    changed = {p.label for p in view.points if rng.random() < 0.3}
    for label in changed:
        _with_set(view, label, {"training.batch_size": 1024})
    text = _said(view)
    for w in widths:
        cpu = view.point({"model.hidden.0": w, "device": "cpu"})
        gpu = view.point({"model.hidden.0": w, "device": "gpu"})
        if (cpu.label in changed) != (gpu.label in changed):
            assert re.search(rf"Not compared: .*width {w}\b", text), (w, text)
            claim = re.search(r"faster than the CPU (?:from|at) width (\d+)", text)
            assert not claim or int(claim.group(1)) != w, text
            if verdicts.usable(cpu) and verdicts.usable(gpu):
                assert re.search(rf"width {w}\b[^;.]*other settings", text), (w, text)


# A sweep of the user's own (verdict: none): the fastest point against the baseline


def _sweep(fits: dict[int, list[float]], baseline: dict | None = None, status: dict | None = None) -> ScenarioView:
    pts = [({"training.batch_size": b}, f, (status or {}).get(b, "ok")) for b, f in fits.items()]
    return _view("none", baseline or {}, pts)


def test_a_sweep_names_its_fastest_point_against_the_baseline() -> None:
    text = _said(_sweep({32: _reps(4.0), 128: _reps(2.0), 512: _reps(1.0)}, {"training.batch_size": 128}))
    assert (
        text.startswith("Fastest: training.batch_size=512, 2.00x faster (95% CI 1.9")
        and "than the baseline training.batch_size=128." in text
    ), text
    assert "Measurably slower than the baseline: training.batch_size=32." in text, text


def test_a_sweep_without_a_baseline_compares_with_its_first_point() -> None:
    text = _said(_sweep({32: _reps(4.0), 128: _reps(2.0)}))
    assert text.startswith("Fastest: training.batch_size=128, 2.00x faster"), text
    assert "the baseline training.batch_size=32" in text, text


def test_a_sweep_with_no_difference_says_so_and_names_what_the_gate_left_out() -> None:
    view = _sweep({32: [1.0, 1.1, 0.9], 128: [1.05, 0.95, 1.0], 512: _reps(0.2)})
    for r in view.point({"training.batch_size": 512}).runs:
        r.quality["test_accuracy"] = 0.199
    text = _said(view)
    assert text.startswith("No point differs measurably from the baseline training.batch_size=32"), text
    assert "not significant" in text and "faster than" not in text, text
    assert "Not compared: training.batch_size=512 (below the accuracy gate (0.199 < 0.80))." in text, text


def test_a_sweep_whose_baseline_is_fastest_says_so() -> None:
    text = _said(_sweep({32: _reps(1.0), 128: _reps(2.0), 512: _reps(3.0)}))
    assert text.startswith("The baseline training.batch_size=32 is measurably the fastest; the closest, "), text
    assert "training.batch_size=128, is 2.00x slower" in text, text


def test_a_failed_baseline_is_said_in_words() -> None:
    # A status is a noun ('error', 'timeout'): the sentence says the point failed, and with what.
    text = _said(_sweep({32: _reps(4.0), 128: _reps(2.0)}, status={32: "error"}))
    assert text.startswith("No comparison on this machine: the baseline training.batch_size=32 failed (error)."), text
    skipped = _said(_sweep({32: _reps(4.0), 128: _reps(2.0)}, status={32: "skipped"}))
    assert skipped.startswith("No comparison on this machine: the baseline training.batch_size=32 is skipped."), skipped


def test_a_count_of_failed_points_says_they_failed() -> None:
    v = _width({100: [1.0], 750: [2.0]}, {100: [0], 750: [0]}, status="timeout")
    text = _said(v)
    assert "(2 GPU points failed: timeout)" in text, text


def test_one_point_without_a_fit_time_says_so() -> None:
    # An ok run whose fit_s is null (a NaN is saved as null): no mean to print, and no traceback.
    view = _sweep({32: [1.0]})
    for r in view.points[0].runs:
        r.timing.pop("fit_s", None)
    text = _said(view)
    assert text.startswith("One point, nothing to compare it with: training.batch_size=32 no fit time recorded."), text
