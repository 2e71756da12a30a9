"""What a report keeps in the user's cache: the result files it has already checked, so it does not
check every field again, never vouching for a file changed since; and the plots it has drawn, so
it does not import matplotlib again. Real `suite report` runs."""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from pathlib import Path

from conftest import suite_cli

from suite import paths
from suite.record import checked_files

FIXTURE = Path(__file__).parent / "fixtures" / "results" / "fixture-local" / "fx_width"


def _results(tmp_path: Path) -> Path:
    res = tmp_path / "results"
    shutil.copytree(FIXTURE, res / "fixture-local" / "fx_width")
    # Older than RACY_S: a file changed just before it is read is never listed.
    time.sleep(checked_files.RACY_S + 0.1)
    return res


def _spoil(path: Path) -> None:
    """The record's status in capitals: no status the suite knows, in a file of the same size."""
    text = path.read_text()
    spoiled = re.sub(r'"status": "(\w+)"', lambda m: m.group(0).upper(), text, count=1)
    assert spoiled != text and len(spoiled) == len(text)
    path.write_text(spoiled)


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_a_second_report_reads_the_checked_files_and_writes_the_same_pages(tmp_path: Path) -> None:
    res, cache = _results(tmp_path), tmp_path / "cache"
    env = {paths.CACHE_ENV: str(cache)}
    before = _tree(res)
    pages = []
    for n in (1, 2):
        out = tmp_path / f"out{n}"
        proc = suite_cli("report", "--results", res, "--out", out, env=env)
        assert proc.returncode == 0, proc.stderr
        pages.append(_tree(out))
    assert pages[0] == pages[1] and "fx_width.md" in pages[0]
    assert _tree(res) == before, "nothing is written into the results folder"
    [listed] = (cache / "checked-results").glob("*.json")
    files = json.loads(listed.read_text())["files"]
    assert sorted(files) == sorted(p.relative_to(res).as_posix() for p in res.rglob("*.json")), "every result listed"


def test_a_file_changed_after_its_check_is_checked_again_even_with_its_size_and_time_put_back(
    tmp_path: Path,
) -> None:
    res, cache = _results(tmp_path), tmp_path / "cache"
    env = {paths.CACHE_ENV: str(cache)}
    assert suite_cli("report", "--results", res, "--out", tmp_path / "out", env=env).returncode == 0
    target = sorted(res.rglob("*.json"))[0]
    info = target.stat()
    _spoil(target)
    os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns))  # the size and modification time it was checked at
    proc = suite_cli("report", "--results", res, "--out", tmp_path / "out", env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert str(target) in proc.stderr and "field status" in proc.stderr, proc.stderr


def test_a_list_left_by_another_version_of_the_checks_or_unreadable_is_not_used(tmp_path: Path) -> None:
    res, cache = _results(tmp_path), tmp_path / "cache"
    env = {paths.CACHE_ENV: str(cache)}
    assert suite_cli("report", "--results", res, "--out", tmp_path / "out", env=env).returncode == 0
    [listed] = (cache / "checked-results").glob("*.json")
    data = json.loads(listed.read_text())
    target = sorted(res.rglob("*.json"))[0]
    _spoil(target)
    # The list vouches for the changed file's new times, but was written by other checks.
    data["files"][target.relative_to(res).as_posix()] = checked_files.key_of(target.stat())
    listed.write_text(json.dumps({**data, "checker": "0" * 64}))
    proc = suite_cli("report", "--results", res, "--out", tmp_path / "out", env=env)
    assert proc.returncode == 2 and "field status" in proc.stderr, proc.stdout + proc.stderr
    listed.write_text("{not json")
    proc = suite_cli("report", "--results", res, "--out", tmp_path / "out", env=env)
    assert proc.returncode == 2 and "field status" in proc.stderr, proc.stdout + proc.stderr


def test_an_unwritable_cache_folder_changes_nothing(tmp_path: Path) -> None:
    res = _results(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    env = {paths.CACHE_ENV: str(blocker / "cache")}  # under a file: no folder can be made there
    proc = suite_cli("report", "--results", res, "--out", tmp_path / "out", env=env)
    assert proc.returncode == 0 and not proc.stderr.strip(), proc.stderr
    assert (tmp_path / "out" / "fx_width.md").is_file()


def test_a_plot_drawn_before_is_taken_from_the_cache_without_matplotlib(tmp_path: Path) -> None:
    """The second report finds every plot among those drawn before: it writes the same PNG bytes
    where matplotlib cannot even be imported. A plot whose data changed is drawn again."""
    res, cache = _results(tmp_path), tmp_path / "cache"
    first = tmp_path / "first"
    assert suite_cli("report", "--results", res, "--out", first, env={paths.CACHE_ENV: str(cache)}).returncode == 0
    broken = tmp_path / "no-matplotlib" / "matplotlib"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('matplotlib is not to be imported')\n")
    env = {paths.CACHE_ENV: str(cache), "PYTHONPATH": f"{broken.parent}{os.pathsep}{paths.IMPORT_ROOT}"}
    again = tmp_path / "again"
    proc = suite_cli("report", "--results", res, "--out", again, env=env)
    assert proc.returncode == 0, proc.stderr
    pngs = sorted(p.name for p in first.glob("*.png"))
    assert pngs and _tree(again) == _tree(first)
    # One more run of a point: its plot is another, which needs matplotlib.
    record = sorted(p for p in res.rglob("*.json") if json.loads(p.read_text())["status"] == "ok")[0]
    data = json.loads(record.read_text())
    data["spec"]["repetition"] += 100
    data["timing"]["fit_s"] *= 3
    record.with_name("extra-r100.json").write_text(json.dumps(data))
    proc = suite_cli("report", "--results", res, "--out", again, env=env)
    assert proc.returncode == 1 and "matplotlib is not to be imported" in proc.stderr, proc.stderr
