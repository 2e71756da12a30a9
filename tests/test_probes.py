"""The step-cost probe and the peak, run for real on Keras (TensorFlow, CPU) in a fresh process."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, write_scenario

from suite.record.results import RunResult
from suite.run import runner
from suite.spec import plan, scenario

PROBE = r"""
import json, statistics
import numpy as np, keras
from suite.worker import model as model_mod, probes

built, compiled = [], []
def build(keras, cfg):
    built.append(cfg)
    return model_mod.build(keras, cfg)
def compile_model(keras, model, training):
    compiled.append(training)
    return model_mod.compile_model(keras, model, training)

model_cfg = {"hidden": [32, 16, 8], "activation": "tanh", "dropout": 0.3, "output_activation": "softmax"}
training = {"optimizer": "sgd", "learning_rate": 0.05, "loss": "categorical_crossentropy", "jit_compile": False,
            "steps_per_execution": 2}
x = np.random.default_rng(0).random((256, 784), dtype=np.float32)
y = keras.utils.to_categorical(np.arange(256) % 10, 10).astype("float32")
fit = {"xy": (x, y), "kw": {"batch_size": 32, "shuffle": True}}
import contextlib
floor = probes.step_floor(keras, build, compile_model, fit, model_cfg, training, contextlib.nullcontext())
tiny = built[0]
out = {"built": tiny, "compiled": compiled[0], "floor": floor}
for dtype in ("float32", "bfloat16"):
    probes.MATMUL_N["cpu"] = 256
    out[dtype] = probes.peak_flops(keras, "cpu", dtype)
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def probed() -> dict:
    env = {**os.environ, "KERAS_BACKEND": "tensorflow", "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_floor_is_the_model_with_width_one_trained_the_same_way(probed: dict) -> None:
    assert probed["built"] == {
        "hidden": [1, 1, 1],
        "activation": "tanh",
        "dropout": 0.3,
        "output_activation": "softmax",
    }
    assert probed["compiled"]["optimizer"] == "sgd" and probed["compiled"]["steps_per_execution"] == 2
    timed = probed["floor"]["epochs_s"]
    assert len(timed) >= 3, "the median of at least 3 epochs, the first (tracing) left out"
    assert probed["floor"]["epoch_s"] == sorted(timed)[len(timed) // 2]


@pytest.mark.slow
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_peak_keeps_values_order_one_in_the_compute_dtype(probed: dict, dtype: str) -> None:
    peak = probed[dtype]
    assert peak["dtype"] == dtype
    # After the whole chain the entries still have the inputs' scale (an RMS of 1), not zeros. q is
    # orthogonal only up to the dtype's rounding (unit roundoff u: 2**-8 for bfloat16), so each link
    # may scale the norm by up to (1 +- u): over a long chain (256 links on a fast, quiet CPU) bfloat16
    # may drift to (1 - 2**-8)**256 = 0.37 and still be of order one; decay to zero, what the chain
    # guards against, would be orders of magnitude below. float32's drift is far inside 0.8 .. 1.25.
    u = {"float32": 2.0**-24, "bfloat16": 2.0**-8}[dtype]
    links = peak["chain_links"]
    low, high = min(0.8, (1 - u) ** links), max(1.25, (1 + u) ** links)
    assert low < peak["rms_after_chain"] < high, (low, high, peak)
    rates = sorted(peak["batches_flops_per_s"])
    assert len(rates) == 7 and peak["flops_per_s"] == rates[3], "the median of several timed batches"


class RecordingBackend:
    """Runs nothing: records whether each run was asked to calibrate, and returns it ok."""

    name = "fake"

    def __init__(self) -> None:
        self.asked: list[tuple[str, bool]] = []

    def skip_reason(self, spec: plan.RunSpec) -> None:
        return None

    def run(self, spec: plan.RunSpec, on_event: Any = None) -> RunResult:
        self.asked.append((spec.point_label, spec.calibrate_peak))
        work = {"peak": {"flops_per_s": 1e9}} if spec.calibrate_peak else {}
        return RunResult(status="ok", spec=spec.to_dict(), work=work, run={"finished_at": "x"})

    def close(self) -> None:
        pass


def test_peak_is_measured_once_per_invocation_and_key(tmp_path: Path) -> None:
    text = """\
name: peaks
question: When is the peak measured?
model: {hidden: [8]}
repeats: 2
variants:
  - name: plain
  - name: threads
    set: {threads.intra_op: 1}
  - name: mixed
    set: {training.mixed_precision: true}
  - name: spe
    set: {training.steps_per_execution: 4}
"""
    specs = plan.expand(scenario.load(write_scenario(tmp_path, "peaks", text)))
    backend = RecordingBackend()
    runner.run_plan(specs, backend, tmp_path / "res", "m", say=lambda _: None)
    measured = [label for label, asked in backend.asked if asked]
    # Thread settings and the compute dtype change the peak; steps_per_execution does not.
    assert measured == ["variant=plain", "variant=threads", "variant=mixed"]
    again = RecordingBackend()
    runner.run_plan(specs, again, tmp_path / "res2", "m", say=lambda _: None)
    assert [label for label, asked in again.asked if asked] == measured, "a new invocation measures again"
