"""Ray backend: one plan spread over the nodes of a Ray cluster, each run placed by Ray's scheduler.

The orchestrator (``RayPool``, driven by ``runner.run_plan_pool``) submits every run of the plan
as a Ray task and saves each result the moment it comes back; nothing but Ray connects the two
sides, so no shared file system is needed. A task asks for 1 CPU, one ``suite_slot`` (a custom
resource: a node offering one runs one benchmark at a time, so a neighbour never skews a timing),
its point's GPUs (``num_gpus``) and, when the scenario's ``gpu_model`` or ``--gpu-model`` names a
model, a share of the custom resource ``gpu_model:NAME`` that only nodes of that model offer.

On its node the task (``run_point``) runs the point through the run skeleton of the node's own
Docker engine (its DOCKER_HOST, or the local socket) when one answers, else of the local backend.
Ray sets the task's CUDA_VISIBLE_DEVICES to the GPUs it assigned; both backends read that variable
as CUDA does (``gpu_pool.inherit_pool``) and hand the run exactly those GPUs, by UUID. A node builds
the image a run needs before its first run when it lacks it (the recipe-hash rule of ``images``).
The checkout travels with the job (Ray's ``working_dir``: the suite, its image catalog, Dockerfile
and locks): every result records the identity of the checkout the orchestrator shipped.

Faults: Ray's own retries are off (``max_retries=0``): a run is never repeated behind the plan's
back. A node that dies mid-run has that run recorded (``error``, "node lost") and retried once on
another node of the same GPU model (``run.ray.retry_of``); a crashed worker's node is watched for
Ray's verdict over later polls, never inside one. A task still running well past its deadline is
stopped by the orchestrator and recorded as ``timeout`` (the node's own deadline normally fires
first). Ctrl-C or SIGTERM stops every started task (each kills and removes its container), forces
what has not ended after a grace, and leaves the queued ones to end with the job. A cluster whose
head stops answering ends the plan with a message; results already saved stay, and so does one
that had reached the orchestrator. Every result taken from Ray stays with the pool until the runner
says it is saved, so an interrupt at any point loses none.

What a task's run starts (a container, a local worker's process group) does not die with the task's
Ray worker: a task killed by force (after a stop's grace, at its deadline, by Ray's memory monitor,
or a crash) leaves it running until the worker's own deadline. Its backend tags everything it
starts with the plan and the attempt (``base.tag_labels``, ``tag_env``), and the orchestrator sends
``sweep``, pinned to the node, to remove it. A backend closed while its worker is still starting
stops that worker itself the moment it exists (``RunSkeleton.closed``).

Stopping is asked through the board, not with ``ray.cancel``: each task looks at the board while
its run goes on and stops its own run. ``ray.cancel`` of a task whose reply is on its way can crash
the driver inside Ray (a check in its task manager, "Tried to complete task that was not pending",
ray-project/ray#54798 fixes one such race); Ray retries a polite cancel every few seconds while the
task tidies up, so the race was met. ``ray.cancel(force=True)`` is left for a task that did not
answer the board within the grace, and for a queued task no node can place.
"""

from __future__ import annotations

import fcntl
import functools
import os
import signal
import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from suite import paths
from suite.backends.base import BackendUnavailable, now_iso
from suite.backends.peak_cache import run_with_peak
from suite.environment import host_facts
from suite.record import code_identity, provenance
from suite.record.results import RunResult
from suite.spec.plan import RunSpec, parse_device

SLOT = "suite_slot"  # custom resource: how many benchmark runs a node takes at once
MODEL_PREFIX = "gpu_model:"  # custom resource per GPU model, e.g. gpu_model:H100
MACHINE_LABEL = "suite-machine"  # node label: the results folder of the node's runs (default: hostname)
MODEL_SHARE = 0.001  # what a run asks of gpu_model:NAME: it selects nodes, it counts nothing
CANCEL_GRACE_S = 20.0  # after a stop is asked (the task removes its container), before a forced cancel
DEADLINE_MARGIN_S = 60.0  # beyond timeout_s and the worker's grace before the orchestrator cancels
POLL_S = 1.0
GCS_CALL_S = 5.0  # the longest a call that needs the head may take before the last answer serves
STEP_S = 0.2  # how often a node's task looks for Ray's interrupt while its run goes on
ASK_EVERY_S = 1.0  # how often a node's task asks the board whether its run is to stop
# After a stop's close (containers removed), how long the run's thread may take to end before the task
# says it stopped: a launch under way then stops its own container (RunSkeleton.closed). Below
# CANCEL_GRACE_S, so the task answers before the orchestrator forces it.
STOP_WAIT_S = 15.0
SWEEP_WAIT_S = 30.0  # how long the orchestrator waits for the nodes' sweeps after a Ctrl-C
SWEEP_SETTLE_S = 2.0  # before a sweep looks: a worker being killed by force is given time to go
SWEEP_ENGINE_S = 8.0  # the limit of each of a sweep's calls to its node's engine
# The tags a node's backend gives its workers (base.tag_labels / tag_env): the plan and the attempt,
# so a sweep finds what a task killed by force left behind.
TAG_PLAN, TAG_ATTEMPT = "ray_plan", "ray_attempt"
HEAD_CHECKS = 5  # GCS connection refusals in a row, HEAD_RETRY_S apart, before the cluster is called gone
HEAD_RETRY_S = 0.5
HEAD_SILENT_S = 120.0  # a head that neither answers nor refuses for this long is gone too
READY_LIMIT_S = 3600.0  # what a node may spend making the run's image before the run's limit starts
LOST_NODE_WAIT_S = 45.0  # how long a crashed task's node may take to be declared dead (Ray's health check)
# What the job ships (Ray's working_dir, which also leaves out what .gitignore names): the checkout
# without its history and without results, so a node reads the same catalog, Dockerfile and locks.
SHIP_EXCLUDES = [".git", "/reports/", "/reproduce/", "/benchmarks/wheels/"]
LOCAL = "a local Ray instance started by the suite"
ALL = "*"  # the board's stop for every attempt of the plan
HEAD_RESOURCE = "node:__internal_head__"  # what Ray gives the head node only (ray._common.constants)
ASKED = "asked"  # why a task stopped its run: the board asked it to
BOARD_GONE = "board gone"  # why a task did not run: the plan's board actor died
# Set on a node (in the environment of its `ray start`): which backend runs its points. auto (the
# default): Docker where the node's engine answers, else local; docker: always (a run without an
# engine is then recorded as such); local: never a container, e.g. a pod without a Docker engine.
NODE_BACKEND_ENV = "SUITE_RAY_NODE_BACKEND"


def shipped_code(results_dir: Path | None) -> dict[str, Any]:
    """The Ray runtime environment that carries this suite's code to every node.

    From a checkout: the checkout itself (suite/, docker/, the locks), less git, the reports and the
    results folder. Installed: the package, which holds its recipes and locks in ``suite/_data``.
    """
    checkout = paths.CHECKOUT
    if checkout is None:
        return {"py_modules": [str(paths.PACKAGE_DIR)]}
    excludes = list(SHIP_EXCLUDES)
    if results_dir is not None:
        try:
            excludes.append(f"/{results_dir.resolve().relative_to(checkout)}/")
        except ValueError:
            pass  # outside the checkout: not shipped anyway
    return {"working_dir": str(checkout), "excludes": excludes}


def import_ray() -> Any:
    """The ``ray`` module, or BackendUnavailable (exit 2) with the command that installs it."""
    try:
        import ray
    except ImportError as exc:
        xy = f"{sys.version_info.major}.{sys.version_info.minor}"
        lock = paths.REQUIREMENTS_DIR / "locks" / f"cluster-py{xy}.txt"
        if lock.is_file():
            how = (
                f"install the locked cluster environment: `{sys.executable} -m pip install --require-hashes "
                f"--only-binary :all: -r {lock}`, or let ./run_all.sh --backend ray set the venv up"
            )
        else:
            have = sorted(p.stem.removeprefix("cluster-py") for p in lock.parent.glob("cluster-py*.txt"))
            how = (
                f"no cluster lock exists for Python {xy} ({lock}); the locks are for Python "
                f"{', '.join(have) or 'none'}: run with one of those "
                "(./run_all.sh --backend ray with PYTHON=/path/to/python<X.Y>)"
            )
        raise BackendUnavailable(f"--backend ray: Ray is not installed in {sys.executable} ({exc}); {how}") from None
    return ray


# -- what a run asks of the cluster -----------------------------------------------------------------


def gpu_model_of(spec: RunSpec, default: str | None = None) -> str | None:
    """The GPU model a run must land on: the scenario's ``gpu_model``, else ``--gpu-model``, else any."""
    return spec.config.get("gpu_model") or default


def demand(spec: RunSpec, gpu_model: str | None = None) -> dict[str, float]:
    """The resources a run's task asks for, in Ray's names (CPU, GPU, custom resources)."""
    kind, count = parse_device(spec.device)
    need: dict[str, float] = {"CPU": 1.0, SLOT: 1.0}
    if kind == "gpu":
        need["GPU"] = float(count)
    model = gpu_model_of(spec, gpu_model)
    if model:
        need[MODEL_PREFIX + model] = MODEL_SHARE
    return need


def placement_problem(need: dict[str, float], nodes: list[dict[str, Any]], where: str) -> str | None:
    """Why no alive node could ever take a task with ``need`` (its total resources, not what is
    free now: a busy node takes it later), or None."""
    alive = [n for n in nodes if n.get("Alive")]
    if not alive:
        return f"no node of {where} is alive"
    if any(all(float(n.get("Resources", {}).get(k, 0)) >= v for k, v in need.items()) for n in alive):
        return None
    offered = sorted({k for n in alive for k in n.get("Resources", {}) if k.startswith(MODEL_PREFIX)})
    models = ", ".join(offered) or "no gpu_model:NAME resource"
    for key, amount in need.items():
        if not any(float(n.get("Resources", {}).get(key, 0)) >= amount for n in alive):
            if key.startswith(MODEL_PREFIX):
                return f"no node of {where} offers {key} (offered: {models})"
            if key == SLOT:
                return (
                    f"no node of {where} offers the resource {SLOT}; start each node with "
                    f"--resources '{{\"{SLOT}\": 1}}' (docs/cluster.md)"
                )
            if key == "GPU":
                most = max((float(n.get("Resources", {}).get("GPU", 0)) for n in alive), default=0)
                return f"needs {amount:g} GPU(s) on one node; the largest node of {where} has {most:g}"
            return f"no node of {where} has {amount:g} {key}"
    return f"no single node of {where} offers all of {_need_text(need)} (nodes offer: {models})"


def _need_text(need: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:g}" for k, v in need.items())


# -- on the node ------------------------------------------------------------------------------------

# (machine, plan session, the GPUs Ray gave the task) -> backend, per Ray worker process: a backend
# keeps the GPU pool it read from CUDA_VISIBLE_DEVICES, and a worker process serves tasks given others.
_node_backends: dict[tuple[str, str, str | None], Any] = {}
_built: set[str] = set()  # image names this worker process made sure of


def run_point(spec_data: dict[str, Any], job: dict[str, Any], ray: Any, board: Any = None) -> dict[str, Any]:
    """Run one point on this node (inside a Ray task) and return {"machine", "result", "peaks"}.

    job: the plan's settings: ``suite`` (the identity of the code shipped), ``session`` (the plan's
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
    why = _mark_started(ray, board, job["key"], node_id=node_id, machine=machine)
    if why:
        return {"machine": machine, "node_id": node_id, "stopped": why}
    backend = _node_backend(machine, job)
    # What the backend's workers carry, so a sweep finds them if this task is killed by force.
    backend.tags = {TAG_PLAN: job["session"], TAG_ATTEMPT: job["key"]}
    spec = RunSpec.from_dict(spec_data)
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
        _mark(board, job["key"], "ready", backend=backend.name)  # the run's deadline counts from here
        # This node's calibrations so far in the plan, from the board (every run is submitted at once,
        # so what the orchestrator knew at submit time is nothing); the job's copy without a board.
        known = _peaks_of(board, node_id) if board is not None else (job.get("peaks") or {}).get(node_id, [])
        peaks = {_peak_key(k): v for k, v in known}
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
        result, measured = _interruptible(work, stop, lambda: _stop_asked(ray, board, job["key"]))
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


class _InThread:
    """``call()`` started in a daemon thread of its own; ``ended`` is set when it returns or raises.

    An Event, not Thread.join: an interrupt inside join marks the thread as ended on Python 3.11
    (its lock-wait handling), and a second join would then not wait for the cleanup at all.
    """

    def __init__(self, call: Callable[[], Any], name: str):
        self.box: dict[str, Any] = {}
        self.ended = threading.Event()

        def run() -> None:
            try:
                self.box["value"] = call()
            except BaseException as exc:  # noqa: BLE001 - handed to the waiting thread
                self.box["error"] = exc
            finally:
                self.ended.set()

        threading.Thread(target=run, name=name, daemon=True).start()

    def outcome(self) -> Any:
        """The call's value, or its exception raised here (once ``ended`` is set)."""
        if "error" in self.box:
            raise self.box["error"]
        return self.box["value"]


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
    running = _InThread(work, "suite-ray-run")
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


def _within(seconds: float, call: Callable[[], Any]) -> Any:
    """``call()``'s value, or None when it has not returned within ``seconds`` (it is then left to
    finish, or not, in a daemon thread); its exception is raised here."""
    running = _InThread(call, "suite-ray-call")
    if not running.ended.wait(seconds):
        return None
    return running.outcome()


def _peaks_of(board: Any, node_id: str) -> list:
    import ray

    try:
        return list(ray.get(board.peaks_of.remote(node_id), timeout=30))
    except Exception:  # noqa: BLE001 - without it the run measures its own peak, as a first run does
        return []


def _peak_key(value: Any) -> tuple:
    return tuple(value)


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


def _mark_started(ray: Any, board: Any, key: str, **facts: Any) -> str | None:
    """Tell the board this task started; why it is not to start its run (None: it is to)."""
    if board is None:
        return None
    return _board_says_stop(ray, lambda: board.mark.remote(key, "started", time.time(), facts))


def _stop_asked(ray: Any, board: Any, key: str) -> str | None:
    if board is None:
        return None
    return _board_says_stop(ray, lambda: board.stop_asked.remote(key))


def _board_says_stop(ray: Any, call: Callable[[], Any]) -> str | None:
    """ASKED when the board says stop; BOARD_GONE when the board is dead (it lives with the
    orchestrator's job: without it no result could go back); None otherwise. A board that is slow,
    or unavailable for a while (ActorUnavailableError, say while the head recovers), stops nothing."""
    try:
        return ASKED if ray.get(call(), timeout=GCS_CALL_S) else None
    except Exception as exc:  # noqa: BLE001
        died = getattr(getattr(ray, "exceptions", None), "ActorDiedError", None)
        return BOARD_GONE if died is not None and isinstance(exc, died) else None


def _mark(board: Any, key: str, what: str, **facts: Any) -> None:
    if board is None:
        return
    try:
        board.mark.remote(key, what, time.time(), facts)
    except Exception:  # noqa: BLE001 - the plan's bookkeeping must never fail a run
        pass


def _node_backend(machine: str, job: dict[str, Any]) -> Any:
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


def sweep(session: str, attempt: str | None = None, settle_s: float = SWEEP_SETTLE_S) -> dict[str, Any]:
    """Remove what a task of plan ``session`` (only attempt ``attempt``, when given) left running on
    this node: containers on the node's engine, local workers' process groups, found by their tags.
    Run on the node (a Ray task pinned to it) after a task there was killed by force: its run's
    container or subprocess outlives it otherwise, until the worker's own deadline."""
    time.sleep(settle_s)
    wanted = {TAG_PLAN: session} | ({TAG_ATTEMPT: attempt} if attempt else {})
    # Processes first (no call that can hang), then the engine, each of its calls bounded, so the
    # whole sweep ends within the orchestrator's wait for it (SWEEP_WAIT_S).
    found: dict[str, Any] = {"containers": [], "processes": _kill_tagged_processes(wanted)}
    try:
        import docker

        from suite.backends.base import tag_labels
        from suite.environment.docker_engine import connect

        client, _ = connect(None, timeout=SWEEP_ENGINE_S)
        try:
            filters = {"label": [f"{k}={v}" for k, v in tag_labels(wanted).items()]}
            for container in client.containers.list(all=True, filters=filters):
                try:
                    container.remove(force=True, v=True)
                except docker.errors.APIError:  # gone, or going: removed by someone else (nodes may share an engine)
                    continue
                found["containers"].append(container.short_id)
        finally:
            client.close()
    except Exception as exc:  # noqa: BLE001 - no engine on this node: only processes to look for
        found["engine"] = f"{type(exc).__name__}: {exc}"
    return found


def _kill_tagged_processes(wanted: dict[str, str]) -> list[int]:
    """SIGKILL the process group of every process whose environment carries the tags ``wanted``."""
    from suite.backends.base import tag_env

    needles = [f"{k}={v}".encode() for k, v in tag_env(wanted).items()]
    killed = []
    for entry in Path("/proc").iterdir() if Path("/proc").is_dir() else []:
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if all(n in environ for n in needles):
            try:
                group = os.getpgid(int(entry.name))
                if group != os.getpgid(0):  # a local worker leads a group of its own; never this task's
                    os.killpg(group, signal.SIGKILL)
                    killed.append(int(entry.name))
            except (ProcessLookupError, PermissionError):
                pass
    return killed


def _backend_key(machine: str, job: dict[str, Any]) -> tuple[str, str, str | None]:
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


class Board:
    """A Ray actor the tasks tell when they start and when their image is ready: the orchestrator's
    clock for the deadline, and where a lost run was running; and each node's peak calibrations, so
    a node's later runs reuse its first measurement as ``run_plan`` does on one machine. Holds no
    result.

    Times are the board's own, taken as a mark arrives, and handed out as ages (``started_for_s``,
    ``ready_for_s``): the nodes', the board's and the orchestrator's clocks never meet.
    """

    def __init__(self) -> None:
        self.marks: dict[str, dict[str, Any]] = {}
        self.peaks: dict[str, list] = {}  # node id -> [[peak key, peak]]: the node's calibrations so far
        self.stops: set[str] = set()  # attempt keys asked to stop; ALL: every one

    def peaks_of(self, node_id: str) -> list:
        return list(self.peaks.get(node_id, []))

    def add_peaks(self, node_id: str, measured: list) -> None:
        self.peaks.setdefault(node_id, []).extend(measured)

    def mark(self, key: str, what: str, at: float, facts: dict[str, Any]) -> bool:
        """Record the mark; whether the attempt is asked to stop (the answer a starting task needs)."""
        del at  # the node's clock: kept out
        entry = self.marks.setdefault(key, {})
        entry[what] = time.monotonic()
        entry.update(facts)
        return self.stop_asked(key)

    def stop(self, keys: list[str] | None) -> bool:
        """Ask the attempts ``keys`` (None: every one, also those not started yet) to stop."""
        self.stops.update([ALL] if keys is None else keys)
        return True

    def stop_asked(self, key: str) -> bool:
        return ALL in self.stops or key in self.stops

    def snapshot(self) -> dict[str, dict[str, Any]]:
        now = time.monotonic()
        out = {}
        for key, entry in self.marks.items():
            ages = {f"{w}_for_s": now - entry[w] for w in ("started", "ready") if w in entry}
            out[key] = {k: v for k, v in entry.items() if k not in ("started", "ready")} | ages
        return out


# -- the orchestrator -------------------------------------------------------------------------------


@dataclass
class Attempt:
    spec: RunSpec
    key: str
    attempt: int = 1
    retry_of: str | None = None
    submitted: float = field(default_factory=time.time)
    cancelled_for: str | None = None  # "timeout" once the orchestrator stopped it at its deadline
    cancelled_at: float | None = None
    pin: list[str] = field(default_factory=list)  # custom resources it must also find (a retry's GPU model)


@dataclass
class _Suspect:
    """A task whose worker crashed, on a node Ray had not declared dead yet."""

    attempt: Attempt
    exc: BaseException
    node_id: str
    until: float  # the pool's clock: a node still alive then was not lost


@dataclass
class Finished:
    """A result the pool hands the runner to save, with the machine folder it belongs to."""

    spec: RunSpec
    machine: str
    result: RunResult
    retried: bool = False  # a lost run another attempt was submitted for: not the run's last word
    key: str | None = None  # the attempt it records (None: a record not made from an attempt)


class RayPool:
    """The plan's side of the Ray backend: connect, submit, collect, cancel."""

    name = "ray"

    def __init__(
        self,
        machine: str,
        address: str | None = None,
        gpu_model: str | None = None,
        *,
        ray_module: Any = None,
        clock: Callable[[], float] = time.time,
        results_dir: Path | None = None,
    ):
        """machine: the orchestrator's results folder (runs no node could take are recorded there).
        address: HOST:PORT of the cluster's head (GCS), or None for a local instance the pool starts."""
        self.machine = machine
        self.results_dir = results_dir
        if address is not None and not address.strip():
            address = None
        if address is not None and "://" in address:
            raise BackendUnavailable(
                f"--ray-address {address}: give the head's HOST:PORT (its GCS address, as `ray start --head` "
                "prints it); the suite runs as a Ray driver on a node of the cluster, not through Ray Client (ray://)"
            )
        self.address = address
        self.gpu_model = gpu_model
        self.clock = clock
        self._ray = ray_module
        self._started_local = False
        self._connected = False
        self.where = f"the Ray cluster at {address}" if address else LOCAL
        self.gcs_address: str | None = None
        self.session = os.urandom(8).hex()
        self.identity: dict[str, Any] = {}
        self._remote: Any = None
        self._board: Any = None
        self._pending: dict[Any, Attempt] = {}
        self._peaks: dict[str, list] = {}
        self._refusals = 0
        self._counter = 0
        self._nodes_cache: tuple[float, list[dict[str, Any]]] | None = None
        self.gone: str | None = None  # set when the cluster stopped answering: why the plan ended
        self._last_marks: dict[str, dict[str, Any]] = {}
        self._silent_since: float | None = None
        self._unplaceable_since: dict[str, float] = {}
        # Results taken from Ray and not yet on file (``saved`` takes them off): an interrupt before
        # then finds them in what ``cancel_all`` hands back, so no result that came back is lost.
        self._unsaved: list[Finished] = []
        # Tasks whose worker crashed on a node not (yet) declared dead: decided on later polls, so
        # Ray's health check is waited out without holding up the rest of the plan.
        self._suspects: dict[str, _Suspect] = {}
        self._node_models: dict[str, list[str]] = {}  # node id -> its gpu_model:NAME resources, as last seen alive
        self._sweeper: Any = None
        self._sweeps: list[Any] = []  # sweep tasks still to be waited for before the pool leaves

    # -- connection -----------------------------------------------------------------------------

    @property
    def ray(self) -> Any:
        if self._ray is None:
            self._ray = import_ray()
        return self._ray

    def connect(self) -> None:
        """Join the cluster (or start a local instance), shipping the checkout as the job's working_dir."""
        if self._connected:
            return
        ray = self.ray
        before = code_identity.current_suite_identity()
        # The GCS going away is detected by this pool (``_head_answers``) within seconds; Ray's own
        # reconnect limit ends the whole process without a word, so it is set well beyond.
        os.environ.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", "600")
        runtime_env = shipped_code(self.results_dir)
        kwargs: dict[str, Any] = {"runtime_env": runtime_env, "logging_level": "ERROR", "log_to_driver": False}
        try:
            if self.address:
                info = ray.init(address=self.address, **kwargs)
            else:
                # "local": always a new instance, never a cluster found through RAY_ADDRESS or /tmp/ray.
                info = ray.init(
                    address="local",
                    include_dashboard=False,
                    resources={SLOT: 1},
                    labels={MACHINE_LABEL: self.machine},
                    **kwargs,
                )
                self._started_local = True
        except Exception as exc:  # noqa: BLE001 - Ray raises ConnectionError, RuntimeError, ValueError...
            raise BackendUnavailable(f"--backend ray: cannot join {self.where}: {type(exc).__name__}: {exc}") from None
        after = code_identity.current_suite_identity()
        self.identity = after if after == before else {**after, "changed_while_shipping": True}
        self.gcs_address = _gcs_address(info, self.address)
        self._connected = True
        # The board lives on the head (the resource Ray gives the head node alone, as Ray Serve and
        # Train place their state actors): not on the node the driver attached to, which may be any
        # node, and one lost with it would leave the plan without its board.
        board = ray.remote(num_cpus=0, max_restarts=0)(Board)
        self._board = board.options(resources={HEAD_RESOURCE: 0.001}).remote()
        self._remote = ray.remote(_task)
        self._sweeper = ray.remote(_sweep_task)

    def nodes(self, max_age_s: float = 2.0) -> list[dict[str, Any]]:
        """The cluster's nodes as Ray lists them (alive and dead), cached for ``max_age_s``."""
        now = self.clock()
        if self._nodes_cache is None or now - self._nodes_cache[0] >= max_age_s:
            self.connect()
            # Bounded: a head that dies during the call leaves Ray's client waiting until Ray ends the
            # process; the list seen last serves until the next poll's head check decides.
            listed = _within(GCS_CALL_S, self.ray.nodes)
            if listed is None:
                if self._nodes_cache is None:
                    raise BackendUnavailable(f"--backend ray: {self.where} did not list its nodes in {GCS_CALL_S:g} s")
                return self._nodes_cache[1]
            self._nodes_cache = (now, list(listed))
            for n in self._nodes_cache[1]:
                if n.get("Alive") and n.get("NodeID"):
                    models = [k for k in n.get("Resources", {}) if k.startswith(MODEL_PREFIX)]
                    self._node_models[str(n["NodeID"])] = sorted(models)
        return self._nodes_cache[1]

    def counts_as_done(self, result: RunResult) -> bool:
        """Whether an ``ok`` result on file makes its run done for this plan: one a Ray node made, on
        the GPU model this plan asks for that run (another model, or a result of the docker or local
        backend in some machine's folder, measured something else)."""
        facts = result.run.get("ray")
        if not isinstance(facts, dict):
            return False
        asked = (result.spec.get("config") or {}).get("gpu_model") or self.gpu_model
        return facts.get("gpu_model") == asked

    # -- the Backend protocol, as far as a pool has it -------------------------------------------

    def inventory(self) -> dict[str, Any]:
        nodes = [n for n in self.nodes() if n.get("Alive")]
        gpus = sum(float(n.get("Resources", {}).get("GPU", 0)) for n in nodes)
        return {"nodes": len(nodes), "gpus": [], "gpu_total": gpus, "cpus": None, "where": self.where}

    def skip_reason(self, spec: RunSpec) -> str | None:
        return placement_problem(demand(spec, self.gpu_model), self.nodes(), self.where)

    def run_info(self) -> dict[str, Any]:
        ray = {"address": self.address or "local", "session": self.session}
        return {"backend": self.name, "machine": self.machine, "ray": ray}

    def skipped(self, spec: RunSpec, reason: str) -> RunResult:
        now = now_iso()
        run = {**self.run_info(), "started_at": now, "finished_at": now}
        # The model asked for, as a node's record names it: a rerun then finds this skip (counts_as_done).
        run["ray"] = {**run["ray"], "gpu_model": gpu_model_of(spec, self.gpu_model)}
        return RunResult(status="skipped", spec=spec.to_dict(), message=reason, run=run, provenance=self._stamp())

    def _stamp(self) -> dict[str, Any]:
        identity = self.identity or code_identity.current_suite_identity()
        return provenance.provenance_of(identity, provenance.environment_here(), None)

    # -- submitting and collecting ----------------------------------------------------------------

    @property
    def pending(self) -> int:
        """Runs whose result is not on file yet: in Ray, being decided (a crashed worker), or held."""
        return len(self._pending) + len(self._suspects) + len(self._unsaved)

    def submit(
        self, spec: RunSpec, *, attempt: int = 1, retry_of: str | None = None, pin: list[str] | None = None
    ) -> None:
        """pin: custom resources the task must also find on its node (a retry's: the lost node's GPU model)."""
        self.connect()
        self._counter += 1
        key = f"{self.session}-{self._counter}"
        need = demand(spec, self.gpu_model)
        custom = {k: v for k, v in need.items() if k not in ("CPU", "GPU")}
        custom.update({k: MODEL_SHARE for k in pin or []})
        job = {
            "suite": self.identity,
            "session": self.session,
            "address": self.address or "local",
            "key": key,
            "attempt": attempt,
            "retry_of": retry_of,
            "gpu_model": self.gpu_model,
            "peaks": self._peaks,
            "pin": list(pin or []),
        }
        ref = self._remote.options(
            num_cpus=need["CPU"],
            num_gpus=need.get("GPU", 0),
            resources=custom,
            max_retries=0,
            retry_exceptions=False,
            name=f"suite {spec.scenario} [{spec.point_label}] rep {spec.repetition}",
        ).remote(spec.to_dict(), job, self._board)
        self._pending[ref] = Attempt(spec, key, attempt, retry_of, submitted=self.clock(), pin=list(pin or []))

    def collect(self, timeout: float = POLL_S) -> list[Finished]:
        """Results to save now: those that arrived within ``timeout``, after the plan's checks
        (deadlines, crashed workers whose node died, runs no alive node can take any more, the head
        still answering), and those handed out before but not yet ``saved``."""
        if (self._pending or self._suspects) and self.gone is None:
            self._poll(timeout)
        return list(self._unsaved)

    def saved(self, done: Finished) -> None:
        """``done`` is on file: the pool lets go of it."""
        self._unsaved = [d for d in self._unsaved if d is not done]

    def held(self) -> list[Finished]:
        """The results taken from Ray and not yet saved (what ``cancel_all`` returns, also when a
        second Ctrl-C ended it early)."""
        return list(self._unsaved)

    def _poll(self, timeout: float) -> None:
        """Take what Ray has for the plan into ``_unsaved``, each result as soon as it is made."""
        # First, and before any call that needs the head: once the head is gone, Ray's calls block,
        # and Ray ends this process on its own within a minute (its raylet or GCS client gives up).
        if not self._head_answers():
            self.gone = (
                f"{self.where} stopped answering (its head at {self.gcs_address} refuses connections, or has "
                f"not answered for {HEAD_SILENT_S:g} s); "
                "the plan ends here. Results already saved are kept; rerun the same command to resume."
            )
            self._salvage()
            self._abandon_all(
                f"outcome unknown: {self.where} stopped answering (its head at {self.gcs_address} is gone) "
                "while this run was in progress on its node, and its result, if any, could not come back"
            )
            return
        ray = self.ray
        if self._pending:
            done, _ = ray.wait(list(self._pending), num_returns=len(self._pending), timeout=timeout)
        else:  # only crashed workers to decide
            time.sleep(timeout)
            done = []
        # Each record is held before its attempt is let go: an interrupt in between finds it twice at
        # most (cancel_all skips an attempt already held), never nowhere.
        for ref in done:
            self._hold(self._finished(ref, self._pending[ref]))
            del self._pending[ref]
        self._decide_suspects()
        self._check_deadlines_and_placement()
        self._note_new_nodes()

    def _hold(self, records: list[Finished]) -> None:
        self._unsaved += records

    def _held_keys(self) -> set[str]:
        return {d.key for d in self._unsaved if d.key}

    def _note_new_nodes(self) -> None:
        """List the nodes again when a task started on a node the pool has not seen alive: a retry of
        a run lost there goes to that node's GPU model, which only the node list tells."""
        if any(m.get("node_id") and m["node_id"] not in self._node_models for m in self._last_marks.values()):
            try:
                self.nodes(max_age_s=0)
            except BackendUnavailable:
                pass

    def _salvage(self) -> None:
        """Results that reached this driver before its head went away (Ray keeps a task's reply with
        the caller that owns it): taken, each within a short limit, as a call may block for good."""
        ray = self.ray
        try:
            refs = list(self._pending)
            found = _within(GCS_CALL_S, lambda: ray.wait(refs, num_returns=len(refs), timeout=0))
        except Exception:  # noqa: BLE001 - nothing can be asked any more
            return
        for ref in (found or ([], []))[0]:
            try:
                value = _within(GCS_CALL_S, functools.partial(ray.get, ref, timeout=GCS_CALL_S))
            except Exception:  # noqa: BLE001 - a failed task: its cause is gone with the head
                continue
            if isinstance(value, dict) and "result" in value:
                attempt = self._pending[ref]
                self._hold([_result_of(attempt, value)])
                del self._pending[ref]

    def _finished(self, ref: Any, attempt: Attempt) -> list[Finished]:
        ray = self.ray
        try:
            value = ray.get(ref)
        except (ray.exceptions.TaskCancelledError, ray.exceptions.WorkerCrashedError) as exc:
            if attempt.cancelled_for == "timeout":  # a forced cancel ends the worker: a crash to Ray
                return [self._recorded(attempt, "timeout", self._timeout_text(attempt))]
            if isinstance(exc, ray.exceptions.WorkerCrashedError):
                return self._lost(attempt, exc)
            return [self._recorded(attempt, "error", "the run's Ray task was cancelled")]
        except ray.exceptions.NodeDiedError as exc:
            return self._lost(attempt, exc)
        except getattr(ray.exceptions, "OutOfMemoryError", ()) as exc:
            # Ray's memory monitor killed the task's worker for its node's memory use: the run's
            # container or subprocess lives on without it, so it is swept.
            self._sweep_attempt(attempt)
            why = f"out of host memory: Ray's memory monitor killed the run's task on its node: {_first_line(exc)}"
            return [self._recorded(attempt, "host_oom", why)]
        except ray.exceptions.RayTaskError as exc:
            return [self._recorded(attempt, "error", f"the run's Ray task failed on its node: {_first_line(exc)}")]
        except ray.exceptions.RayError as exc:
            return [self._recorded(attempt, "error", f"Ray could not run the task: {type(exc).__name__}: {exc}")]
        if value.get("stopped"):  # it stopped its run when the board asked, or found it gone
            if attempt.cancelled_for == "timeout":
                return [self._recorded(attempt, "timeout", self._timeout_text(attempt))]
            if value["stopped"] == BOARD_GONE:
                why = "the plan's board (a Ray actor on the cluster's head) is gone, so its node ran nothing"
                return [self._recorded(attempt, "error", why)]
            return [self._recorded(attempt, "error", "the run was stopped before it ended (the plan was stopping)")]
        for key, peak in value.get("peaks") or []:
            self._peaks.setdefault(value["node_id"], []).append([key, peak])
        return [_result_of(attempt, value)]

    def _lost(self, attempt: Attempt, exc: BaseException) -> list[Finished]:
        """A task whose worker or node died: "node lost" when its node is dead (Ray said so, or lists
        it dead), then one retry on a node of the same GPU model; a worker crash on a node that stays
        alive LOST_NODE_WAIT_S (Ray's health check takes a while) is an error, not retried. Until
        that is known the run waits among the suspects, decided on later polls."""
        mark = self._marks().get(attempt.key, {})
        node_id = mark.get("node_id")
        if isinstance(exc, self.ray.exceptions.NodeDiedError):
            return self._node_lost(attempt, str(node_id) if node_id else None)
        if not node_id:
            return [self._crashed(attempt, exc)]
        self._suspects[attempt.key] = _Suspect(attempt, exc, str(node_id), self.clock() + LOST_NODE_WAIT_S)
        self._decide_suspects(max_age_s=0)
        return []

    def _decide_suspects(self, max_age_s: float = 1.0) -> None:
        """Hold the record of every suspect whose node Ray now lists dead, or that outlived the wait."""
        if not self._suspects:
            return
        nodes = {n.get("NodeID"): n for n in self.nodes(max_age_s=max_age_s)}
        for key, suspect in list(self._suspects.items()):
            node = nodes.get(suspect.node_id)
            if node is None or not node.get("Alive"):
                self._hold(self._node_lost(suspect.attempt, suspect.node_id))
            elif self.clock() >= suspect.until:
                self._hold([self._crashed(suspect.attempt, suspect.exc)])
            else:
                continue
            del self._suspects[key]

    def _crashed(self, attempt: Attempt, exc: BaseException) -> Finished:
        self._sweep_attempt(attempt)  # its run's container or subprocess outlives the worker
        where = f"node {self._marks().get(attempt.key, {}).get('machine') or '?'}"
        return self._recorded(attempt, "error", f"the run's Ray worker on {where} crashed: {_first_line(exc)}")

    def _node_lost(self, attempt: Attempt, node_id: str | None) -> list[Finished]:
        mark = self._marks().get(attempt.key, {})
        where = f"node {mark.get('machine') or node_id or '?'}"
        out = [self._recorded(attempt, "error", f"node lost: {where} of {self.where} died during the run")]
        if attempt.attempt >= 2:
            return out
        # The same GPU model as the lost node: the run's own, else the lost node's gpu_model resources.
        problem = None
        pin: list[str] = []
        if not gpu_model_of(attempt.spec, self.gpu_model):
            if node_id is None or node_id not in self._node_models:
                problem = "the lost node's GPU model is not known (the node list never showed it alive)"
            else:
                pin = self._node_models[node_id]
        need = demand(attempt.spec, self.gpu_model) | {k: MODEL_SHARE for k in pin}
        problem = problem or placement_problem(need, self.nodes(max_age_s=0), self.where)
        if problem:
            lost = out[0].result
            out[0] = replace(out[0], result=replace(lost, message=f"{lost.message}; not retried: {problem}"))
            return out
        self.submit(attempt.spec, attempt=2, retry_of=attempt.key, pin=pin)
        out[0] = replace(out[0], retried=True)
        return out

    def _sweep_attempt(self, attempt: Attempt) -> None:
        """Sweep, on the node it ran on, what attempt left (fire and forget; ``close`` waits for it)."""
        node_id = self._marks().get(attempt.key, {}).get("node_id")
        if node_id:
            self._sweep([str(node_id)], attempt.key)

    def _sweep(self, node_ids: list[str], attempt: str | None = None) -> list[Any]:
        """Submit ``sweep`` to each node (pinned to it, asking for no resource); the refs."""
        refs = []
        for node_id in node_ids:
            try:
                strategies = self.ray.util.scheduling_strategies
                strategy = strategies.NodeAffinitySchedulingStrategy(node_id=node_id, soft=False)
                refs.append(
                    self._sweeper.options(
                        num_cpus=0, max_retries=0, scheduling_strategy=strategy, name="suite sweep"
                    ).remote(self.session, attempt)
                )
            except Exception:  # noqa: BLE001 - the worker's own deadline ends its run then
                pass
        self._sweeps += refs
        return refs

    def _timeout_text(self, attempt: Attempt) -> str:
        limit = attempt.spec.timeout_s
        if self._marks().get(attempt.key, {}).get("ready_for_s") is None:
            return (
                f"the run's task was still getting its image ready {READY_LIMIT_S:g} s + {limit:g} s (timeout_s) "
                f"+ {DEADLINE_MARGIN_S + 5:g} s after it started; cancelled by the orchestrator"
            )
        return (
            f"the run's task was still running {limit:g} s (timeout_s) + {DEADLINE_MARGIN_S + 5:g} s after its "
            "image was ready; cancelled by the orchestrator (the node's own deadline did not end it)"
        )

    def _check_deadlines_and_placement(self) -> None:
        if not self._pending:
            return
        marks = self._marks()
        now = self.clock()
        nodes = None
        for ref, attempt in list(self._pending.items()):
            mark = marks.get(attempt.key, {})
            ready_for = mark.get("ready_for_s")
            started_for = mark.get("started_for_s")
            limit = attempt.spec.timeout_s + 5.0 + DEADLINE_MARGIN_S
            if attempt.cancelled_for == "timeout" and now - (attempt.cancelled_at or now) > CANCEL_GRACE_S:
                self.ray.cancel(ref, force=True)  # it did not stop when asked: its process goes
                attempt.cancelled_at = now
                self._sweep_attempt(attempt)  # and what its run started, after it
            elif attempt.cancelled_for is None and (
                (ready_for is not None and ready_for > limit)
                or (ready_for is None and started_for is not None and started_for > READY_LIMIT_S + limit)
            ):
                attempt.cancelled_for, attempt.cancelled_at = "timeout", now
                self._ask_stop([attempt.key])  # the task stops its run and removes its container
            elif started_for is None and attempt.cancelled_for is None:
                # Queued: can any alive node still take it? (Its nodes may all have died.)
                nodes = nodes if nodes is not None else self.nodes()
                need = demand(attempt.spec, self.gpu_model) | {k: MODEL_SHARE for k in attempt.pin}
                problem = placement_problem(need, nodes, self.where)
                since = self._unplaceable_since.setdefault(attempt.key, now) if problem else None
                if problem is None:
                    self._unplaceable_since.pop(attempt.key, None)
                elif since is not None and now - since >= LOST_NODE_WAIT_S:  # a node may be rejoining (a pod replaced)
                    attempt.cancelled_for = "unplaceable"
                    self.ray.cancel(ref, force=True)
                    text = f"no alive node can take this run any more: {problem}"
                    self._hold([self._recorded(attempt, "error", text)])
                    self._pending.pop(ref)

    def _ask_stop(self, keys: list[str] | None) -> bool:
        """Ask the board to stop ``keys`` (None: every attempt); whether it said so in time."""
        board, ray = self._board, self.ray
        try:
            return bool(_within(GCS_CALL_S, lambda: ray.get(board.stop.remote(keys), timeout=GCS_CALL_S)))
        except Exception:  # noqa: BLE001 - the forced cancel after the grace still ends the task
            return False

    def _marks(self) -> dict[str, dict[str, Any]]:
        """The board's snapshot (the last one seen once the cluster is gone: the board went with it)."""
        if self.gone is None:
            self._snapshot()  # without the board the tasks' own deadlines still hold
        return self._last_marks

    def _snapshot(self) -> dict[str, dict[str, Any]] | None:
        """The board's snapshot now, or None when it did not come within GCS_CALL_S."""
        try:
            self._last_marks = dict(self.ray.get(self._board.snapshot.remote(), timeout=GCS_CALL_S))
        except Exception:  # noqa: BLE001
            return None
        return self._last_marks

    def _head_answers(self) -> bool:
        """Whether the cluster's GCS still accepts connections (HEAD_CHECKS refusals in a row: gone)."""
        if not self.gcs_address:
            return True
        host, _, port = self.gcs_address.rpartition(":")
        for attempt in range(HEAD_CHECKS):
            try:
                with socket.create_connection((host or "127.0.0.1", int(port)), timeout=2):
                    self._silent_since = None
                    return True
            except (ConnectionRefusedError, ConnectionResetError):
                pass  # the head's machine answers: nothing listens there any more
            except OSError:
                # No answer at all (a network pause, a busy host): gone only when it lasts; Ray's own
                # clients wait far longer (RAY_gcs_rpc_server_reconnect_timeout_s, set above).
                now = self.clock()
                self._silent_since = self._silent_since if self._silent_since is not None else now
                return now - self._silent_since < HEAD_SILENT_S
            if attempt < HEAD_CHECKS - 1:
                time.sleep(HEAD_RETRY_S)
        return False

    def _recorded(self, attempt: Attempt, status: str, message: str) -> Finished:
        """A result the orchestrator writes itself (the task returned none): under the machine the
        task ran on, when known, else this one's."""
        mark = self._marks().get(attempt.key, {})
        machine = str(mark.get("machine") or self.machine)
        now = now_iso()
        started_for = mark.get("started_for_s")
        facts: dict[str, Any] = {
            "node_id": mark.get("node_id"),
            "machine": machine,
            "address": self.address or "local",
            "attempt": attempt.attempt,
            "attempt_id": attempt.key,
            "session": self.session,
            "gpu_model": gpu_model_of(attempt.spec, self.gpu_model),
        }
        if attempt.retry_of:
            facts["retry_of"] = attempt.retry_of
        if attempt.pin:
            facts["pinned_to"] = list(attempt.pin)
        run = {
            # The node's backend when its task said (it returned no result); else this pool's name.
            "backend": mark.get("backend") or self.name,
            "machine": machine,
            "started_at": _iso(time.time() - started_for) if started_for is not None else now,
            "finished_at": now,
            "ray": facts,
        }
        spec = attempt.spec.to_dict()
        result = RunResult(status=status, spec=spec, message=message, run=run, provenance=self._stamp())
        return Finished(attempt.spec, machine, result, key=attempt.key)

    def _abandon_all(self, why: str) -> None:
        """The runs in flight when the cluster went away: the started ones and the crashed workers'
        recorded (held), the queued ones left for the next run (they never ran)."""
        marks = self._marks()
        started = [a for a in self._pending.values() if marks.get(a.key, {}).get("started_for_s") is not None]
        self._hold([self._recorded(a, "error", why) for a in started])
        self._pending.clear()
        self._hold_suspects(why)

    def _hold_suspects(self, why: str) -> None:
        """Record every undecided crashed worker's run with ``why`` (its node is swept, as for a crash)."""
        for key, suspect in list(self._suspects.items()):
            if self.gone is None:
                self._sweep_attempt(suspect.attempt)
            self._hold([self._recorded(suspect.attempt, "error", why)])
            del self._suspects[key]

    # -- stopping ---------------------------------------------------------------------------------

    def cancel_all(self, say: Callable[[str], None] = print) -> list[Finished]:
        """Stop every task: the started ones through the board (each kills and removes its container),
        forced when one has not ended within CANCEL_GRACE_S or at a second Ctrl-C, and then what a
        forced task's run left on its node is swept; the queued ones are left alone (a queued task
        that starts now sees the stop and runs nothing, and those still queued end with the job when
        the pool leaves the cluster).
        Returns the results to be saved, all held until ``saved`` (a second Ctrl-C loses none): those
        taken from Ray before, the runs that ended meanwhile (a stopped one has none), and crashed
        workers' runs."""
        self._hold_suspects("the run's Ray worker crashed; the plan stopped before Ray said whether its node died")
        held = self._held_keys()  # attempts already recorded (an interrupt came as one was let go)
        for ref in [r for r, a in self._pending.items() if a.key in held]:
            del self._pending[ref]
        if not self._pending or not self._connected or self.gone is not None:
            self._pending.clear()
            return list(self._unsaved)
        ray = self.ray
        # Until the board says which tasks started, any may have: a second Ctrl-C forces them all.
        running: list[Any] = list(self._pending)
        say(
            f"stopping {len(self._pending)} Ray task(s): a started one removes its container, a queued one "
            "does not start (Ctrl-C again: force at once)"
        )
        try:
            # The snapshot after the stop: a task marked started before it is waited for, any other
            # sees the stop when it marks.
            asked = self._ask_stop(None)
            marks = self._snapshot() if asked else None
            if marks is not None:
                running = [r for r, a in self._pending.items() if marks.get(a.key, {}).get("started_for_s") is not None]
            # Without a snapshot every task may be running: all are waited for (and forced after).
            if not asked:  # the board answered nothing in time: Ray's polite cancel instead
                for ref in running:
                    try:
                        ray.cancel(ref, force=False)
                    except Exception:  # noqa: BLE001
                        pass
            try:
                done = ray.wait(running, num_returns=len(running), timeout=CANCEL_GRACE_S)[0] if running else []
            except Exception:  # noqa: BLE001
                done = []
            self._take_ended(done, running)
        finally:
            # Also after a second Ctrl-C: what ended by now is taken, what has not is forced, and what
            # a forced task's run started on the node (a container, a worker's process group)
            # outlives it and is swept on every node.
            try:
                self._take_ended(ray.wait(running, num_returns=len(running), timeout=0)[0] if running else [], running)
            except BaseException:  # noqa: BLE001 - Ray refuses, or Ctrl-C once more: the rest is forced all the same
                pass
            forced = 0
            for ref in running:
                try:
                    ray.cancel(ref, force=True)
                    forced += 1
                except Exception:  # noqa: BLE001 - done already, or the cluster is gone
                    pass
            self._pending.clear()
            if forced:
                self._sweep_everywhere(forced, say)
        return list(self._unsaved)

    def _take_ended(self, done: list[Any], running: list[Any]) -> None:
        """Hold the result of each task in ``done`` that ended with one (a run stopped by the board has
        none); a task Ray's memory monitor killed, or whose worker crashed, has its attempt swept."""
        ray = self.ray
        for ref in done:  # each leaves ``running`` (the tasks to force) once it is dealt with
            attempt = self._pending[ref]
            try:
                value = ray.get(ref, timeout=GCS_CALL_S)
            except Exception as exc:  # noqa: BLE001 - cancelled, or failed: no result to keep
                killed = [getattr(ray.exceptions, n, None) for n in ("OutOfMemoryError", "WorkerCrashedError")]
                if any(c is not None and isinstance(exc, c) for c in killed):
                    self._sweep_attempt(attempt)
                running.remove(ref)
                continue
            if isinstance(value, dict) and "result" in value:
                self._hold([_result_of(attempt, value)])
                del self._pending[ref]
            running.remove(ref)

    def _sweep_everywhere(self, forced: int, say: Callable[[str], None]) -> None:
        """Sweep every alive node for the plan's containers and workers, waiting up to SWEEP_WAIT_S."""
        try:
            alive = [str(n["NodeID"]) for n in self.nodes(max_age_s=0) if n.get("Alive") and n.get("NodeID")]
        except Exception:  # noqa: BLE001 - the workers' own deadlines end their runs then
            return
        say(f"{forced} task(s) forced: removing what their runs left on {len(alive)} node(s)")
        self._wait_for_sweeps(self._sweep(alive), say)

    def _wait_for_sweeps(self, refs: list[Any], say: Callable[[str], None]) -> None:
        refs = [r for r in refs if r is not None]
        if not refs:
            return
        try:
            done, left = self.ray.wait(refs, num_returns=len(refs), timeout=SWEEP_WAIT_S)
        except Exception:  # noqa: BLE001
            return
        self._sweeps = [r for r in self._sweeps if r not in done]
        removed = []
        for ref in done:
            try:
                found = self.ray.get(ref, timeout=GCS_CALL_S)
            except Exception:  # noqa: BLE001
                continue
            removed += list(found.get("containers", [])) + [f"pid {p}" for p in found.get("processes", [])]
        if removed:
            say(f"removed after the forced stop: {', '.join(removed)}")
        if left:
            say(f"{len(left)} node(s) did not sweep within {SWEEP_WAIT_S:g} s: their runs end at their own deadline")

    def close(self) -> None:
        """Cancel what is left and leave the cluster (stopping the local instance the pool started)."""
        if not self._connected:
            return
        if self.gone is not None:
            self._connected = False  # nothing to cancel or leave: every call would block (see collect)
            return
        try:
            self.cancel_all(say=lambda _line: None)
            # The sweeps submitted during the plan end with its job: they are waited for first.
            self._wait_for_sweeps(list(self._sweeps), say=lambda _line: None)
        finally:
            self._connected = False
            try:
                self.ray.shutdown()
            except Exception:  # noqa: BLE001
                pass


def _task(spec_data: dict[str, Any], job: dict[str, Any], board: Any) -> dict[str, Any]:
    """The Ray task: runs on the node Ray chose."""
    import ray

    return run_point(spec_data, job, ray, board)


def _result_of(attempt: Attempt, value: dict[str, Any]) -> Finished:
    """The result a task sent back, to be saved under the machine it ran on."""
    return Finished(attempt.spec, value["machine"], RunResult.from_dict(value["result"]), key=attempt.key)


def _sweep_task(session: str, attempt: str | None) -> dict[str, Any]:
    """The Ray task that runs ``sweep`` on the node it is pinned to."""
    return sweep(session, attempt)


def _gcs_address(info: Any, address: str | None) -> str | None:
    try:
        found = info.address_info.get("gcs_address") if hasattr(info, "address_info") else info["gcs_address"]
    except Exception:  # noqa: BLE001
        found = None
    return str(found or address or "") or None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[-1][:300] if text else type(exc).__name__


def _iso(unix: float) -> str:
    from datetime import UTC, datetime

    return datetime.fromtimestamp(unix, UTC).isoformat(timespec="microseconds")
