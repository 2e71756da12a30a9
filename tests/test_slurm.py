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

import hashlib
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
from conftest import copy_of_checkout
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


def _cluster(gpus: int) -> Iterator[SlurmCluster]:
    missing = missing_tools()
    if missing:
        pytest.skip(f"Slurm is not installed here (no {', '.join(missing)}): {INSTALL}")
    if os.geteuid() != 0:
        pytest.skip("the test's Slurm daemons run as root (SlurmUser=root), and its fake GPUs need mknod")
    require_ray()
    held = _venv_environment()
    if held not in ("dev", "cluster"):
        # The job's run_all.sh keeps its venv in the cluster environment: any other would be
        # reinstalled, and this venv is the one running the tests.
        pytest.skip(f"this venv ({sys.prefix}) holds no current dev or cluster lock ({held or 'no record'})")
    with SlurmCluster(gpus=gpus) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def cpu_slurm() -> Iterator[SlurmCluster]:
    """A node without GPUs: a CPU-only partition."""
    yield from _cluster(0)


@pytest.fixture(scope="module")
def gpu_slurm() -> Iterator[SlurmCluster]:
    """A node with two GPUs in Slurm's gres (character devices, no GPU behind them)."""
    yield from _cluster(2)


def _venv_environment() -> str:
    """The environment this venv holds, when its record and stamp say it holds the current lock."""
    venv = Path(sys.prefix)
    try:
        held = json.loads((venv / ".suite-lock.json").read_text())["environment"]
        stamp = (venv / ".requirements.sha256").read_text().strip()
    except (OSError, ValueError, KeyError, TypeError):
        return ""
    lock = REPO / "requirements" / "locks" / f"{held}-py{sys.version_info.major}.{sys.version_info.minor}.txt"
    current = lock.is_file() and hashlib.sha256(lock.read_bytes()).hexdigest() == stamp
    return held if current else f"{held}, not the current lock"


def _ray_ports() -> str:
    """RAY_START_ARGS that put every port of the node's Ray on a free one (the defaults are fixed
    numbers another Ray on this machine may hold)."""
    names = ("node-manager", "object-manager", "dashboard-agent-listen", "dashboard-agent-grpc", "metrics-export")
    ports = free_ports(len(names) + 3)
    args = [f"--{name}-port={port}" for name, port in zip(names, ports, strict=False)]
    args += [f"--runtime-env-agent-port={ports[-3]}", f"--ray-client-server-port={ports[-2]}"]
    args += [f"--dashboard-port={ports[-1]}", "--object-store-memory=100000000", "--include-log-monitor=false"]
    return " ".join(args)


# What the recipe says when its node's `ray start --head` ended before the head took connections.
HEAD_LOST = "stopped before it answered"


def _submit(slurm: SlurmCluster, tmp_path: Path, name: str, device: str, *args: str, **export: str) -> dict[str, Any]:
    """Submit the shipped script with ``args`` (sbatch's options, then ``--`` and run_all.sh's) for a
    scenario ``name`` of one point on ``device``, and wait for the job; what it left behind.

    A job whose Ray head ended before it answered is submitted once more, in a folder of its own:
    on this 2-core machine, loaded by the other tests, ``ray start`` can give up in its own fixed
    startup wait (tests/ray_local.py starts its heads again for the same reason). The recipe itself
    stops at once there, with that message; a head that cannot start at all fails both jobs, and
    the failure shows both jobs' output and Ray logs."""
    job = _submit_once(slurm, tmp_path / "1", name, device, *args, **export)
    if HEAD_LOST not in job["said"]:
        return job
    again = _submit_once(slurm, tmp_path / "2", name, device, *args, **export)
    first = f"{again['ray_logs']}\n--- the first job\n{_job_report(job)}"
    return {**again, "left": job["left"] + again["left"], "ray_logs": first}


def _submit_once(slurm: SlurmCluster, where: Path, name: str, device: str, *args: str, **export: str) -> dict[str, Any]:
    sbatch, run_all = (args[: args.index("--")], args[args.index("--") + 1 :]) if "--" in args else (args, ())
    where.mkdir()
    checkout = copy_of_checkout(where / "checkout")
    (checkout / f"{name}.yaml").write_text(SCENARIO.format(name=name, device=device), encoding="utf-8")
    ray_tmp = Path(tempfile.mkdtemp(prefix="sr", dir="/tmp"))  # Ray's socket paths must stay short
    output = where / "job.out"
    port = free_ports(1)[0]
    env = {
        **slurm.env,
        **AUTH,
        "SUITE_VENV": sys.prefix,
        "RAY_PORT": str(port),
        "RAY_TEMP_DIR": str(ray_tmp),
        "RAY_START_ARGS": _ray_ports(),
        # No download: MNIST's address is a closed port here, so data fetch fails at once.
        "SUITE_MNIST_URL": f"http://127.0.0.1:{free_ports(1)[0]}/mnist.npz",
        **export,
    }
    for name_ in ("RAY_ADDRESS", "SUITE_ENV"):
        env.pop(name_, None)
    job_id = ""
    try:
        proc = subprocess.run(
            ["sbatch", "--parsable", f"--output={output}", *sbatch, SCRIPT, *(run_all or ("--smoke", f"{name}.yaml"))],
            cwd=checkout,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        job_id = proc.stdout.strip().split(";")[0]
        fields = slurm.wait(job_id, JOB_TIMEOUT_S)
    finally:
        said = output.read_text(errors="replace") if output.is_file() else ""
        ray_logs = _ray_log_tails(ray_tmp)
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
        "port": port,
        "ray_logs": ray_logs,
    }


def _ray_log_tails(ray_tmp: Path, lines: int = 30) -> str:
    """The last lines of the head's GCS and raylet logs: why a job's Ray did not start, where the
    job's own output says only that it stopped (the folder is removed after the job)."""
    tails = []
    for log in sorted(ray_tmp.glob("session_2*/logs/*")):
        if log.name.startswith(("gcs_server.", "raylet.")) and log.is_file():
            text = log.read_text(errors="replace").splitlines()[-lines:]
            tails.append(f"--- {log.name} (last {len(text)} lines)\n" + "\n".join(text))
    return "\n".join(tails) or "(no Ray log)"


def _job_report(job: dict[str, Any]) -> str:
    """All the job left to read, whole: its Slurm fields, its output and its Ray logs."""
    return f"job: {job['fields']}\n--- the job's output\n{job['said']}\n{job['ray_logs']}"


def _assert_ran(job: dict[str, Any], name: str, machine: str) -> dict[str, Any]:
    fields, said = job["fields"], job["said"]
    assert fields["JobState"] == "COMPLETED" and fields["ExitCode"] == "0:0", _job_report(job)
    assert "1 node(s) joined" in said, said
    assert not job["left"], f"processes left after the job: {job['left']}"
    assert len(job["results"]) == 1, (job["results"], said)
    path, result = job["results"][0]
    assert path.parent.parent.name == machine, path
    ray = result["run"]["ray"]
    # What only a node's own task reports: it ran on a Ray node, not in the orchestrator.
    assert ray["task_id"] and ray["node_ip"] and ray["machine"] == machine, ray
    assert ray["address"].endswith(f":{job['port']}"), ray
    assert result["run"]["backend"] == "local", result["run"]
    page = job["checkout"] / "reports" / f"{name}.md"
    assert page.is_file(), said
    assert name in page.read_text(encoding="utf-8")
    return result


def test_the_sbatch_recipe_runs_a_plan_on_a_cpu_partition(cpu_slurm: SlurmCluster, tmp_path: Path) -> None:
    # No --gres and no GPU_MODEL; the machine label defaults to the partition's name.
    job = _submit(cpu_slurm, tmp_path, "slurm_cpu", "cpu")
    assert "1 node(s) with 0 GPU(s)" in job["said"] and "SUITE_ENV=cluster," in job["said"], job["said"]
    result = _assert_ran(job, "slurm_cpu", cpu_slurm.partition)
    assert result["status"] == "ok", result
    assert result["run"]["ray"]["gpu_ids"] == [], result["run"]["ray"]


def test_a_failed_plan_fails_the_job_and_leaves_no_process(cpu_slurm: SlurmCluster, tmp_path: Path) -> None:
    # run_all.sh's exit code (2: a scenario file that does not exist) is the job's, after Ray stopped.
    job = _submit(cpu_slurm, tmp_path, "slurm_missing", "cpu", "--", "--smoke", "no_such_scenario.yaml")
    assert job["fields"]["JobState"] == "FAILED" and job["fields"]["ExitCode"] == "2:0", (job["fields"], job["said"])
    assert "no_such_scenario.yaml" in job["said"], job["said"]
    assert not job["left"], f"processes left after the job: {job['left']}"


def test_the_sbatch_recipe_hands_the_job_gpus_to_ray(gpu_slurm: SlurmCluster, tmp_path: Path) -> None:
    # Two GPUs of model FAKE from Slurm's gres: Ray offers them to the points that ask for that model,
    # gives the run one of them, and the node's worker (TensorFlow's CPU build, no GPU behind the
    # devices) records the run as skipped, from the node.
    job = _submit(gpu_slurm, tmp_path, "slurm_gpu", "gpu", "--gres=gpu:2", GPU_MODEL="FAKE")
    assert "1 node(s) with 2 GPU(s)" in job["said"] and "GPU model 'FAKE'" in job["said"], job["said"]
    result = _assert_ran(job, "slurm_gpu", "FAKE")
    assert result["status"] == "skipped" and "this machine has no GPU" in result["message"], result
    ray = result["run"]["ray"]
    assert ray["gpu_model"] == "FAKE" and len(ray["gpu_ids"]) == 1, ray


@pytest.mark.parametrize(
    ("setting", "said"),
    [
        ({"GPUS_PER_NODE": "four"}, "GPUS_PER_NODE='four': a whole number is allowed"),
        ({"RAY_PORT": "63 79"}, "RAY_PORT='63 79': a whole number is allowed"),
        ({"MACHINE": "../elsewhere"}, "MACHINE='../elsewhere': 1 to 100 letters, digits"),
        ({"MACHINE": ".hidden"}, "MACHINE='.hidden': 1 to 100 letters"),
        ({"GPU_MODEL": "-x", "GPUS_PER_NODE": "1"}, "GPU_MODEL='-x': 1 to 100 letters"),
        ({"RAY_PORT": "70000"}, "RAY_PORT=70000: 1 to 65535 is allowed"),
        ({"CPUS_PER_NODE": "0"}, "CPUS_PER_NODE=0: at least 1 is allowed"),
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
