"""What a report keeps in the user's cache: the result files it has already checked (by the sha256
of their bytes), so it does not check every field again, and never vouches for bytes it did not
check; the plots it has drawn, so it does not import matplotlib again; and what it last wrote into
each report folder and from what, so it rewrites nothing that would not change, and never leaves a
page that would. Real `suite report` runs."""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import mmap
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from conftest import REPO, suite_cli

from suite import paths

FIXTURE = Path(__file__).parent / "fixtures" / "results" / "fixture-local" / "fx_width"
RICH = Path(__file__).parent / "fixtures" / "rich"  # a run's record with telemetry, provenance, an image


def _results(under: Path, source: Path = FIXTURE) -> Path:
    res = under / "results"
    if source == FIXTURE:
        shutil.copytree(FIXTURE, res / "fixture-local" / "fx_width")
    else:
        shutil.copytree(source, res)
    return res


def _timed(res: Path) -> Path:
    """A result file with a fit time."""
    return next(p for p in sorted(res.rglob("*.json")) if json.loads(p.read_text())["timing"].get("fit_s"))


def _spoiled(text: str) -> str:
    """The fit time made negative, in a file of the same size: a record that loads as any other,
    and that only the field checks refuse ("field timing.fit_s")."""
    spoiled = re.sub(r'"fit_s": (\d)', r'"fit_s":-\1', text, count=1)
    assert spoiled != text and len(spoiled) == len(text)
    return spoiled


def _tree(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def _report(res: Path, out: Path, cache: Path, **env: str) -> tuple[int, str]:
    proc = suite_cli("report", "--results", res, "--out", out, env={paths.CACHE_ENV: str(cache), **env})
    return proc.returncode, proc.stdout + proc.stderr


@pytest.mark.parametrize("source", [FIXTURE, RICH], ids=["width", "telemetry"])
def test_a_second_report_reads_the_checked_files_and_writes_the_same_pages(tmp_path: Path, source: Path) -> None:
    """The second report decodes the checked files another way (orjson): the same pages and exports."""
    res, cache = _results(tmp_path, source), tmp_path / "cache"
    before = _tree(res)
    for n in (1, 2):
        out = tmp_path / f"out{n}"
        proc = suite_cli(
            "report", "--results", res, "--out", out, "--format", "md,json,csv", env={paths.CACHE_ENV: str(cache)}
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
    assert _tree(tmp_path / "out1") == _tree(tmp_path / "out2") and len(_tree(tmp_path / "out1")) >= 5
    assert _tree(res) == before, "nothing is written into the results folder"
    [listed] = (cache / "checked-results").glob("*.json")
    data = json.loads(listed.read_text())
    by_digest = {hashlib.sha256(p.read_bytes()).hexdigest(): p for p in res.rglob("*.json")}
    assert set(data["files"]) == set(by_digest) and data["code"] == paths.code_digest(), "every result, by its bytes"
    # Beside the list, the record of each file with telemetry series less those, by its bytes.
    with_series = {d for d, p in by_digest.items() if '"series"' in p.read_text()}
    stored = _stored(cache) if with_series else {}
    assert set(stored) == with_series and (source == FIXTURE or with_series), "none where there are no series"
    assert not (cache / "slim-results").exists() or with_series
    for digest, record in stored.items():
        whole = json.loads(by_digest[digest].read_text())
        for metric in whole.get("telemetry", {}).get("metrics", []):
            assert metric.pop("series")
        assert record == whole


def _stored(cache: Path) -> dict[str, dict]:
    """The records of the one results folder's store, by the sha256 of their files' bytes."""
    [store] = (cache / "slim-results").glob("*.jsonl")
    header, *lines = store.read_bytes().splitlines()
    assert header.decode() == paths.code_digest()
    return {line[:64].decode(): json.loads(line[65:]) for line in lines}


def test_bytes_changed_after_their_check_are_checked_again_whatever_the_files_times_say(tmp_path: Path) -> None:
    """A write through a shared mapping whose page is already dirty leaves every time of the file as
    it was (Linux sets them at the page's first write fault): the list goes by the bytes read."""
    res, cache = _results(tmp_path), tmp_path / "cache"
    target = _timed(res)
    with open(target, "r+b") as fh, mmap.mmap(fh.fileno(), 0) as mapped:
        mapped[0:1] = mapped[0:1]  # the page's first write: the file's times are set now
        code, said = _report(res, tmp_path / "out", cache)
        assert code == 0, said
        mapped[:] = _spoiled(mapped[:].decode()).encode()  # through the dirty page
        mapped.flush()
    code, said = _report(res, tmp_path / "out", cache)
    assert code == 2 and str(target) in said and "field timing.fit_s" in said, said


def test_a_list_made_by_other_code_or_unreadable_vouches_for_nothing(tmp_path: Path) -> None:
    res, cache = _results(tmp_path), tmp_path / "cache"
    assert _report(res, tmp_path / "out", cache)[0] == 0
    [listed] = (cache / "checked-results").glob("*.json")
    target = _timed(res)
    target.write_text(_spoiled(target.read_text()))
    # A list of another version of the suite that holds the spoiled file's bytes: not this code's checks.
    spoiled = hashlib.sha256(target.read_bytes()).hexdigest()
    listed.write_text(json.dumps({"code": "0" * 64, "files": [spoiled]}))
    for garbage in (None, "{not json", "[" * 100_000 + "]" * 100_000):
        if garbage is not None:
            listed.write_text(garbage)
        code, said = _report(res, tmp_path / "out", cache)
        assert code == 2 and "field timing.fit_s" in said, said


def test_without_a_writable_cache_a_utf8_folder_name_or_a_cache_apart_the_report_is_the_same(tmp_path: Path) -> None:
    res = _results(Path(os.fsdecode(bytes(tmp_path) + b"/r\xe9sultats")))  # Latin-1, not UTF-8
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    code, said = _report(res, tmp_path / "out", blocker / "cache")  # under a file: no folder there
    assert code == 0 and "error" not in said.lower() and "Traceback" not in said, said
    code, said = _report(res, tmp_path / "again", tmp_path / "cache")
    assert code == 0 and _tree(tmp_path / "out") == _tree(tmp_path / "again"), said
    for _ in (1, 2):  # a cache inside the results folder: its list is not kept there, to be read as a result
        code, said = _report(res, tmp_path / "inside", res / "cache")
        assert code == 0, said


def test_a_plot_drawn_before_is_taken_from_the_cache_without_matplotlib(tmp_path: Path) -> None:
    """The second report finds every plot among those drawn before: it writes the same PNG bytes
    where matplotlib cannot even be imported. A plot whose data changed is drawn again."""
    res, cache = _results(tmp_path), tmp_path / "cache"
    assert _report(res, tmp_path / "first", cache)[0] == 0
    broken = tmp_path / "no-matplotlib" / "matplotlib"
    broken.mkdir(parents=True)
    (broken / "__init__.py").write_text("raise ImportError('matplotlib is not to be imported')\n")
    pythonpath = f"{broken.parent}{os.pathsep}{paths.IMPORT_ROOT}"
    code, said = _report(res, tmp_path / "again", cache, PYTHONPATH=pythonpath)
    assert code == 0, said
    assert list((tmp_path / "first").glob("*.png")) and _tree(tmp_path / "again") == _tree(tmp_path / "first")
    # One more run of a point: its plot is another, which needs matplotlib.
    record = sorted(p for p in res.rglob("*.json") if json.loads(p.read_text())["status"] == "ok")[0]
    data = json.loads(record.read_text())
    data["spec"]["repetition"] += 100
    data["timing"]["fit_s"] *= 3
    record.with_name("extra-r100.json").write_text(json.dumps(data))
    code, said = _report(res, tmp_path / "again", cache, PYTHONPATH=pythonpath)
    assert code == 1 and "matplotlib is not to be imported" in said, said


def test_a_plot_is_the_same_whatever_matplotlibrc_this_machine_has(tmp_path: Path) -> None:
    """Plots are drawn in matplotlib's default style, so a plot taken from the cache is the one that
    would be drawn now, and a published page's plots do not depend on where they were drawn."""
    res = _results(tmp_path)
    assert _report(res, tmp_path / "plain", tmp_path / "cache1")[0] == 0
    rc = tmp_path / "matplotlibrc"
    rc.write_text("figure.dpi: 20\nlines.linewidth: 9\naxes.prop_cycle: cycler('color', ['r'])\nfont.size: 30\n")
    assert _report(res, tmp_path / "styled", tmp_path / "cache2", MATPLOTLIBRC=str(rc))[0] == 0
    pngs = sorted(p.name for p in (tmp_path / "plain").glob("*.png"))
    assert pngs and all((tmp_path / "plain" / n).read_bytes() == (tmp_path / "styled" / n).read_bytes() for n in pngs)


def test_the_code_digest_passes_over_what_is_no_module_and_is_none_without_sources(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An editor's lock file (a dangling link) or a FIFO named *.py is no module: it neither changes
    the digest nor blocks it. A package without its .py files gives no digest, and so no cache."""
    package = tmp_path / "suite"
    (package / "sub").mkdir(parents=True)
    (package / "a.py").write_text("A = 1\n")
    (package / "sub" / "b.py").write_text("B = 2\n")
    monkeypatch.setattr(paths, "PACKAGE_DIR", package)
    paths.code_digest.cache_clear()
    try:
        plain = paths.code_digest()
        (package / ".#a.py").symlink_to("root@host.1234:1700000000")
        os.mkfifo(package / "sub" / "c.py")
        paths.code_digest.cache_clear()
        assert paths.code_digest() == plain and plain is not None
        (package / "a.py").write_text("A = 2\n")
        paths.code_digest.cache_clear()
        assert paths.code_digest() not in (plain, None)
        for module in package.rglob("*.py"):
            module.unlink()
        paths.code_digest.cache_clear()
        assert paths.code_digest() is None and paths.cache_dir() is None
    finally:
        paths.code_digest.cache_clear()


def _stamps(tree: Path) -> dict[str, int]:
    return {p.name: p.stat().st_mtime_ns for p in tree.iterdir()}


def test_a_report_over_the_results_it_was_written_from_rewrites_nothing(tmp_path: Path) -> None:
    """Same results, options and code, and every page as it was written: nothing is rewritten, and
    the command says which files it left as they were. Another option writes anew."""
    res, out, cache = _results(tmp_path, RICH), tmp_path / "out", tmp_path / "cache"
    args = ("report", "--results", res, "--out", out, "--format", "md,json,csv")
    first = suite_cli(*args, env={paths.CACHE_ENV: str(cache)})
    assert first.returncode == 0 and "wrote" in first.stdout, first.stdout + first.stderr
    pages, times = _tree(out), _stamps(out)
    second = suite_cli(*args, env={paths.CACHE_ENV: str(cache)})
    assert second.returncode == 0, second.stdout + second.stderr
    assert "wrote" not in second.stdout and "nothing rewritten" in second.stdout, second.stdout
    said = {line.removeprefix("unchanged ") for line in second.stdout.splitlines() if line.startswith("unchanged ")}
    assert said == {str(out / name) for name in pages} and len(said) >= 6, second.stdout
    assert _tree(out) == pages and _stamps(out) == times
    third = suite_cli(*args[:-1], "md", env={paths.CACHE_ENV: str(cache)})
    assert third.returncode == 0 and "wrote" in third.stdout and "unchanged" not in third.stdout, third.stdout


def _changed_value(res: Path) -> None:
    target = _timed(res)
    target.write_text(target.read_text().replace('"fit_s": ', '"fit_s": 1', 1))


def _added(res: Path) -> None:
    data = json.loads(_timed(res).read_text())
    data["spec"]["repetition"] += 100
    (_timed(res).parent / "extra-r100.json").write_text(json.dumps(data))


def _removed(res: Path) -> None:
    _timed(res).unlink()


def _renamed(res: Path) -> None:
    target = _timed(res)
    target.rename(target.with_name("renamed-" + target.name))


@pytest.mark.parametrize("change", [_changed_value, _added, _removed, _renamed], ids=lambda f: f.__name__.strip("_"))
def test_a_report_whose_results_changed_is_written_anew(tmp_path: Path, change: Callable[[Path], None]) -> None:
    res, out, cache = _results(tmp_path), tmp_path / "out", tmp_path / "cache"
    assert _report(res, out, cache)[0] == 0
    before = _tree(out)
    change(res)
    code, said = _report(res, out, cache)
    assert code == 0 and "wrote" in said and "unchanged" not in said, said
    assert _tree(out) != before or change is _renamed, "the pages show the change (a file's name is not shown)"
    fresh = tmp_path / "fresh"
    assert _report(res, fresh, tmp_path / "cache-apart")[0] == 0
    assert _tree(out) == _tree(fresh), "what a report with no cache writes"


def test_a_page_edited_or_deleted_is_written_again(tmp_path: Path) -> None:
    res, out, cache = _results(tmp_path), tmp_path / "out", tmp_path / "cache"
    assert _report(res, out, cache)[0] == 0
    pages = _tree(out)
    (out / "hardware.md").write_text("edited\n")
    (out / "README.md").unlink()
    code, said = _report(res, out, cache)
    assert code == 0 and "wrote" in said and _tree(out) == pages, said


@pytest.mark.parametrize("name", ["../outside.md", "OUTSIDE", "sub/inside.md"])
def test_an_entry_naming_a_file_outside_the_report_folder_vouches_for_nothing(tmp_path: Path, name: str) -> None:
    """The entry is read as untrusted: a name that is not a file of the report folder itself, even
    with that file's true sha256, makes the report write everything."""
    res, out, cache = _results(tmp_path), tmp_path / "out", tmp_path / "cache"
    assert _report(res, out, cache)[0] == 0
    [entry] = (cache / "written-reports").glob("*.json")
    data = json.loads(entry.read_text())
    outside = tmp_path / "outside.md"
    outside.write_text("not a page\n")
    (out / "sub").mkdir()
    (out / "sub" / "inside.md").write_text("not a page either\n")
    name = str(outside) if name == "OUTSIDE" else name
    data["files"].append([name, hashlib.sha256((out / name).read_bytes()).hexdigest()])
    entry.write_text(json.dumps(data))
    code, said = _report(res, out, cache)
    assert code == 0 and "wrote" in said and "unchanged" not in said, said


@pytest.mark.parametrize("listed", ["scenarios", "files"])
def test_an_entry_naming_a_file_twice_vouches_for_nothing(tmp_path: Path, listed: str) -> None:
    """A report's own entry names each file once: one naming a file many times (each name hashed
    again, up to gigabytes read) was not written by a report, and the report writes everything."""
    res, out, cache = _results(tmp_path), tmp_path / "out", tmp_path / "cache"
    scenario = tmp_path / "fx_width.yaml"
    scenario.write_text((paths.CHECKOUT / "tests" / "fixtures" / "scenarios" / "fx_width.yaml").read_text())
    _named_scenario(res, str(scenario))
    assert _report(res, out, cache)[0] == 0
    [entry] = (cache / "written-reports").glob("*.json")
    data = json.loads(entry.read_text())
    assert data[listed], data
    data[listed] = data[listed] * 1_000
    entry.write_text(json.dumps(data))
    code, said = _report(res, out, cache)
    assert code == 0 and "wrote" in said and "unchanged" not in said, said


@pytest.mark.parametrize(
    "options",
    [("--format", "md,json"), ("-k", "width=100"), ("--reference", "fixture-local")],
    ids=["format", "select", "reference"],
)
def test_a_report_with_other_options_is_written_anew_and_then_left_as_it_is(
    tmp_path: Path, options: tuple[str, str]
) -> None:
    res, out, cache = _results(tmp_path), tmp_path / "out", tmp_path / "cache"
    assert _report(res, out, cache)[0] == 0
    env = {paths.CACHE_ENV: str(cache)}
    for verb in ("wrote", "unchanged"):
        proc = suite_cli("report", "--results", res, "--out", out, *options, env=env)
        assert proc.returncode == 0 and f"{verb} " in proc.stdout, proc.stdout + proc.stderr
    if options[0] == "--format":  # the formats in another order: the same files
        proc = suite_cli("report", "--results", res, "--out", out, "--format", "json,md", env=env)
        assert proc.returncode == 0 and "wrote" not in proc.stdout, proc.stdout + proc.stderr
    # One entry per folder, the last report's: -k writes into a folder of its own, the others into this one.
    said = _report(res, out, cache)[1]
    assert ("unchanged" in said) == (options[0] == "-k") and ("wrote" in said) != (options[0] == "-k"), said


def _named_scenario(res: Path, scenario: str) -> None:
    """The results name ``scenario`` as their file (an absolute path is taken as it is)."""
    for record in res.rglob("*.json"):
        data = json.loads(record.read_text())
        data["spec"]["scenario_file"] = scenario
        record.write_text(json.dumps(data))


def test_a_page_does_not_depend_on_the_data_this_machine_holds(tmp_path: Path) -> None:
    """Whether a page's points are all of its scenario file's is told by their labels: a data
    folder the file names, readable or not, changes nothing on the page."""
    res, cache = _results(tmp_path), tmp_path / "cache"
    scenario, data = tmp_path / "fx_width.yaml", tmp_path / "mnist"
    text = (paths.CHECKOUT / "tests" / "fixtures" / "scenarios" / "fx_width.yaml").read_text()
    scenario.write_text(text.replace("data: {allow_synthetic: true,", f"data: {{data_dir: {data},"))
    _named_scenario(res, str(scenario))
    data.mkdir()
    (data / "t10k-images-idx3-ubyte.gz").write_bytes(b"not gzip")  # damaged: loading the scenario refuses it
    assert suite_cli("check", scenario, "--smoke").returncode == 2
    assert _report(res, tmp_path / "damaged", cache)[0] == 0
    (data / "t10k-images-idx3-ubyte.gz").unlink()
    assert _report(res, tmp_path / "gone", cache)[0] == 0
    assert _tree(tmp_path / "damaged") == _tree(tmp_path / "gone")
    assert "-k" not in (tmp_path / "gone" / "fx_width.md").read_text().split("python -m suite run")[1].split("\n")[0]


def test_a_scenario_file_a_system_cannot_open_is_not_read_and_the_report_is_written(tmp_path: Path) -> None:
    """A result may name any text as its scenario file: one with a NUL or a lone surrogate names
    no file, and the page names its points with -k."""
    res, out, cache = _results(tmp_path), tmp_path / "out", tmp_path / "cache"
    for name in ("a\u0000b", "\ud800.yaml"):
        _named_scenario(res, name)
        for verb in ("wrote", "unchanged"):
            code, said = _report(res, out, cache)
            assert code == 0 and f"{verb} " in said and "Traceback" not in said, said


def test_a_report_whose_scenario_file_changed_is_written_anew(tmp_path: Path) -> None:
    """A page's "Reproduce" command names its points with -k unless they are all of the scenario
    file's (report/rerun): the file is an input of the page, and an edit of it is seen."""
    res, out, cache = _results(tmp_path), tmp_path / "out", tmp_path / "cache"
    scenario = tmp_path / "fx_width.yaml"
    scenario.write_text((paths.CHECKOUT / "tests" / "fixtures" / "scenarios" / "fx_width.yaml").read_text())
    _named_scenario(res, str(scenario))
    code, said = _report(res, out, cache)
    assert code == 0 and "wrote" in said, said
    page = (out / "fx_width.md").read_text()
    assert _report(res, out, cache)[1].count("unchanged ") == len(_tree(out))
    scenario.write_text(scenario.read_text() + "\n# a comment changes the bytes, not the points\n")
    code, said = _report(res, out, cache)
    assert code == 0 and "wrote" in said and (out / "fx_width.md").read_text() == page, said
    scenario.unlink()  # now unreadable: the page names its points with -k
    code, said = _report(res, out, cache)
    assert code == 0 and "wrote" in said and (out / "fx_width.md").read_text() != page, said
    assert "unchanged" in _report(res, out, cache)[1], "still unreadable: nothing changed"


def test_a_scenario_file_edited_and_put_back_during_a_report_leaves_no_page_of_the_edit(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The entry keeps the sha256 of the very bytes the page was made from: a file edited as the
    report reads it and put back before the next one cannot leave a page made from the edit."""
    from suite import cli
    from suite.safe import bounded

    res, out, cache = _results(tmp_path), tmp_path / "out", tmp_path / "cache"
    scenario = tmp_path / "fx_width.yaml"
    original = (paths.CHECKOUT / "tests" / "fixtures" / "scenarios" / "fx_width.yaml").read_text()
    edited = original.replace("model.hidden.0: [100, 750]", "model.hidden.0: [100, 751]")
    assert edited != original
    scenario.write_text(original)
    _named_scenario(res, str(scenario))
    real_read = bounded.read_bytes

    def read_then_edit(path: Path | str, limit: int) -> bytes:
        raw = real_read(path, limit)
        if Path(path) == scenario:
            scenario.write_text(edited)  # another program's edit, just after this read
        return raw

    monkeypatch.setenv(paths.CACHE_ENV, str(cache))
    monkeypatch.setattr(bounded, "read_bytes", read_then_edit)
    assert cli.main(["report", "--results", str(res), "--out", str(out)]) == 0
    monkeypatch.undo()
    scenario.write_text(original)  # put back
    code, said = _report(res, out, cache)
    fresh = tmp_path / "fresh"
    assert _report(res, fresh, tmp_path / "other-cache")[0] == 0
    assert code == 0 and _tree(out) == _tree(fresh), said


def test_a_link_planted_in_the_cache_folder_deletes_nothing_where_it_leads(tmp_path: Path) -> None:
    """Each cache file's folder must be a real folder of this user's: pruning it through a link
    would delete the oldest files of the same suffix elsewhere (result files among them)."""
    res, out, cache = _results(tmp_path), tmp_path / "out", tmp_path / "cache"
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for n in range(1_005):
        (elsewhere / f"{n:04}.json").write_text("{}")
        (elsewhere / f"{n:04}.png").write_text("")
    cache.mkdir()
    for n in range(10):
        (elsewhere / f"{n:04}.jsonl").write_text("")
    before = _tree(elsewhere)
    for name in ("written-reports", "plots", "checked-results", "slim-results"):
        (cache / name).symlink_to(elsewhere, target_is_directory=True)
    for _ in range(2):
        code, said = _report(res, out, cache)
        assert code == 0 and "wrote" in said and "unchanged" not in said, said
    assert _tree(elsewhere) == before


@pytest.mark.parametrize("garbage", ["{not json", "[]", '{"inputs": 1, "files": 2}', "[" * 100_000 + "]" * 100_000])
def test_an_unreadable_entry_vouches_for_nothing(tmp_path: Path, garbage: str) -> None:
    res, out, cache = _results(tmp_path), tmp_path / "out", tmp_path / "cache"
    assert _report(res, out, cache)[0] == 0
    [entry] = (cache / "written-reports").glob("*.json")
    entry.write_text(garbage)
    code, said = _report(res, out, cache)
    assert code == 0 and "wrote" in said and "unchanged" not in said, said
    assert _report(res, out, cache)[1].count("unchanged") == len(_tree(out)), "the entry is whole again"


def test_without_a_writable_cache_or_with_it_inside_a_folder_every_report_writes(tmp_path: Path) -> None:
    res = _results(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    out = tmp_path / "out"
    for cache in (blocker / "cache", res / "cache", out / "cache"):
        for _ in (1, 2):
            code, said = _report(res, out, cache)
            assert code == 0 and "wrote" in said and "unchanged" not in said, said
    assert not (res / "cache").exists() or not any((res / "cache").rglob("written-reports/*"))


def test_the_inputs_digest_follows_the_code_and_the_packages(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """What the pages' bytes depend on beyond the files and options: the suite's code and the
    versions of the packages that format numbers, tables and plots."""
    from suite.record import results
    from suite.report import up_to_date

    res = _results(tmp_path)
    read = results.read_folder(res)

    def digest() -> str | None:
        return up_to_date.inputs_digest(read, res, tmp_path / "out", {"formats": ["md"]})

    plain = digest()
    assert plain is not None and digest() == plain
    assert up_to_date.inputs_digest(read, res, tmp_path / "other", {"formats": ["md"]}) != plain
    assert up_to_date.inputs_digest(read[1:], res, tmp_path / "out", {"formats": ["md"]}) != plain
    real_version = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version", lambda p: "99.0" if p == "tabulate" else real_version(p))
    assert digest() not in (plain, None)
    monkeypatch.undo()
    monkeypatch.setattr(paths, "code_digest", lambda: "0" * 64)
    assert digest() not in (plain, None)
    monkeypatch.setattr(paths, "code_digest", lambda: None)
    assert digest() is None
    monkeypatch.undo()
    monkeypatch.setattr(paths, "CHECKOUT", None)  # installed: paths on a page are relative to the working folder
    monkeypatch.chdir(tmp_path)
    installed = digest()
    monkeypatch.chdir(res)
    assert digest() not in (installed, None)


def test_bytes_not_kept_are_read_again_and_the_digest_is_of_the_bytes_decoded(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Beyond the bytes kept, a file is read again to be decoded; where it changed in between, the
    record and the digest a report's entry keeps are both of the bytes decoded."""
    from suite.record import results

    res = _results(tmp_path)
    monkeypatch.setattr(results, "KEPT_BYTES", 0)
    read = results.read_folder(res)
    assert read and all(f.raw is None for f in read)
    target = _timed(res)
    before = next(f.sha256 for f in read if f.path == target)
    _changed_value(res)
    loaded = dict(results.load_folder(res, read=read))
    after = next(f.sha256 for f in read if f.path == target)
    assert after == hashlib.sha256(target.read_bytes()).hexdigest() != before
    assert results.FIT_S.of(loaded[target]) == json.loads(target.read_text())["timing"]["fit_s"]


def _planted(cache: Path, how: str, name: str) -> Path:
    """The cache's folder ``name``, made by someone else first: a link to a folder they can write,
    or a folder of another user's that anyone can write. Where the files found there are put."""
    if how == "link":
        shared = cache.parent / f"shared-{name}"
        shared.mkdir(parents=True)
        cache.mkdir(exist_ok=True)
        (cache / name).symlink_to(shared, target_is_directory=True)
        return shared
    (cache / name).mkdir(parents=True)
    os.chown(cache / name, 4321, 4321)
    (cache / name).chmod(0o777)
    return cache / name


@pytest.mark.parametrize("how", ["link", "another user's"])
def test_a_list_found_through_a_link_or_in_another_users_folder_vouches_for_nothing(tmp_path: Path, how: str) -> None:
    """What the cache refuses to write through it does not read through either: a list planted there
    naming a record's bytes would let them in unchecked, and a scenario named '../..' would have the
    report write its pages outside --out."""
    if how != "link" and os.getuid() != 0:
        pytest.skip("only root can make a folder of another user's")
    res, out, cache = _results(tmp_path), tmp_path / "deep" / "out", tmp_path / "cache"
    record = _timed(res)
    data = json.loads(record.read_text())
    data["spec"]["scenario"] = "../../escaped"
    record.write_text(json.dumps(data))
    listed = [hashlib.sha256(p.read_bytes()).hexdigest() for p in res.rglob("*.json")]
    folder = _planted(cache, how, "checked-results")
    name = hashlib.sha256(os.fsencode(os.path.realpath(res))).hexdigest()[:32]
    (folder / f"{name}.json").write_text(json.dumps({"code": paths.code_digest(), "files": listed}))
    code, said = _report(res, out, cache)
    assert code == 2 and "field spec.scenario" in said, said
    assert not list(tmp_path.rglob("escaped*")), said


@pytest.mark.parametrize("how", ["link", "another user's"])
def test_a_plot_found_through_a_link_or_in_another_users_folder_is_drawn_anew(tmp_path: Path, how: str) -> None:
    if how != "link" and os.getuid() != 0:
        pytest.skip("only root can make a folder of another user's")
    res, out, cache = _results(tmp_path), tmp_path / "out", tmp_path / "cache"
    assert _report(res, tmp_path / "first", tmp_path / "own-cache")[0] == 0
    drawn = _tree(tmp_path / "first")
    folder = _planted(cache, how, "plots")
    forged = b"\x89PNG\r\n\x1a\n forged " + b"\x00\x00\x00\x00IEND\xaeB`\x82"
    for png in (tmp_path / "own-cache" / "plots").glob("*.png"):
        (folder / png.name).write_bytes(forged)
    code, said = _report(res, out, cache)
    assert code == 0 and _tree(out) == drawn, said


def _forged_store(cache: Path, code: str | None) -> Path:
    """The store of the first report, each record's fit time made 1,000 s, under ``code``'s digest."""
    [store] = (cache / "slim-results").glob("*.jsonl")
    forged = [(code or "").encode()]
    for digest, record in _stored(cache).items():
        if record["timing"].get("fit_s"):
            record["timing"]["fit_s"] = 1000.0
        forged.append(digest.encode() + b" " + json.dumps(record).encode())
    store.write_bytes(b"\n".join(forged) + b"\n")
    return store


def test_the_second_report_reads_the_records_kept_in_the_store_of_what_it_checked(tmp_path: Path) -> None:
    """Read from the store, records are what the pages show (this user's cache vouches for them as
    its list does); a store of other code, or one whose lines do not decode, gives none: the pages are
    drawn from the files."""
    res, cache = _results(tmp_path, RICH), tmp_path / "cache"
    assert _report(res, tmp_path / "first", cache)[0] == 0
    first = _tree(tmp_path / "first")
    store = _forged_store(cache, paths.code_digest())
    assert _report(res, tmp_path / "forged", cache)[0] == 0
    assert "1000.00" in (tmp_path / "forged" / "mnist_mlp_width.md").read_text(), "the records the store holds"
    for garbage in (None, b"\n".join(line[:65] + b"{not json" for line in store.read_bytes().splitlines())):
        _forged_store(cache, "0" * 64)  # another code's
        if garbage is not None:
            store.write_bytes(paths.code_digest().encode() + b"\n" + garbage)
        out = tmp_path / f"again-{garbage is None}"
        code, said = _report(res, out, cache)
        assert code == 0 and _tree(out) == first, said
        assert len(_stored(cache)) == len(list(res.rglob("*.json"))) and "1000.0" not in store.read_text(), "anew"


@pytest.mark.parametrize("how", ["link", "another user's"])
def test_a_store_found_through_a_link_or_in_another_users_folder_gives_no_record(tmp_path: Path, how: str) -> None:
    if how != "link" and os.getuid() != 0:
        pytest.skip("only root can make a folder of another user's")
    res, cache = _results(tmp_path, RICH), tmp_path / "cache"
    assert _report(res, tmp_path / "first", cache)[0] == 0
    first = _tree(tmp_path / "first")
    store = _forged_store(cache, paths.code_digest())
    shutil.move(store.parent, tmp_path / "planted-store")
    folder = _planted(cache, how, "slim-results")
    shutil.copy(tmp_path / "planted-store" / store.name, folder / store.name)
    code, said = _report(res, tmp_path / "out", cache)
    assert code == 0 and _tree(tmp_path / "out") == first, said


def test_compare_keeps_a_store_for_each_folder_and_says_the_same_from_it(tmp_path: Path) -> None:
    first, second, cache = _results(tmp_path / "a", RICH), _results(tmp_path / "b", RICH), tmp_path / "cache"
    said = []
    for _ in range(2):
        proc = suite_cli("compare", first, second, env={paths.CACHE_ENV: str(cache)})
        assert proc.returncode == 0, proc.stdout + proc.stderr
        said.append(proc.stdout)
    assert said[0] == said[1] and "mnist_mlp_width" in said[0]
    stores = sorted((cache / "slim-results").glob("*.jsonl"))
    assert len(stores) == 2
    for store in stores:  # what compare reads the second time: each record's fit time made 1,000 s
        header, *lines = store.read_bytes().splitlines()
        records = [(line[:65], json.loads(line[65:])) for line in lines]
        for _, record in records:
            record["timing"]["fit_s"] = 1000.0
        store.write_bytes(b"\n".join([header, *(d + json.dumps(r).encode() for d, r in records)]) + b"\n")
    proc = suite_cli("compare", first, second, env={paths.CACHE_ENV: str(cache)})
    assert proc.returncode == 0 and "1000.00" in proc.stdout, proc.stdout + proc.stderr


def _console_report(res: Path, out: Path, cache: Path, **limits: int) -> tuple[int, str]:
    """``suite report`` as the console runs it, with ``suite.record.checked_files``' limits set."""
    program = "; ".join(
        ["from suite.record import checked_files", *(f"checked_files.{k} = {v}" for k, v in limits.items())]
        + ["from suite.cli import console", "console()"]
    )
    proc = subprocess.run(
        [sys.executable, "-c", program, "report", "--results", str(res), "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": str(REPO), paths.CACHE_ENV: str(cache)},
    )
    return proc.returncode, proc.stdout + proc.stderr


def test_a_store_at_its_cap_is_not_written_again_by_a_report_over_the_same_files(tmp_path: Path) -> None:
    """Records beyond the cap are decoded from their files at each report; the store, holding what
    fits, is left as it is (not rewritten whole by every report over a folder that outgrew it)."""
    res, cache = _results(tmp_path, RICH), tmp_path / "cache"
    [record] = res.rglob("*.json")
    data = json.loads(record.read_text())
    for repetition in (1, 2, 3):  # four records of the same size, a few kilobytes each without series
        data["spec"]["repetition"] = repetition
        record.with_name(f"{record.stem}-{repetition}.json").write_text(json.dumps(data))
    code, said = _console_report(res, tmp_path / "first", cache, MAX_STORE_BYTES=20_000)
    assert code == 0, said
    [store] = (cache / "slim-results").glob("*.jsonl")
    held, inode = _stored(cache), os.stat(store).st_ino
    assert 1 <= len(held) < 4, "what fits under the cap"
    code, said = _console_report(res, tmp_path / "second", cache, MAX_STORE_BYTES=20_000)
    assert code == 0 and _tree(tmp_path / "second") == _tree(tmp_path / "first"), said
    assert os.stat(store).st_ino == inode and _stored(cache) == held, "not written again (a write replaces the file)"
    record.with_name(f"{record.stem}-1.json").unlink()  # a file gone: the store follows the folder
    code, said = _console_report(res, tmp_path / "third", cache, MAX_STORE_BYTES=20_000)
    assert code == 0, said
    digests = {hashlib.sha256(p.read_bytes()).hexdigest() for p in res.rglob("*.json")}
    assert set(_stored(cache)) <= digests and len(_stored(cache)) == min(len(held), 3)


def test_the_lists_of_the_folders_read_least_recently_go_first(tmp_path: Path) -> None:
    """One list per results folder, at most KEPT_LISTS: reading a folder's list counts as a use."""
    cache, listed = tmp_path / "cache", {}
    for step, name in enumerate(("a", "b", "a", "c")):
        res = tmp_path / name / "results"
        if not res.exists():
            _results(tmp_path / name)
        before = set((cache / "checked-results").glob("*.json"))
        code, said = _console_report(res, tmp_path / f"out{step}", cache, KEPT_LISTS=2)
        assert code == 0, said
        listed.setdefault(name, set((cache / "checked-results").glob("*.json")) - before)
    assert all(len(new) == 1 for new in listed.values()), listed
    kept = set((cache / "checked-results").glob("*.json"))
    assert kept == listed["a"] | listed["c"], "a's list, read after b's was written, is kept; b's went"
