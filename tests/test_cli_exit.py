"""How `python -m suite` ends. report and compare end holding every record they decoded, and exit
without freeing them one by one: their output must still all arrive, through a pipe that buffers
it, with the command's exit code. Real `suite` processes, with Python's output buffered as a user's
is (no PYTHONUNBUFFERED)."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import suite_cli

from suite import paths

FIXTURE = Path(__file__).parent / "fixtures" / "results" / "fixture-local" / "fx_width"


def _results(tmp_path: Path) -> Path:
    res = tmp_path / "results"
    shutil.copytree(FIXTURE, res / "fixture-local" / "fx_width")
    return res


def _suite(tmp_path: Path, *args: object) -> subprocess.CompletedProcess[str]:
    # An empty value: the interpreter reads PYTHONUNBUFFERED as set only when it is not empty.
    env = {"PYTHONUNBUFFERED": "", paths.CACHE_ENV: str(tmp_path / "cache")}
    return suite_cli(*args, env=env)


def test_report_prints_every_line_and_its_pages_are_whole(tmp_path: Path) -> None:
    res, out = _results(tmp_path), tmp_path / "out"
    proc = _suite(tmp_path, "report", "--results", res, "--out", out)
    assert proc.returncode == 0, proc.stderr
    wrote = [line.removeprefix("wrote ") for line in proc.stdout.splitlines() if line.startswith("wrote ")]
    pages = sorted(str(p) for p in out.iterdir() if p.is_file())
    assert sorted(wrote) == pages and len(pages) >= 3
    assert (out / "README.md").read_text().endswith("\n")
    again = _suite(tmp_path, "report", "--results", res, "--out", out)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[-1].endswith("nothing rewritten")


def test_an_error_after_the_records_are_loaded_keeps_its_exit_code_and_message(tmp_path: Path) -> None:
    res = _results(tmp_path)
    proc = _suite(tmp_path, "report", "--results", res, "--out", tmp_path / "out", "--reference", "nosuch")
    assert proc.returncode == 2
    assert "--reference 'nosuch': no such machine" in proc.stderr


def test_compare_prints_its_whole_table(tmp_path: Path) -> None:
    res = _results(tmp_path)
    other = tmp_path / "other"
    shutil.copytree(res, other)
    proc = _suite(tmp_path, "compare", res, other)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.endswith("\n") and "fx_width" in proc.stdout


def _in_bash(tmp_path: Path, redirect: str) -> subprocess.CompletedProcess[str]:
    """``suite report`` with its output sent as ``redirect`` says, in bash."""
    res = _results(tmp_path)
    cmd = f"{shlex.quote(sys.executable)} -m suite report --results {res} --out {tmp_path / 'out'} {redirect}"
    env = {**os.environ, "PYTHONPATH": str(paths.IMPORT_ROOT), "PYTHONUNBUFFERED": "", paths.CACHE_ENV: str(tmp_path)}
    return subprocess.run(["bash", "-c", f"set -o pipefail; {cmd}"], capture_output=True, text=True, env=env)


def test_a_reader_gone_before_the_output_is_flushed_gives_exit_code_1(tmp_path: Path) -> None:
    proc = _in_bash(tmp_path, "| true")
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr and "Exception ignored" not in proc.stderr


def test_output_that_cannot_be_written_says_so_with_exit_code_120(tmp_path: Path) -> None:
    proc = _in_bash(tmp_path, "> /dev/full")
    assert proc.returncode == 120
    assert proc.stderr == "error: the output could not be written: No space left on device\n"
    assert (tmp_path / "out" / "README.md").is_file()


@pytest.mark.parametrize("closed", ["1", "2"], ids=["stdout", "stderr"])
def test_a_stream_closed_from_the_start_is_no_error(tmp_path: Path, closed: str) -> None:
    proc = _in_bash(tmp_path, f"{closed}>&-")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stdout + proc.stderr
    assert (tmp_path / "out" / "README.md").is_file()
