"""Real digits: a smoke MLP must learn MNIST, and must not "learn" it with shuffled labels."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import suite_cli, write_scenario

from suite.record import results
from suite.worker import data

pytestmark = pytest.mark.slow

TEXT = """\
name: real_digits
question: Does the pipeline really train on MNIST?
model: {hidden: [128, 64], dropout: 0.1}
training: {optimizer: adam, epochs: 6, batch_size: 64}
data: {data_dir: "DIR", test_samples: 2000}
repeats: 1
variants:
  - name: true labels
  - name: shuffled labels
    set: {data.shuffle_labels: true}
"""


def test_accuracy_gate_passes_on_real_labels_and_fails_on_shuffled(tmp_path: Path, mnist_dir: Path) -> None:
    path = write_scenario(tmp_path, "real_digits", TEXT.replace("DIR", str(mnist_dir)))
    proc = suite_cli("run", path, "--backend", "local", "--results", tmp_path / "res", "--machine", "m")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    by_variant = {r.spec["point"]["variant"]: r for _, r in results.load_folder(tmp_path / "res")}
    real, shuffled = by_variant["true labels"], by_variant["shuffled labels"]
    assert real.quality["data_source"] == "idx-t10k-split"
    # The host resolved the folder's digits by content, and the worker trained on exactly those.
    identity = real.spec["config"]["data"]["identity"]
    expected = data.idx_digest(data.read_idx_files(mnist_dir))
    assert identity["source"] == "idx" and identity["sha256"] == expected
    assert real.quality["train_samples"] == 8000 and real.quality["test_samples"] == 2000
    assert real.quality["test_accuracy"] >= 0.90, real.quality
    assert shuffled.quality["test_accuracy"] < 0.5, shuffled.quality

    out = tmp_path / "reports"
    assert suite_cli("report", "--results", tmp_path / "res", "--out", out).returncode == 0
    page = (out / "real_digits.md").read_text()
    assert "below the accuracy gate" in page, "the broken run is flagged in the table"
