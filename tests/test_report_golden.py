"""Reports against golden Markdown, built from real result files the suite produced (tests/fixtures).

UPDATE_GOLDEN=1 rewrites the golden files after an intended change; review the diff.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from suite import report

FIXTURES = Path(__file__).parent / "fixtures" / "results"
GOLDEN = Path(__file__).parent / "golden"


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reports")
    report.write_reports(FIXTURES, out)
    return out


def test_markdown_matches_golden(rendered: Path) -> None:
    pages = sorted(rendered.glob("*.md"))
    assert {p.name for p in pages} >= {"README.md", "hardware.md", "fx_width.md", "fx_scaling.md", "fx_knobs.md"}
    if os.environ.get("UPDATE_GOLDEN"):
        GOLDEN.mkdir(exist_ok=True)
        for p in pages:
            shutil.copy(p, GOLDEN / p.name)
    for p in pages:
        assert p.read_text() == (GOLDEN / p.name).read_text(), f"{p.name} differs from tests/golden/{p.name}"


def test_regeneration_is_byte_identical(rendered: Path, tmp_path: Path) -> None:
    report.write_reports(FIXTURES, tmp_path)
    for p in rendered.iterdir():
        assert (tmp_path / p.name).read_bytes() == p.read_bytes(), p.name
    assert list(rendered.glob("*.png")), "plots are written"


def test_plots_are_linked(rendered: Path) -> None:
    for name in ("fx_width", "fx_scaling", "fx_knobs"):
        page = (rendered / f"{name}.md").read_text()
        pngs = [p.name for p in rendered.glob(f"{name}.*.png")]
        assert pngs and all(f"]({png})" in page for png in pngs)


def test_hardware_comparison_names_what_differs(tmp_path: Path) -> None:
    # Two machines from one real folder: the copy's GPU facts are edited, to exercise the facts section.
    src = FIXTURES / "fixture-local"
    for name in ("box-a", "box-b"):
        shutil.copytree(src, tmp_path / name)
    for path in (tmp_path / "box-b").rglob("*.json"):
        data = json.loads(path.read_text())
        data["run"]["machine"] = "box-b"
        if data["environment"]:  # runs that reached the worker
            data["environment"]["gpus_driver"] = [
                {"index": 0, "uuid": "GPU-x", "name": "Other GPU", "memory_mib": 1, "driver": "999.1"}
            ]
        path.write_text(json.dumps(data))
    for path in (tmp_path / "box-a").rglob("*.json"):
        data = json.loads(path.read_text())
        data["run"]["machine"] = "box-a"
        path.write_text(json.dumps(data))
    report.write_reports(tmp_path, tmp_path / "out", reference="box-a")
    text = (tmp_path / "out" / "hardware.md").read_text()
    assert "Reference: `box-a`" in text
    assert "Differ: GPU model, GPU driver." in text
    assert "| GPU model     | none" in text and "Other GPU" in text
    assert "(95% CI" in text, "ratios against the reference carry intervals"


def test_cells_are_escaped() -> None:
    assert report.cell("a|b\nc") == "a\\|b c"
