"""Table cells at their edges: figures that would mislead are shown as what they are."""

from __future__ import annotations

import dataclasses
from typing import Any

from suite.record.results import RunResult
from suite.report import environment_section, pages
from suite.report.points import Point, ScenarioView


def _point(timing: dict[str, Any], work: dict[str, Any] | None = None, device: str = "gpu:2") -> tuple:
    spec = {
        "scenario": "s",
        "point": {"device": device},
        "point_label": f"device={device}",
        "repetition": 0,
        "config": {"device": device, "training": {"batch_size": 128}},
        "fingerprint": "f",
        "report": {},
    }
    runs = [
        RunResult(
            status="ok", spec={**spec, "repetition": i}, timing=timing, work=work or {}, quality={"test_accuracy": 0.97}
        )
        for i in range(3)
    ]
    p = Point(spec["point_label"], spec["point"], runs)
    view = ScenarioView("m", "s", False, [p])
    return view, p, pages.point_row(view, p)


def _remade(p: Point) -> tuple[ScenarioView, Point]:
    """A point made anew from ``p``'s runs, changed since ``p`` was made: a point's figures are worked
    out once, from its runs as they were when it was made."""
    again = Point(p.label, p.coords, p.runs)
    return ScenarioView("m", "s", False, [again]), again


def test_probe_slower_than_the_model_is_noise_not_100_percent() -> None:
    _, _, row = _point({"step_s": 0.010, "step_floor_s": 0.012, "fit_s": 1.0})
    assert row["fixed cost per step (ms)"] == "12.00 of 10.00 (all fixed cost, within noise)"
    _, _, row = _point({"step_s": 0.010, "step_floor_s": 0.004, "fit_s": 1.0})
    assert row["fixed cost per step (ms)"] == "4.00 of 10.00 (40%)"


def test_share_of_peak_counts_every_gpu_and_flags_over_100() -> None:
    work = {"achieved_flops_per_s": 30e9, "peak": {"flops_per_s": 10e9}}
    _, _, row = _point({"fit_s": 1.0}, work, device="gpu:2")
    assert row["GFLOP/s (% of peak)"] == "30.0 (150.0%: above the measured peak, check the calibration)"
    _, _, row = _point({"fit_s": 1.0}, {**work, "peak": {"flops_per_s": 100e9}}, device="gpu:2")
    assert row["GFLOP/s (% of peak)"] == "30.0 (15.0%)", "the peak of 2 GPUs is twice one's"


def test_negative_first_epoch_overhead_is_noise() -> None:
    _, _, row = _point({"fit_s": 1.0, "first_epoch_overhead_s": -0.05})
    assert row["first-epoch overhead (s)"] == "-0.05 (noise: none measurable)"


def test_one_epoch_says_the_steady_figure_holds_compilation() -> None:
    _, _, row = _point({"fit_s": 1.0, "steady_epoch_s": 1.0, "steady_includes_first_epoch": True})
    assert "one epoch: the steady epoch includes tracing and compilation" in row["notes"]


def _env_run(device: str, finished: str, gpus: list[dict]) -> RunResult:
    spec = {
        "scenario": "s",
        "point": {"device": device},
        "point_label": f"device={device}",
        "repetition": 0,
        "config": {"device": device, "training": {"batch_size": 128}},
        "fingerprint": device,
        "report": {},
    }
    return RunResult(
        status="ok",
        spec=spec,
        run={"finished_at": finished, "backend": "docker"},
        timing={"fit_s": 1.0},
        quality={"test_accuracy": 0.97},
        environment={"host": {}, "versions": {}, "gpus_driver": gpus},
    )


def test_gpu_facts_come_from_the_gpu_points() -> None:
    h100 = [{"name": "NVIDIA H100", "memory_mib": 81559, "driver": "550.1", "uuid": "GPU-1", "index": 0}]
    gpu_run = _env_run("gpu", "2026-01-01T00:00:00", h100)
    cpu_run = _env_run("cpu", "2026-01-02T00:00:00", [])  # newer, in a CPU container: sees no GPU
    view = ScenarioView(
        "m",
        "s",
        False,
        [Point("device=gpu", {"device": "gpu"}, [gpu_run]), Point("device=cpu", {"device": "cpu"}, [cpu_run])],
    )
    assert "- GPUs: NVIDIA H100 (81559 MiB, driver 550.1)" in environment_section.environment_lines(view)
    from suite.report import compare

    facts = compare.machine_facts([view])
    assert facts["GPU model"] == "NVIDIA H100" and facts["GPU driver"] == "550.1"


def test_without_a_gpu_run_the_gpu_facts_are_not_recorded_not_none() -> None:
    """A CPU run sees no GPU (in a container above all): a machine whose GPU points did not run
    does not say it has none."""
    from suite.report import compare

    cpu_run = _env_run("cpu", "2026-01-02T00:00:00", [])
    view = ScenarioView("m", "s", False, [Point("device=cpu", {"device": "cpu"}, [cpu_run])])
    facts = compare.machine_facts([view])
    assert facts["GPU model"] == compare.NOT_RECORDED and facts["GPU driver"] == compare.NOT_RECORDED
    page = compare.render([view])
    assert "Not recorded by its results: GPU model, GPU driver" in page  # and what this bare record lacks
    assert "(GPU facts come from runs of GPU points that reached the worker)." in page
    assert "Differ:" not in page and "Same:" not in page, "one machine: nothing to tell apart"
    assert "Welch" not in page, "no ratio is shown, so none is explained"
    data = compare.collect([view])  # compare --json says the same
    assert data["facts_same"] == [] == data["facts_differ"], data


def test_a_machine_s_provenance_facts_are_those_of_the_runs_that_measured() -> None:
    """A scenario whose points were all skipped (no GPU) started no container: its runs have no
    image, and the machine's image recipe is the one its measured runs used, not "...; none"."""
    from suite.report import compare

    measured = dataclasses.replace(
        _env_run("cpu", "2026-01-01T00:00:00", []),
        provenance={"image": {"recipe_hash": "5feb46549234" + "0" * 52}},
    )
    skipped = dataclasses.replace(
        _env_run("gpu", "2026-01-02T00:00:00", []),
        status="skipped",
        environment={},
        provenance={"suite": {"git_revision": "a" * 40}},
    )
    views = [
        ScenarioView("m", "measured", False, [Point("device=cpu", {"device": "cpu"}, [measured])]),
        ScenarioView("m", "skips", False, [Point("device=gpu", {"device": "gpu"}, [skipped])]),
    ]
    assert compare.machine_facts(views)["image recipe"] == "5feb46549234"
    assert compare.machine_facts(views[1:])["image recipe"] == "none", "a machine of skips only: its skips' facts"


def test_crossover_plot_places_points_by_value() -> None:
    import matplotlib.pyplot as plt

    from suite.report import plots

    def run(width: int, device: str) -> RunResult:
        spec = {
            "scenario": "s",
            "point": {"model.hidden.0": width, "device": device},
            "point_label": f"{width}-{device}",
            "repetition": 0,
            "fingerprint": f"{width}{device}",
            "config": {"device": device, "training": {"batch_size": 128}},
            "report": {"verdict": "gpu_crossover"},
        }
        return RunResult(
            status="ok",
            spec=spec,
            timing={"steady_epoch_s": width / 100, "fit_s": 1.0},
            quality={"test_accuracy": 0.97},
            run={"finished_at": "x"},
        )

    points = [
        Point(f"{w}-{d}", {"model.hidden.0": w, "device": d}, [run(w, d)])
        for w in (100, 750, 2000)
        for d in ("cpu", "gpu")
        if not (w == 100 and d == "gpu")
    ]
    fig, ax = plt.subplots()
    try:
        assert plots.crossover(ScenarioView("m", "s", False, points), ax)
        xs = {c.get_label(): list(c.lines[0].get_xdata()) for c in ax.containers}
        assert xs == {"cpu": [100, 750, 2000], "gpu": [750, 2000]}, "the GPU curve starts at 750, not at 100"
        assert ax.get_xscale() == "log" and ax.get_xlabel().endswith("(log scale)"), "the label says how it is placed"
    finally:
        plt.close(fig)


def _telemetry(
    busy: float | None, memory: float | None, hwm: float | None = None, gpu_mem: float | None = None
) -> dict:
    metrics = []
    if busy is not None:
        metrics.append({"name": "gpu_util_percent", "device": "GPU-a", "summary": {"steady": {"mean": busy}}})
    for name, value in (("memory_bytes", memory), ("process_hwm_bytes", hwm), ("gpu_memory_used_bytes", gpu_mem)):
        if value is not None:
            metrics.append({"name": name, "device": None, "summary": {"run": {"max": value}}})
    return {"metrics": metrics}


def test_gpu_busy_is_the_plain_mean_over_repetitions_and_peak_memory_the_largest() -> None:
    _, p, _ = _point({"fit_s": 1.0})
    for r, busy, mem in zip(p.runs, (10.0, 20.0, 60.0), (2**30, 3 * 2**30, 2 * 2**30), strict=True):
        r.telemetry.update(_telemetry(busy, mem, hwm=mem / 2, gpu_mem=2**29))
    row = pages.point_row(*_remade(p))
    assert row["GPU busy"] == "30%"
    assert row["peak memory"] == "3.00 GiB (GPU 0.50 GiB)"


def test_kernel_high_water_mark_wins_when_higher_than_the_sampled_peak() -> None:
    _, p, _ = _point({"fit_s": 1.0}, device="cpu")
    for r in p.runs:
        r.telemetry.update(_telemetry(None, 2**30, hwm=1.5 * 2**30))
    row = pages.point_row(*_remade(p))
    assert row["peak memory"] == "1.50 GiB"
    assert row["GPU busy"] == "-", "a CPU point has no GPU to be busy"


def test_results_without_telemetry_say_not_measured() -> None:
    _, _, row = _point({"fit_s": 1.0})
    assert row["GPU busy"] == "-" and row["peak memory"] == "-"


def _width_view(cpu_status: str, gpu_status: str, data: dict[str, Any] | None = None) -> ScenarioView:
    """The width scenario's two devices at one width, each point three runs of ``status``; the CPU
    point is the baseline (``report.baseline``), as in scenarios/mnist_mlp_width.yaml."""
    points = []
    for device, status, fit in (("cpu", cpu_status, 2.0), ("gpu", gpu_status, 1.0)):
        spec = {
            "scenario": "s",
            "point": {"width": 100, "device": device},
            "point_label": f"width=100, device={device}",
            "config": {"device": device},
            "fingerprint": device,
            "report": {"baseline": {"device": "cpu"}, "verdict": "gpu_crossover"},
        }
        quality = {"test_accuracy": 0.97, **(data or {})}
        runs = [
            RunResult(status=status, spec={**spec, "repetition": i}, timing={"fit_s": fit + i / 100}, quality=quality)
            for i in range(3)
        ]
        points.append(Point(spec["point_label"], spec["point"], runs))
    return ScenarioView("m", "s", False, points)


def _results_table(page: str) -> list[str]:
    """The Results section's lines up to its notes or plot."""
    lines = page.split("### Results\n\n", 1)[1].splitlines()
    return lines[: next(i for i, line in enumerate(lines) if line.startswith("#"))]


def test_a_vs_baseline_column_without_a_ratio_is_left_out_and_the_page_says_why() -> None:
    """Only the CPU points ran (a machine without a GPU): every row would read "baseline"."""
    table = _results_table(pages.render_scenario([_width_view("ok", "skipped")]))
    assert not any("vs baseline" in line for line in table), table
    headers = [h.strip() for h in table[0].split("|")[1:-1]]
    assert headers == [h for h in pages.ANSWER_HEADERS if h != "vs baseline (fit time)"], table
    said = [line for line in table if line.startswith("No ratio to a baseline")]
    assert said == [
        "No ratio to a baseline: the one point that ran here is a baseline, and no point compared with it "
        "has an ok run (see Skips and failures)."
    ], table
    # Only the GPU point ran: compared with nothing, its cell would read "-".
    table = _results_table(pages.render_scenario([_width_view("error", "ok")]))
    assert not any("vs baseline" in line for line in table), table
    assert "No ratio to a baseline: no point that ran here could be compared with its baseline." in table
    # Both ran: the column holds the ratio, and no line says there is none.
    table = _results_table(pages.render_scenario([_width_view("ok", "ok")]))
    assert "vs baseline (fit time)" in table[0], table
    assert "1.99x faster (95% CI" in next(line for line in table if "device=gpu" in line), table
    assert not any(line.startswith("No ratio") for line in table), table
    # The export keeps the column whatever the page shows.
    view = _width_view("ok", "skipped")
    assert pages.point_row(view, view.points[0])["vs baseline (fit time)"] == "baseline"


def test_synthetic_data_is_said_once_with_why_the_real_data_was_not_used() -> None:
    why = "no /data/mnist.npz; download failed: Exception: URL fetch failure (name resolution)"
    synthetic = {"data_source": "synthetic", "data_detail": f"synthetic, same shapes as MNIST ({why})"}
    lines = environment_section.environment_lines(_width_view("ok", "skipped", synthetic))
    data = [line for line in lines if "synthetic" in line]
    assert data == [f"- Data: **synthetic** (MNIST's shapes, not its digits; {why})"], lines
    # A detail in other words (an older worker's) is given whole; a real source is named as recorded.
    other = {"data_source": "synthetic", "data_detail": "made up"}
    lines = environment_section.environment_lines(_width_view("ok", "skipped", other))
    assert "- Data: **synthetic** (MNIST's shapes, not its digits; made up)" in lines, lines
    lines = environment_section.environment_lines(_width_view("ok", "ok", {"data_source": "keras_cache"}))
    assert "- Data: keras_cache" in lines, lines


def test_a_point_that_is_its_own_baseline_is_not_said_to_lack_points_that_did_not_run() -> None:
    """A sweep of one point (verdict none, no baseline named): it is the baseline, and nothing is
    compared with it; no point is missing."""
    view, _, _ = _point({"fit_s": 1.0}, device="cpu")
    table = _results_table(pages.render_scenario([view]))
    assert not any("vs baseline" in line for line in table), table
    assert "No ratio to a baseline: its one point is the baseline, with no other point to compare with it." in table


def test_why_no_run_reached_the_worker_names_each_gpu_count_once() -> None:
    """The scaling scenario's points need 1, 2 and 4 GPUs, skipped for one reason: said once, as
    its verdict says it, not three times joined by semicolons."""
    rest = "; the Docker engine gives its containers no GPU"
    points = []
    for n in (1, 2, 4):
        spec = {"scenario": "s", "point": {"device": f"gpu:{n}"}, "point_label": f"device=gpu:{n}", "fingerprint": "f"}
        message = f"needs {n} GPU(s){rest} (docker info: Runtimes: runc)"
        points.append(
            Point(f"device=gpu:{n}", spec["point"], [RunResult(status="skipped", spec=spec, message=message)])
        )
    lines = environment_section.environment_lines(ScenarioView("m", "s", False, points))
    said = next(line for line in lines if line.startswith("- CPU, GPUs and versions"))
    assert said.endswith(f"(needs 1, 2 or 4 GPU(s){rest})"), said


def test_smoke_size_on_synthetic_digits_still_says_the_accuracy_means_nothing() -> None:
    synthetic = {"data_source": "synthetic", "data_detail": "synthetic, same shapes as MNIST (offline)"}
    view = dataclasses.replace(_width_view("ok", "skipped", synthetic), smoke=True)
    said = environment_section.caveat(view)
    assert said.startswith("**Smoke size, on synthetic digits**: a check that the scenario runs"), said
    assert "the test accuracy says nothing of MNIST" in said, said


def test_pairs_the_cpu_gpu_verdict_could_not_compare_are_counted_as_comparisons() -> None:
    """Two widths whose GPU points were skipped: two CPU-GPU comparisons are missing, named by
    their widths; the CPU points ran, so "2 points ... skipped" would misname them."""
    points = []
    for width in (100, 750):
        for device, status in (("cpu", "ok"), ("gpu", "skipped")):
            spec = {
                "scenario": "s",
                "point": {"width": width, "device": device},
                "point_label": f"width={width}, device={device}",
                "config": {"device": device},
                "fingerprint": device,
                "report": {"baseline": {"device": "cpu"}, "verdict": "gpu_crossover"},
            }
            runs = [RunResult(status=status, spec=spec, timing={"fit_s": 1.0}, quality={"test_accuracy": 0.97})]
            points.append(Point(spec["point_label"], spec["point"], runs))
    page = pages.render_scenario([ScenarioView("m", "s", False, points)])
    assert "### Not compared\n\n- 2 comparisons (width 100; width 750): GPU: skipped\n" in page, page
    assert "- `skipped`, 2 runs of 2 points (width=100, device=gpu; width=750, device=gpu)" in page, page
