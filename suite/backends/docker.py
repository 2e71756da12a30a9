"""Docker backend: every run in a fresh container of a pinned image, through docker-py only.

The container gets the suite's code read-only (the repository at /suite), one read-write folder
holding spec.json and result.json, and the Keras dataset cache read-only. CPU runs get no device
request and ``CUDA_VISIBLE_DEVICES=""``; GPU runs get ``DeviceRequest(device_ids=[...])`` with the
host inventory's indices (``capabilities`` alone would mean zero GPUs, silently). A watchdog
thread enforces the run's timeout by killing the container: ``wait(timeout=)`` is only an HTTP
read timeout. The container is removed whatever happens, Ctrl-C included; ``close`` removes any
container this backend started that is still there, found by its session label.
"""

from __future__ import annotations

import os
import posixpath
import re
import shutil
import signal
import tempfile
import threading
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from suite import engine, hostinfo, images
from suite.backends.base import (
    classify_exit,
    device_skip_reason,
    gpu_ids,
    host_inventory,
    now_iso,
    result_from_worker,
    skipped_result,
)
from suite.engine import engine_answers, engine_facts
from suite.plan import RunSpec, parse_device
from suite.results import RunResult

__all__ = ["DockerBackend", "auto_choice", "engine_answers", "engine_facts"]

REPO_ROOT = Path(__file__).resolve().parents[2]
CODE_DIR, OUT_DIR, KERAS_DIR = "/suite", "/out", "/keras"
SHM_SIZE = "1g"  # NVIDIA's TensorFlow run line; Docker's 64 MB default starves NCCL in multi-GPU runs
MEMLOCK_UNLIMITED, STACK_BYTES = -1, 67108864  # --ulimit memlock=-1 --ulimit stack=67108864
# Host variables that change what TensorFlow does; passed through so a container run is tuned as
# the same run on the host would be (the local backend passes the whole environment).
PASS_PREFIXES = ("TF_", "XLA_", "NCCL_", "OMP_", "KMP_", "MKL_")
LABEL_SESSION, LABEL_RUN, LABEL_RUN_ID = "suite.session", "suite.run", "suite.run_id"
EXIT_SIGNAL_BASE = 128  # a container whose process a signal ended exits with 128 + the signal's number
IMAGE_ENV = "SUITE_DOCKER_IMAGE"  # "REF" for every run, or "NAME=REF,NAME=REF" per images.yaml name
# Dot names: a folder left behind by a killed run is never read as a result file.
SPEC_NAME, RESULT_NAME = ".spec.json", ".result.json"


class DockerBackend:
    name = "docker"

    def __init__(
        self,
        machine: str | None = None,
        docker_host: str | None = None,
        results_dir: str | Path | None = None,
        image: str | Mapping[str, str] | None = None,
        *,
        mem_limit: str | None = None,
        shm_size: str = SHM_SIZE,
        network_mode: str = "none",
        keras_home: str | Path | None = None,
        inventory: dict[str, Any] | None = None,
    ):
        """
        image: a reference (tag or ID) every run uses, or a mapping images.yaml name -> reference;
            None: each run's ``config.image`` (or the GPU/CPU default) as tagged by ``images build``.
        results_dir: per-run folders go under ``results_dir/.docker-runs`` (bind mounts from the home
            folder work where /tmp is private to the daemon, as with snap's Docker); default: system temp.
        mem_limit: a container memory limit (``"8g"``); none by default, as on the host.
        network_mode: "none" by default: a run needs no network, and a missing dataset then fails
            fast instead of waiting for DNS.
        keras_home: the dataset cache mounted read-only; default $KERAS_HOME or ~/.keras if it exists.
        inventory: GPUs to hand out instead of the host's NVML/nvidia-smi inventory.
        """
        self.machine = machine or hostinfo.machine_name()
        self.daemon = engine.daemon(docker_host)
        self._docker_host = docker_host
        self.results_dir = Path(results_dir).resolve() if results_dir else None  # bind mounts need absolute paths
        self.image_override = image if image is not None else _image_from_env(os.environ.get(IMAGE_ENV, ""))
        self.mem_limit, self.shm_size, self.network_mode = mem_limit, shm_size, network_mode
        self.keras_home = _keras_home(keras_home)
        self._inventory = inventory
        self.session = uuid.uuid4().hex[:16]
        self._client: Any = None
        self._engine: dict[str, Any] = {}
        self._catalog: images.Catalog | None = None
        self._refused_ulimits: set[str] = set()

    # -- protocol -------------------------------------------------------------------------------

    def inventory(self) -> dict[str, Any]:
        if self._inventory is None:
            self._inventory = host_inventory()
        return self._inventory

    def skip_reason(self, spec: RunSpec) -> str | None:
        if spec.config["backend"] != "tensorflow":
            backend = spec.config["backend"]
            return f"Keras backend {backend!r}: the suite's images hold TensorFlow only (use --backend local)"
        return device_skip_reason(spec, self.inventory())

    def run_info(self) -> dict[str, Any]:
        info = {
            "backend": self.name,
            "machine": self.machine,
            "daemon": self.daemon.address,
            "daemon_source": self.daemon.source,
        }
        if self._engine:
            info.update(engine_version=self._engine.get("Version"), engine_api_version=self._engine.get("ApiVersion"))
        return info

    def skipped(self, spec: RunSpec, reason: str) -> RunResult:
        return skipped_result(spec, reason, self.run_info())

    def run(self, spec: RunSpec) -> RunResult:
        started = now_iso()
        try:
            client = self._connect()
            ref, image = self._image(client, spec)
        except _Unavailable as exc:
            return self._failed(spec, exc.status, str(exc), started)
        info = {**self.run_info(), "image": ref, **images.image_record(image), "started_at": started}
        with self._run_folder(spec) as folder:
            spec_file, result_file = folder / SPEC_NAME, folder / RESULT_NAME
            spec_file.write_text(_json(spec.to_dict()), encoding="utf-8")
            status, message, log, extra = self._run_container(client, spec, image, folder)
            info.update(extra, finished_at=now_iso())
            return result_from_worker(spec, result_file, log, info, status, message)

    def close(self) -> None:
        """Kill and remove every container of this session still on the engine (also after Ctrl-C)."""
        if self._client is None:
            return
        try:
            mine = {"label": f"{LABEL_SESSION}={self.session}"}
            for container in self._client.containers.list(all=True, filters=mine):
                _remove(container)
        except Exception:  # noqa: BLE001 - the engine is gone: nothing left to remove, and close must not raise
            pass
        finally:
            self._client.close()
            self._client = None

    # -- one container --------------------------------------------------------------------------

    def _run_container(
        self, client: Any, spec: RunSpec, image: Any, folder: Path
    ) -> tuple[str, str, str, dict[str, Any]]:
        """(status or "" to take the worker's, message, log, facts for the result's ``run``)."""
        import docker
        import requests

        ids = gpu_ids(spec, self.inventory())
        # Where the container's own cost goes (seconds): create, start, wait for exit, logs, remove.
        phases: dict[str, float] = {}
        extra: dict[str, Any] = {"gpu_ids": ids, "gpu_uuids": self._uuids(ids), "container_s": phases}
        kwargs = self._container_kwargs(spec, image, folder, ids)
        extra["cuda_visible_devices"] = kwargs["environment"].get("CUDA_VISIBLE_DEVICES")
        container, deadline = None, _Deadline(spec.timeout_s)
        try:
            container = self._start(client, kwargs, extra)
            if container is None:
                return *_start_failure(extra.pop("start_error"), bool(ids), self.daemon.address), "", extra
            deadline.arm(container)
            t = time.perf_counter()
            code = int(container.wait(timeout=None).get("StatusCode", -1))  # None: no HTTP timeout
            timed_out = deadline.disarm()  # waits out a kill in flight, so its verdict is final
            phases["wait"] = time.perf_counter() - t
            t = time.perf_counter()
            container.reload()
            log = container.logs(stdout=True, stderr=True).decode("utf-8", errors="replace")
            phases["inspect_logs"] = time.perf_counter() - t
            extra.update(exit_code=code, oom_killed=bool(container.attrs["State"].get("OOMKilled")))
            status, message = classify_exit(
                deadline_fired=timed_out,
                oom_killed=extra["oom_killed"],
                exit_code=code,
                signum=_exit_signal(code),
                wrote_result=(folder / RESULT_NAME).is_file(),
                timeout_s=spec.timeout_s,
                memory_limit=self.mem_limit,
                what="container",
            )
            return status, message, log, extra
        except docker.errors.APIError as exc:
            return "error", f"the Docker engine refused the run: {_engine_text(exc)}", "", extra
        except (docker.errors.DockerException, requests.RequestException) as exc:
            return "error", f"lost the Docker engine at {self.daemon.address} during the run: {exc}", "", extra
        finally:
            deadline.disarm()
            if container is not None:
                t = time.perf_counter()
                _remove(container)
                phases["remove"] = time.perf_counter() - t

    def _start(self, client: Any, kwargs: dict[str, Any], extra: dict[str, Any]) -> Any:
        """Create and start the container; None (with ``extra["start_error"]``) when the engine refuses.

        An engine that may not raise a resource limit (a daemon without CAP_SYS_RESOURCE refuses
        memlock=-1) gets the run without that limit, once and for the rest of the session, and the
        result says so: a run with the engine's default limit beats no run.
        """
        import docker

        while True:
            kwargs["ulimits"] = [u for u in kwargs["ulimits"] if u.name not in self._refused_ulimits]
            kwargs["environment"]["SUITE_LAUNCH_UNIX"] = repr(time.time())  # create counts as launch
            t = time.perf_counter()
            container = client.containers.create(**kwargs)
            extra["container_s"]["create"] = time.perf_counter() - t
            extra.update(
                container_id=container.id,
                ulimits={u.name: u.hard for u in kwargs["ulimits"]},
                engine_device_requests=container.attrs["HostConfig"].get("DeviceRequests"),
            )
            if self._refused_ulimits:
                extra["ulimits_refused"] = sorted(self._refused_ulimits)
            try:
                t = time.perf_counter()
                container.start()
                extra["container_s"]["start"] = time.perf_counter() - t
                return container
            except docker.errors.APIError as exc:
                _remove(container)
                refused = _refused_ulimit(_engine_text(exc), [u.name for u in kwargs["ulimits"]])
                if refused is None:
                    extra["start_error"] = exc
                    return None
                self._refused_ulimits.add(refused)
            except BaseException:  # Ctrl-C mid-start: the caller never sees this container
                _remove(container)
                raise

    def _container_kwargs(self, spec: RunSpec, image: Any, folder: Path, ids: list[str]) -> dict[str, Any]:
        from docker.types import DeviceRequest, Ulimit

        kind, _ = parse_device(spec.device)
        env = {k: v for k, v in os.environ.items() if k.startswith(PASS_PREFIXES)}
        env.update(
            PYTHONPATH=CODE_DIR, PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1", KERAS_BACKEND=spec.config["backend"]
        )
        if kind == "cpu":
            env["CUDA_VISIBLE_DEVICES"] = ""  # the worker's device check then proves no GPU is seen
        volumes = {str(REPO_ROOT): {"bind": CODE_DIR, "mode": "ro"}, str(folder): {"bind": OUT_DIR, "mode": "rw"}}
        if self.keras_home:
            volumes[str(self.keras_home)] = {"bind": KERAS_DIR, "mode": "ro"}
            env["KERAS_HOME"] = KERAS_DIR
        data_dir = (spec.config.get("data") or {}).get("data_dir")
        if data_dir:
            host, inside = _data_mount(str(data_dir))
            if host.is_dir() and not host.is_relative_to(REPO_ROOT):  # inside the repo: already mounted
                volumes[str(host)] = {"bind": inside, "mode": "ro"}
        python = (image.labels or {}).get("suite.python", "python3")
        kwargs: dict[str, Any] = {
            "image": image.id,  # the ID, not the tag: the record names exactly what ran
            "command": [python, "-m", "suite.worker", f"{OUT_DIR}/{SPEC_NAME}", f"{OUT_DIR}/{RESULT_NAME}"],
            "working_dir": CODE_DIR,
            "environment": env,
            "volumes": volumes,
            "labels": {
                LABEL_SESSION: self.session,
                LABEL_RUN: spec.fingerprint,
                LABEL_RUN_ID: spec.run_id,
                "suite.scenario": spec.scenario,
            },
            "shm_size": self.shm_size,
            "ulimits": [
                Ulimit(name="memlock", soft=MEMLOCK_UNLIMITED, hard=MEMLOCK_UNLIMITED),
                Ulimit(name="stack", soft=STACK_BYTES, hard=STACK_BYTES),
            ],
            "network_mode": self.network_mode,
            "detach": True,
        }
        if self.mem_limit:
            kwargs.update(mem_limit=self.mem_limit, memswap_limit=self.mem_limit)  # no swap: OOM is OOM
        if ids:
            kwargs["device_requests"] = [DeviceRequest(device_ids=ids, capabilities=[["gpu"]])]
        return kwargs

    # -- helpers --------------------------------------------------------------------------------

    def _connect(self) -> Any:
        if self._client is None:
            try:
                client, _ = engine.connect(self._docker_host)
                self._engine = client.version()
            except Exception as exc:  # noqa: BLE001 - no engine is a status of every run, not a crash
                raise _Unavailable(
                    "error", f"no Docker engine answers at {self.daemon.address} ({self.daemon.source}): {exc}"
                ) from None
            self._client = client
        return self._client

    def _image(self, client: Any, spec: RunSpec) -> tuple[str, Any]:
        import docker

        if self._catalog is None:
            try:
                self._catalog = images.load_catalog()
            except images.ImageError as exc:
                raise _Unavailable("image_unavailable", str(exc)) from None
        kind, _ = parse_device(spec.device)
        name = spec.config.get("image") or self._catalog.default_for(kind == "gpu")
        ref = self._override_for(name)
        if ref is None:
            if name not in self._catalog.images:
                raise _Unavailable(
                    "image_unavailable",
                    f"no image named {name!r} in {images.CATALOG} (known: {', '.join(sorted(self._catalog.images))})",
                )
            ref = self._catalog.tag(name)
        try:
            return ref, client.images.get(ref)
        except docker.errors.ImageNotFound:
            raise _Unavailable(
                "image_unavailable",
                f"image {ref} ({name}) is not on the Docker engine at "
                f"{self.daemon.address}; build it with `python -m suite images build {name}`",
            ) from None
        except docker.errors.APIError as exc:
            raise _Unavailable("error", f"the Docker engine could not inspect {ref}: {_engine_text(exc)}") from None

    def _override_for(self, name: str) -> str | None:
        if isinstance(self.image_override, str):
            return self.image_override
        if isinstance(self.image_override, Mapping):
            return self.image_override.get(name)
        return None

    def _uuids(self, ids: list[str]) -> list[str]:
        by_index = {str(g["index"]): g.get("uuid") for g in self.inventory().get("gpus", [])}
        return [str(by_index.get(i)) for i in ids]

    def _failed(self, spec: RunSpec, status: str, message: str, started: str) -> RunResult:
        run = {**self.run_info(), "started_at": started, "finished_at": now_iso()}
        return RunResult(status=status, spec=spec.to_dict(), message=message, run=run)

    def _run_folder(self, spec: RunSpec) -> _Folder:
        parent = None
        if self.results_dir is not None:
            parent = self.results_dir / ".docker-runs"  # a dot folder: never read as results
            parent.mkdir(parents=True, exist_ok=True)
        return _Folder(tempfile.mkdtemp(prefix=f"{spec.run_id}-", dir=parent))


def auto_choice(docker_host: str | None = None) -> tuple[str, str]:
    """("docker" | "local", why) for ``--backend auto``: docker when an engine answers and has the default images."""
    if not engine_answers(docker_host):
        return "local", f"no Docker engine answers at {engine.daemon(docker_host).address}"
    try:
        rows = images.list_images(docker_host=docker_host)
    except images.ImageError as exc:
        return "local", str(exc)
    gpus, _ = hostinfo.gpu_inventory()
    wanted = {"cpu"} | ({"gpu"} if gpus else set())
    missing = [r["tag"] for r in rows if set(r["default_for"].split(",")) & wanted and r["state"] != "built"]
    if missing:
        return "local", f"the Docker engine lacks {', '.join(missing)} (python -m suite images build)"
    return "docker", f"Docker engine at {engine.daemon(docker_host).address} with the default images"


class _Unavailable(Exception):
    def __init__(self, status: str, message: str):
        super().__init__(message)
        self.status = status


class _Folder:
    """A per-run folder, removed afterwards (the worker wrote into it as root: rmtree copes)."""

    def __init__(self, path: str):
        self.path = Path(path)

    def __enter__(self) -> Path:
        return self.path

    def __exit__(self, *exc: object) -> None:
        shutil.rmtree(self.path, ignore_errors=True)


class _Deadline:
    """The run's time limit: a timer thread that kills the container when it runs out.

    ``fired`` is set before the kill is sent: the container's exit (137) can reach the thread in
    ``wait`` while ``kill()`` is still waiting for the engine's answer, and must read as a timeout.
    """

    def __init__(self, seconds: float):
        self.seconds, self.fired = seconds, False
        self._timer: threading.Timer | None = None

    def arm(self, container: Any) -> None:
        self._timer = threading.Timer(self.seconds, self._kill, args=(container,))
        self._timer.daemon = True
        self._timer.start()

    def disarm(self) -> bool:
        """Stop the timer, let a kill in flight finish, and say whether the deadline ended the run."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer.join()
        return self.fired

    def _kill(self, container: Any) -> None:
        self.fired = True
        try:
            container.kill()
        except Exception as exc:  # noqa: BLE001 - judged below; the watchdog thread must not die with a trace
            if _already_exited(exc):
                self.fired = False  # it ended on its own before the kill: not a timeout


def _already_exited(exc: Exception) -> bool:
    """The engine refused a kill because the container no longer runs (409) or is gone (404)."""
    import docker

    return isinstance(exc, docker.errors.APIError) and exc.status_code in (404, 409)


def _exit_signal(code: int) -> int | None:
    """The signal that ended a container's process, from its exit code (128 + N), if one did."""
    if EXIT_SIGNAL_BASE < code < EXIT_SIGNAL_BASE + signal.NSIG:
        return code - EXIT_SIGNAL_BASE
    return None


def _start_failure(exc: Any, gpu: bool, address: str) -> tuple[str, str]:
    text = _engine_text(exc)
    if gpu and ("device driver" in text or "nvidia" in text.lower() or "gpu" in text.lower()):
        return "error", (
            f"the Docker engine at {address} cannot give this container GPUs: {text}. Install the "
            "NVIDIA Container Toolkit on the engine's host, run `nvidia-ctk runtime configure "
            "--runtime=docker` and restart dockerd; `python -m suite env` shows the engine's runtimes"
        )
    return "error", f"the Docker engine could not start the container: {text}"


# The kernel's resource numbers as runc reports them: "error setting rlimit type 8".
_RLIMIT_NAMES = {3: "stack", 8: "memlock"}


def _refused_ulimit(text: str, requested: list[str]) -> str | None:
    """The ulimit name an engine refused to set, if that is why the start failed."""
    match = re.search(r"error setting rlimit type (\d+)", text)
    if not match:
        return None
    name = _RLIMIT_NAMES.get(int(match.group(1)))
    return name if name in requested else None


def _engine_text(exc: Any) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc).strip()


def _remove(container: Any) -> None:
    try:
        container.remove(force=True, v=True)  # force: kills it first if it still runs
    except Exception:  # noqa: BLE001 - already gone (removed by close() or by hand)
        pass


def _image_from_env(value: str) -> str | dict[str, str] | None:
    value = value.strip()
    if not value:
        return None
    if "=" not in value:
        return value
    pairs = (item.split("=", 1) for item in value.split(",") if item.strip())
    return {name.strip(): ref.strip() for name, ref in pairs}


def _keras_home(given: str | Path | None) -> Path | None:
    path = Path(given) if given else Path(os.environ.get("KERAS_HOME") or Path.home() / ".keras")
    return path.resolve() if path.is_dir() else None


def _data_mount(data_dir: str) -> tuple[Path, str]:
    """Host folder of ``data.data_dir`` and where the worker, running in /suite, will look for it."""
    if os.path.isabs(data_dir):
        return Path(data_dir), data_dir
    return (REPO_ROOT / data_dir).resolve(), posixpath.normpath(posixpath.join(CODE_DIR, data_dir))


def _json(data: Any) -> str:
    import json

    return json.dumps(data, indent=1, sort_keys=True)
