"""hardware.md and `suite compare` leave a point below the accuracy gate out of comparisons, as its
scenario page does: a fast broken run gets no ratio against the other machine."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from conftest import suite_cli

FIXTURES = Path(__file__).parent / "fixtures" / "results"
GATED = "width=100, device=cpu"


def _machines(tmp_path: Path) -> tuple[Path, Path]:
    results = tmp_path / "results"
    for machine in ("fixture-local", "fixture-docker"):
        shutil.copytree(FIXTURES / machine / "fx_width", results / machine / "fx_width")
    for path in (results / "fixture-docker" / "fx_width").glob("*.json"):
        record = json.loads(path.read_text())
        if record["spec"]["point_label"] == GATED:  # trained to chance level on this machine
            record["quality"]["test_accuracy"] = 0.11
            path.write_text(json.dumps(record))
    return results / "fixture-local", results / "fixture-docker"


def test_hardware_page_gives_no_ratio_for_a_point_below_the_gate(tmp_path: Path) -> None:
    local, docker = _machines(tmp_path)

    done = suite_cli("report", "--results", local.parent, "--out", tmp_path / "out")

    assert done.returncode == 0, done.stderr
    page = (tmp_path / "out" / "hardware.md").read_text()
    rows = {line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("|")}
    assert "below the accuracy gate: not compared" in rows[GATED], rows[GATED]
    assert "than the reference" not in rows[GATED], rows[GATED]
    assert "than the reference" in rows["width=750, device=cpu"], "a point above the gate is still compared"


def test_compare_json_gives_no_ratio_for_a_point_below_the_gate(tmp_path: Path) -> None:
    local, docker = _machines(tmp_path)

    done = suite_cli("compare", local, docker, "--json")

    assert done.returncode == 0, done.stderr
    points = {p["point"]: p["machines"] for s in json.loads(done.stdout)["scenarios"] for p in s["points"]}
    gated = points[GATED][str(docker)]
    assert gated["below_gate"] is True and gated["speedup_vs_reference"] is None
    assert points["width=750, device=cpu"][str(docker)]["speedup_vs_reference"] is not None
