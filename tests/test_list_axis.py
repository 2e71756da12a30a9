"""A matrix axis whose values are lists (``model.hidden: [[512, 512], [512, 512, 512]]``, as the
worked scenario of docs/scenarios.md has it) goes through the verdict and the plot like any other axis."""

from __future__ import annotations

from test_verdicts import _reps, _view

from suite.report import plots, verdicts

DEPTHS = ([512, 512], [512, 512, 512, 512], [512] * 8)


def test_list_valued_axis_gets_a_verdict_and_a_plot() -> None:
    points = []
    for i, hidden in enumerate(DEPTHS):
        points.append(({"model.hidden": hidden, "device": "cpu"}, _reps(1.0 + i), "ok"))
        points.append(({"model.hidden": hidden, "device": "gpu"}, _reps(2.0), "ok"))
    view = _view("gpu_crossover", {"device": "cpu"}, points)
    text = verdicts.verdict(view)
    assert "[512, 512, 512, 512, 512, 512, 512, 512]" in text, text  # the deepest, where the GPU wins
    for p in view.points:
        for r in p.runs:
            r.timing["steady_epoch_s"] = r.timing["fit_s"] / 10  # what the plot draws
    png = plots.render(view)
    assert png is not None and png.startswith(b"\x89PNG")
