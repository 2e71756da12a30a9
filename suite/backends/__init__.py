"""Backends by name: where a RunSpec becomes a RunResult (``local`` subprocess or ``docker`` container).

The one registry the CLI (``--backend`` choices, ``make``) and ``run_all.sh`` (through
``python -m suite backends``) read. Each entry imports its module only when used, so the local
backend never imports docker-py.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from suite.backends.base import BackendUnavailable

if TYPE_CHECKING:
    from suite.backends.base import Backend

AUTO = "auto"


@dataclass(frozen=True)
class BackendOptions:
    """What a backend may need from the command line."""

    machine: str
    results_dir: Path
    docker_host: str | None = None
    gpus: list[str] | None = None  # host GPU indices or UUIDs the backend may hand out; None: all


@dataclass(frozen=True)
class Entry:
    about: str
    make: Callable[[BackendOptions], Backend]
    # (usable, why): whether ``auto`` may pick it, asked in registry order.
    usable: Callable[[BackendOptions], tuple[bool, str]]
    # Makes the backend ready to run (the docker one builds the images); raises BackendUnavailable.
    # ``chosen``: False under ``auto``, where a backend that cannot be reached at all is passed over quietly.
    prepare: Callable[[BackendOptions, Callable[[str], None], bool], None] | None = None


def _make_local(opts: BackendOptions) -> Backend:
    from suite.backends.local import LocalBackend

    return LocalBackend(machine=opts.machine, gpus=opts.gpus)


def _docker_module() -> Any:
    try:
        from suite.backends import docker
    except ImportError as exc:
        raise BackendUnavailable(f"the docker backend cannot be loaded ({exc}); use --backend local") from None
    return docker


def _engine_where(opts: BackendOptions) -> str:
    return opts.docker_host or os.environ.get("DOCKER_HOST") or "the local socket"


def _make_docker(opts: BackendOptions) -> Backend:
    docker = _docker_module()
    # Checked once here: otherwise every point of the plan would be recorded as a failed run.
    if not docker.engine_answers(opts.docker_host):
        raise BackendUnavailable(
            f"--backend docker: no Docker engine answers at {_engine_where(opts)}; start it, point "
            "--docker-host (or DOCKER_HOST) at one that runs, or use --backend local"
        )
    return docker.DockerBackend(
        machine=opts.machine, docker_host=opts.docker_host, results_dir=opts.results_dir, gpus=opts.gpus
    )


def _docker_usable(opts: BackendOptions) -> tuple[bool, str]:
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
    from suite import images

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


BACKENDS: dict[str, Entry] = {
    "docker": Entry(
        "every run in a version-pinned container (docker/images.yaml) on a Docker engine",
        _make_docker,
        _docker_usable,
        _prepare_docker,
    ),
    "local": Entry("every run as a subprocess of this machine's Python", _make_local, lambda _: (True, "")),
}


def names() -> list[str]:
    """What ``--backend`` accepts: ``auto`` and every registered backend."""
    return [AUTO, *BACKENDS]


def choose(opts: BackendOptions) -> tuple[str, str]:
    """(name, why) for ``auto``: the first backend in registry order that can run here."""
    passed_over = []
    for name, entry in BACKENDS.items():
        ok, why = entry.usable(opts)
        if ok:
            return name, "; ".join(passed_over) or why or f"{name} can run here"
        passed_over.append(why or f"{name} cannot run here")
    raise BackendUnavailable("no backend can run here: " + "; ".join(passed_over))


def make(name: str, opts: BackendOptions) -> Backend:
    """A ready backend by name; ``auto`` must be resolved with ``choose`` first. Raises BackendUnavailable."""
    if name not in BACKENDS:
        raise BackendUnavailable(f"no backend named {name!r}; known: {', '.join(names())}")
    return BACKENDS[name].make(opts)


def prepare(name: str, opts: BackendOptions, say: Callable[[str], None] = print) -> list[str]:
    """Get ``name`` (or, for ``auto``, every backend that has a preparation step) ready; returns what failed."""
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
