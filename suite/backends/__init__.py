"""Backends by name: where a RunSpec becomes a RunResult (``local`` subprocess, ``docker``
container, or ``ray``: a pool of nodes of a Ray cluster, each running its runs in one of those two).

The one registry the CLI (``--backend`` choices, ``make``) and ``run_all.sh`` (through
``python -m suite backends``, and ``environment_of`` for the locked environment a backend needs)
read. Each entry imports its module only when used, so the local backend never imports docker-py,
and nothing imports Ray unless ``--backend ray`` is asked for.

This module imports only the standard library at the top (``BackendUnavailable`` is loaded on first
use): ``run_all.sh`` asks ``environment_of`` with the system Python, before any venv exists.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from suite.backends.base import Backend

AUTO = "auto"
DEFAULT_ENVIRONMENT = "run"  # requirements/locks/<environment>-pyX.Y.txt (requirements/environments.txt)


def __getattr__(name: str) -> Any:
    # BackendUnavailable lives in base.py (which imports the suite's dependencies): loaded on first use.
    if name == "BackendUnavailable":
        from suite.backends.base import BackendUnavailable

        return BackendUnavailable
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def _unavailable(message: str) -> Exception:
    from suite.backends.base import BackendUnavailable

    return BackendUnavailable(message)


@dataclass(frozen=True)
class BackendOptions:
    """What a backend may need from the command line."""

    machine: str
    results_dir: Path
    docker_host: str | None = None
    gpus: list[str] | None = None  # host GPU indices or UUIDs the backend may hand out; None: all
    ray_address: str | None = None  # the Ray cluster's head (HOST:PORT); None: a local instance
    gpu_model: str | None = None  # runs go to nodes offering gpu_model:NAME (a scenario's own wins)


@dataclass(frozen=True)
class Entry:
    about: str
    make: Callable[[BackendOptions], Backend]
    # (usable, why): whether ``auto`` may pick it, asked in registry order.
    usable: Callable[[BackendOptions], tuple[bool, str]]
    # Makes the backend ready to run (the docker one builds the images); raises BackendUnavailable.
    # ``chosen``: False under ``auto``, where a backend that cannot be reached at all is passed over quietly.
    prepare: Callable[[BackendOptions, Callable[[str], None], bool], None] | None = None
    # The hash-locked environment (requirements/environments.txt) the orchestrator's venv must hold.
    environment: str = DEFAULT_ENVIRONMENT


def _make_local(opts: BackendOptions) -> Backend:
    from suite.backends.local import LocalBackend

    return LocalBackend(machine=opts.machine, gpus=opts.gpus, results_folder=opts.results_dir / opts.machine)


def _docker_module() -> Any:
    try:
        from suite.backends import docker
    except ImportError as exc:
        raise _unavailable(f"the docker backend cannot be loaded ({exc}); use --backend local") from None
    return docker


def _engine_where(opts: BackendOptions) -> str:
    return opts.docker_host or os.environ.get("DOCKER_HOST") or "the local socket"


def _make_docker(opts: BackendOptions) -> Backend:
    docker = _docker_module()
    # Checked once here: otherwise every point of the plan would be recorded as a failed run.
    if not docker.engine_answers(opts.docker_host):
        raise _unavailable(
            f"--backend docker: no Docker engine answers at {_engine_where(opts)}; start it, point "
            "--docker-host (or DOCKER_HOST) at one that runs, or use --backend local"
        )
    return docker.DockerBackend(
        machine=opts.machine, docker_host=opts.docker_host, results_dir=opts.results_dir, gpus=opts.gpus
    )


def _docker_usable(opts: BackendOptions) -> tuple[bool, str]:
    from suite.backends.base import BackendUnavailable

    try:
        docker = _docker_module()
    except BackendUnavailable as exc:
        return False, str(exc)
    choice, why = docker.auto_choice(docker_host=opts.docker_host)
    return choice == "docker", why


def _prepare_docker(opts: BackendOptions, say: Callable[[str], None], chosen: bool) -> None:
    """Build (or confirm) the images this machine's runs use: the CPU default, and the GPU one where GPUs are.

    Where the engine cannot pull the catalog's base (no registry answers), ``images.build_images``
    makes it from Debian packages instead, so an engine without a registry still runs every point
    in a container; only a build that fails both ways leaves ``auto`` to the next backend.
    """
    from suite.backends.base import BackendUnavailable

    try:
        docker = _docker_module()
    except BackendUnavailable:
        if not chosen:
            return
        raise
    if not docker.engine_answers(opts.docker_host):
        if not chosen:
            return
        raise BackendUnavailable(f"no Docker engine answers at {_engine_where(opts)}")
    from suite.environment import images

    if os.environ.get(docker.IMAGE_ENV):
        say(f"images given by {docker.IMAGE_ENV}; nothing to build")
        return
    try:
        # The CPU image first: the engine is asked for its host's GPUs through a container of it
        # (a remote server's GPUs, not this machine's), and only then is the GPU image known to be needed.
        images.build_images(images.needed_images(False), docker_host=opts.docker_host, progress=say)
        remote = docker.DockerBackend(machine=opts.machine, docker_host=opts.docker_host, gpus=opts.gpus)
        try:
            has_gpus = bool(remote.inventory().get("gpus"))
        finally:
            remote.close()
        if has_gpus:
            images.build_images(images.needed_images(True), docker_host=opts.docker_host, progress=say)
    except images.ImageError as exc:
        raise BackendUnavailable(str(exc)) from None


def _make_ray(opts: BackendOptions) -> Any:
    from suite.backends import ray_cluster

    pool = ray_cluster.RayPool(
        opts.machine, address=opts.ray_address, gpu_model=opts.gpu_model, results_dir=opts.results_dir
    )
    pool.connect()  # a cluster that does not answer is said once, here, not per run
    return pool


def _prepare_ray(opts: BackendOptions, say: Callable[[str], None], chosen: bool) -> None:
    """Only checks that Ray is installed: each node builds its own images before its first run."""
    del opts, say
    if chosen:
        from suite.backends.ray_cluster import head

        head.import_ray()


BACKENDS: dict[str, Entry] = {
    "docker": Entry(
        "every run in a version-pinned container (docker/images.yaml) on a Docker engine",
        _make_docker,
        _docker_usable,
        _prepare_docker,
    ),
    "local": Entry("every run as a subprocess of this machine's Python", _make_local, lambda _: (True, "")),
    "ray": Entry(
        "one plan over the nodes of a Ray cluster (--ray-address; none: a local instance), each run "
        "in a container on its node's engine, or a subprocess where the node has none",
        _make_ray,
        lambda _: (False, "ray runs only when asked for (--backend ray)"),
        _prepare_ray,
        environment="cluster",
    ),
}


def environment_of(name: str) -> str:
    """The locked environment ``--backend name`` needs (``auto`` and unknown names: the default).

    Standard library only: ``run_all.sh`` asks it before the venv exists, with the system Python::

        python3 -c 'import sys; from suite.backends import environment_of; print(environment_of(sys.argv[1]))' ray
    """
    entry = BACKENDS.get(name)
    return entry.environment if entry is not None else DEFAULT_ENVIRONMENT


def names() -> list[str]:
    """What ``--backend`` accepts: ``auto`` and every registered backend."""
    return [AUTO, *BACKENDS]


def choose(opts: BackendOptions) -> tuple[str, str]:
    """(name, why) for ``auto``: the first backend in registry order that can run here."""
    passed_over: list[str] = []
    for name, entry in BACKENDS.items():
        ok, why = entry.usable(opts)
        if ok:
            return name, "; ".join(passed_over) or why or f"{name} can run here"
        passed_over.append(why or f"{name} cannot run here")
    raise _unavailable("no backend can run here: " + "; ".join(passed_over))


def make(name: str, opts: BackendOptions) -> Backend:
    """A ready backend by name; ``auto`` must be resolved with ``choose`` first. Raises BackendUnavailable."""
    if name not in BACKENDS:
        raise _unavailable(f"no backend named {name!r}; known: {', '.join(names())}")
    return BACKENDS[name].make(opts)


def prepare(name: str, opts: BackendOptions, say: Callable[[str], None] = print) -> list[str]:
    """Get ``name`` (or, for ``auto``, every backend that has a preparation step) ready; returns what failed."""
    from suite.backends.base import BackendUnavailable

    chosen = list(BACKENDS) if name == AUTO else [name]
    failed = []
    for each in chosen:
        step = BACKENDS[each].prepare if each in BACKENDS else None
        if step is None:
            continue
        try:
            step(opts, say, name != AUTO)
        except BackendUnavailable as exc:
            failed.append(f"{each}: {exc}")
    return failed
