"""``python -m suite compare``: which folder is faster, said in words, by the factor its result files give."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np
from conftest import REPO, suite_cli

FIXTURE = REPO / "tests" / "fixtures" / "results" / "fixture-local" / "fx_width"
SCALES = (2.4, 2.5, 2.7)  # B's fit times over A's, by repetition: B is about 2.5 times slower


def _folder(tmp_path: Path, name: str, scales: tuple[float, ...]) -> Path:
    """A copy of the fixture's fx_width results with each ok run's fit time times its repetition's scale."""
    target = tmp_path / name / "fx_width"
    shutil.copytree(FIXTURE, target)
    for path in target.glob("*.json"):
        data = json.loads(path.read_text())
        if data["status"] == "ok":
            data["timing"]["fit_s"] *= scales[data["spec"]["repetition"]]
        path.write_text(json.dumps(data))
    return tmp_path / name


def _fit_times(folder: Path) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}
    for path in sorted(folder.rglob("*.json")):
        data = json.loads(path.read_text())
        if data["status"] == "ok":
            times.setdefault(data["spec"]["point_label"], []).append(data["timing"]["fit_s"])
    return times


def _geomean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(values))))


def _cell(out: str, point: str, column: int) -> str:
    row = next(line for line in out.splitlines() if line.startswith(f"| {point} "))
    return [c.strip() for c in row.strip("|").split("|")][column]


def test_compare_says_the_slower_folder_is_slower_by_the_ratio_of_geometric_means(tmp_path: Path) -> None:
    a, b = _folder(tmp_path, "A", (1.0, 1.0, 1.0)), _folder(tmp_path, "B", SCALES)
    times_a, times_b = _fit_times(a), _fit_times(b)
    assert times_a.keys() == times_b.keys() and len(times_a) == 2
    proc = suite_cli("compare", a, b)
    assert proc.returncode == 0, proc.stderr
    assert f"Reference: `{a}`" in proc.stdout
    for point in times_a:
        slower = _geomean(times_b[point]) / _geomean(times_a[point])  # B's time over A's: above 1, B is slower
        assert slower > 2
        cell = _cell(proc.stdout, point, 2)
        said = f"{_geomean(times_b[point]):.2f}, {slower:.2f}x slower than the reference (95% CI "
        assert cell.startswith(said), cell
        assert "faster" not in cell

    # The other way round, A against B as the reference: A is faster by the same factor.
    back = suite_cli("compare", b, a)
    assert back.returncode == 0, back.stderr
    for point in times_a:
        faster = _geomean(times_b[point]) / _geomean(times_a[point])
        cell = _cell(back.stdout, point, 2)
        assert f"{faster:.2f}x faster than the reference (95% CI " in cell and "slower" not in cell, cell

    # The JSON keeps its numbers (the reference's time over this folder's) and says which way they divide.
    doc = json.loads(suite_cli("compare", a, b, "--json").stdout)
    assert "reference's geometric mean fit time over this machine's" in doc["ratio_direction"]
    for point in doc["scenarios"][0]["points"]:
        other = point["machines"][str(b)]
        if other["fit_s_geomean"] is None:
            continue
        times = times_a[point["point"]], times_b[point["point"]]
        assert np.isclose(other["speedup_vs_reference"], _geomean(times[0]) / _geomean(times[1]))
        assert other["speedup_text"] == _cell(proc.stdout, point["point"], 2).split(", ", 1)[1]
        assert re.fullmatch(r"\d\.\d\dx slower than the reference \(95% CI [\d.]+-[\d.]+\)", other["speedup_text"])


def test_runs_made_with_set_are_left_out_as_in_the_hardware_page(tmp_path: Path) -> None:
    """A folder may hold runs of the same points made with ``--set``: compare, as ``hardware.md``,
    compares the scenario files' own settings, and a --set run never stands in for them."""
    a, b = _folder(tmp_path, "A", (1.0, 1.0, 1.0)), _folder(tmp_path, "B", (1.0, 1.0, 1.0))
    for path in list((b / "fx_width").glob("*.json")):
        data = json.loads(path.read_text())
        data["spec"]["overrides"] = {"training.epochs": 9}
        data["spec"]["fingerprint"] = "f" * 64
        if data["status"] == "ok":
            data["timing"]["fit_s"] *= 100
        (path.parent / f"set-{path.name}").write_text(json.dumps(data))
    proc = suite_cli("compare", a, b)
    assert proc.returncode == 0, proc.stderr
    for point in _fit_times(a):
        assert _cell(proc.stdout, point, 2).startswith(f"{_geomean(_fit_times(a)[point]):.2f}, 1.00x"), proc.stdout


def test_a_folder_of_several_machines_is_refused_naming_them(tmp_path: Path) -> None:
    """Each folder is one machine's: a folder holding several would mix their runs into one column."""
    a = _folder(tmp_path, "A", (1.0, 1.0, 1.0))
    both = tmp_path / "both"
    for machine in ("box1", "box2"):
        shutil.copytree(a, both / machine)
        for path in (both / machine).rglob("*.json"):
            data = json.loads(path.read_text())
            data["run"]["machine"] = machine
            path.write_text(json.dumps(data))
    proc = suite_cli("compare", a, both)
    assert proc.returncode == 2 and "2 machines (box1, box2)" in proc.stderr, proc.stdout + proc.stderr


def test_compare_refuses_one_folder_given_twice(tmp_path: Path) -> None:
    # Both columns would hold its runs, merged into one under one name, or shown twice as if measured twice.
    a = _folder(tmp_path, "A", (1.0, 1.0, 1.0))
    (tmp_path / "link").symlink_to(a)
    for other in (a, tmp_path / "link", tmp_path / "A" / ".." / "A"):
        proc = suite_cli("compare", a, other)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
        assert f"{a} and {other} are one folder: compare takes two different results folders" in proc.stderr


def test_a_fact_recorded_as_null_is_not_recorded_never_none_nor_the_same(tmp_path: Path) -> None:
    """nvidia-smi's "[N/A]" is recorded as null, and a host may not say its CPU: neither is printed as
    "None", nor counted as a value two machines share."""
    a, b = _folder(tmp_path, "A", (1.0, 1.0, 1.0)), _folder(tmp_path, "B", (1.0, 1.0, 1.0))
    gpu = {"index": 0, "name": "NVIDIA H100 80GB HBM3", "uuid": None, "memory_mib": None, "driver": None}
    ok = {}
    for path in sorted(a.rglob("*.json")):
        data = json.loads(path.read_text())
        if data["status"] == "ok":
            ok[data["spec"]["point"]["model.hidden.0"], data["spec"]["repetition"]] = data
    for folder in (a, b):
        for path in sorted(folder.rglob("*.json")):
            data = json.loads(path.read_text())
            if data["status"] == "skipped":  # a GPU point that ran, on a GPU whose driver nvidia-smi did not say
                like = ok[data["spec"]["point"]["model.hidden.0"], data["spec"]["repetition"]]
                data.update(status="ok", message="", **{k: like[k] for k in ("timing", "quality", "work")})
                data["environment"] = json.loads(json.dumps(like["environment"]))
                data["environment"]["gpus_driver"] = [gpu]
            for key in ("cpu_model", "python"):
                data.get("environment", {}).get("host", {}).pop(key, None)
            path.write_text(json.dumps(data))
    proc = suite_cli("compare", a, b)
    assert proc.returncode == 0, proc.stderr
    for fact in ("GPU driver", "CPU", "Python"):
        assert _cell(proc.stdout, fact, 1) == _cell(proc.stdout, fact, 2) == "not recorded", proc.stdout
    doc = json.loads(suite_cli("compare", a, b, "--json").stdout)
    assert {"GPU driver", "CPU", "Python"} <= set(doc["facts_unrecorded"]) - set(doc["facts_same"]), doc
    assert "GPU model" in doc["facts_same"]

    report = suite_cli("report", "--results", a, "--out", tmp_path / "out")
    assert report.returncode == 0, report.stderr
    page = (tmp_path / "out" / "fx_width.md").read_text()
    assert "- GPUs: NVIDIA H100 80GB HBM3 (memory not recorded, driver not recorded)" in page, page
    on_gpu = next(p for p in sorted((a / "fx_width").glob("*.json")) if "gpus_driver" in p.read_text())
    shown = suite_cli("show", on_gpu)
    assert "gpus NVIDIA H100 80GB HBM3 (UUID not recorded, driver not recorded)" in shown.stdout, shown.stdout
    for said in ("None MiB", "driver None", "| None "):
        assert said not in page + proc.stdout + shown.stdout


def test_compare_refuses_a_folder_and_one_inside_it(tmp_path: Path) -> None:
    # The inner folder's runs would be in both columns: "1.00x as fast" measured against themselves.
    a = _folder(tmp_path, "A", (1.0, 1.0, 1.0))
    for pair in ((tmp_path, a), (a, a / "fx_width"), (a / "fx_width", tmp_path / "link")):
        (tmp_path / "link").unlink(missing_ok=True)
        (tmp_path / "link").symlink_to(a)
        proc = suite_cli("compare", *pair)
        assert proc.returncode == 2 and proc.stdout == "", proc.stdout + proc.stderr
        assert "lies inside" in proc.stderr, proc.stderr


def _skipped_rows(out: str) -> list[str]:
    return [line for line in out.splitlines() if line.startswith("| ") and "| skipped " in line]


def test_points_skipped_on_every_machine_leave_the_table_for_a_sentence(tmp_path: Path) -> None:
    """A row that says "skipped" in every column compares nothing: the points are named once below
    the table. A point that failed, or ran, anywhere keeps its row."""
    a, b = _folder(tmp_path, "A", (1.0, 1.0, 1.0)), _folder(tmp_path, "B", (1.0, 1.0, 1.0))
    proc = suite_cli("compare", a, b)
    assert proc.returncode == 0, proc.stderr
    assert not _skipped_rows(proc.stdout), proc.stdout
    assert "2 points skipped on every machine: width=100, device=gpu; width=750, device=gpu." in proc.stdout
    assert _cell(proc.stdout, "width=100, device=cpu", 1) and _cell(proc.stdout, "width=750, device=cpu", 1)
    for path in (b / "fx_width").glob("*.json"):  # in B, the GPU point of width 100 failed instead
        data = json.loads(path.read_text())
        if data["spec"]["point_label"] == "width=100, device=gpu":
            data.update(status="error", message="a failure")
            path.write_text(json.dumps(data))
    proc = suite_cli("compare", a, b)
    assert proc.returncode == 0, proc.stderr
    assert _cell(proc.stdout, "width=100, device=gpu", 1) == "skipped", proc.stdout
    assert _cell(proc.stdout, "width=100, device=gpu", 2) == "error", proc.stdout
    assert "1 point skipped on every machine: width=750, device=gpu." in proc.stdout
    doc = json.loads(suite_cli("compare", a, b, "--json").stdout)
    assert len(doc["scenarios"][0]["points"]) == 4, "the JSON keeps every point"


def test_many_points_skipped_are_counted_and_one_machines_page_names_it(tmp_path: Path) -> None:
    res = tmp_path / "results" / "box" / "fx_width"
    shutil.copytree(FIXTURE, res)
    records = [json.loads(p.read_text()) for p in sorted(res.glob("*.json"))]
    data = next(r for r in records if r["status"] == "skipped")
    for width in range(1, 8):  # seven GPU points more, each skipped
        data["spec"].update(point_label=f"width={width}, device=gpu", fingerprint=f"{width:064x}")
        data["spec"]["point"] = {"width": width, "device": "gpu"}
        (res / f"extra-{width}.json").write_text(json.dumps(data))
    proc = suite_cli("report", "--results", tmp_path / "results", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = (tmp_path / "out" / "hardware.md").read_text()
    assert not _skipped_rows(page) and "9 points skipped on `fixture-local`." in page, page
    assert "| width=100, device=cpu |" in page


def test_the_smoke_size_note_stands_beside_times_only(tmp_path: Path) -> None:
    res = tmp_path / "results" / "box" / "fx_width"
    shutil.copytree(FIXTURE, res)
    for path in res.glob("*.json"):
        data = json.loads(path.read_text())
        data["spec"]["smoke"] = True
        path.write_text(json.dumps(data))
    note = "Smoke size on: `fixture-local` (not comparable with full-size runs)."
    pages = {}
    for name in ("timed", "skips alone"):
        if name == "skips alone":
            for path in res.glob("*.json"):
                if json.loads(path.read_text())["status"] != "skipped":
                    path.unlink()
        proc = suite_cli("report", "--results", tmp_path / "results", "--out", tmp_path / name)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        pages[name] = (tmp_path / name / "hardware.md").read_text()
    assert note in pages["timed"] and note not in pages["skips alone"], pages
    assert "2 points skipped on `fixture-local`" in pages["skips alone"], pages


def test_an_image_id_is_shown_as_on_the_pages_and_kept_whole_in_the_json(tmp_path: Path) -> None:
    docker, local = (REPO / "tests" / "fixtures" / "results" / name for name in ("fixture-docker", "fixture-local"))
    image_id = next(
        i for f in sorted(docker.rglob("*.json")) if (i := json.loads(f.read_text())["run"].get("image_id"))
    )
    assert image_id.startswith("sha256:") and len(image_id) == 71
    proc = suite_cli("compare", docker, local)
    assert proc.returncode == 0, proc.stderr
    assert _cell(proc.stdout, "image ID", 1) == image_id[7:19] and image_id not in proc.stdout
    doc = json.loads(suite_cli("compare", docker, local, "--json").stdout)
    assert doc["facts"][str(docker)]["image ID"] == image_id and "image ID" in doc["facts_differ"]


def test_a_machine_measured_at_smoke_size_against_one_at_full_size_gets_no_ratio(tmp_path: Path) -> None:
    """Smoke size trains another, smaller job: its time is shown, and said not compared, on either side."""
    a, b = _folder(tmp_path, "A", (1.0, 1.0, 1.0)), _folder(tmp_path, "B", SCALES)
    for path in (b / "fx_width").glob("*.json"):
        data = json.loads(path.read_text())
        data["spec"]["smoke"] = True
        path.write_text(json.dumps(data))
    for reference, other, said in (
        (a, b, "smoke size, the reference full size"),
        (b, a, "full size, the reference smoke size"),
    ):
        proc = suite_cli("compare", reference, other)
        assert proc.returncode == 0, proc.stderr
        for point, times in _fit_times(other).items():
            assert _cell(proc.stdout, point, 2) == f"{_geomean(times):.2f} (not compared: {said})", proc.stdout
        rows = [line for line in proc.stdout.splitlines() if line.startswith("| width=")]
        assert rows and not [r for r in rows if "x faster" in r or "x slower" in r], proc.stdout
        doc = json.loads(suite_cli("compare", reference, other, "--json").stdout)
        cells = [p["machines"][str(other)] for p in doc["scenarios"][0]["points"]]
        assert all(c["size_differs"] and c["speedup_vs_reference"] is None for c in cells if c["fit_s_geomean"])
    twin = shutil.copytree(b, tmp_path / "B2")  # both at smoke size: compared, as two full-size machines
    both = suite_cli("compare", b, twin)
    mean = _geomean(_fit_times(b)["width=100, device=cpu"])
    assert both.returncode == 0 and f"{mean:.2f}, 1.00x as fast as the reference" in both.stdout, both.stdout


def _machine_folder(source: Path, into: Path, machine: str, smoke: bool, scenarios: tuple[str, ...]) -> None:
    """``source``'s results of ``scenarios`` as machine ``machine``'s, at smoke size or not."""
    for path in sorted(source.rglob("*.json")):
        data = json.loads(path.read_text())
        if data["spec"]["scenario"] not in scenarios:
            continue
        data["spec"]["smoke"] = smoke
        data["run"]["machine"] = machine
        target = into / machine / data["spec"]["scenario"] / path.name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(data))


def test_by_default_the_reference_is_a_machine_at_full_size(tmp_path: Path) -> None:
    """A reference at smoke size would leave every full-size machine uncompared: the first by name
    at full size is taken instead, unless --reference names one."""
    local = REPO / "tests" / "fixtures" / "results" / "fixture-local"
    res = tmp_path / "results"
    for machine, smoke in (("a-smoke", True), ("b", False), ("c", False)):
        _machine_folder(local, res, machine, smoke, ("fx_width",))
    proc = suite_cli("report", "--results", res, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = (tmp_path / "out" / "hardware.md").read_text()
    assert "Reference: `b`." in page and "1.00x as fast as the reference" in _cell(page, "width=100, device=cpu", 3)
    assert _cell(page, "width=100, device=cpu", 2).endswith("(not compared: smoke size, the reference full size)")
    chosen = suite_cli("report", "--results", res, "--out", tmp_path / "chosen", "--reference", "a-smoke")
    assert chosen.returncode == 0, chosen.stdout + chosen.stderr
    assert "Reference: `a-smoke`." in (tmp_path / "chosen" / "hardware.md").read_text()


def test_points_skipped_wherever_the_scenario_ran_leave_the_table(tmp_path: Path) -> None:
    """A machine without the scenario ran none of it: the points skipped on the others leave the table."""
    local = REPO / "tests" / "fixtures" / "results" / "fixture-local"
    res = tmp_path / "results"
    _machine_folder(local, res, "a", False, ("fx_knobs",))
    for machine in ("b", "c"):
        _machine_folder(local, res, machine, False, ("fx_width", "fx_knobs"))
    proc = suite_cli("report", "--results", res, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    page = (tmp_path / "out" / "hardware.md").read_text()
    width = page[page.index("## fx_width") : page.index("## Recorded facts")]  # after fx_knobs, by name
    assert "2 points skipped on `b` and `c`: width=100, device=gpu; width=750, device=gpu." in width, width
    assert not _skipped_rows(width) and "| width=100, device=cpu | not run " in width, width
