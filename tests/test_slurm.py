"""The shipped Slurm recipe, ``docs/cluster/suite-ray.sbatch``, submitted with ``sbatch`` to a real
one-node Slurm on 127.0.0.1 (tests/slurm_local.py), as a user submits it from a checkout.

The job starts Ray on its node, runs ``./run_all.sh --backend ray`` with a smoke plan of one small
scenario written here, and ends; the tests check that the results came back through Ray from the
Slurm job, that the pages were written, and that no Ray, worker or Slurm process is left. The
checkout is a copy of this one in a temp folder (its results and pages never touch this one), and
the job runs in this test's own venv (``SUITE_VENV``; the dev lock holds the cluster one, so
``SUITE_ENV=cluster`` uses it as it is). Skipped with the reason where Slurm or munge is not installed.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ray_local import AUTH, free_ports, processes_under, require_ray
from slurm_local import INSTALL, SlurmCluster, missing_tools

REPO = Path(__file__).resolve().parents[1]
SCRIPT = "docs/cluster/suite-ray.sbatch"
JOB_TIMEOUT_S = 420  # a smoke job takes about 40 s here; Ray's start and TensorFlow's import dominate

SCENARIO = """\
name: {name}
question: Does a Slurm job bring its results back through Ray?
description: One tiny MLP point (Slurm recipe test).
model: {{hidden: [16]}}
training: {{epochs: 1, batch_size: 64}}
data: {{allow_synthetic: true, train_samples: 256, test_samples: 128}}
device: {device}
repeats: 1
timeout_s: 300
"""


@pytest.fixture(scope="module")
def slurm() -> Iterator[SlurmCluster]:
    missing = missing_tools()
    if missing:
        pytest.skip(f"Slurm is not installed here (no {', '.join(missing)}): {INSTALL}")
    require_ray()
    gpus = 2 if os.geteuid() == 0 else 0  # fake GPU devices need mknod, which needs root
    with SlurmCluster(gpus=gpus) as cluster:
        yield cluster


def _checkout(into: Path) -> Path:
    """This checkout's files as a clone would have them (tracked and new, not ignored: no .venv, no
    results), in a folder of its own."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"],
        cwd=REPO,
        capture_output=True,
        check=True,
    ).stdout.decode()
    for rel in filter(None, listed.split("\0")):
        src = REPO / rel
        if src.is_file():
            (into / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, into / rel)
    return into


def _submit(slurm: SlurmCluster, tmp_path: Path, name: str, device: str, *sbatch: str, **export: str) -> dict[str, Any]:
    """Submit the shipped script for ``name`` (one point on ``device``) and wait for the job; what it left."""
    checkout = _checkout(tmp_path / "checkout")
    (checkout / f"{name}.yaml").write_text(SCENARIO.format(name=name, device=device), encoding="utf-8")
    ray_tmp = Path(tempfile.mkdtemp(prefix="sr", dir="/tmp"))  # Ray's socket paths must stay short
    output = tmp_path / "job.out"
    env = {
        **slurm.env,
        **AUTH,
        "SUITE_VENV": sys.prefix,
        "SUITE_ENV": "cluster",
        "RAY_PORT": str(free_ports(1)[0]),
        "RAY_TEMP_DIR": str(ray_tmp),
        **export,
    }
    env.pop("RAY_ADDRESS", None)
    started = time.monotonic()
    proc = subprocess.run(
        ["sbatch", "--parsable", f"--output={output}", *sbatch, SCRIPT, "--smoke", f"{name}.yaml"],
        cwd=checkout,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    job_id = proc.stdout.strip().split(";")[0]
    try:
        fields = slurm.wait(job_id, JOB_TIMEOUT_S)
    finally:
        said = output.read_text(errors="replace") if output.is_file() else ""
    seconds = time.monotonic() - started
    # The job's Ray steps end with it; their processes may take a moment to go.
    deadline = time.monotonic() + 30
    while (left := processes_under(ray_tmp) + processes_under(checkout)) and time.monotonic() < deadline:
        time.sleep(0.5)
    shutil.rmtree(ray_tmp, ignore_errors=True)
    results = sorted((checkout / "reports" / "results").glob(f"*/{name}/*.json"))
    return {
        "fields": fields,
        "said": said,
        "left": left,
        "results": [(p, json.loads(p.read_text())) for p in results],
        "checkout": checkout,
        "seconds": seconds,
        "address": f"{env['RAY_PORT']}",
    }


def _assert_ran(job: dict[str, Any], name: str, machine: str) -> dict[str, Any]:
    fields, said = job["fields"], job["said"]
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", (fields, said)
    assert "1 node(s) joined" in said, said
    assert not job["left"], f"processes left after the job: {job['left']}"
    assert len(job["results"]) == 1, (job["results"], said)
    path, result = job["results"][0]
    assert path.parent.parent.name == machine, path
    ray = result["run"]["ray"]
    # What only a node's own task reports: it ran on a Ray node, not in the orchestrator.
    assert ray["task_id"] and ray["node_ip"] and ray["machine"] == machine, ray
    assert ray["address"].endswith(":" + job["address"]), ray
    assert result["run"]["backend"] == "local", result["run"]
    page = job["checkout"] / "reports" / f"{name}.md"
    assert page.is_file(), said
    assert name in page.read_text(encoding="utf-8")
    return result


def test_the_sbatch_recipe_runs_a_plan_on_a_cpu_partition(slurm: SlurmCluster, tmp_path: Path) -> None:
    # No --gres and no GPU_MODEL: a CPU-only partition.
    job = _submit(slurm, tmp_path, "slurm_cpu", "cpu")
    result = _assert_ran(job, "slurm_cpu", "cpu")
    assert result["status"] == "ok", result
    assert result["run"]["ray"]["gpu_ids"] == [], result["run"]["ray"]


def test_the_sbatch_recipe_hands_the_job_gpus_to_ray(slurm: SlurmCluster, tmp_path: Path) -> None:
    if not slurm.gpus:
        pytest.skip("the node's fake GPU devices need mknod, which needs root")
    # Two GPUs of model FAKE from Slurm's gres: Ray offers them to the points that ask for that model,
    # gives the run one of them, and the node's worker (TensorFlow's CPU build, no GPU behind the
    # devices) records the run as skipped, from the node.
    job = _submit(slurm, tmp_path, "slurm_gpu", "gpu", f"--gres=gpu:{slurm.gpus}", GPU_MODEL="FAKE")
    result = _assert_ran(job, "slurm_gpu", "FAKE")
    assert result["status"] == "skipped" and "this machine has no GPU" in result["message"], result
    ray = result["run"]["ray"]
    assert ray["gpu_model"] == "FAKE" and len(ray["gpu_ids"]) == 1, ray


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ({"GPUS_PER_NODE": "four"}, "GPUS_PER_NODE='four': a whole number is allowed"),
        ({"RAY_PORT": "63 79"}, "RAY_PORT='63 79': a whole number is allowed"),
        ({"MACHINE": "../elsewhere"}, "MACHINE='../elsewhere': letters, digits"),
        ({"GPU_MODEL": "H100"}, "GPU_MODEL=H100, but the job has no GPUs: submit with --gres=gpu:N"),
        ({"SUITE_VENV": "/nonexistent/venv"}, "the venv /nonexistent/venv"),
    ],
)
def test_a_bad_site_setting_stops_the_job_before_ray_starts(tmp_path: Path, setting: dict[str, str], said: str) -> None:
    # What sbatch runs is the script itself, in the submit folder: no Slurm needed to see it refuse.
    env = {"PATH": os.environ["PATH"], "SLURM_SUBMIT_DIR": str(tmp_path), **setting}
    proc = subprocess.run(
        ["bash", str(REPO / SCRIPT)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=30, check=False
    )
    assert proc.returncode == 2, proc.stderr
    assert said in proc.stderr and "suite-ray.sbatch" in proc.stderr, proc.stderr
