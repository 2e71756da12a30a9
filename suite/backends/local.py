"""Local backend: the worker as a subprocess of this machine's Python.

Each repetition is a fresh process in its own process group, so a timeout kills the worker and
anything it started. GPUs are chosen with CUDA_VISIBLE_DEVICES: an empty string for CPU runs,
the UUIDs of the pool's first N GPUs for GPU runs (the pool: the host's GPUs, as far as an
inherited CUDA_VISIBLE_DEVICES and ``--gpus`` allow). The run itself is ``RunSkeleton``'s; this module
only starts, reads, kills and cleans up a process.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from suite import datasets, hostinfo, provenance, telemetry
from suite.backends.base import (
    Exit,
    RunSkeleton,
    device_skip_reason,
    gpu_env,
    host_inventory,
    restrict_gpus,
    tag_env,
)
from suite.plan import RunSpec
from suite.worker.data import PATH_ENV as DATA_PATH_ENV

REPO_ROOT = Path(__file__).resolve().parents[2]


class LocalBackend(RunSkeleton):
    name = "local"
    what = "worker"

    def __init__(self, python: str | None = None, machine: str | None = None, gpus: list[str] | None = None):
        """gpus: the host GPUs (indices or UUIDs) the suite may hand out; None: all of them."""
        self.python = python or sys.executable
        self.machine = machine or hostinfo.machine_name()
        self.allowed_gpus = gpus
        self._inventory: dict[str, Any] | None = None
        self._current: _Process | None = None
        self._environment: dict[str, Any] | None = None

    def inventory(self) -> dict[str, Any]:
        if self._inventory is None:
            self._inventory = restrict_gpus(host_inventory(), self.allowed_gpus)
        return self._inventory

    def skip_reason(self, spec: RunSpec) -> str | None:
        backend = spec.config["backend"]
        if importlib.util.find_spec(backend) is None:
            return f"Keras backend {backend!r} is not installed in {self.python}"
        # Keras feeds a tf.data pipeline to every backend, but only where TensorFlow is installed.
        tf_data = spec.config["training"]["input_pipeline"] == "tf_data"
        if tf_data and backend != "tensorflow" and importlib.util.find_spec("tensorflow") is None:
            return f"training.input_pipeline tf_data needs TensorFlow (tf.data), not installed in {self.python}"
        reason = device_skip_reason(spec, self.inventory())
        if reason is None and spec.device.startswith("gpu") and backend == "tensorflow" and _cpu_only_tensorflow():
            reason = (
                "the local TensorFlow is the CPU-only build (tensorflow-cpu); use --backend docker, or install "
                "requirements/locks/run-gpu-py<X.Y>.txt (SUITE_ENV=run-gpu ./run_all.sh)"
            )
        return reason

    def run_info(self) -> dict[str, Any]:
        return {"backend": self.name, "machine": self.machine, "python": self.python}

    def environment_provenance(self, run: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The lock of the venv ``self.python`` belongs to, and whether its packages match it; asked
        once per backend (one plan): a plan does not reinstall its own interpreter's packages."""
        if self._environment is None:
            self._environment = provenance.venv_environment(self.python)
        return json.loads(json.dumps(self._environment)), None

    def launch(self, spec: RunSpec, spec_json: bytes, env: dict[str, str]) -> _Process:
        folder = Path(tempfile.mkdtemp(prefix="suite-run-"))
        spec_file, result_file = folder / "spec.json", folder / "result.json"
        spec_file.write_bytes(spec_json)
        full_env = {
            **os.environ,
            **env,
            **gpu_env(spec, self.inventory()),  # by UUID; replaces the inherited CUDA_VISIBLE_DEVICES
            "PYTHONPATH": os.pathsep.join([str(REPO_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep),
            "SUITE_LAUNCH_UNIX": repr(time.time()),
            **tag_env(self.tags),
        }
        # The file or folder the host resolved for this spec (its sha256 is in the spec): the worker
        # reads exactly that, whatever KERAS_HOME or working folder it inherits.
        data_path = datasets.locate(spec.config["data"])
        full_env.pop(DATA_PATH_ENV, None)
        if data_path is not None:
            full_env[DATA_PATH_ENV] = str(data_path)
        cmd = [self.python, "-m", "suite.worker", str(spec_file), str(result_file)]
        try:
            proc = subprocess.Popen(
                cmd,
                env=full_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=REPO_ROOT,
                start_new_session=True,  # its own group: a kill reaches whatever the worker started
            )
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            raise
        process = _Process(proc, folder, result_file, self)
        process.facts["cuda_visible_devices"] = full_env["CUDA_VISIBLE_DEVICES"]
        process.facts["gpu_pool"] = self.inventory().get("pool")
        self._current = process
        return process

    def close(self) -> None:
        self.closed = True  # first: a launch still under way stops its worker itself (RunSkeleton)
        if self._current is not None:
            self._current.kill()


class _Process:
    """One worker subprocess, as the run skeleton drives it."""

    def __init__(self, proc: subprocess.Popen, folder: Path, result_file: Path, owner: LocalBackend):
        self.proc, self.folder, self.result_file, self.owner = proc, folder, result_file, owner
        self.facts: dict[str, Any] = {}

    def telemetry_sources(self) -> list[telemetry.Sampler]:
        """The worker's process tree from /proc; NVML for the GPUs it was given, by their UUIDs; the
        machine's load beside it (what processes other than this one and the worker's tree used)."""
        samplers: list[telemetry.Sampler] = [telemetry.ProcSampler(self.proc.pid)]
        given = [i for i in str(self.facts.get("cuda_visible_devices") or "").split(",") if i]
        uuids: list[str] = []
        if given:
            by_index = {str(g.get("index")): g.get("uuid") for g in self.owner.inventory().get("gpus", [])}
            uuids = [by_index.get(i) or i for i in given]
            samplers.append(telemetry.NvmlSampler(uuids))
        own = telemetry.Ownership(singles=[os.getpid()], trees=[self.proc.pid])
        samplers.append(telemetry.LoadSampler(own, gpus=uuids))
        return samplers

    def lines(self) -> Iterator[str]:
        assert self.proc.stdout is not None
        for raw in self.proc.stdout:
            yield raw.decode("utf-8", errors="replace")

    def wait(self) -> Exit:
        code = self.proc.wait()
        return Exit(code=code, signum=-code if code < 0 else None)  # a subprocess a signal ended: -N

    def kill(self) -> bool:
        if self.proc.poll() is not None:
            return False
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            return False
        self.proc.wait()
        return True

    def result(self) -> bytes | None:
        try:
            return self.result_file.read_bytes()
        except FileNotFoundError:
            return None

    def cleanup(self) -> None:
        if self.proc.stdout is not None and self.proc.stdout.closed:
            return  # done before
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # anything the worker left running in its group
        except (ProcessLookupError, PermissionError):
            pass
        self.proc.wait()
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        if self.owner._current is self:
            self.owner._current = None


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
