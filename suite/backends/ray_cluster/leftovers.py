"""What a task killed by force left on its node (a container, a local worker's process group), found
by its tags and removed."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

SWEEP_SETTLE_S = 2.0  # before a sweep looks: a worker being killed by force is given time to go
SWEEP_ENGINE_S = 8.0  # the limit of each of a sweep's calls to its node's engine
# The tags a node's backend gives its workers (base.tag_labels / tag_env): the plan and the attempt,
# so a sweep finds what a task killed by force left behind.
TAG_PLAN, TAG_ATTEMPT = "ray_plan", "ray_attempt"


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
            for container in client.containers.list(all=True, filters=filters, ignore_removed=True):
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


def sweep_task(session: str, attempt: str | None) -> dict[str, Any]:
    """The Ray task that runs ``sweep`` on the node it is pinned to."""
    return sweep(session, attempt)
