"""`suite run` refuses what cannot work before any run starts: exit 2, one message, no traceback, no records."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from conftest import REPO, suite_cli, write_scenario

from suite import backends
from suite.run import results_folder

# Every point needs 64 GPUs: skipped at once on any test machine, so a run ends without TensorFlow.
SKIPPED_ONLY = """\
name: refusals
question: Is bad input refused before anything runs?
device: gpu:64
repeats: 1
"""


def _scenario(tmp_path: Path) -> Path:
    return write_scenario(tmp_path, "refusals", SKIPPED_ONLY)


def _refused(proc: subprocess.CompletedProcess, *words: str) -> None:
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    for word in words:
        assert word in proc.stderr, proc.stderr


def _records(folder: Path) -> list[Path]:
    return list(folder.rglob("*.json")) if folder.exists() else []


def test_results_folder_that_cannot_be_created(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    proc = suite_cli("run", _scenario(tmp_path), "--backend", "local", "--results", blocker / "res", timeout=120)
    _refused(proc, f"results folder {blocker / 'res'}", "cannot be created or written")


def test_docker_backend_without_an_engine_is_one_message_and_no_records(tmp_path: Path) -> None:
    res = tmp_path / "res"
    # Nothing listens on port 9 (discard): the engine check fails at once.
    args = ("run", _scenario(tmp_path), "--backend", "docker", "--docker-host", "tcp://127.0.0.1:9", "--results", res)
    proc = suite_cli(*args, timeout=120)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.count("error:") == 1 and "--backend docker" in proc.stderr, proc.stderr
    assert not _records(res), "no run was recorded"


def test_second_run_on_a_held_folder_says_who_holds_it(tmp_path: Path) -> None:
    res = tmp_path / "res"
    with results_folder.hold_folder(res / "m"):
        proc = suite_cli("run", _scenario(tmp_path), "--backend", "local", "--results", res, "--machine", "m")
    _refused(proc, f"is in use by `suite run` process {os.getpid()} on host", "--wait")
    assert not _records(res)


def test_second_run_with_wait_runs_after_the_first(tmp_path: Path) -> None:
    res = tmp_path / "res"
    cmd = [sys.executable, "-m", "suite", "run", str(_scenario(tmp_path)), "--backend", "local"]
    cmd += ["--results", str(res), "--machine", "m", "--wait"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    with results_folder.hold_folder(res / "m"):
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        first = proc.stdout.readline()  # its first words: nothing runs before the folder is its own
        assert first.startswith(f"waiting for `suite run` process {os.getpid()}"), first + proc.stderr.read()
        assert proc.poll() is None and not _records(res)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, out + err
    assert len(_records(res)) == 1, "it ran once the folder was free"


def test_backends_command_lists_the_registry() -> None:
    proc = suite_cli("backends", "--names", timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == list(backends.BACKENDS)


def test_run_all_reads_backend_names_from_the_registry() -> None:
    code = [ln for ln in (REPO / "run_all.sh").read_text().splitlines() if not ln.lstrip().startswith("#")]
    for name in backends.BACKENDS:
        assert not any(f" {name} " in f" {ln} " or f"--backend {name}" in ln for ln in code), name
    assert any("suite backends" in ln for ln in code)
