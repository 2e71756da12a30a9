"""The multi-GPU code path (MirroredStrategy) on 4 logical CPU devices, as the 4096 scenario runs it."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SCENARIOS, suite_cli, write_scenario

from suite.record import results

pytestmark = pytest.mark.slow


def test_mirrored_strategy_over_four_logical_cpus(tmp_path: Path) -> None:
    # The shipped scenario, with its GPU axis swapped for logical CPU devices and a smaller model.
    text = (SCENARIOS / "mlp4096_gpus.yaml").read_text()
    text = text.replace("device: [gpu:1, gpu:2, gpu:4]", "device: ['cpu:1', 'cpu:4']")
    text = text.replace("hidden: [4096, 2048, 512, 64]", "hidden: [512, 256, 64, 32]")
    text = text.replace('baseline: {device: "gpu:1"}', 'baseline: {device: "cpu:1"}')
    text = text.replace("name: mlp4096_gpus", "name: mlp_logical_cpus")
    path = write_scenario(tmp_path, "mlp_logical_cpus", text)
    proc = suite_cli("run", "--smoke", path, "--backend", "local", "--results", tmp_path / "res", "--machine", "m")
    assert proc.returncode == 0, proc.stdout + proc.stderr

    runs = {r.spec["point_label"]: r for _, r in results.load_folder(tmp_path / "res")}
    assert set(runs) == {f"batch_mode={m}, device={d}" for m in ("global", "per_replica") for d in ("cpu:1", "cpu:4")}
    four_global = runs["batch_mode=global, device=cpu:4"].run["settings"]
    four_per_replica = runs["batch_mode=per_replica, device=cpu:4"].run["settings"]
    one = runs["batch_mode=global, device=cpu:1"].run["settings"]
    assert four_global["strategy"] == "MirroredStrategy" and four_global["replicas"] == 4
    assert four_global["global_batch"] == 128 and four_global["per_replica_batch"] == 32
    assert four_per_replica["global_batch"] == 512 and four_per_replica["per_replica_batch"] == 128
    assert one["strategy"] is None and one["replicas"] == 1
    seen = runs["batch_mode=global, device=cpu:4"].environment["devices"]["logical"]
    assert sum("CPU" in d for d in seen) == 4
    assert all(r.ok for r in runs.values())
