"""A plot's line follows its numeric axis, whatever order the runs were made in: a point rerun on
its own (`run -k ... --fresh`) gets the first place of its new plan, and must not make the line
jump back along the axis."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import suite_cli

FIXTURE = Path(__file__).parent / "fixtures" / "results" / "fixture-local" / "fx_width"


def _results(folder: Path, order: dict[int, int]) -> Path:
    """fx_width's CPU points at widths 100 and 750, and one made from 750's runs at width 300 (slower:
    the line bends there); ``order``: width -> the place its runs had in their plan."""
    scenario = folder / "fixture-local" / "fx_width"
    shutil.copytree(FIXTURE, scenario)
    for path in sorted(scenario.glob("*.json")):
        record = json.loads(path.read_text())
        if record["spec"]["point"].get("device") != "cpu":
            continue
        width = record["spec"]["point"]["model.hidden.0"]
        record["spec"]["order"] = order[width]
        path.write_text(json.dumps(record))
        if width == 750:
            spec = record["spec"]
            spec["point"]["model.hidden.0"] = 300
            spec["point_label"] = "width=300, device=cpu"
            spec["config"]["model"]["hidden"][0] = 300
            spec["fingerprint"] = "0300" + spec["fingerprint"][4:]
            spec["order"] = order[300]
            record["timing"]["fit_s"] *= 2
            (scenario / ("0300" + path.name[4:])).write_text(json.dumps(record))
    return folder


def test_the_plot_does_not_depend_on_the_order_the_points_ran_in(tmp_path: Path) -> None:
    pngs = []
    for name, order in (("in_order", {100: 0, 300: 1, 750: 2}), ("750_rerun_first", {100: 1, 300: 2, 750: 0})):
        results = _results(tmp_path / name / "results", order)
        done = suite_cli("report", "--results", results, "--out", tmp_path / name / "out")
        assert done.returncode == 0, done.stderr
        pngs.append((tmp_path / name / "out" / "fx_width.fixture-local.png").read_bytes())

    assert pngs[0] == pngs[1], "the same points drawn the same way"
