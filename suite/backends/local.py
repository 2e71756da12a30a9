"""Local backend: the worker as a subprocess of this machine's Python.

Each repetition is a fresh process in its own process group, so a timeout kills the worker and
anything it started. Being in a session of its own, nothing would end it with its ``suite run``:
it holds a lifeline instead (``lifeline``: a pipe whose end-of-file it watches), so it removes its
temp folder and ends as soon as the process that started it is gone, whatever killed it. A
SIGKILL the suite did not send is taken for the OOM killer's only on the kernel's own count
(``oom``). GPUs are chosen with CUDA_VISIBLE_DEVICES: an empty string for CPU runs,
the UUIDs of the pool's first N GPUs for GPU runs (the pool: the host's GPUs, as far as an
inherited CUDA_VISIBLE_DEVICES and ``--gpus`` allow). The run itself is ``RunSkeleton``'s; this module
only starts, reads, kills and cleans up a process.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from suite import paths, telemetry
from suite.backends import lifeline
from suite.backends.base import Exit, Inventory, RunSkeleton, tag_env
from suite.backends.gpu_pool import device_skip_reason, gpu_env, host_inventory, restrict_gpus
from suite.backends.oom import OomWitness
from suite.environment import datasets, host_facts
from suite.record import provenance
from suite.spec.plan import RunSpec
from suite.worker import lifeline as worker_lifeline
from suite.worker.data import PATH_ENV as DATA_PATH_ENV

FOLLOW_CGROUP_S = 1.0  # how often a running worker's memory cgroup is read again (oom.OomWitness)


class LocalBackend(RunSkeleton):
    name = "local"
    what = "worker"

    def __init__(
        self,
        python: str | None = None,
        machine: str | None = None,
        gpus: list[str] | None = None,
        results_folder: Path | None = None,
    ):
        """gpus: the host GPUs (indices or UUIDs) the suite may hand out; None: all of them.
        results_folder: the machine folder the results go to, carried in each worker's environment,
        so a later ``suite run`` on that folder finds a worker still running for it
        (``lifeline.foreign_workers``)."""
        self.python = python or sys.executable
        self.machine = machine or host_facts.machine_name()
        self.allowed_gpus = gpus
        self.results_folder = results_folder
        self._swept = False
        self._inventory: Inventory | None = None
        self._current: _Process | None = None
        self._environment: dict[str, Any] | None = None

    def inventory(self) -> Inventory:
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
        if not self._swept:  # what runs whose host and worker both died left in the temp folder
            self._swept = True
            lifeline.sweep_stale_run_folders()
        folder, lock_fd = lifeline.make_run_folder()
        try:
            return self._spawn(spec, spec_json, env, folder, lock_fd)
        except BaseException:
            shutil.rmtree(folder, ignore_errors=True)
            os.close(lock_fd)
            raise

    def _spawn(self, spec: RunSpec, spec_json: bytes, env: dict[str, str], folder: Path, lock_fd: int) -> _Process:
        spec_file, result_file = folder / "spec.json", folder / "result.json"
        spec_file.write_bytes(spec_json)
        full_env = {
            **os.environ,
            **env,
            **gpu_env(spec, self.inventory()),  # by UUID; replaces the inherited CUDA_VISIBLE_DEVICES
            "PYTHONPATH": os.pathsep.join([str(paths.IMPORT_ROOT), os.environ.get("PYTHONPATH", "")]).rstrip(
                os.pathsep
            ),
            "SUITE_LAUNCH_UNIX": repr(time.time()),
            **tag_env(self.tags),
        }
        # The file or folder the host resolved for this spec (its sha256 is in the spec): the worker
        # reads exactly that, whatever KERAS_HOME or working folder it inherits.
        data_path = datasets.locate(spec.config["data"])
        full_env.pop(DATA_PATH_ENV, None)
        if data_path is not None:
            full_env[DATA_PATH_ENV] = str(data_path)
        line = lifeline.Lifeline()
        full_env.pop(worker_lifeline.RESULTS_FOLDER_ENV, None)
        if self.results_folder is not None:
            full_env[worker_lifeline.RESULTS_FOLDER_ENV] = str(self.results_folder.resolve())
        full_env[worker_lifeline.ORCHESTRATOR_ENV] = lifeline.process_identity(os.getpid())
        full_env[worker_lifeline.PARENT_FD_ENV] = str(line.child_fd)
        full_env[worker_lifeline.RUN_FOLDER_ENV] = str(folder)
        cmd = [self.python, "-m", "suite.worker", str(spec_file), str(result_file)]
        try:
            proc = subprocess.Popen(
                cmd,
                env=full_env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=paths.IMPORT_ROOT,  # the folder the worker imports suite from
                start_new_session=True,  # its own group: a kill reaches whatever the worker started
                # The lifeline's read end, and the folder's lock: held while the worker lives, so no
                # sweep removes the folder of a worker that outlived its host.
                pass_fds=(line.child_fd, lock_fd),
            )
        except BaseException:
            line.cut()
            raise
        try:
            line.spawned()
            process = _Process(proc, folder, result_file, self, line, lock_fd)
            process.facts["cuda_visible_devices"] = full_env["CUDA_VISIBLE_DEVICES"]
            process.facts["gpu_pool"] = self.inventory().get("pool")
        except BaseException:
            # A stop signal before the run holds the worker: it goes now (launch removes the folder).
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            line.cut()
            if proc.stdout is not None:
                proc.stdout.close()
            raise
        self._current = process
        return process

    def close(self) -> None:
        self.closed = True  # first: a launch still under way stops its worker itself (RunSkeleton)
        if self._current is not None:
            self._current.kill()


class _Process:
    """One worker subprocess, as the run skeleton drives it."""

    def __init__(
        self,
        proc: subprocess.Popen,
        folder: Path,
        result_file: Path,
        owner: LocalBackend,
        line: lifeline.Lifeline,
        lock_fd: int,
    ):
        self.proc, self.folder, self.result_file, self.owner = proc, folder, result_file, owner
        self.line, self.lock_fd = line, lock_fd
        self.facts: dict[str, Any] = {}
        self.oom = OomWitness(proc.pid)

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
        self._follow_until_exit()
        code = self.proc.wait()
        signum = -code if code < 0 else None  # a subprocess a signal ended: -N
        if signum != signal.SIGKILL:
            return Exit(code=code, signum=signum, oom_killed=False)
        acted, evidence = self.oom.verdict()
        self.facts["oom_evidence"] = evidence
        return Exit(code=code, signum=signum, oom_killed=acted, oom_evidence=evidence)

    def _follow_until_exit(self) -> None:
        """Block until the worker ends, reading its memory cgroup again every FOLLOW_CGROUP_S (it may
        be moved into another one after it starts). A pidfd wakes this at the exit itself, so the
        end of a run is seen as soon as with a plain wait; without one (Linux before 5.3), the
        plain wait follows and the cgroup at launch stands."""
        try:
            fd = os.pidfd_open(self.proc.pid)
        except (AttributeError, OSError):
            return
        try:
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            while not poller.poll(FOLLOW_CGROUP_S * 1000):
                self.oom.follow()
        finally:
            os.close(fd)

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
        self.line.cut()  # after the wait: the worker is gone, nothing is left to end
        if self.proc.stdout is not None:
            self.proc.stdout.close()
        shutil.rmtree(self.folder, ignore_errors=True)
        os.close(self.lock_fd)
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
