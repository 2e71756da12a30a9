"""Docker backend: every run in a fresh container of a pinned image, through docker-py only.

The engine can be anywhere: the local socket, ``ssh://user@host`` or ``tcp://`` with TLS. Nothing
is bind-mounted from the orchestrator's disk (``docker_parts``): code and spec go in through the
archive endpoint into a volume before the container starts, the result comes out after it exits,
and MNIST sits in a named volume per engine. The GPUs, CPUs and driver are the engine host's, asked
of the engine in a short probe container; GPU runs get ``DeviceRequest(device_ids=[UUIDs])``
(``capabilities`` alone would mean zero GPUs, silently). The run flow (deadline, classification,
merge) is ``RunSkeleton``'s.

Containers run as an unprivileged user with no capabilities, ``no-new-privileges``, a read-only
root file system, a tmpfs for /tmp and no network. They carry the session and the orchestrator's
host, pid and deadline as labels: the first contact with an engine removes the containers of
sessions that are over, and ``close`` removes this session's own. The worker also ends itself
shortly after the run's limit, so no container outlives its orchestrator by more than that.
"""

from __future__ import annotations

import os
import posixpath
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from suite.backends import docker_parts as parts
from suite.backends.base import WORKER_DEADLINE_GRACE_S, Inventory, RunSkeleton, Unavailable, tag_labels
from suite.backends.docker_run import (
    OUT_NAME,
    RESULT_PATH,
    WORK_DIR,
    ContainerRun,
    engine_is_local,
    engine_text,
    probe_engine,
    remove_container,
)
from suite.backends.gpu_pool import device_skip_reason, gpu_env, gpus_for, inherit_pool, restrict_gpus
from suite.environment import datasets, docker_engine, host_facts, images
from suite.environment.docker_engine import engine_answers, engine_facts
from suite.record import code_identity, provenance
from suite.spec.plan import RunSpec, parse_device
from suite.worker.data import PATH_ENV as DATA_PATH_ENV

__all__ = ["DockerBackend", "auto_choice", "engine_answers", "engine_facts"]

KERAS_DIR = "/keras"
SHM_SIZE = "1g"  # NVIDIA's TensorFlow run line; Docker's 64 MB default starves NCCL in multi-GPU runs
TMPFS = {"/tmp": "rw,nosuid,nodev,size=1g,mode=1777"}  # HOME too: Keras writes its config there
MEMLOCK_UNLIMITED, STACK_BYTES = -1, 67108864  # --ulimit memlock=-1 --ulimit stack=67108864
# Host variables that change what TensorFlow does; passed through so a container run is tuned as
# the same run on the host would be (the local backend passes the whole environment).
PASS_PREFIXES = ("TF_", "XLA_", "NCCL_", "OMP_", "KMP_", "MKL_")
LABEL_SESSION, LABEL_RUN, LABEL_RUN_ID = parts.LABEL_SESSION, "suite.run", "suite.run_id"
# Whose GPUs a skip counts: a container sees the GPUs the engine's runtime hands it, not its host's
# (a GPU server without the NVIDIA runtime gives none).
ENGINE_GPUS = "the Docker engine gives its containers"
IMAGE_ENV = "SUITE_DOCKER_IMAGE"  # "REF" for every run, or "NAME=REF,NAME=REF" per images.yaml name
REAP_MARGIN_S = 60  # beyond a run's own limit before another host may call its session over


class DockerBackend(RunSkeleton):
    name = "docker"
    what = "container"
    # The container gets the code copied into its payload at launch (docker_parts.code_files): a later
    # edit of the checkout cannot reach it, so the provenance recorded is that copy's.
    code_copied_at_launch = True

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
        inventory: Inventory | None = None,
        user: str = f"{parts.RUN_UID}:{parts.RUN_GID}",
        gpus: list[str] | None = None,
    ):
        """
        image: a reference (tag or ID) every run uses, or a mapping images.yaml name -> reference;
            None: each run's ``config.image`` (or the GPU/CPU default) as tagged by ``images build``.
        results_dir: accepted for the command line's sake; nothing of a run is written on this side.
        mem_limit: a container memory limit (``"8g"``); none by default, as on the host.
        network_mode: "none" by default: a run needs no network, and a missing dataset then fails
            fast instead of waiting for DNS.
        keras_home: the Keras cache whose ``datasets/mnist.npz`` (or imported ``mnist-idx/``) is placed on
            the engine when the host resolved a run's data to it; default $KERAS_HOME or ~/.keras.
        inventory: GPUs to hand out instead of asking the engine.
        gpus: the engine host's GPUs (indices or UUIDs) the suite may hand out; None: all of them.
        """
        del results_dir
        self.machine = machine or host_facts.machine_name()
        self.daemon = docker_engine.daemon(docker_host)
        self._docker_host = docker_host
        self.image_override = image if image is not None else _image_from_env(os.environ.get(IMAGE_ENV, ""))
        self.memory_limit, self.shm_size, self.network_mode, self.user = mem_limit, shm_size, network_mode, user
        self.keras_home = Path(keras_home) if keras_home else _default_keras_home()
        self._inventory = inventory
        self.allowed_gpus = gpus
        self.session = uuid.uuid4().hex[:16]
        self.orchestrator = parts.orchestrator_label()
        self.reaped: list[dict[str, str]] = []
        self._client: Any = None
        self._stream_client: Any = None
        self._engine: dict[str, Any] = {}
        self._catalog: images.Catalog | None = None
        self.refused_ulimits: set[str] = set()
        self._code: dict[str, bytes] | None = None
        self._code_identity: dict[str, Any] | None = None  # the checkout when _code was read
        self._volumes: dict[str, dict[str, Any]] = {}

    # -- protocol -------------------------------------------------------------------------------

    def inventory(self) -> Inventory:
        if self._inventory is None:
            self._inventory = restrict_gpus(self._engine_pool(self._ask_engine()), self.allowed_gpus)
        return self._inventory

    def _engine_pool(self, found: Inventory) -> Inventory:
        """The engine host's GPUs the suite may use: on a local engine the orchestrator's inherited
        CUDA_VISIBLE_DEVICES (a scheduler's allocation on this machine) limits them, as for local
        runs; on a remote one it names this machine's GPUs, not the engine's, and is not applied."""
        if engine_is_local(self.daemon.address):
            return inherit_pool(found)
        why = "every GPU of the engine's host (a CUDA_VISIBLE_DEVICES here names this machine's GPUs)"
        pool = {"source": why, "cuda_visible_devices": None, "uuids": [g.get("uuid") for g in found.get("gpus", [])]}
        return {**found, "pool": pool, "outside_pool": []}

    def skip_reason(self, spec: RunSpec) -> str | None:
        if spec.config["backend"] != "tensorflow":
            backend = spec.config["backend"]
            return f"Keras backend {backend!r}: the suite's images hold TensorFlow only (use --backend local)"
        return device_skip_reason(spec, self.inventory(), holder=ENGINE_GPUS)

    def run_info(self) -> dict[str, Any]:
        info: dict[str, Any] = {
            "backend": self.name,
            "machine": self.machine,
            "daemon": self.daemon.address,
            "daemon_source": self.daemon.source,
            "daemon_link": docker_engine.tls_mode(self.daemon.address),
            "session": self.session,
        }
        if self._engine:
            info.update(engine_version=self._engine.get("Version"), engine_api_version=self._engine.get("ApiVersion"))
        return info

    def suite_provenance(self) -> dict[str, Any]:
        """The checkout as it was when the suite's code was read for this session's containers (read
        once, so every run of the session ran that code, whatever the tree did since); the checkout
        now for a result that never got that far."""
        if self._code_identity is not None:
            return dict(self._code_identity)
        return super().suite_provenance()

    def environment_provenance(self, run: dict[str, Any]) -> tuple[dict[str, Any], dict[str, Any] | None]:
        """The image's lock and recipe, from the image facts ``launch`` recorded in ``run``."""
        return provenance.image_provenance(run)

    def launch(self, spec: RunSpec, spec_json: bytes, env: dict[str, str]) -> ContainerRun:
        client = self._connect()
        ref, image = self._image(client, spec)
        facts: dict[str, Any] = {"image": ref, **images.image_record(image)}
        gpus = gpus_for(spec, self.inventory())
        facts.update(gpu_ids=[str(g["index"]) for g in gpus], gpu_uuids=[g.get("uuid") for g in gpus])
        facts["gpu_pool"] = self.inventory().get("pool")
        try:
            mounts, data_env, data_facts = self._data(client, spec, image.id)
        except Exception as exc:  # noqa: BLE001 - the engine refused the data volume: a status, not a crash
            raise Unavailable(
                "error", f"could not place the data on the engine at {self.daemon.address}: {exc}"
            ) from None
        facts["data_volumes"] = data_facts
        run_env = {**env, **data_env, **gpu_env(spec, self.inventory())}
        kwargs = self._container_kwargs(spec, image, run_env, mounts, [g["uuid"] for g in gpus])
        facts["cuda_visible_devices"] = kwargs["environment"].get("CUDA_VISIBLE_DEVICES")
        if self._code is None:
            self._code, self._code_identity = _code_with_identity()
        payload = parts.run_payload(self._code, spec_json, OUT_NAME)
        return ContainerRun.start(self, client, kwargs, payload, facts)

    def close(self) -> None:
        """Kill and remove every container of this session still on the engine (also after Ctrl-C).

        When the link to the engine broke during the session, fresh connections are tried (twice).
        """
        self.closed = True  # first: a launch still under way stops its container itself (RunSkeleton)
        if self._client is None:
            return
        mine = {"label": f"{LABEL_SESSION}={self.session}"}
        clients = [self._client]
        for attempt in range(3):
            try:
                for container in clients[-1].containers.list(all=True, filters=mine, ignore_removed=True):
                    remove_container(container)
                if not clients[-1].containers.list(all=True, filters=mine, ignore_removed=True):  # checked, not assumed
                    break
            except Exception:  # noqa: BLE001 - this link is broken: a fresh connection below
                pass
            if attempt < 2:
                try:
                    clients.append(docker_engine.connect(self._docker_host, timeout=30)[0])
                except Exception:  # noqa: BLE001 - out of reach: the worker ends itself at its deadline
                    break
        for client in [*clients, self._stream_client]:
            try:
                if client is not None:
                    client.close()
            except Exception:  # noqa: BLE001
                pass
        self._client = self._stream_client = None

    # -- what a container gets ------------------------------------------------------------------

    def labels(self, spec: RunSpec | None = None) -> dict[str, str]:
        labels = {LABEL_SESSION: self.session, parts.LABEL_ORCHESTRATOR: self.orchestrator, **tag_labels(self.tags)}
        if spec is not None:
            deadline = time.time() + spec.timeout_s + WORKER_DEADLINE_GRACE_S + REAP_MARGIN_S
            labels.update(
                {
                    parts.LABEL_DEADLINE: f"{deadline:.0f}",
                    LABEL_RUN: spec.fingerprint,
                    LABEL_RUN_ID: spec.run_id,
                    "suite.scenario": spec.scenario,
                }
            )
        return labels

    def hardening(self) -> dict[str, Any]:
        """The least-privilege settings of every container (each one recorded in the result)."""
        return {
            "user": self.user,
            "security_opt": ["no-new-privileges"],
            "cap_drop": ["ALL"],
            "read_only": True,
            "tmpfs": dict(TMPFS),
            "network_mode": self.network_mode,
        }

    def _container_kwargs(
        self, spec: RunSpec, image: Any, env: dict[str, str], mounts: list[Any], uuids: list[str]
    ) -> dict[str, Any]:
        from docker.types import DeviceRequest, Mount, Ulimit

        kind, _ = parse_device(spec.device)
        environment = {k: v for k, v in os.environ.items() if k.startswith(PASS_PREFIXES)}
        environment.update(env, PYTHONPATH=WORK_DIR, PYTHONDONTWRITEBYTECODE="1", HOME="/tmp")
        if kind == "cpu":
            environment["CUDA_VISIBLE_DEVICES"] = ""  # the worker's device check then proves no GPU is seen
        # GPU runs: CUDA_VISIBLE_DEVICES holds the same UUIDs as the device request (a container
        # sees the host's UUIDs and bus ids), and SUITE_GPUS tells the worker which GPUs to confirm.
        python = (image.labels or {}).get("suite.python", "python3")
        kwargs: dict[str, Any] = {
            "image": image.id,  # the ID, not the tag: the record names exactly what ran
            "command": [python, "-m", "suite.worker", f"{WORK_DIR}/spec.json", RESULT_PATH],
            "working_dir": WORK_DIR,
            "environment": environment,
            "mounts": [Mount(WORK_DIR, None, type="volume"), *mounts],  # anonymous: removed with the container
            "labels": self.labels(spec),
            "shm_size": self.shm_size,
            "ulimits": [
                Ulimit(name="memlock", soft=MEMLOCK_UNLIMITED, hard=MEMLOCK_UNLIMITED),
                Ulimit(name="stack", soft=STACK_BYTES, hard=STACK_BYTES),
            ],
            "detach": True,
            **self.hardening(),
        }
        if self.memory_limit:
            kwargs.update(mem_limit=self.memory_limit, memswap_limit=self.memory_limit)  # no swap: OOM is OOM
        if uuids:
            kwargs["device_requests"] = [DeviceRequest(device_ids=uuids, capabilities=[["gpu"]])]
            # Stated, not left to the toolkit's default: "utility" is what injects nvidia-smi, which
            # the worker's GPU facts and a remote engine's GPU telemetry read inside the container.
            environment["NVIDIA_DRIVER_CAPABILITIES"] = "compute,utility"
        return kwargs

    def _data(self, client: Any, spec: RunSpec, image_id: str) -> tuple[list[Any], dict[str, str], list[dict]]:
        """The read-only mount of the data the host resolved for this spec, and the path the worker reads.

        Keras' mnist.npz and imported IDX files are placed as they lie in the Keras cache, under
        KERAS_DIR; a scenario's data_dir at the path the worker resolves it to. Each set of files is
        a volume keyed by its sha256, placed once per engine; the worker checks the spec's sha256.
        """
        from docker.types import Mount

        data_cfg = spec.config.get("data") or {}
        host = datasets.locate(data_cfg, self.keras_home)
        if host is None:  # synthetic, or no data at all: the worker says which
            return [], {}, []
        data_dir = data_cfg.get("data_dir")
        if data_dir:
            target = container_data_dir(str(data_dir))
            files, worker_path = (parts.data_files(host) if host.is_dir() else {}), target
        elif host.is_dir():
            rel = posixpath.join("datasets", host.name)
            files = {posixpath.join(rel, name): p for name, p in parts.data_files(host).items()}
            target, worker_path = KERAS_DIR, posixpath.join(KERAS_DIR, rel)
        else:
            files = {"datasets/mnist.npz": host} if host.is_file() else {}
            target, worker_path = KERAS_DIR, posixpath.join(KERAS_DIR, "datasets/mnist.npz")
        env = {DATA_PATH_ENV: worker_path}
        if not files:  # gone since planning: the worker reports the path it was told
            return [], env, []
        key = "|".join(f"{k}={v}" for k, v in sorted(files.items()))
        if key not in self._volumes:  # verified once per session; placed once per engine
            self._volumes[key] = parts.ensure_data_volume(client, image_id, files, self.labels())
        placed = self._volumes[key]
        return [Mount(target, placed["volume"], type="volume", read_only=True)], env, [{**placed, "target": target}]

    # -- the engine -----------------------------------------------------------------------------

    def _connect(self) -> Any:
        if self._client is None:
            try:
                client, _ = docker_engine.connect(self._docker_host)
                self._engine = client.version()
            except Exception as exc:  # noqa: BLE001 - no engine is a status of every run, not a crash
                raise Unavailable(
                    "error", f"no Docker engine answers at {self.daemon.address} ({self.daemon.source}): {exc}"
                ) from None
            self._client = client
            try:
                self.reaped = parts.reap_dead_sessions(client, self.session)
            except Exception:  # noqa: BLE001 - reaping is housekeeping: a failure must not stop the runs
                pass
        return self._client

    def stream_client(self) -> Any:
        """A second client without an HTTP timeout: a log stream may be quiet for a long epoch."""
        if self._stream_client is None:
            self._stream_client, _ = docker_engine.connect(self._docker_host, timeout=None)
        return self._stream_client

    def _ask_engine(self) -> Inventory:
        """The engine host's GPUs and CPUs, from a short probe container of the run image."""
        try:
            client = self._connect()
        except Unavailable as exc:
            return {"gpus": [], "gpu_note": str(exc), "cpus": None}
        info = client.info()
        runtimes = sorted(info.get("Runtimes") or {})
        base: Inventory = {"gpus": [], "cpus": info.get("NCPU"), "source": "engine info", "runtimes": runtimes}
        image = self._probe_image(client)
        if image is None:
            return {**base, "gpu_note": "no suite image on the engine to ask it for GPUs"}
        gpu_runtime = "nvidia" in runtimes or bool(info.get("CDISpecDirs"))
        found = probe_engine(client, image, self, gpu_runtime)
        if not gpu_runtime:
            found["gpu_note"] = (
                f"the engine at {self.daemon.address} has no NVIDIA runtime (runtimes: {', '.join(runtimes) or 'none'})"
            )
            found["gpus"] = []
        return {**base, **found, "source": "probe container"}

    def _probe_image(self, client: Any) -> Any:
        import docker

        refs: list[str] = []
        if isinstance(self.image_override, str):
            refs.append(self.image_override)
        elif isinstance(self.image_override, Mapping):
            refs += list(self.image_override.values())
        try:
            catalog = self._load_catalog()
            refs += [catalog.tag(catalog.default_for(gpu)) for gpu in (True, False)]
        except Unavailable:
            pass
        for ref in refs:
            try:
                return client.images.get(ref)
            except docker.errors.DockerException:
                continue
        return None

    def _load_catalog(self) -> images.Catalog:
        if self._catalog is None:
            try:
                self._catalog = images.load_catalog()
            except images.ImageError as exc:
                raise Unavailable("image_unavailable", str(exc)) from None
        return self._catalog

    def image_for(self, spec: RunSpec) -> tuple[str, Any]:
        """(reference, docker-py image) a run of ``spec`` would start from on this backend's engine.

        Raises ``Unavailable`` as a run would (no engine, image missing), so a caller says the same.
        """
        return self._image(self._connect(), spec)

    def _image(self, client: Any, spec: RunSpec) -> tuple[str, Any]:
        import docker

        kind, _ = parse_device(spec.device)
        name = spec.config.get("image")
        ref: str | None
        if isinstance(self.image_override, str):
            ref = self.image_override
        else:
            catalog = self._load_catalog()
            name = name or catalog.default_for(kind == "gpu")
            ref = self._override_for(name)
            if ref is None:
                if name not in catalog.images:
                    raise Unavailable(
                        "image_unavailable",
                        f"no image named {name!r} in {images.CATALOG} (known: {', '.join(sorted(catalog.images))})",
                    )
                ref = catalog.tag(name)
        try:
            return ref, client.images.get(ref)
        except docker.errors.ImageNotFound:
            raise Unavailable(
                "image_unavailable",
                f"image {ref} ({name}) is not on the Docker engine at "
                f"{self.daemon.address}; build it with `python -m suite images build {name}`",
            ) from None
        except docker.errors.APIError as exc:
            raise Unavailable("error", f"the Docker engine could not inspect {ref}: {engine_text(exc)}") from None
        except Exception as exc:  # noqa: BLE001 - the link broke (ssh gone, socket refused): a status of this run
            raise Unavailable(
                "error", f"lost the Docker engine at {self.daemon.address} before the run: {type(exc).__name__}: {exc}"
            ) from None

    def _override_for(self, name: str | None) -> str | None:
        if isinstance(self.image_override, str):
            return self.image_override
        if isinstance(self.image_override, Mapping) and name:
            return self.image_override.get(name)
        return None


def auto_choice(docker_host: str | None = None) -> tuple[str, str]:
    """("docker" | "local", why) for ``--backend auto``: docker when an engine answers and has the default images."""
    if not engine_answers(docker_host):
        return "local", f"no Docker engine answers at {docker_engine.daemon(docker_host).address}"
    try:
        rows = images.list_images(docker_host=docker_host)
    except images.ImageError as exc:
        return "local", str(exc)
    asked = DockerBackend(docker_host=docker_host)
    try:
        gpus = asked.inventory().get("gpus", [])  # the engine host's, not this machine's
    finally:
        asked.close()
    wanted = {"cpu"} | ({"gpu"} if gpus else set())
    missing = [r["tag"] for r in rows if set(r["default_for"].split(",")) & wanted and r["state"] != "built"]
    if missing:
        return "local", f"the Docker engine lacks {', '.join(missing)} (python -m suite images build)"
    return "docker", f"Docker engine at {docker_engine.daemon(docker_host).address} with the default images"


def _code_with_identity(tries: int = 3) -> tuple[dict[str, bytes], dict[str, Any]]:
    """The suite's code files and the checkout's identity, taken so that they agree: the identity
    before and after the read must be the same (an edit in between reads again)."""
    for _ in range(tries):
        before = code_identity.current_suite_identity()
        code = parts.code_files()
        after = code_identity.current_suite_identity()
        if after == before:
            break
    return code, after


def container_data_dir(data_dir: str) -> str:
    """Where the worker, running in WORK_DIR, finds ``data.data_dir``: the same absolute path, or
    the relative one resolved from the work folder."""
    if os.path.isabs(data_dir):
        return data_dir
    return posixpath.normpath(posixpath.join(WORK_DIR, data_dir))


def _image_from_env(value: str) -> str | dict[str, str] | None:
    value = value.strip()
    if not value:
        return None
    if "=" not in value:
        return value
    pairs = (item.split("=", 1) for item in value.split(",") if item.strip())
    return {name.strip(): ref.strip() for name, ref in pairs}


def _default_keras_home() -> Path:
    return datasets.cache_dir().parent  # where the host resolves the data: one definition
