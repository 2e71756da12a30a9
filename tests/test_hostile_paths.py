"""Names that become paths, from every source (scenario files, flags, result files), and writes
through planted links: refused with exit 2 naming the source, and nothing written outside the
folders. Through the real CLI."""

from __future__ import annotations

import csv
import json
import os
import shutil
from pathlib import Path

import pytest
from conftest import suite_cli, write_scenario
from docker_fixtures import SMALL_SCENARIO

FIXTURES = Path(__file__).parent / "fixtures" / "results"


def _tree(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _copy_results(tmp_path: Path) -> Path:
    res = tmp_path / "work" / "results"
    shutil.copytree(FIXTURES / "fixture-local" / "fx_knobs", res / "fixture-local" / "fx_knobs")
    return res


def _craft(res: Path, **changes: object) -> Path:
    """The first result file with ``changes`` ("spec.scenario": "../x") applied."""
    path = sorted(res.rglob("*.json"))[0]
    data = json.loads(path.read_text())
    for dotted, value in changes.items():
        section, key = dotted.split(".")
        data[section][key] = value
    path.write_text(json.dumps(data))
    return path


@pytest.mark.parametrize(
    "field, value",
    [
        ("spec.scenario", "../../escaped"),
        ("spec.scenario", "/tmp/abs"),
        ("run.machine", "../m"),
        ("spec.fingerprint", "./../../../escaped"),  # a rerun's file is named after it
    ],
)
def test_a_result_file_cannot_choose_where_report_and_reproduce_write(tmp_path: Path, field: str, value: str) -> None:
    res = _copy_results(tmp_path)
    crafted = _craft(res, **{field: value})
    before = _tree(tmp_path)
    proc = suite_cli("report", "--results", res, "--out", tmp_path / "work" / "out")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert f"{crafted}: field {field}: got {value!r}" in proc.stderr and "; allowed: " in proc.stderr
    again = suite_cli("reproduce", crafted, "--results", tmp_path / "work" / "again", "--anyway")
    assert again.returncode == 2 and f"field {field}" in again.stderr and "Traceback" not in again.stderr
    outside = {p for p in _tree(tmp_path) - before if not p.startswith("work")}
    assert not outside and not (tmp_path / "escaped").exists(), outside


@pytest.mark.parametrize("machine", ["../../x", "/abs/x", "..", ".hidden", "a/b", "tab\there", "x" * 101])
def test_machine_names_are_one_safe_folder(tmp_path: Path, machine: str) -> None:
    path = write_scenario(tmp_path, "tiny_paths", SMALL_SCENARIO.format(name="tiny_paths", widths="[32]"))
    for command in ("check", "run"):
        proc = suite_cli(
            command, path, "--smoke", "--backend", "local", "--results", tmp_path / "r", "--machine", machine
        )
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (command, proc.stderr)
        assert f"machine name (--machine): got {machine!r}"[:70] in proc.stderr and "; allowed: " in proc.stderr
    assert not (tmp_path / "x").exists() and not Path("/abs").exists()


@pytest.mark.parametrize("name", ["..", ".", "tiny\n", "_x", ".x", "a" * 300, ".suite-run.lock", "a b"])
def test_scenario_names_are_one_safe_folder(tmp_path: Path, name: str) -> None:
    text = SMALL_SCENARIO.format(name="PLACEHOLDER", widths="[32]").replace(
        "name: PLACEHOLDER", f"name: {json.dumps(name)}"
    )
    path = write_scenario(tmp_path, "named", text)
    for command in ("check", "run"):
        proc = suite_cli(command, path, "--smoke", "--backend", "local", "--results", tmp_path / "r")
        assert proc.returncode == 2 and "Traceback" not in proc.stderr, (command, name, proc.stderr)
        assert "key 'name'" in proc.stderr and "allowed: 1 to 100 letters" in proc.stderr, proc.stderr
    assert not (tmp_path / "r").exists()


def test_a_link_planted_as_the_run_lock_is_not_written_through(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "tiny_lock", SMALL_SCENARIO.format(name="tiny_lock", widths="[32]"))
    folder = tmp_path / "r" / "box"
    folder.mkdir(parents=True)
    target = tmp_path / "victim"
    target.write_text("keep\n")
    os.symlink(target, folder / ".suite-run.lock")
    proc = suite_cli("run", path, "--smoke", "--backend", "local", "--results", tmp_path / "r", "--machine", "box")
    assert proc.returncode == 2 and "cannot be the run lock" in proc.stderr, proc.stdout + proc.stderr
    assert target.read_text() == "keep\n"


def test_report_temp_files_are_not_written_through_a_planted_link(tmp_path: Path) -> None:
    out = tmp_path / "out"
    out.mkdir()
    target = tmp_path / "victim"
    target.write_text("keep\n")
    for name in ("README.md", "fx_knobs.md", "hardware.md"):
        os.symlink(target, out / f".{name}.tmp")  # the fixed names pages were once written through
    proc = suite_cli("report", "--results", FIXTURES, "--out", out)
    assert proc.returncode == 0, proc.stderr
    assert target.read_text() == "keep\n" and (out / "fx_knobs.md").is_file()


def test_csv_cells_that_a_spreadsheet_would_run_are_text(tmp_path: Path) -> None:
    res = _copy_results(tmp_path)
    for path in res.rglob("*.json"):
        data = json.loads(path.read_text())
        if data["spec"]["point_label"] == "variant=default":
            data["spec"]["point_label"] = "=HYPERLINK(1)"
        elif data["spec"]["point_label"].startswith("variant=steps"):
            data["spec"]["point_label"] = "\t=HYPERLINK(2)"
        data["message"] = "failed \x1b[2J\x1b]0;owned\x07 here"  # runs.csv: shown, never obeyed by a terminal
        data["spec"]["point"]["\x1b[2J\x1b]0;pwned\x07x"] = 1  # a coordinate's name is a column's header
        path.write_text(json.dumps(data))
    out = tmp_path / "out"
    proc = suite_cli("report", "--results", res, "--out", out, "--format", "csv")
    assert proc.returncode == 0, proc.stderr
    rows = list(csv.DictReader((out / "points.csv").open(newline="", encoding="utf-8")))
    assert {"'=HYPERLINK(1)", "'\t=HYPERLINK(2)"} <= {r["point"] for r in rows}, [r["point"] for r in rows]
    overheads = [r["first_epoch_overhead_s_median"] for r in rows]
    assert all(not v.startswith("'") for v in overheads), "numbers, negative ones too, stay numbers"
    runs = (out / "runs.csv").read_text(encoding="utf-8")
    assert "\x1b" not in runs and "\x07" not in runs, "no control character reaches the file"
    assert "failed \\x1b[2J\\x1b]0;owned\\x07 here" in runs, runs[:2000]
    points = (out / "points.csv").read_text(encoding="utf-8")
    assert "\x1b" not in points and "\x07" not in points, "nor its header"
    assert "coord.\\x1b[2J\\x1b]0;pwned\\x07x" in points.splitlines()[0], points.splitlines()[0]


def test_a_link_planted_as_a_scenario_folder_is_not_written_through(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "tiny_link", SMALL_SCENARIO.format(name="tiny_link", widths="[16]"))
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "r" / "box").mkdir(parents=True)
    os.symlink(outside, tmp_path / "r" / "box" / "tiny_link")
    kept = tmp_path / "tmp"
    kept.mkdir()
    proc = suite_cli(
        "run",
        path,
        "--smoke",
        "--backend",
        "local",
        "--results",
        tmp_path / "r",
        "--machine",
        "box",
        env={"TMPDIR": str(kept)},
    )
    assert proc.returncode == 1 and "it is a link; results are never written through one" in proc.stdout + proc.stderr
    assert list(outside.iterdir()) == [] and len(list(kept.rglob("*.json"))) == 1, "kept aside, not lost"


def test_a_link_planted_as_the_fallback_folder_is_not_followed(tmp_path: Path) -> None:
    """The fallback lies in the shared temp folder, where anyone may plant a link at its name first."""
    path = write_scenario(tmp_path, "tiny_fall", SMALL_SCENARIO.format(name="tiny_fall", widths="[16]"))
    temp, outside = tmp_path / "tmp", tmp_path / "outside"
    temp.mkdir()
    outside.mkdir()
    os.symlink(outside, temp / f"suite-unsaved-{os.getuid()}")
    (tmp_path / "r" / "box").mkdir(parents=True)
    os.symlink(tmp_path / "nowhere", tmp_path / "r" / "box" / "tiny_fall")  # the results folder fails
    env = {"TMPDIR": str(temp), "HOME": str(tmp_path / "home")}
    proc = suite_cli(
        "run", path, "--smoke", "--backend", "local", "--results", tmp_path / "r", "--machine", "box", env=env
    )
    assert proc.returncode == 1 and list(outside.iterdir()) == [], proc.stdout + proc.stderr
    assert len(list((tmp_path / "home" / ".cache" / "suite-unsaved").rglob("*.json"))) == 1


def test_report_k_does_not_write_through_a_planted_selected_link(tmp_path: Path) -> None:
    out, outside = tmp_path / "out", tmp_path / "outside"
    out.mkdir()
    outside.mkdir()
    os.symlink(outside, out / "selected")
    proc = suite_cli("report", "--results", FIXTURES, "--out", out, "-k", "device=cpu")
    assert proc.returncode == 2 and "a link" in proc.stderr and list(outside.iterdir()) == [], proc.stderr


def test_report_json_is_not_written_among_the_results_it_reads(tmp_path: Path) -> None:
    res = _copy_results(tmp_path)
    proc = suite_cli("report", "--results", res, "--out", res, "--format", "json")
    assert proc.returncode == 2 and "inside the results folder" in proc.stderr, proc.stderr
    assert suite_cli("report", "--results", res, "--out", tmp_path / "out").returncode == 0


def test_pages_are_as_readable_as_any_file_made_here(tmp_path: Path) -> None:
    proc = suite_cli("report", "--results", FIXTURES, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    umask = os.umask(0o022)
    os.umask(umask)
    assert (tmp_path / "out" / "README.md").stat().st_mode & 0o777 == 0o666 & ~umask


def test_a_report_lists_results_without_following_links_to_folders_or_reading_temp_and_cache_files(
    tmp_path: Path,
) -> None:
    """A link back up the results folder would make a walk that follows it endless; temp files
    (``.name``) and folders of caches (``_name``) hold no result. The report counts the results
    alone, as ``--format json`` lists them; a machine folder named ``*.json`` is a folder, and a link
    so named is refused as a result."""
    res = _copy_results(tmp_path)
    results = sorted(res.rglob("*.json"))
    machine = res / "fixture-local"
    os.symlink(res, machine / "loop")  # a link to a folder above
    (machine / "_cache").mkdir()
    shutil.copy(results[0], machine / "_cache" / "copy.json")
    shutil.copy(results[0], machine / "fx_knobs" / ".partial.json")
    out = tmp_path / "out"
    proc = suite_cli("report", "--results", res, "--out", out, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    listed = [r["file"] for r in json.loads((out / "report.json").read_text())["runs"]]
    assert listed == [p.relative_to(res).as_posix() for p in results], listed
    shutil.move(machine, res / "box.json")  # what `run --machine box.json` makes
    proc = suite_cli("report", "--results", res, "--out", out, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    listed = [r["file"] for r in json.loads((out / "report.json").read_text())["runs"]]
    assert listed == ["box.json/" + p.relative_to(machine).as_posix() for p in results], listed
    os.symlink(res / "box.json", res / "link.json")
    proc = suite_cli("report", "--results", res, "--out", out, "--format", "json")
    assert proc.returncode == 2 and f"{res / 'link.json'}: not a readable result file" in proc.stderr
    assert "not a regular file (a folder)" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr


def test_a_page_s_reproduce_command_names_the_folder_its_results_are_in(tmp_path: Path) -> None:
    """A machine's folder renamed (or results copied in under another name): the records still name
    the machine, and the page's reproduce command names the folder that holds them."""
    res = tmp_path / "results"
    shutil.copytree(FIXTURES / "fixture-local" / "fx_knobs", res / "box-2024" / "fx_knobs")
    proc = suite_cli("report", "--results", res, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "out" / "fx_knobs.md").read_text()
    assert "## On `fixture-local`" in page
    said = next(line for line in page.splitlines() if line.startswith("To check these numbers: "))
    assert said == f"To check these numbers: `python -m suite reproduce {res / 'box-2024' / 'fx_knobs'}`", said


def test_the_index_names_the_results_folder_it_was_made_from(tmp_path: Path) -> None:
    res = _copy_results(tmp_path)
    out = tmp_path / "pages"
    assert suite_cli("report", "--results", res, "--out", out).returncode == 0
    index = (out / "README.md").read_text(encoding="utf-8")
    assert f"from the result files under `{res}/`" in index, index.splitlines()[2]
    inside = out / "results"
    shutil.copytree(res, inside)
    assert suite_cli("report", "--results", inside, "--out", out).returncode == 0
    assert "from the result files under `results/`" in (out / "README.md").read_text(encoding="utf-8")
