"""Local backend: the worker as a subprocess of this machine's Python.

Each repetition is a fresh process in its own process group, so a timeout kills the worker and
anything it started. GPUs are chosen with CUDA_VISIBLE_DEVICES: an empty string for CPU runs,
the inventory's first N indices for GPU runs.
"""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from suite import hostinfo
from suite.backends.base import (
    classify_exit,
    device_skip_reason,
    gpu_ids,
    host_inventory,
    now_iso,
    result_from_worker,
    skipped_result,
)
from suite.plan import RunSpec
from suite.results import RunResult

REPO_ROOT = Path(__file__).resolve().parents[2]


class LocalBackend:
    name = "local"

    def __init__(self, python: str | None = None, machine: str | None = None):
        self.python = python or sys.executable
        self.machine = machine or hostinfo.machine_name()
        self._inventory: dict[str, Any] | None = None
        self._current: subprocess.Popen | None = None

    def inventory(self) -> dict[str, Any]:
        if self._inventory is None:
            self._inventory = host_inventory()
        return self._inventory

    def skip_reason(self, spec: RunSpec) -> str | None:
        backend = spec.config["backend"]
        if importlib.util.find_spec(backend) is None:
            return f"Keras backend {backend!r} is not installed in {self.python}"
        reason = device_skip_reason(spec, self.inventory())
        if reason is None and spec.device.startswith("gpu") and backend == "tensorflow" and _cpu_only_tensorflow():
            reason = (
                "the local TensorFlow is the CPU-only build (tensorflow-cpu); use --backend docker, or install "
                "requirements/worker-gpu.txt (SUITE_WORKER_REQUIREMENTS=requirements/worker-gpu.txt ./run_all.sh)"
            )
        return reason

    def run_info(self) -> dict[str, Any]:
        return {"backend": self.name, "machine": self.machine, "python": self.python}

    def skipped(self, spec: RunSpec, reason: str) -> RunResult:
        return skipped_result(spec, reason, self.run_info())

    def run(self, spec: RunSpec) -> RunResult:
        ids = gpu_ids(spec, self.inventory())
        env = {
            **os.environ,
            "CUDA_VISIBLE_DEVICES": ",".join(ids),
            "KERAS_BACKEND": spec.config["backend"],
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "PYTHONUNBUFFERED": "1",
        }
        with tempfile.TemporaryDirectory(prefix="suite-run-") as tmp:
            spec_file, result_file, log_file = Path(tmp, "spec.json"), Path(tmp, "result.json"), Path(tmp, "log.txt")
            spec_file.write_text(_json(spec.to_dict()), encoding="utf-8")
            info = {**self.run_info(), "cuda_visible_devices": env["CUDA_VISIBLE_DEVICES"], "started_at": now_iso()}
            code, timed_out = self._spawn(spec, env, spec_file, result_file, log_file)
            info.update(finished_at=now_iso(), exit_code=code)
            status, message = classify_exit(
                deadline_fired=timed_out,
                oom_killed=False,  # a subprocess has no engine to say so: the kernel's SIGKILL is the sign
                exit_code=code,
                signum=-code if code < 0 else None,
                wrote_result=result_file.is_file(),
                timeout_s=spec.timeout_s,
            )
            log = log_file.read_text(encoding="utf-8", errors="replace")
            return result_from_worker(spec, result_file, log, info, status, message)

    def _spawn(
        self, spec: RunSpec, env: dict[str, str], spec_file: Path, result_file: Path, log_file: Path
    ) -> tuple[int, bool]:
        """(the worker's return code, whether the suite's deadline ended it)."""
        cmd = [self.python, "-m", "suite.worker", str(spec_file), str(result_file)]
        with log_file.open("wb") as log:
            env["SUITE_LAUNCH_UNIX"] = repr(time.time())
            proc = subprocess.Popen(
                cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO_ROOT, start_new_session=True
            )
            self._current = proc
            try:
                return proc.wait(timeout=spec.timeout_s), False
            except subprocess.TimeoutExpired:
                # Decided here, before the kill: the -9 it causes must not read as anything but a timeout.
                _kill_group(proc)
                return proc.returncode, True
            except BaseException:
                # Ctrl-C: the worker is in its own session, so the terminal's signal never reached it.
                _kill_group(proc)
                raise
            finally:
                self._current = None

    def close(self) -> None:
        if self._current is not None:
            _kill_group(self._current)


def _cpu_only_tensorflow() -> bool:
    """tensorflow-cpu installed and no full tensorflow: it can never see a GPU (checked without importing)."""
    from importlib import metadata

    def installed(dist: str) -> bool:
        try:
            metadata.version(dist)
            return True
        except metadata.PackageNotFoundError:
            return False

    return installed("tensorflow-cpu") and not installed("tensorflow")


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()


def _json(data: Any) -> str:
    import json

    return json.dumps(data, indent=1, sort_keys=True)
