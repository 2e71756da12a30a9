"""Failures are results: each gets its status, the plan carries on, and a killed plan loses nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from conftest import REPO, suite_cli, write_scenario

from suite.backends.local import LocalBackend
from suite.record import results
from suite.spec import plan, scenario

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
    proc = suite_cli(
        "run", path, "--backend", "local", "--results", tmp_path / "res", "--machine", "m", "--allow-synthetic"
    )
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
    cmd += ["--machine", "m", "--allow-synthetic"]
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

    again = suite_cli("run", path, "--backend", "local", "--results", res, "--machine", "m", "--allow-synthetic")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"{len(survivors)} runs already done (ok result on file; --fresh reruns)" in again.stdout
    final = [results.load(p) for p in sorted(folder.glob("*.json"))]
    assert len(final) == 4 and all(r.ok for r in final)
    assert {r.spec["point_label"] for r in final} == {f"width={w}" for w in (8, 16, 24, 32)}


# -- the kernel's OOM killer on the local backend -------------------------------------------------

# Room to import TensorFlow (tighter, the kernel evicts and rereads its mapped libraries for minutes
# instead of killing), not for the 60,000 synthetic digits the worker then generates in float64.
LOCAL_MEMORY_LIMIT = 700 * 1024 * 1024
CGROUP_V1_MEMORY = Path("/sys/fs/cgroup/memory")
CGROUP_V2 = Path("/sys/fs/cgroup")

OOM_SCENARIO = """\
name: local_oom
question: Is a run the kernel kills for memory recorded as host_oom?
model: {hidden: [64]}
training: {epochs: 1}
data: {allow_synthetic: true, train_samples: 1024, test_samples: 256}
repeats: 1
"""


def _memory_cgroup_parent() -> tuple[Path, dict[str, str]] | str:
    """Where to make a memory cgroup and which files set its limit (swap included), or why not."""
    limit = str(LOCAL_MEMORY_LIMIT)
    if (CGROUP_V1_MEMORY / "memory.limit_in_bytes").is_file():
        # memsw (memory + swap) after the memory limit: the kernel refuses it below memory's.
        return CGROUP_V1_MEMORY, {"memory.limit_in_bytes": limit, "memory.memsw.limit_in_bytes": limit}
    controllers = CGROUP_V2 / "cgroup.subtree_control"
    if controllers.is_file() and "memory" in controllers.read_text().split():
        return CGROUP_V2, {"memory.max": limit, "memory.swap.max": "0"}
    return "no cgroup memory controller at /sys/fs/cgroup/memory (v1) or enabled in /sys/fs/cgroup (v2)"


@pytest.fixture
def memory_cgroup() -> Iterator[Path]:
    """A fresh memory cgroup with LOCAL_MEMORY_LIMIT; removed afterwards, with any process left in it."""
    found = _memory_cgroup_parent()
    if isinstance(found, str):
        pytest.skip(found)
    parent, limits = found
    group = parent / f"suite-test-{uuid.uuid4().hex[:12]}"
    try:
        group.mkdir()
    except OSError as exc:
        pytest.skip(f"cannot create a memory cgroup in {parent} ({exc}); needs root and a writable controller")
    try:
        try:
            for name, value in limits.items():
                if (group / name).exists():  # memsw / swap.max exist only with swap accounting
                    (group / name).write_text(value)
        except OSError as exc:
            pytest.skip(f"cannot set a memory limit on {group} ({exc})")
        yield group
    finally:
        _remove_cgroup(group)


def _remove_cgroup(group: Path) -> None:
    for _ in range(50):
        left = [int(pid) for pid in (group / "cgroup.procs").read_text().split()]
        for pid in left:  # only the worker this test started can be in it
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            group.rmdir()
            return
        except OSError:  # busy until the kernel has reaped what was in it
            time.sleep(0.1)
    group.rmdir()


def test_kernel_oom_kill_on_the_local_backend_is_host_oom(
    memory_cgroup: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The worker's Python joins the limited cgroup, then becomes the real interpreter (same pid):
    # whatever ends it, the local backend sees exactly the process it started.
    wrapper = tmp_path / "python-in-cgroup"
    join = f'echo $$ > "{memory_cgroup}/cgroup.procs" || exit 97'  # 97: could not join, plainly not an OOM
    wrapper.write_text(f'#!/bin/sh\n{join}\nexec "{sys.executable}" "$@"\n')
    wrapper.chmod(0o755)
    monkeypatch.setenv("KERAS_HOME", str(tmp_path / "keras"))  # no cached MNIST: synthetic data, all of it
    backend = LocalBackend(python=str(wrapper), machine="test")
    small = plan.expand(scenario.load(write_scenario(tmp_path, "local_oom", OOM_SCENARIO)))[0]

    control = backend.run(small)
    assert control.status == "ok", ("TensorFlow and a small data set must fit", control.message, control.log_tail)

    changed = replace(small, config={**small.config, "data": {**small.config["data"], "train_samples": None}})
    big = replace(changed, fingerprint=plan.fingerprint_of(replace(changed, fingerprint="")))
    t = time.monotonic()
    result = backend.run(big)
    elapsed = time.monotonic() - t

    assert result.status == "host_oom", (result.status, result.message, result.log_tail)
    assert result.run["exit_code"] == -signal.SIGKILL, "the kernel killed it, not a MemoryError in Python"
    assert "OOM killer" in result.message and "did not send" in result.message
    assert elapsed < 300, f"{elapsed:.0f} s: the kernel thrashed before killing; raise LOCAL_MEMORY_LIMIT"


# -- the worker's own deadline --------------------------------------------------------------------

ENDLESS = """\
name: endless
question: Does a worker nobody watches end by itself?
model: {hidden: [256, 256]}
training: {epochs: 10000}
data: {allow_synthetic: true, train_samples: 4096, test_samples: 128}
repeats: 1
timeout_s: 3
measure: {step_overhead: false}
"""


def test_worker_with_no_host_left_ends_itself_at_its_deadline(tmp_path: Path) -> None:
    # As after `suite run` was SIGKILLed: the worker runs in its own session, nobody kills it.
    from suite.backends.base import spec_json, worker_env

    spec = plan.expand(scenario.load(write_scenario(tmp_path, "endless", ENDLESS)))[0]
    (tmp_path / "spec.json").write_bytes(spec_json(spec))
    env = {**os.environ, **worker_env(spec), "PYTHONPATH": str(REPO), "CUDA_VISIBLE_DEVICES": ""}
    own_limit = float(env["SUITE_DEADLINE_S"])
    assert own_limit > spec.timeout_s, "the host's deadline fires first while the host lives"
    t = time.monotonic()
    proc = subprocess.run(
        [sys.executable, "-m", "suite.worker", str(tmp_path / "spec.json"), str(tmp_path / "result.json")],
        env=env,
        capture_output=True,
        timeout=own_limit + 60,
    )
    elapsed = time.monotonic() - t
    assert proc.returncode == 124, proc.stdout[-2000:]
    assert own_limit <= elapsed < own_limit + 20
    record = results_json(tmp_path / "result.json")
    assert record["status"] == "timeout" and "own deadline" in record["message"]


def results_json(path: Path) -> dict:
    import json

    return json.loads(path.read_text(encoding="utf-8"))
