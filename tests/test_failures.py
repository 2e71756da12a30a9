"""Failures are results: each gets its status, the plan carries on, and a killed plan loses nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import REPO, suite_cli, write_scenario

from suite import results

pytestmark = pytest.mark.slow

FAILING = """\
name: failures
question: Do failures become results?
model: {hidden: [32]}
training: {epochs: 2, optimizer: sgd}
data: {allow_synthetic: true, train_samples: 1024, test_samples: 256}
repeats: 1
variants:
  - name: nan
    set: {training.learning_rate: 1.0e+12}
  - name: raises
    set: {data.data_dir: /nonexistent/mnist}
  - name: times out
    set: {timeout_s: 1}
  - name: fine
"""


def test_timeout_error_and_nan_each_get_their_status_and_the_plan_goes_on(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "failures", FAILING)
    proc = suite_cli("run", path, "--backend", "local", "--results", tmp_path / "res", "--machine", "m")
    assert proc.returncode == 1, "some runs failed"
    assert "some runs failed" in proc.stdout
    by_variant = {r.spec["point"]["variant"]: r for _, r in results.load_folder(tmp_path / "res")}
    assert by_variant["nan"].status == "nan_loss"
    assert by_variant["raises"].status == "error"
    assert "data_dir /nonexistent/mnist" in by_variant["raises"].message
    assert "Traceback" in by_variant["raises"].log_tail
    assert by_variant["times out"].status == "timeout"
    assert by_variant["fine"].status == "ok", "the run after the failures still ran"

    out = tmp_path / "reports"
    assert suite_cli("report", "--results", tmp_path / "res", "--out", out).returncode == 0
    page = (out / "failures.md").read_text()
    for status in ("nan_loss", "error", "timeout"):
        assert f"`{status}`" in page


SLOW_PLAN = """\
name: killed
question: Does a killed plan lose anything?
model: {hidden: [32]}
training: {epochs: 1}
data: {allow_synthetic: true, train_samples: 512, test_samples: 128}
repeats: 1
matrix:
  model.hidden.0: [8, 16, 24, 32]
"""


def test_sigkill_mid_plan_then_rerun_loses_nothing(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "killed", SLOW_PLAN)
    res = tmp_path / "res"
    cmd = [sys.executable, "-m", "suite", "run", str(path), "--backend", "local", "--results", str(res)]
    cmd += ["--machine", "m"]
    proc = subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    folder = res / "m" / "killed"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(list(folder.glob("*.json"))) < 2:
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the orchestrator and the worker in flight
    proc.wait()
    survivors = sorted(folder.glob("*.json"))
    assert 2 <= len(survivors) < 4, "killed mid-plan"
    assert all(results.load(p).ok for p in survivors), "every result on disk is whole"

    again = suite_cli("run", path, "--backend", "local", "--results", res, "--machine", "m")
    assert again.returncode == 0, again.stdout + again.stderr
    assert again.stdout.count(": already done (") == len(survivors)
    final = [results.load(p) for p in sorted(folder.glob("*.json"))]
    assert len(final) == 4 and all(r.ok for r in final)
    assert {r.spec["point_label"] for r in final} == {f"width={w}" for w in (8, 16, 24, 32)}
