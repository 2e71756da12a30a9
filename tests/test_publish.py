"""Publishing: what the suite writes never makes its own checkout look modified.

A copy of this checkout with the code under test committed in it; a run, a report (which rewrites
the tracked ``reports/README.md``), ``--version``, a second run, a publishing commit of
``reports/`` and ``reproduce``, all through the real CLI and judged by git itself.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docker_fixtures import SMALL_SCENARIO

REPO = Path(__file__).resolve().parents[1]
GIT = ["git", "-c", "user.name=test", "-c", "user.email=test@example.invalid"]
needs_git = pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")


def _checkout(tmp_path: Path) -> Path:
    """A clone of this repository with every file of the working tree as it stands committed in it."""
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "--quiet", str(REPO), str(clone)], check=True, capture_output=True)
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    )
    for name in filter(None, listed.stdout.decode().split("\0")):
        source = REPO / name
        if source.is_file() and not name.startswith("reports/results/"):
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, clone / name)
    subprocess.run([*GIT, "add", "-A"], cwd=clone, check=True)
    subprocess.run([*GIT, "commit", "--quiet", "--allow-empty", "-m", "code under test"], cwd=clone, check=True)
    return clone


def _suite(clone: Path, tmp_path: Path, *args: object) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(clone), "KERAS_HOME": str(tmp_path / "keras")}
    return subprocess.run(
        [sys.executable, "-m", "suite", *map(str, args)], cwd=clone, env=env, capture_output=True, text=True
    )


def _status(clone: Path) -> str:
    return subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True).stdout


@needs_git
@pytest.mark.slow
def test_a_report_and_its_publishing_commit_leave_the_code_clean_and_reproducible(tmp_path: Path) -> None:
    clone = _checkout(tmp_path)
    scenario = tmp_path / "tiny_publish.yaml"
    scenario.write_text(SMALL_SCENARIO.format(name="tiny_publish", widths="[64]"), encoding="utf-8")
    run = ("run", scenario, "--smoke", "--backend", "local", "--machine", "box")

    proc = _suite(clone, tmp_path, *run)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    proc = _suite(clone, tmp_path, "report")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert " M reports/README.md" in _status(clone), "the report rewrote the tracked index (the premise)"

    version = _suite(clone, tmp_path, "--version")
    assert version.returncode == 0 and "uncommitted" not in version.stdout, version.stdout

    proc = _suite(clone, tmp_path, *run, "--fresh")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    made = sorted((clone / "reports" / "results" / "box" / "tiny_publish").glob("*.json"))
    assert made, "results under the default folder"
    for path in made:
        suite = json.loads(path.read_text())["provenance"]["suite"]
        assert suite["git_dirty"] is False and suite["dirty_paths"] == [], path

    # Publishing is committing reports/: HEAD moves, the code does not.
    subprocess.run([*GIT, "add", "reports"], cwd=clone, check=True)
    subprocess.run([*GIT, "commit", "--quiet", "-m", "publish"], cwd=clone, check=True)
    proc = _suite(clone, tmp_path, "reproduce", made[-1], "--results", tmp_path / "again")
    assert proc.returncode != 2, proc.stdout + proc.stderr
    assert "do not fit" not in proc.stderr and "verdict:" in proc.stdout, proc.stdout + proc.stderr

    # A change to the code is still a change.
    module = clone / "suite" / "safe" / "markdown.py"
    module.write_text(module.read_text(encoding="utf-8") + "\n# edited\n", encoding="utf-8")
    version = _suite(clone, tmp_path, "--version")
    assert "+ uncommitted changes (1 file" in version.stdout, version.stdout
