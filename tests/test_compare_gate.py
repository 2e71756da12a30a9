"""hardware.md and `suite compare` leave a point below the accuracy gate out of comparisons, as its
scenario page does: a fast broken run gets no ratio against the other machine."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


def _edited(tmp_path: Path, label: str, edit: Callable[[dict[str, Any]], None]) -> tuple[Path, Path]:
    """The two fixture machines, ``edit`` applied to the docker machine's runs of ``label``."""
    results = tmp_path / "results"
    for machine in ("fixture-local", "fixture-docker"):
        shutil.copytree(FIXTURES / machine / "fx_width", results / machine / "fx_width")
    for path in (results / "fixture-docker" / "fx_width").glob("*.json"):
        record = json.loads(path.read_text())
        if record["spec"]["point_label"] == label:
            edit(record)
            path.write_text(json.dumps(record))
    return results / "fixture-local", results / "fixture-docker"


def _real_mnist(record: dict[str, Any]) -> None:
    record["spec"]["config"]["data"]["identity"] = {"source": "mnist.npz", "sha256": "ab" * 32}
    record["quality"]["data_source"] = "mnist.npz"


def _synthetic(record: dict[str, Any]) -> None:
    record["spec"]["config"]["data"]["identity"] = {"source": "synthetic", "note": "no mnist.npz"}


def _bigger_batch(record: dict[str, Any]) -> None:
    record["spec"]["config"]["training"]["batch_size"] = 512


def _other_image(record: dict[str, Any]) -> None:
    record["spec"]["config"]["image"] = "tf2.20-cpu"


def test_machines_that_trained_on_other_data_or_settings_get_no_ratio(tmp_path: Path) -> None:
    """As on a scenario page, hardware.md and `compare` never divide the times of other work: one
    machine's runs on MNIST against the other's on synthetic digits, or at another batch size. Each
    cell says its own runs' value first, the reference's second (hardware.md's reference is the first
    machine by name, fixture-docker; compare's the first folder given, fixture-local)."""
    mnist = "mnist.npz sha256 abababababab"
    for edit, on_page, in_json in (
        (_real_mnist, f"other data: synthetic, against {mnist}", f"other data: {mnist}, against synthetic"),
        (
            _bigger_batch,
            "settings (training.batch_size 128 against 512)",
            "settings (training.batch_size 512 against 128)",
        ),
    ):
        local, docker = _edited(tmp_path / edit.__name__, "width=750, device=cpu", edit)
        if edit is _real_mnist:  # the other machine's runs of that point record their data too: synthetic
            for path in (local / "fx_width").glob("*.json"):
                record = json.loads(path.read_text())
                if record["spec"]["point_label"] == "width=750, device=cpu":
                    _synthetic(record)
                    path.write_text(json.dumps(record))
        done = suite_cli("report", "--results", local.parent, "--out", tmp_path / edit.__name__ / "out")
        assert done.returncode == 0, done.stderr
        page = (tmp_path / edit.__name__ / "out" / "hardware.md").read_text()
        rows = {line.split("|")[1].strip(): line for line in page.splitlines() if line.startswith("|")}
        assert f"(not compared: {'trained on ' if edit is _real_mnist else ''}" in rows["width=750, device=cpu"]
        assert on_page in rows["width=750, device=cpu"], rows["width=750, device=cpu"]
        assert "than the reference" not in rows["width=750, device=cpu"]
        assert "than the reference" in rows["width=100, device=cpu"], "the point run alike is still compared"
        if edit is _real_mnist:  # the facts name each machine's data (the fixtures' older runs record none)
            assert [c.strip() for c in rows["data"].split("|")[2:4]] == [mnist, "synthetic"], rows["data"]
        done = suite_cli("compare", local, docker, "--json")
        assert done.returncode == 0, done.stderr
        points = {p["point"]: p["machines"] for s in json.loads(done.stdout)["scenarios"] for p in s["points"]}
        cell = points["width=750, device=cpu"][str(docker)]
        assert cell["speedup_vs_reference"] is None and cell["not_compared"].endswith(in_json), cell


def test_a_machine_whose_results_name_no_data_is_compared_its_data_not_recorded(tmp_path: Path) -> None:
    """Results made before records named their data say nothing either way: compared, as before,
    with the "data" fact "not recorded" for that machine."""
    local, docker = _edited(tmp_path, "width=750, device=cpu", _real_mnist)
    done = suite_cli("compare", local, docker, "--json")
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    points = {p["point"]: p["machines"] for s in doc["scenarios"] for p in s["points"]}
    cell = points["width=750, device=cpu"][str(docker)]
    assert cell["speedup_vs_reference"] is not None and cell["not_compared"] is None, cell
    assert doc["facts"][str(local)]["data"] == "not recorded", doc["facts"]


def test_an_image_of_other_versions_is_what_machines_are_compared_on(tmp_path: Path) -> None:
    """A scenario run in another image (another TensorFlow) on one machine: the comparison the
    facts below the table explain, not other settings."""
    local, docker = _edited(tmp_path, "width=750, device=cpu", _other_image)
    done = suite_cli("compare", local, docker, "--json")
    assert done.returncode == 0, done.stderr
    points = {p["point"]: p["machines"] for s in json.loads(done.stdout)["scenarios"] for p in s["points"]}
    cell = points["width=750, device=cpu"][str(docker)]
    assert cell["speedup_vs_reference"] is not None and cell["not_compared"] is None, cell


def test_a_fact_that_does_not_apply_says_so_not_a_dash(tmp_path: Path) -> None:
    """A CPU build of TensorFlow was built for no CUDA, and a local run used no Docker engine: each
    cell says which, where a "-" could have meant either or a fact not recorded."""
    local, docker = _machines(tmp_path)
    done = suite_cli("compare", local, docker, "--json")
    assert done.returncode == 0, done.stderr
    facts = json.loads(done.stdout)["facts"]
    assert facts[str(local)]["Docker engine"] == "none (local)", facts
    assert facts[str(docker)]["Docker engine"] == "20.10.24+dfsg1", facts
    for machine in (local, docker):
        assert facts[str(machine)]["CUDA build"] == facts[str(machine)]["cuDNN build"] == "none (CPU build)"
