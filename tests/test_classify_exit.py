"""How a run ended, one rule for every backend, and the Docker deadline that can no longer lose its race.

Fast: no TensorFlow and no Docker engine. The deadline tests drive the real ``_Deadline`` and the
real ``DockerBackend._run_container`` with a stand-in for the engine's container, whose kill makes
a concurrent ``wait`` return before ``kill()`` itself does, as a real engine's answer can.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import docker
import pytest
import requests
from conftest import write_scenario

from suite import plan, scenario
from suite.backends.base import classify_exit
from suite.backends.docker import DockerBackend, _Deadline, _exit_signal
from suite.plan import RunSpec

# -- the rule -------------------------------------------------------------------------------------


def classify(**observed: Any) -> tuple[str, str]:
    seen = {"deadline_fired": False, "oom_killed": False, "exit_code": 0, "signum": None, "wrote_result": True}
    return classify_exit(**{**seen, "timeout_s": 3, **observed})


@pytest.mark.parametrize(
    "observed",
    [
        {"exit_code": -9, "signum": 9, "wrote_result": False},  # the local backend's own kill
        {"exit_code": 137, "signum": 9, "wrote_result": False},  # the Docker backend's own kill
        {"exit_code": 137, "signum": 9, "oom_killed": True},  # the kill and the OOM killer met
        {"exit_code": 0, "wrote_result": True},  # it finished just as the deadline fired
    ],
    ids=["local-kill", "container-kill", "also-oom-killed", "finished-meanwhile"],
)
def test_classify_deadline_fired_is_timeout_whatever_the_exit(observed: dict[str, Any]) -> None:
    status, message = classify(deadline_fired=True, **observed)
    assert status == "timeout"
    assert "3 s" in message and "timeout_s" in message


def test_classify_timeout_names_a_fractional_limit() -> None:
    _, message = classify(deadline_fired=True, exit_code=-9, signum=9, wrote_result=False, timeout_s=1.5)
    assert "1.5 s" in message


@pytest.mark.parametrize(
    ("exit_code", "what"), [(-9, "worker"), (137, "container")], ids=["subprocess-minus-9", "container-137"]
)
def test_classify_sigkill_the_suite_did_not_send_is_host_oom(exit_code: int, what: str) -> None:
    status, message = classify(exit_code=exit_code, signum=signal.SIGKILL, wrote_result=False, what=what)
    assert status == "host_oom"
    assert f"exit code {exit_code}" in message and what in message
    assert "OOM killer sends SIGKILL when memory runs out" in message
    assert "memory limit" not in message, "no limit was set: none is named"


def test_classify_oom_flag_is_host_oom_and_names_the_limit() -> None:
    status, message = classify(oom_killed=True, exit_code=137, signum=9, memory_limit="600m", what="container")
    assert status == "host_oom"
    assert "600m" in message and "OOM killer" in message


def test_classify_oom_flag_wins_over_a_written_result() -> None:
    # The worker may have written "ok" before a process of the run was killed: the kernel's word wins.
    assert classify(oom_killed=True, exit_code=0, wrote_result=True)[0] == "host_oom"
    assert classify(exit_code=-9, signum=9, wrote_result=True)[0] == "host_oom"


@pytest.mark.parametrize(
    ("observed", "expected"),
    [
        ({"exit_code": 3}, "worker exited with code 3 without writing a result"),
        ({"exit_code": -11, "signum": 11}, "worker killed by SIGSEGV (exit code -11) without writing a result"),
        ({"exit_code": 139, "signum": 11, "what": "container"}, "container killed by SIGSEGV (exit code 139)"),
        ({"exit_code": None}, "no exit code"),
    ],
    ids=["exit-code", "subprocess-signal", "container-signal", "no-code"],
)
def test_classify_no_result_file_is_error_with_how_it_ended(observed: dict[str, Any], expected: str) -> None:
    status, message = classify(wrote_result=False, **observed)
    assert status == "error" and expected in message


@pytest.mark.parametrize(
    "observed",
    [{"exit_code": 0}, {"exit_code": 1}, {"exit_code": 143, "signum": 15}],
    ids=["ok", "worker-reported-failure", "sigterm-after-writing"],
)
def test_classify_a_written_result_defers_to_the_worker(observed: dict[str, Any]) -> None:
    # The worker's own status then stands: ok, nan_loss, gpu_oom, device_mismatch, error.
    assert classify(wrote_result=True, **observed) == ("", "")


@pytest.mark.parametrize(
    ("code", "signum"), [(137, 9), (139, 11), (143, 15), (0, None), (1, None), (128, None), (255, None), (-1, None)]
)
def test_classify_container_exit_code_to_signal(code: int, signum: int | None) -> None:
    assert _exit_signal(code) == signum


# -- the Docker deadline --------------------------------------------------------------------------


class RacingContainer:
    """A container whose kill ends it (``wait`` returns 137) a while before ``kill()`` returns.

    With a real engine the exit event and the kill's HTTP answer travel separately, so the thread
    in ``wait`` can see the exit first.
    """

    id = "racing"

    def __init__(self, kill_answer_s: float = 0.5, kill_error: Exception | None = None, exits_after_s: float = 60):
        self.kill_answer_s, self.kill_error, self.exits_after_s = kill_answer_s, kill_error, exits_after_s
        self.attrs: dict[str, Any] = {"HostConfig": {}, "State": {"OOMKilled": False}}
        self.exited = threading.Event()
        self.code = 0
        self.wait_returned = self.kill_returned = 0.0
        self.removed = False

    def start(self) -> None:
        pass

    def wait(self, timeout: float | None = None) -> dict[str, int]:
        self.exited.wait(self.exits_after_s)
        self.wait_returned = time.monotonic()
        return {"StatusCode": self.code if self.exited.is_set() else 0}

    def kill(self) -> None:
        if self.kill_error is not None:
            raise self.kill_error
        self.code = 137
        self.exited.set()
        time.sleep(self.kill_answer_s)
        self.kill_returned = time.monotonic()

    def reload(self) -> None:
        pass

    def logs(self, **_: Any) -> bytes:
        return b"training...\n"

    def remove(self, **_: Any) -> None:
        self.removed = True


class OneContainerEngine:
    """The part of docker-py's client that ``_run_container`` uses, handing out one container."""

    def __init__(self, container: RacingContainer):
        self.containers = self
        self.container = container

    def create(self, **_: Any) -> RacingContainer:
        return self.container


class Image:
    id, labels = "sha256:test", {"suite.python": "python3"}


def spec_with_timeout(tmp_path: Path, seconds: float) -> RunSpec:
    text = (
        "name: race\nquestion: Which status?\nmodel: {hidden: [8]}\n"
        "data: {allow_synthetic: true, train_samples: 64, test_samples: 64}\nrepeats: 1\n"
    )
    spec = plan.expand(scenario.load(write_scenario(tmp_path, "race", text)))[0]
    changed = replace(spec, config={**spec.config, "timeout_s": seconds}, fingerprint="")
    return replace(changed, fingerprint=plan.fingerprint_of(changed))


def run_container(tmp_path: Path, container: RacingContainer, timeout_s: float) -> tuple[str, str, dict[str, Any]]:
    backend = DockerBackend(machine="test", inventory={"gpus": [], "cpus": 2}, keras_home=tmp_path / "none")
    folder = tmp_path / "run"
    folder.mkdir()
    spec = spec_with_timeout(tmp_path, timeout_s)
    status, message, _, extra = backend._run_container(OneContainerEngine(container), spec, Image(), folder)
    return status, message, extra


def test_docker_timeout_whose_exit_arrives_before_the_kill_returns_is_timeout(tmp_path: Path) -> None:
    container = RacingContainer(kill_answer_s=0.5)
    status, message, extra = run_container(tmp_path, container, timeout_s=0.2)
    assert container.wait_returned < container.kill_returned, "the race happened: wait saw 137 first"
    assert extra["exit_code"] == 137
    assert status == "timeout", message
    assert "0.2 s" in message
    assert container.removed


def test_docker_deadline_is_marked_before_the_kill_is_sent() -> None:
    deadline = _Deadline(0.05)
    marked_at_kill: list[bool] = []

    class Recorder(RacingContainer):
        def kill(self) -> None:
            marked_at_kill.append(deadline.fired)
            super().kill()

    container = Recorder(kill_answer_s=0.2)
    deadline.arm(container)
    container.wait()
    assert deadline.fired, "already marked when wait returns, while kill() has not returned yet"
    assert deadline.disarm() is True
    assert marked_at_kill == [True]


def conflict(status_code: int) -> docker.errors.APIError:
    response = requests.Response()
    response.status_code = status_code
    return docker.errors.APIError("container is not running", response=response)


@pytest.mark.parametrize("status_code", [409, 404], ids=["not-running", "gone"])
def test_docker_deadline_whose_kill_finds_the_container_ended_is_no_timeout(status_code: int) -> None:
    deadline = _Deadline(0.01)
    deadline.arm(RacingContainer(kill_error=conflict(status_code)))
    time.sleep(0.2)
    assert deadline.disarm() is False


def test_docker_deadline_kept_when_the_kill_fails_otherwise() -> None:
    # The engine did not say the container had ended: the limit was reached, and that is what is known.
    deadline = _Deadline(0.01)
    deadline.arm(RacingContainer(kill_error=docker.errors.APIError("engine hiccup", response=None)))
    time.sleep(0.2)
    assert deadline.disarm() is True


def test_docker_run_ending_before_its_deadline_is_classified_by_its_exit(tmp_path: Path) -> None:
    container = RacingContainer(exits_after_s=0.05)
    container.exited.set()
    container.code = 137  # the OOM killer's SIGKILL, not the suite's
    status, message, _ = run_container(tmp_path, container, timeout_s=30)
    assert status == "host_oom", message
