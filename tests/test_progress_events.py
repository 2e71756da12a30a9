"""Live progress: the worker's epoch and phase lines reach the runner's callback while the run goes."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from conftest import write_scenario

from suite.backends.local import LocalBackend
from suite.spec import plan, scenario

pytestmark = pytest.mark.slow

SMALL = """\
name: progress
question: Does the host see each epoch as it ends?
model: {hidden: [32]}
training: {epochs: 3}
data: {allow_synthetic: true, train_samples: 1024, test_samples: 256}
repeats: 1
"""


def test_local_run_streams_each_epoch_and_phase(tmp_path: Path) -> None:
    spec = plan.expand(scenario.load(write_scenario(tmp_path, "progress", SMALL)))[0]
    seen: list[tuple[float, dict[str, Any]]] = []
    result = LocalBackend(machine="test").run(spec, on_event=lambda e: seen.append((time.monotonic(), e)))
    finished = time.monotonic()
    assert result.status == "ok", (result.message, result.log_tail)
    events = [e for _, e in seen]
    fit = [e for e in events if e["event"] == "epoch" and e["phase"] == "fit"]
    assert [(e["epoch"], e["epochs"]) for e in fit] == [(1, 3), (2, 3), (3, 3)]
    assert [e["epoch_s"] for e in fit] == pytest.approx(result.timing["epoch_s"], abs=1e-5)
    phases = [e["phase"] for e in events if e["event"] == "phase"]
    assert phases[:3] == ["setup", "fit", "evaluate"] and "probe" in phases
    assert seen[0][0] < finished - 0.5, "events arrive while the run goes, not at its end"
    assert result.timing["epoch_s"] and "fit_s" in result.timing, "results still come from the result file"
