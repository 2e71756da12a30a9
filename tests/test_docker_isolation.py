"""Containers on a real engine: least privilege that holds, no orphans, dead sessions reaped, live ones kept.

Each container of a run carries its session and its orchestrator (host, pid, start time, deadline).
A new session removes what dead sessions left on the engine, running or exited, and never touches a
live session's; the worker ends itself shortly after its limit when no orchestrator is left.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from docker_fixtures import (  # noqa: F401 - fixtures
    REPO,
    SMALL_SCENARIO,
    backend_factory,
    engine_client,
    image_fixture,
    session_containers,
    sigkill_once_running,
    small_specs,
)

from suite.backends import docker_parts as parts
from suite.backends.base import spec_json, worker_env
from suite.backends.docker import DockerBackend
from suite.backends.docker_run import ContainerRun

pytestmark = pytest.mark.docker

# Run as the worker would be, with the same settings: what can it do?
PROBE_RIGHTS = r"""
import json, os
def can_write(path):
    try:
        with open(path, "w") as fh:
            fh.write("x")
        return True
    except OSError as exc:
        return exc.strerror
status = dict(l.split(":", 1) for l in open("/proc/self/status") if ":" in l)
print(json.dumps({
    "uid": os.getuid(), "gid": os.getgid(),
    "root_fs": can_write("/etc/suite-probe"), "code": can_write("/work/suite/__init__.py"),
    "spec": can_write("/work/spec.json"), "out": can_write("/work/out/x"), "tmp": can_write("/tmp/x"),
    "cap_eff": status["CapEff"].strip(), "no_new_privs": status["NoNewPrivs"].strip(),
    "net": sorted(os.listdir("/sys/class/net")),
}))
"""


def test_worker_rights_are_least_privilege(backend, client: Any, tmp_path: Path) -> None:
    import json

    docker_backend: DockerBackend = backend()
    spec = small_specs(tmp_path)[0]
    docker_client = docker_backend._connect()
    _, image = docker_backend._image(docker_client, spec)
    kwargs = docker_backend._container_kwargs(spec, image, worker_env(spec), [], [])
    kwargs["command"] = ["python3", "-c", PROBE_RIGHTS]
    payload = parts.run_payload(parts.code_files(), spec_json(spec), "out")
    run = ContainerRun.start(docker_backend, docker_client, kwargs, payload, {})
    try:
        assert run.wait().code == 0
        seen = json.loads(run.container.logs().decode().strip().splitlines()[-1])
    finally:
        run.cleanup()
    assert (seen["uid"], seen["gid"]) == (65534, 65534)
    assert seen["root_fs"] == "Read-only file system"
    assert seen["code"] == "Permission denied" and seen["spec"] == "Permission denied"
    assert seen["out"] is True and seen["tmp"] is True
    assert int(seen["cap_eff"], 16) == 0 and seen["no_new_privs"] == "1"
    assert seen["net"] == ["lo"]
    assert run.facts["isolation"]["user"] == "65534:65534"


def _sleeper(client: Any, image: str, labels: dict[str, str], *, running: bool = True) -> Any:
    command = ["python3", "-c", "import time; time.sleep(300)" if running else "pass"]
    container = client.containers.run(image, command, detach=True, network_mode="none", labels=labels)
    if not running:
        container.wait(timeout=60)
    return container


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


def test_new_session_removes_dead_sessions_only(client: Any, test_image: str) -> None:
    host = parts.orchestrator_label().split(":")[0]
    now = time.time()
    cases = {
        "dead-here-running": ({parts.LABEL_ORCHESTRATOR: f"{host}:{_dead_pid()}:1"}, True, True),
        "dead-here-exited": ({parts.LABEL_ORCHESTRATOR: f"{host}:{_dead_pid()}:1"}, False, True),
        "pid-reused": ({parts.LABEL_ORCHESTRATOR: f"{host}:{os.getpid()}:1"}, True, True),
        "live-here": ({parts.LABEL_ORCHESTRATOR: parts.orchestrator_label()}, True, False),
        # The same hostname in another pid namespace (or on another machine of that name): its pid
        # means nothing here, so only its own deadline can end it.
        "same-name-other-namespace": (
            {
                parts.LABEL_ORCHESTRATOR: f"{host.split('~')[0]}~otherboot~1:{_dead_pid()}:1",
                parts.LABEL_DEADLINE: f"{now + 3600:.0f}",
            },
            True,
            False,
        ),
        "elsewhere-past-deadline": (
            {parts.LABEL_ORCHESTRATOR: "other-host:1:1", parts.LABEL_DEADLINE: f"{now - 10:.0f}"},
            False,
            True,
        ),
        "elsewhere-within-deadline": (
            {parts.LABEL_ORCHESTRATOR: "other-host:1:1", parts.LABEL_DEADLINE: f"{now + 3600:.0f}"},
            True,
            False,
        ),
        "unknown-owner": ({}, True, False),
    }
    made = {}
    try:
        for name, (labels, running, _) in cases.items():
            session = {parts.LABEL_SESSION: f"test-reap-{name}-{os.getpid()}"}
            made[name] = _sleeper(client, test_image, {**session, **labels}, running=running)
        newcomer = DockerBackend(machine="test", image=test_image)
        newcomer._connect()
        newcomer.close()
        for name, (_, _, dead) in cases.items():
            session = f"test-reap-{name}-{os.getpid()}"
            left = session_containers(client, session)
            # Another session on this engine may reap a dead one first; the engine's state is what counts.
            assert (left == []) is dead, (name, [c.status for c in left])
    finally:
        for container in made.values():
            try:
                container.remove(force=True)
            except Exception:  # noqa: BLE001 - reaped by the test's subject
                pass


LONG_SCENARIO = """\
name: {name}
question: Does a container outlive its orchestrator?
model: {{hidden: [256, 256]}}
training: {{epochs: 1000}}
data: {{allow_synthetic: true, train_samples: 8192, test_samples: 256}}
repeats: 1
timeout_s: {timeout}
measure: {{step_overhead: false}}
"""


def long_spec(tmp_path: Path, timeout_s: float) -> Any:
    from suite.spec import plan, scenario

    path = tmp_path / "long.yaml"
    path.write_text(LONG_SCENARIO.format(name="long", timeout=timeout_s), encoding="utf-8")
    return plan.expand(scenario.load(path))[0]


def test_unwatched_worker_ends_itself_after_its_limit(backend, tmp_path: Path) -> None:
    # Nobody waits on, streams from or kills this container, as after the orchestrator's death.
    import json

    timeout_s = 6
    docker_backend: DockerBackend = backend()
    spec = long_spec(tmp_path, timeout_s)
    docker_client = docker_backend._connect()
    _, image = docker_backend._image(docker_client, spec)
    kwargs = docker_backend._container_kwargs(spec, image, worker_env(spec), [], [])
    payload = parts.run_payload(parts.code_files(), spec_json(spec), "out")
    started = time.monotonic()
    run = ContainerRun.start(docker_backend, docker_client, kwargs, payload, {})
    try:
        outcome = run.container.wait(timeout=timeout_s + 60)
        elapsed = time.monotonic() - started
        record = json.loads(run.result() or b"{}")
    finally:
        run.cleanup()
    assert outcome["StatusCode"] == 124, outcome  # the worker's own exit, not a kill
    assert timeout_s < elapsed < timeout_s + 30
    assert record["status"] == "timeout" and "own deadline" in record["message"]


def test_sigkilled_orchestrator_leaves_nothing_after_the_next_session(
    backend, client: Any, test_image: str, tmp_path: Path
) -> None:
    name = f"orphan_{os.getpid()}"
    path = tmp_path / f"{name}.yaml"
    path.write_text(LONG_SCENARIO.format(name=name, timeout=600), encoding="utf-8")
    # A concurrent, live session with a run in flight: never to be disturbed.
    live = backend()
    live_container = _sleeper(client, test_image, live.labels())
    cmd = [sys.executable, "-m", "suite", "run", str(path), "--backend", "docker", "--results", str(tmp_path / "r")]
    cmd += ["--allow-synthetic"]
    env = {**os.environ, "PYTHONPATH": str(REPO), "SUITE_DOCKER_IMAGE": test_image}
    proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    label = f"suite.scenario={name}"
    try:
        dead_session = sigkill_once_running(client, label, proc)
        newcomer = DockerBackend(machine="test", image=test_image)
        newcomer._connect()
        newcomer.close()
        # Another session on this engine may have reaped it first: either way, nothing is left.
        assert session_containers(client, dead_session) == []
        live_container.reload()
        assert live_container.status == "running", "a live session's container is never removed"
    finally:
        if proc.poll() is None:
            proc.kill()
        for c in client.containers.list(ignore_removed=True, all=True, filters={"label": label}):
            c.remove(force=True)
        live_container.remove(force=True)
