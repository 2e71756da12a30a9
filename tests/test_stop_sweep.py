"""What a stop leaves behind, on real parts.

A backend closed (from another thread: a Ray task asked to stop) while its worker is starting stops
that worker itself once it exists: a subprocess of this machine's Python, a container on this
machine's engine. ``leftovers.sweep`` removes what a task killed by force left on its node, found
by the tags its backend gave it (container labels, a local worker's environment), and nothing else.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import pytest
from docker_fixtures import (  # noqa: F401 - fixtures
    assert_no_container_left,
    backend_factory,
    engine_client,
    image_fixture,
    small_specs,
)

from suite.backends import local as local_backend
from suite.backends.base import tag_env, tag_labels
from suite.backends.docker_run import ContainerRun
from suite.backends.ray_cluster import leftovers


def test_a_local_worker_that_starts_after_the_close_is_stopped_at_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    backend = local_backend.LocalBackend(machine="test")
    started: list[subprocess.Popen] = []
    real = subprocess.Popen

    def close_first(cmd: Any, *args: Any, **kwargs: Any) -> subprocess.Popen:
        if "suite.worker" not in cmd:  # git and the like go through the same module
            return real(cmd, *args, **kwargs)
        backend.close()  # the stop arrives while the worker is being started: close finds nothing yet
        proc = real(cmd, *args, **kwargs)
        started.append(proc)
        return proc

    monkeypatch.setattr(local_backend.subprocess, "Popen", close_first)
    result = backend.run(small_specs(tmp_path)[0])
    assert result.status == "error" and "the backend was closed" in result.message, result.message
    [proc] = started
    assert proc.poll() is not None, "the worker was stopped, not left to run"
    assert proc.returncode == -9, proc.returncode


@pytest.mark.docker
def test_a_container_that_starts_after_the_close_is_removed(
    backend: Any, client: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    docker_backend = backend()
    real = ContainerRun.start.__func__  # type: ignore[attr-defined]
    made: list[str] = []

    def close_first(cls: Any, owner: Any, engine: Any, kwargs: dict, payload: bytes, facts: dict) -> ContainerRun:
        owner.close()  # the close lists the session's containers before this one exists
        run = real(cls, owner, engine, kwargs, payload, facts)
        made.append(run.container.id)
        return run

    monkeypatch.setattr(ContainerRun, "start", classmethod(close_first))
    result = docker_backend.run(small_specs(tmp_path)[0])
    assert result.status == "error" and "the backend was closed" in result.message, result.message
    assert made, "the container was made after the close"
    assert_no_container_left(client, f"suite.session={docker_backend.session}")


@pytest.mark.docker
def test_sweep_removes_the_tagged_containers_of_an_attempt_then_of_the_plan(client: Any, test_image: str) -> None:
    plan, other_plan = f"p{uuid.uuid4().hex[:8]}", f"q{uuid.uuid4().hex[:8]}"
    tags = {
        "attempt": {leftovers.TAG_PLAN: plan, leftovers.TAG_ATTEMPT: f"{plan}-1"},
        "sibling": {leftovers.TAG_PLAN: plan, leftovers.TAG_ATTEMPT: f"{plan}-2"},
        "stranger": {leftovers.TAG_PLAN: other_plan, leftovers.TAG_ATTEMPT: f"{other_plan}-1"},
    }
    made = {
        name: client.containers.run(
            test_image, ["300"], entrypoint=["sleep"], detach=True, network_mode="none", labels=tag_labels(t)
        )
        for name, t in tags.items()
    }
    try:
        found = leftovers.sweep(plan, f"{plan}-1", settle_s=0)
        assert found["containers"] == [made["attempt"].short_id], found
        left = {c.id for c in client.containers.list(ignore_removed=True, all=True)}
        assert made["attempt"].id not in left and {made["sibling"].id, made["stranger"].id} <= left
        found = leftovers.sweep(plan, settle_s=0)
        assert found["containers"] == [made["sibling"].short_id], found
        assert made["stranger"].id in {c.id for c in client.containers.list(ignore_removed=True, all=True)}, (
            "another plan's stays"
        )
    finally:
        for container in made.values():
            try:
                container.remove(force=True)
            except Exception:  # noqa: BLE001 - removed by the sweep
                pass


def _sleeper(tags: dict[str, str]) -> subprocess.Popen:
    env = {**os.environ, **tag_env(tags)}
    # Its own session, as the local backend starts a worker.
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env, start_new_session=True)


def _wait_gone(proc: subprocess.Popen, seconds: float = 10) -> bool:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        if proc.poll() is not None:
            return True
        time.sleep(0.05)
    return False


def test_sweep_kills_the_tagged_local_workers_and_no_other_process() -> None:
    plan = f"p{uuid.uuid4().hex[:8]}"
    mine = _sleeper({leftovers.TAG_PLAN: plan, leftovers.TAG_ATTEMPT: f"{plan}-1"})
    sibling = _sleeper({leftovers.TAG_PLAN: plan, leftovers.TAG_ATTEMPT: f"{plan}-2"})
    untagged = _sleeper({})
    try:
        time.sleep(0.5)  # their environments are readable once they run
        found = leftovers.sweep(plan, f"{plan}-1", settle_s=0)
        assert found["processes"] == [mine.pid], found
        assert _wait_gone(mine) and mine.returncode == -9
        assert sibling.poll() is None and untagged.poll() is None
        found = leftovers.sweep(plan, settle_s=0)
        assert found["processes"] == [sibling.pid] and _wait_gone(sibling)
        assert untagged.poll() is None, "a process without the plan's tags is never touched"
    finally:
        for proc in (mine, sibling, untagged):
            if proc.poll() is None:
                proc.kill()
            proc.wait()


@pytest.mark.docker
def test_a_container_removed_by_another_session_while_listed_does_not_stop_a_sweep_or_a_reap(
    client: Any, test_image: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Nodes may share an engine, and every new session reaps dead ones: a container listed by one
    may be gone before it is inspected. The others are still removed, and nothing raises."""
    import docker

    from suite.backends import docker_parts as parts

    plan, dead_session = f"p{uuid.uuid4().hex[:8]}", f"test-race-{uuid.uuid4().hex[:8]}"
    # A session of another host, within its deadline for every other process (the other tests' Docker
    # sessions reap dead ones on this engine too, and took these between create and start) and past
    # it for this test's own reap, which reads the time an hour on.
    deadline = time.time() + 3600
    dead = {
        parts.LABEL_SESSION: dead_session,
        parts.LABEL_ORCHESTRATOR: "another-host-of-this-test:1:",
        parts.LABEL_DEADLINE: str(deadline),
    }
    real_session_dead = parts.session_dead

    def sleeper(labels: dict[str, str]) -> Any:
        return client.containers.run(
            test_image, ["300"], entrypoint=["sleep"], detach=True, network_mode="none", labels=labels
        )

    made = [sleeper(tag_labels({leftovers.TAG_PLAN: plan})) for _ in range(2)]
    made += [sleeper(dead) for _ in range(2)]
    taken_away: list[str] = []
    real_listing = docker.api.client.APIClient.containers
    # The sweep's containers first, then the dead session's: the reap lists the sweep's too, which the
    # engine may still be removing ("removal ... is already in progress", 409 to a second remove).
    targets = {c.id for c in made[:2]}

    def listing_then_one_goes(api: Any, *args: Any, **kwargs: Any) -> Any:
        listed = real_listing(api, *args, **kwargs)
        for entry in listed:  # another session removes the first of the test's containers it lists
            if entry["Id"] in targets and entry["Id"] not in taken_away:
                client.api.remove_container(entry["Id"], force=True)
                taken_away.append(entry["Id"])
                break
        return listed

    try:
        monkeypatch.setattr(docker.api.client.APIClient, "containers", listing_then_one_goes)
        found = leftovers.sweep(plan, settle_s=0)
        assert "engine" not in found, found
        targets = {c.id for c in made[2:]}
        # An hour on for this test's dead session only: the engine is shared with tests running beside
        # this one, whose containers within their own deadlines must not be reaped by this clock.
        monkeypatch.setattr(
            parts,
            "session_dead",
            lambda labels: real_session_dead(
                labels, now=deadline + 1 if labels.get(parts.LABEL_SESSION) == dead_session else None
            ),
        )
        reaped = parts.reap_dead_sessions(client, own_session="test-race-the-reaper")
        monkeypatch.undo()
        left = {c.id for c in client.containers.list(ignore_removed=True, all=True)}
        assert len(taken_away) == 2 and not {c.id for c in made} & left, (found, reaped, taken_away)
        assert len(found["containers"]) == 1 and len([r for r in reaped if dead_session in str(r)]) == 1, (
            found,
            reaped,
        )
    finally:
        monkeypatch.undo()
        for container in made:
            try:
                container.remove(force=True)
            except Exception:  # noqa: BLE001 - removed by the sweep, the reap or the race
                pass
