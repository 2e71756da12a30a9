"""One run's container on a Docker engine, as the run skeleton drives it, and the engine probe.

Create, put the code and spec in, start; stream the log, wait, fetch the result, remove. Every
transport error (socket, ssh, TLS) after the start is a lost engine (``RunLost``), recorded as
``error`` with its cause.
"""

from __future__ import annotations

import os
import re
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

from suite import telemetry
from suite.backends import docker_parts as parts
from suite.backends.base import Exit, Inventory, RunLost, Unavailable
from suite.backends.worker_output import split_lines
from suite.environment.docker_engine import Daemon

WORK_DIR = "/work"  # an anonymous volume: the archive endpoints see volumes, not tmpfs or a read-only rootfs
OUT_NAME = "out"
OUT_DIR, RESULT_PATH = f"{WORK_DIR}/{OUT_NAME}", f"{WORK_DIR}/{OUT_NAME}/result.json"
EXIT_SIGNAL_BASE = 128  # a container whose process a signal ended exits with 128 + the signal's number


class DockerBackend(Protocol):
    """What a container run needs of the backend that made it (suite.backends.docker.DockerBackend)."""

    daemon: Daemon
    refused_ulimits: set[str]  # limits this engine refused: left out for the rest of the session

    def stream_client(self) -> Any: ...

    def labels(self) -> dict[str, str]: ...

    def hardening(self) -> dict[str, Any]: ...


class ContainerRun:
    """One run's container, as the run skeleton drives it."""

    def __init__(self, backend: DockerBackend, container: Any, facts: dict[str, Any]):
        self.backend, self.container, self.facts = backend, container, facts
        self.phases: dict[str, float] = facts["container_s"]
        self._removed = False
        self.poller: GpuPoller | None = None  # nvidia-smi's helper container, on a remote engine with GPUs

    @classmethod
    def start(
        cls, backend: DockerBackend, client: Any, kwargs: dict[str, Any], payload: bytes, facts: dict[str, Any]
    ) -> ContainerRun:
        """Create, put the code and spec in, start. An engine that may not raise a resource limit (a
        daemon without CAP_SYS_RESOURCE refuses memlock=-1) gets the run without it, for the rest of
        the session, and the result says so: a run with the engine's default limit beats no run."""
        import docker

        facts["container_s"] = phases = {}
        while True:
            kwargs["ulimits"] = [u for u in kwargs["ulimits"] if u.name not in backend.refused_ulimits]
            kwargs["environment"]["SUITE_LAUNCH_UNIX"] = repr(time.time())  # create counts as launch
            container = None
            try:
                t = time.perf_counter()
                container = client.containers.create(**kwargs)
                phases["create"] = time.perf_counter() - t
                facts.update(
                    container_id=container.id,
                    ulimits={u.name: u.hard for u in kwargs["ulimits"]},
                    engine_device_requests=container.attrs["HostConfig"].get("DeviceRequests"),
                    isolation=_isolation(container.attrs),
                )
                if backend.refused_ulimits:
                    facts["ulimits_refused"] = sorted(backend.refused_ulimits)
                t = time.perf_counter()
                container.put_archive(WORK_DIR, payload)
                phases["put_archive"] = time.perf_counter() - t
                t = time.perf_counter()
                container.start()
                phases["start"] = time.perf_counter() - t
                return cls(backend, container, facts)
            except docker.errors.APIError as exc:
                if container is not None:
                    remove_container(container)
                text = engine_text(exc)
                refused = _refused_ulimit(text, [u.name for u in kwargs["ulimits"]])
                if refused is None:
                    message = _start_failure(text, bool(kwargs.get("device_requests")), backend)
                    raise Unavailable("error", message, facts) from None
                backend.refused_ulimits.add(refused)
            except Exception as exc:  # noqa: BLE001 - transport errors differ by scheme (ssh: AttributeError)
                if container is not None:
                    remove_container(container)
                message = f"lost the Docker engine at {backend.daemon.address}: {_what(exc)}"
                raise Unavailable("error", message, facts) from None
            except BaseException:  # Ctrl-C mid-start: the skeleton never sees this container
                if container is not None:
                    remove_container(container)
                raise

    def telemetry_sources(self) -> list[telemetry.Sampler]:
        """Container stats from the engine; the container's GPUs through NVML when the engine runs on
        this machine, else through nvidia-smi in a helper container of its own (``GpuPoller``), so
        the poller's CPU and memory are not counted in the run container's stats. The machine's
        load (processes outside the container's cgroup) only where the engine runs on this
        machine: this /proc is not a remote engine's."""
        stats = telemetry.DockerStatsSampler(self.backend.stream_client, self.container.id)
        samplers: list[telemetry.Sampler] = [stats]
        uuids = [u for r in self.facts.get("engine_device_requests") or [] for u in r.get("DeviceIDs") or []]
        local = engine_is_local(self.backend.daemon.address)
        if local:
            own = telemetry.Ownership(singles=[os.getpid()], cgroup=self.container.id)
            samplers.append(telemetry.LoadSampler(own, gpus=uuids))
        if uuids:
            if local:
                samplers.append(telemetry.NvmlSampler(uuids))
            else:
                image = (self.container.attrs or {}).get("Image") or self.container.image.id
                self.poller = GpuPoller(self.backend, image, uuids)
                samplers.append(telemetry.SmiSampler(self.poller.stream, GpuPoller.method))
        return samplers

    def lines(self) -> Iterator[str]:
        client = self.backend.stream_client()  # in the reading thread: a failure ends the log, not the run
        yield from split_lines(client.api.logs(self.container.id, stdout=True, stderr=True, stream=True, follow=True))

    def wait(self) -> Exit:
        t = time.perf_counter()
        try:
            code = int(self.container.wait(timeout=None).get("StatusCode", -1))  # None: no HTTP timeout
            self.phases["wait"] = time.perf_counter() - t
            self.container.reload()
        except Exception as exc:  # noqa: BLE001 - transport errors differ by scheme (socket, ssh, TLS)
            raise RunLost(
                f"lost the Docker engine at {self.backend.daemon.address} during the run: {_what(exc)}"
            ) from None
        oom = bool(self.container.attrs["State"].get("OOMKilled"))
        self.facts.update(oom_killed=oom)
        said = "the engine reports that the kernel's OOM killer ended it" if oom else "the engine reports no OOM kill"
        return Exit(code=code, signum=exit_signal(code), oom_killed=oom, oom_evidence=f"{said} (State.OOMKilled)")

    def kill(self) -> bool:
        try:
            self.container.kill()
        except Exception as exc:  # noqa: BLE001
            if _already_exited(exc):
                return False
            raise
        return True

    def result(self) -> bytes | None:
        import docker

        t = time.perf_counter()
        try:
            chunks, _ = self.container.get_archive(RESULT_PATH)
            return parts.file_from_archive(chunks)
        except docker.errors.NotFound:
            return None
        except Exception as exc:  # noqa: BLE001
            raise RunLost(
                f"could not fetch the result from the engine at {self.backend.daemon.address}: {_what(exc)}"
            ) from None
        finally:
            self.phases["fetch_result"] = time.perf_counter() - t

    def cleanup(self) -> None:
        if self._removed:
            return
        self._removed = True
        if self.poller is not None:
            self.poller.close()
        t = time.perf_counter()
        remove_container(self.container)
        self.phases["remove"] = time.perf_counter() - t


def engine_is_local(address: str) -> bool:
    """An engine on this machine: reached through a unix socket or a named pipe (its GPUs are this
    host's), written as a URL or as a bare socket path. The one test of it, for every caller."""
    return address.startswith(("unix://", "npipe://", "/"))


class GpuPoller:
    """nvidia-smi looping in a short-lived helper container of its own on the run's engine.

    It gets the run's GPUs by the same device request as the run (UUIDs, capability gpu) with
    ``NVIDIA_DRIVER_CAPABILITIES=utility`` (nvidia-smi and NVML, no CUDA), the run's image, the
    least-privilege settings of every container, and the session's labels, so a session that dies
    leaves it to the reaping of dead sessions. It is removed when sampling stops or the run is
    cleaned up, whichever comes first. Being its own container, its CPU and memory are not in the
    run container's stats.
    """

    method = (
        "nvidia-smi --query-gpu ... -lms 200 in a helper container on the engine with the run's GPUs "
        "(not counted in the run container's stats); samples timed by nvidia-smi's timestamp"
    )
    HELPER = "gpu-telemetry"  # its suite.helper label

    def __init__(self, backend: DockerBackend, image: str, uuids: list[str]):
        self.backend, self.image, self.uuids = backend, image, list(uuids)
        self._lock = threading.Lock()
        self._container: Any = None
        self._closed = False

    def kwargs(self, command: list[str]) -> dict[str, Any]:
        from docker.types import DeviceRequest

        return {
            "command": command,
            "labels": {**self.backend.labels(), "suite.helper": self.HELPER},
            "environment": {"NVIDIA_DRIVER_CAPABILITIES": "utility", "HOME": "/tmp"},
            "device_requests": [DeviceRequest(device_ids=self.uuids, capabilities=[["gpu"]])],
            "detach": True,
            **self.backend.hardening(),
        }

    def stream(self, command: list[str]) -> Iterator[bytes]:
        """Create and start the helper, yield its output; RuntimeError when it cannot run or fails."""
        import docker

        client = self.backend.stream_client()
        try:
            container = client.containers.create(self.image, **self.kwargs(command))
        except docker.errors.APIError as exc:
            raise RuntimeError(f"the engine refused nvidia-smi's container: {engine_text(exc)}") from None
        with self._lock:
            self._container = container
            closed = self._closed
        try:
            if closed:
                return
            try:
                container.start()
            except docker.errors.APIError as exc:
                raise RuntimeError(f"the engine could not start nvidia-smi: {engine_text(exc)}") from None
            yield from client.api.logs(container.id, stdout=True, stderr=True, stream=True, follow=True)
            if not self._closed:
                code = container.wait(timeout=30).get("StatusCode")
                if code not in (0, None):
                    raise RuntimeError(f"nvidia-smi exited with code {code}")
        finally:
            self.close()

    def close(self) -> None:
        """Remove the helper (now or, if it is being created, as soon as it exists); idempotent."""
        with self._lock:
            self._closed = True
            container, self._container = self._container, None
        if container is not None:
            remove_container(container)


def _isolation(attrs: dict[str, Any]) -> dict[str, Any]:
    """The least-privilege settings as the engine stored them for this container."""
    host, config = attrs.get("HostConfig") or {}, attrs.get("Config") or {}
    return {
        "user": config.get("User"),
        "read_only_rootfs": bool(host.get("ReadonlyRootfs")),
        "cap_drop": host.get("CapDrop"),
        "cap_add": host.get("CapAdd"),
        "security_opt": host.get("SecurityOpt"),
        "network_mode": host.get("NetworkMode"),
        "tmpfs": host.get("Tmpfs"),
        "privileged": bool(host.get("Privileged")),
        "bind_mounts": host.get("Binds") or [],
        "mounts": [
            {"target": m.get("Target"), "type": m.get("Type"), "read_only": bool(m.get("ReadOnly"))}
            for m in host.get("Mounts") or []
        ],
    }


def probe_engine(client: Any, image: Any, backend: DockerBackend, gpu_runtime: bool) -> Inventory:
    """Run PROBE in a hardened, short container; with all GPUs requested where a GPU runtime exists."""
    from docker.types import DeviceRequest

    python = (image.labels or {}).get("suite.python", "python3")
    kwargs: dict[str, Any] = {
        "command": [python, "-c", parts.PROBE],
        "labels": {**backend.labels(), "suite.helper": "probe"},
        "environment": {"NVIDIA_DRIVER_CAPABILITIES": "compute,utility", "HOME": "/tmp"},
        "detach": True,
        **backend.hardening(),
    }
    if gpu_runtime:
        kwargs["device_requests"] = [DeviceRequest(count=-1, capabilities=[["gpu"]])]
    try:
        container = client.containers.create(image.id, **kwargs)
    except Exception as exc:  # noqa: BLE001
        return {"gpus": [], "gpu_note": f"the engine refused the probe container: {engine_text(exc)}"}
    try:
        container.start()
        container.wait(timeout=120)
        return parts.parse_probe(container.logs().decode("utf-8", errors="replace"))
    except Exception as exc:  # noqa: BLE001 - a failed probe means: no GPU known, said so
        return {"gpus": [], "gpu_note": f"the probe container failed: {engine_text(exc)}"}
    finally:
        remove_container(container)


def _already_exited(exc: Exception) -> bool:
    """The engine refused a kill because the container no longer runs (409) or is gone (404)."""
    import docker

    return isinstance(exc, docker.errors.APIError) and exc.status_code in (404, 409)


def exit_signal(code: int) -> int | None:
    """The signal that ended a container's process, from its exit code (128 + N), if one did."""
    if EXIT_SIGNAL_BASE < code < EXIT_SIGNAL_BASE + signal.NSIG:
        return code - EXIT_SIGNAL_BASE
    return None


def _start_failure(text: str, gpu: bool, backend: DockerBackend) -> str:
    if gpu and ("device driver" in text or "nvidia" in text.lower() or "gpu" in text.lower()):
        return (
            f"the Docker engine at {backend.daemon.address} cannot give this container GPUs: {text}. Install the "
            "NVIDIA Container Toolkit on the engine's host, run `nvidia-ctk runtime configure "
            "--runtime=docker` and restart dockerd; `python -m suite env` shows the engine's runtimes"
        )
    return f"the Docker engine could not start the container: {text}"


# The kernel's resource numbers as runc reports them: "error setting rlimit type 8".
_RLIMIT_NAMES = {3: "stack", 8: "memlock"}


def _refused_ulimit(text: str, requested: list[str]) -> str | None:
    """The ulimit name an engine refused to set, if that is why the start failed."""
    match = re.search(r"error setting rlimit type (\d+)", text)
    if not match:
        return None
    name = _RLIMIT_NAMES.get(int(match.group(1)))
    return name if name in requested else None


def engine_text(exc: Any) -> str:
    explanation = getattr(exc, "explanation", None)
    return str(explanation or exc).strip()


def _what(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {engine_text(exc)}" if str(exc) else type(exc).__name__


def remove_container(container: Any) -> None:
    try:
        container.remove(force=True, v=True)  # force: kills it first if it still runs; v: its work volume
    except Exception:  # noqa: BLE001 - already gone (removed by close() or by hand), or the engine is lost
        pass
