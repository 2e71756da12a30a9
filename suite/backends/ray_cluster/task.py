"""On the node: the Ray task that runs one point through the node's own backend, asking the board
between steps whether to stop."""

from __future__ import annotations

import fcntl
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, Required, TypedDict

from suite.backends.base import BackendUnavailable
from suite.backends.peak_cache import run_with_peak
from suite.backends.ray_cluster.board import ASKED, mark, mark_started, peak_key, peaks_of, stop_asked
from suite.backends.ray_cluster.leftovers import TAG_ATTEMPT, TAG_PLAN
from suite.backends.ray_cluster.placement import MACHINE_LABEL, gpu_model_of
from suite.backends.ray_cluster.threads import InThread
from suite.environment import host_facts
from suite.record import provenance
from suite.record.results import RunResult
from suite.spec.plan import RunSpec, parse_device

STEP_S = 0.2  # how often a node's task looks for Ray's interrupt while its run goes on
ASK_EVERY_S = 1.0  # how often a node's task asks the board whether its run is to stop
# After a stop's close (containers removed), how long the run's thread may take to end before the task
# says it stopped: a launch under way then stops its own container (RunSkeleton.closed). Below
# CANCEL_GRACE_S, so the task answers before the orchestrator forces it.
STOP_WAIT_S = 15.0
# Set on a node (in the environment of its `ray start`): which backend runs its points. auto (the
# default): Docker where the node's engine answers, else local; docker: always (a run without an
# engine is then recorded as such); local: never a container, e.g. a pod without a Docker engine.
NODE_BACKEND_ENV = "SUITE_RAY_NODE_BACKEND"
# (machine, plan session, the GPUs Ray gave the task) -> backend, per Ray worker process: a backend
# keeps the GPU pool it read from CUDA_VISIBLE_DEVICES, and a worker process serves tasks given others.
_node_backends: dict[tuple[str, str, str | None], Any] = {}
_built: set[str] = set()  # image names this worker process made sure of


class Job(TypedDict, total=False):
    """What the orchestrator sends with each task (``RayPool.submit``)."""

    suite: Required[dict[str, Any]]  # the identity of the code shipped
    session: Required[str]  # the plan's id, which tags everything its runs start
    key: Required[str]  # this attempt's id
    address: str  # the cluster's HOST:PORT, or "local"
    attempt: int  # 1, or 2 for the retry of a run whose node was lost
    retry_of: str | None  # the lost attempt's key
    gpu_model: str | None  # --gpu-model
    peaks: dict[str, list]  # by node id: its peak calibrations so far (read without a board)
    pin: list[str]  # custom resources the task's node must also offer (a retry's GPU model)


class Reply(TypedDict, total=False):
    """What a task sends back: its run's result and new peak calibrations, or why it stopped."""

    machine: Required[str]
    node_id: Required[str]
    result: dict[str, Any]  # RunResult.to_dict()
    peaks: list  # [[peak key, peak]] measured by this run
    stopped: str  # ASKED, NOT_STARTED or BOARD_GONE: no run, or none to its end


def _ray_facts(
    ray: Any, ctx: Any, job: Job, spec: RunSpec, node: tuple[str, str], gpu_ids: list[str]
) -> dict[str, Any]:
    """The result's ``run.ray`` section: where (``node``: its id and machine name) and as which
    attempt of the plan the run ran."""
    node_id, machine = node
    facts = {
        "node_id": node_id,
        "node_ip": _node_ip(ray),
        "machine": machine,
        "address": job.get("address"),
        "task_id": _task_id(ctx),
        "gpu_ids": gpu_ids,
        "gpu_model": gpu_model_of(spec, job.get("gpu_model")),
        "attempt": job.get("attempt", 1),
        "attempt_id": job["key"],
        "session": job.get("session"),
    }
    if job.get("retry_of"):
        facts["retry_of"] = job["retry_of"]
    if job.get("pin"):
        facts["pinned_to"] = list(job["pin"])  # a retry sent to the lost node's GPU model
    return facts


def run_point(spec_data: dict[str, Any], job: Job, ray: Any, board: Any = None) -> Reply:
    """Run one point on this node (inside a Ray task) and return {"machine", "result", "peaks"}.

    job: the plan's settings (``Job``): ``suite`` (the identity of the code shipped), ``session`` (the plan's
    id), ``address``, ``key`` (this attempt), ``attempt``, ``retry_of``, ``gpu_model`` and ``peaks``
    (this node's peak calibrations of earlier runs in the plan, by node id).
    """
    ctx = ray.get_runtime_context()
    node_id = ctx.get_node_id()
    labels = _labels(ctx)
    machine = labels.get(MACHINE_LABEL) or host_facts.machine_name()
    gpu_ids = [str(g) for g in ray.get_gpu_ids()]
    # The "started" mark answers whether the plan is stopping: the board takes calls one at a time,
    # so a task marked before a stop is waited for, and one marked after it never starts its run.
    why = mark_started(ray, board, job["key"], node_id=node_id, machine=machine)
    if why:
        return {"machine": machine, "node_id": node_id, "stopped": why}
    backend = _node_backend(machine, job)
    # What the backend's workers carry, so a sweep finds them if this task is killed by force.
    backend.tags = {TAG_PLAN: job["session"], TAG_ATTEMPT: job["key"]}
    spec = RunSpec.from_dict(spec_data)
    facts = _ray_facts(ray, ctx, job, spec, (node_id, machine), gpu_ids)
    stopping = threading.Event()  # set by a stop: the work's thread starts nothing after it

    def stop() -> None:
        stopping.set()
        backend.close()

    def work() -> tuple[RunResult, list]:
        problem = _gpu_mapping_problem(backend, spec, machine, gpu_ids)  # before an image is made for nothing
        if problem:
            return replace(backend.skipped(spec, problem), status="error"), []
        _ensure_image(backend, spec)  # may take minutes: the board is asked meanwhile too
        if stopping.is_set():
            raise StopAsked(ASKED)
        mark(board, job["key"], "ready", backend=backend.name)  # the run's deadline counts from here
        # This node's calibrations so far in the plan, from the board (every run is submitted at once,
        # so what the orchestrator knew at submit time is nothing); the job's copy without a board.
        known = peaks_of(board, node_id) if board is not None else (job.get("peaks") or {}).get(node_id, [])
        peaks = {peak_key(k): v for k, v in known}
        before = set(peaks)
        # The node's own rule first: Ray placed the run by resources, but only the node knows whether
        # its engine has a GPU runtime or its TensorFlow can see a GPU.
        reason = backend.skip_reason(spec)
        if reason:
            return backend.skipped(spec, reason), []
        if stopping.is_set():
            raise StopAsked(ASKED)
        result = run_with_peak(spec, backend, peaks)
        return result, [[list(k), v] for k, v in peaks.items() if k not in before]

    try:
        result, measured = _interruptible(work, stop, lambda: stop_asked(ray, board, job["key"]))
        if measured and board is not None:
            board.add_peaks.remote(node_id, measured)
    except StopAsked as asked:
        _node_backends.pop(_backend_key(machine, job), None)  # closed by _interruptible
        return {"machine": machine, "node_id": node_id, "stopped": str(asked)}
    except BaseException:
        backend.close()  # a cancel (KeyboardInterrupt here): no container of the session stays
        _node_backends.pop(_backend_key(machine, job), None)
        raise
    result = replace(result, run={**result.run, "ray": facts})
    return {"machine": machine, "node_id": node_id, "result": result.to_dict(), "peaks": measured}


class StopAsked(Exception):
    """The board asked this task to stop its run (Ctrl-C on the orchestrator, or its deadline), or
    is gone; its text says which (ASKED or BOARD_GONE)."""


def _interruptible(
    work: Callable[[], Any], stop: Callable[[], None], stop_asked: Callable[[], str | None] | None = None
) -> Any:
    """``work()`` in a thread of its own, while this thread waits in short steps and, every
    ASK_EVERY_S, asks ``stop_asked()`` (the board) whether to stop (None: go on; else why).

    A stop asked, or a KeyboardInterrupt (Ray's cancel raises it in the thread that runs the task,
    between Python steps only: a run waits for its container inside one blocking call to the engine,
    where it would never arrive), calls ``stop()`` (the backend's close: kill and remove the
    session's containers, or the worker's process group), which ends the blocked wait; the work's
    thread is given time to clean up, then StopAsked (or the interrupt) goes on.
    """
    running = InThread(work, "suite-ray-run")
    asked_at = time.monotonic()
    try:
        while not running.ended.wait(STEP_S):
            if stop_asked is not None and time.monotonic() - asked_at >= ASK_EVERY_S:
                why = stop_asked()
                if why:
                    raise StopAsked(why)
                asked_at = time.monotonic()
    except BaseException:
        stop()
        running.ended.wait(STOP_WAIT_S)
        raise
    return running.outcome()


def _labels(ctx: Any) -> dict[str, str]:
    try:
        raw = ctx.get_node_labels() or {}
    except Exception:  # noqa: BLE001 - an older Ray without labels: the hostname names the folder
        return {}
    out = {}
    for key, value in raw.items():
        out[str(key)] = str(value[0] if isinstance(value, list | tuple) and value else value)
    return out


def _node_ip(ray: Any) -> str | None:
    try:
        return str(ray.util.get_node_ip_address())
    except Exception:  # noqa: BLE001
        return None


def _task_id(ctx: Any) -> str | None:
    try:
        return str(ctx.get_task_id())
    except Exception:  # noqa: BLE001
        return None


def _node_backend(machine: str, job: Job) -> Any:
    """This node's backend for the plan: Docker when its engine answers, else local; one per plan,
    worker process and set of GPUs Ray gave the task (a backend reads its GPU pool once, from the
    CUDA_VISIBLE_DEVICES Ray set, and a Docker backend asks its engine for the GPUs once)."""
    key = _backend_key(machine, job)
    if key not in _node_backends:
        from suite.backends import docker_parts, local
        from suite.environment.docker_engine import engine_answers

        backend: Any
        choice = os.environ.get(NODE_BACKEND_ENV, "auto").strip() or "auto"
        if choice not in ("auto", "docker", "local"):
            raise BackendUnavailable(
                f"{NODE_BACKEND_ENV}={choice!r} on node {machine}: allowed are auto, docker, local"
            )
        if choice == "docker" or (choice == "auto" and engine_answers(None)):
            from suite.backends.docker import DockerBackend

            backend = DockerBackend(machine=machine)
            # The code this session's containers get is the job's copy (py_modules): its identity
            # is the orchestrator's checkout, which no git here can tell.
            backend._code = docker_parts.code_files()
            backend._code_identity = dict(job["suite"])
        else:
            backend = local.LocalBackend(machine=machine)
            # Asked as the worker will run (a subprocess): this task's process has Ray's vendored
            # packages on its path, which no worker imports.
            backend._environment = provenance.venv_environment(backend.python, in_subprocess=True)
        shipped = dict(job["suite"])
        backend.suite_provenance = lambda: dict(shipped)
        _node_backends[key] = backend
    return _node_backends[key]


def _gpu_mapping_problem(backend: Any, spec: RunSpec, machine: str, gpu_ids: list[str]) -> str | None:
    """Why a GPU run cannot have the GPUs Ray gave its task, or None. Ray's GPU indices are the node's;
    an engine reached otherwise than by a socket on the node (tcp://, ssh://) may be another
    machine's, whose GPUs those indices do not name (the Docker backend then hands out the engine
    host's first GPUs, which may be another job's)."""
    if getattr(backend, "name", "") != "docker" or parse_device(spec.device)[0] != "gpu":
        return None
    from suite.backends.docker_run import engine_is_local

    address = backend.daemon.address
    if engine_is_local(address):
        return None
    return (
        f"node {machine}'s Docker engine is reached at {address}, not through a socket on the node: the GPUs "
        f"Ray gave this task ({', '.join(gpu_ids) or 'none'}) are the node's, and that engine's may be another "
        f"machine's; give the node its local engine (no DOCKER_HOST in the environment of its `ray start`) "
        f"or set {NODE_BACKEND_ENV}=local there"
    )


def _backend_key(machine: str, job: Job) -> tuple[str, str, str | None]:
    return machine, job["session"], os.environ.get("CUDA_VISIBLE_DEVICES")


def _ensure_image(backend: Any, spec: RunSpec) -> None:
    """Build the image this run needs on the node's engine when the engine lacks it (or holds an
    older recipe), once per worker process, one build at a time on the node (a file lock)."""
    if getattr(backend, "name", "") != "docker" or backend.image_override is not None:
        return
    from suite.environment import images

    catalog = images.load_catalog()
    name = spec.config.get("image") or catalog.default_for(parse_device(spec.device)[0] == "gpu")
    if name in _built:
        return
    lock = Path(tempfile.gettempdir()) / "suite-ray-image-build.lock"
    with open(lock, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        images.build_images([name], progress=lambda _line: None)
    _built.add(name)


def ray_task(spec_data: dict[str, Any], job: Job, board: Any) -> Reply:
    """The Ray task: runs on the node Ray chose."""
    import ray

    return run_point(spec_data, job, ray, board)
