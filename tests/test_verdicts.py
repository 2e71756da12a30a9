"""Verdict wording at its edges, on result records built for the purpose (inputs, not measurements)."""

from __future__ import annotations

from typing import Any

from suite import verdicts
from suite.results import RunResult
from suite.views import Point, ScenarioView


def _run(point: dict[str, Any], fit: float, rep: int, status: str = "ok", acc: float = 0.97, **cfg: Any) -> RunResult:
    label = ", ".join(f"{k}={v}" for k, v in point.items())
    config = {"device": point.get("device", "cpu"), "training": {"batch_size": 128}, **cfg}
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


def _view(verdict: str, baseline: dict, points: list[tuple[dict, list[float], str]]) -> ScenarioView:
    pts = []
    for coords, fits, status in points:
        runs = [_run(coords, f, i, status) for i, f in enumerate(fits)]
        for r in runs:
            r.spec["report"].update(verdict=verdict, baseline=baseline)
        pts.append(Point(runs[0].spec["point_label"], coords, runs))
    return ScenarioView("m", "s", False, pts)


def _width(cpu: dict[int, list[float]], gpu: dict[int, list[float]], status: str = "ok") -> ScenarioView:
    points = []
    for w in cpu:
        points.append(({"model.hidden.0": w, "device": "cpu"}, cpu[w], "ok"))
        points.append(({"model.hidden.0": w, "device": "gpu"}, gpu[w], status))
    return _view("gpu_crossover", {"device": "cpu"}, points)


def test_gpu_never_wins() -> None:
    v = _width({100: [1.0, 1.02, 0.98], 750: [2.0, 2.05, 1.95]}, {100: [3.0, 3.1, 2.9], 750: [4.0, 4.1, 3.9]})
    text = verdicts.verdict(v)
    assert text.startswith("The GPU is never faster than the CPU here; closest at width 750")


def test_gpu_wins_everywhere() -> None:
    v = _width({100: [3.0, 3.1, 2.9], 750: [9.0, 9.1, 8.9]}, {100: [1.0, 1.02, 0.98], 750: [1.5, 1.52, 1.48]})
    assert verdicts.verdict(v).startswith("The GPU is faster at every point measured; at width 100: GPU speedup 3.00x")


def test_gpu_wins_from_a_width_on() -> None:
    v = _width(
        {100: [1.0, 1.02, 0.98], 750: [6.0, 6.1, 5.9], 2000: [20.0, 20.5, 19.5]},
        {100: [3.0, 3.1, 2.9], 750: [2.0, 2.05, 1.95], 2000: [4.0, 4.1, 3.9]},
    )
    assert verdicts.verdict(v).startswith("The GPU is faster from width 750 on: GPU speedup 3.00x (95% CI")


def test_interval_containing_one_is_not_a_win() -> None:
    v = _width({100: [1.0, 1.2, 0.9]}, {100: [0.95, 1.15, 1.0]})
    text = verdicts.verdict(v)
    assert "never faster" in text and "not significant" in text


def test_no_gpu_says_why() -> None:
    v = _width({100: [1.0], 750: [2.0]}, {100: [0], 750: [0]}, status="skipped")
    text = verdicts.verdict(v)
    assert text.startswith("No CPU-GPU comparison on this machine: GPU points did not run (needs 1 GPU(s)")
    assert "CPU fit time: 1.00 s at width 100 to 2.00 s at width 750" in text


def test_broken_fast_run_does_not_win() -> None:
    v = _width({100: [3.0, 3.1, 2.9]}, {100: [1.0, 1.0, 1.0]})
    for r in v.points[1].runs:
        r.quality["test_accuracy"] = 0.1  # fast, and wrong
    assert "did not run" in verdicts.verdict(v) or "no GPU point" in verdicts.verdict(v)


def test_scaling_speedup_and_efficiency() -> None:
    pts = []
    for mode, fits in (("global", {1: 10.0, 2: 12.0, 4: 20.0}), ("per_replica", {1: 10.0, 2: 6.0, 4: 3.5})):
        for n, f in fits.items():
            pts.append(({"training.batch_mode": mode, "device": f"gpu:{n}"}, [f, f * 1.01, f * 0.99], "ok"))
    text = verdicts.verdict(_view("scaling", {"device": "gpu:1"}, pts))
    assert text.startswith("Speedup over gpu:1 (total fit time): batch 128 split across devices: gpu:2 0.83x")
    assert "gpu:4 0.50x" in text and "efficiency 12%" in text
    assert "128 per device: gpu:2 1.67x" in text and "gpu:4 2.86x" in text and "efficiency 71%" in text
    assert text.endswith("On gpu:4, the per-device batch instead of the split one: speedup 5.71x (95% CI 5.60-5.83).")


def test_knobs_names_the_best_setting() -> None:
    pts = [
        ({"variant": "default", "training.batch_size": 128}, [10.0, 10.1, 9.9], "ok"),
        ({"variant": "xla", "training.batch_size": 128}, [5.0, 5.05, 4.95], "ok"),
        ({"variant": "spe", "training.batch_size": 128}, [2.5, 2.52, 2.48], "ok"),
    ]
    text = verdicts.verdict(_view("knobs", {"variant": "default"}, pts))
    assert text.startswith("Biggest gain: variant=spe, training.batch_size=128, 4.00x (95% CI")
