"""How a run ended, one rule for every backend, and the deadline that can no longer lose its race.

Fast: no TensorFlow and no Docker engine. The deadline tests drive the real ``Deadline`` and the
real ``RunSkeleton.run`` (the flow both backends use) with a stand-in execution whose kill makes a
concurrent ``wait`` return before ``kill()`` itself does, as a real engine's answer can.
"""

from __future__ import annotations

import signal
import threading
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from conftest import write_scenario

from suite.backends.base import Exit, RunLost, RunSkeleton, classify_exit
from suite.backends.docker_run import exit_signal
from suite.backends.worker_output import Deadline, parse_event, split_lines
from suite.spec import plan, scenario
from suite.spec.plan import RunSpec

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
def test_classify_sigkill_the_suite_did_not_send_is_host_oom_where_the_oom_killer_acted(
    exit_code: int, what: str
) -> None:
    acted = "the kernel's OOM killer acted in its memory cgroup during the run (oom_kill 0 -> 1)"
    status, message = classify(
        exit_code=exit_code, signum=signal.SIGKILL, wrote_result=False, what=what, oom_killed=True, oom_evidence=acted
    )
    assert status == "host_oom"
    assert f"exit code {exit_code}" in message and what in message and acted in message
    assert "did not send" in message and "OOM killer sends SIGKILL when memory runs out" in message
    assert "memory limit" not in message, "no limit was set: none is named"


@pytest.mark.parametrize(
    ("exit_code", "what"), [(-9, "worker"), (137, "container")], ids=["subprocess-minus-9", "container-137"]
)
def test_classify_sigkill_without_the_oom_killer_is_error_naming_the_evidence(exit_code: int, what: str) -> None:
    evidence = "no OOM kill on this machine during the run (oom_kill 3 -> 3 in /proc/vmstat)"
    status, message = classify(
        exit_code=exit_code, signum=signal.SIGKILL, wrote_result=False, what=what, oom_evidence=evidence
    )
    assert status == "error"
    assert message.startswith(f"{what} killed by SIGKILL (exit code {exit_code}), not by the kernel's OOM killer")
    assert evidence in message and "the suite did not send it either" in message
    unknown = classify(exit_code=exit_code, signum=signal.SIGKILL, wrote_result=False, what=what, oom_killed=None)
    assert unknown[0] == "error" and "whether the kernel's OOM killer sent it is not known" in unknown[1]


def test_classify_oom_flag_is_host_oom_and_names_the_limit() -> None:
    status, message = classify(oom_killed=True, exit_code=137, signum=9, memory_limit="600m", what="container")
    assert status == "host_oom"
    assert "600m" in message and "OOM killer" in message


def test_classify_oom_flag_wins_over_a_written_result() -> None:
    # The worker may have written "ok" before a process of the run was killed: the kernel's word wins.
    assert classify(oom_killed=True, exit_code=0, wrote_result=True)[0] == "host_oom"
    assert classify(exit_code=-9, signum=9, oom_killed=True, wrote_result=True)[0] == "host_oom"
    # Killed after writing its result, and not by the OOM killer: the result is whole, and stands.
    assert classify(exit_code=-9, signum=9, oom_killed=False, wrote_result=True) == ("", "")


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
    assert exit_signal(code) == signum


# -- the deadline, in the one run flow ------------------------------------------------------------


class RacingExecution:
    """A worker whose kill ends it (``wait`` sees 137) a while before ``kill()`` returns.

    With a real engine the exit event and the kill's HTTP answer travel separately, so the thread
    in ``wait`` can see the exit first.
    """

    def __init__(self, kill_answer_s: float = 0.5, kill_error: Exception | None = None, exits_after_s: float = 60):
        self.kill_answer_s, self.kill_error, self.exits_after_s = kill_answer_s, kill_error, exits_after_s
        self.facts: dict[str, Any] = {}
        self.exited = threading.Event()
        self.code = 0
        self.wait_returned = self.kill_returned = 0.0
        self.cleaned = 0
        self.output = ["training...", '@@suite {"event": "epoch", "epoch": 1, "epochs": 2}', "@@suite not json"]
        self.record: bytes | None = None
        self.lost: str | None = None
        self.oom: bool | None = None  # what the backend's evidence says of the OOM killer

    def lines(self):
        yield from self.output

    def wait(self) -> Exit:
        self.exited.wait(self.exits_after_s)
        self.wait_returned = time.monotonic()
        if self.lost:
            raise RunLost(self.lost)
        code = self.code if self.exited.is_set() else 0
        return Exit(code=code, signum=exit_signal(code), oom_killed=self.oom)

    def kill(self) -> bool:
        if self.kill_error is not None:
            raise self.kill_error
        if self.exited.is_set():
            return False
        self.code = 137
        self.exited.set()
        time.sleep(self.kill_answer_s)
        self.kill_returned = time.monotonic()
        return True

    def result(self) -> bytes | None:
        return self.record

    def cleanup(self) -> None:
        self.cleaned += 1


class FakeBackend(RunSkeleton):
    name, what = "fake", "container"

    def __init__(self, execution: RacingExecution):
        self.execution = execution
        self.env: dict[str, str] = {}

    def run_info(self) -> dict[str, Any]:
        return {"backend": self.name}

    def launch(self, spec: RunSpec, spec_json: bytes, env: dict[str, str]) -> RacingExecution:
        self.env = env
        return self.execution


def spec_with_timeout(tmp_path: Path, seconds: float) -> RunSpec:
    text = (
        "name: race\nquestion: Which status?\nmodel: {hidden: [8]}\n"
        "data: {allow_synthetic: true, train_samples: 64, test_samples: 64}\nrepeats: 1\n"
    )
    spec = plan.expand(scenario.load(write_scenario(tmp_path, "race", text)))[0]
    changed = replace(spec, config={**spec.config, "timeout_s": seconds}, fingerprint="")
    return replace(changed, fingerprint=plan.fingerprint_of(changed))


def test_timeout_whose_exit_arrives_before_the_kill_returns_is_timeout(tmp_path: Path) -> None:
    execution = RacingExecution(kill_answer_s=0.5)
    result = FakeBackend(execution).run(spec_with_timeout(tmp_path, 0.2))
    assert execution.wait_returned < execution.kill_returned, "the race happened: wait saw 137 first"
    assert result.run["exit_code"] == 137
    assert result.status == "timeout", result.message
    assert "0.2 s" in result.message
    assert execution.cleaned >= 1


def test_deadline_is_marked_before_the_kill_is_sent() -> None:
    deadline = Deadline(0.05)
    marked_at_kill: list[bool] = []
    execution = RacingExecution(kill_answer_s=0.2)

    def kill() -> bool:
        marked_at_kill.append(deadline.fired)
        return execution.kill()

    deadline.arm(kill)
    execution.wait()
    assert deadline.fired, "already marked when wait returns, while kill() has not returned yet"
    assert deadline.disarm() is True
    assert marked_at_kill == [True]


def test_deadline_whose_kill_finds_the_worker_ended_is_no_timeout() -> None:
    execution = RacingExecution()
    execution.exited.set()
    deadline = Deadline(0.01)
    deadline.arm(execution.kill)
    time.sleep(0.2)
    assert deadline.disarm() is False


def test_deadline_kept_when_the_kill_fails_otherwise() -> None:
    # The backend did not say the worker had ended: the limit was reached, and that is what is known.
    deadline = Deadline(0.01)
    deadline.arm(RacingExecution(kill_error=OSError("engine hiccup")).kill)
    time.sleep(0.2)
    assert deadline.disarm() is True


def test_run_ending_before_its_deadline_is_classified_by_its_exit(tmp_path: Path) -> None:
    execution = RacingExecution(exits_after_s=0.05)
    execution.exited.set()
    execution.code = 137  # the OOM killer's SIGKILL, not the suite's
    execution.oom = True
    result = FakeBackend(execution).run(spec_with_timeout(tmp_path, 30))
    assert result.status == "host_oom", result.message


def test_worker_record_is_merged_and_progress_lines_become_events(tmp_path: Path) -> None:
    execution = RacingExecution(exits_after_s=0.01)
    execution.exited.set()
    execution.record = b'{"status": "ok", "message": "", "timing": {"fit_s": 1.5}, "settings": {"replicas": 1}}'
    events: list[dict[str, Any]] = []
    backend = FakeBackend(execution)
    result = backend.run(spec_with_timeout(tmp_path, 30), on_event=events.append)
    assert result.status == "ok" and result.timing == {"fit_s": 1.5}
    assert result.run["settings"] == {"replicas": 1} and result.run["backend"] == "fake"
    assert events == [{"event": "epoch", "epoch": 1, "epochs": 2}], "one valid progress line, one malformed"
    assert float(backend.env["SUITE_DEADLINE_S"]) > 30, "the worker's own deadline comes after the host's"


def test_a_failing_event_sink_never_fails_the_run(tmp_path: Path) -> None:
    execution = RacingExecution(exits_after_s=0.01)
    execution.exited.set()
    execution.record = b'{"status": "ok", "message": ""}'

    def broken(event: dict[str, Any]) -> None:
        raise RuntimeError("display gone")

    assert FakeBackend(execution).run(spec_with_timeout(tmp_path, 30), on_event=broken).status == "ok"


def test_lost_backend_is_error_with_its_cause(tmp_path: Path) -> None:
    execution = RacingExecution(exits_after_s=0.01)
    execution.lost = "lost the Docker engine at ssh://x during the run: EOFError"
    result = FakeBackend(execution).run(spec_with_timeout(tmp_path, 30))
    assert result.status == "error" and "ssh://x" in result.message and "EOFError" in result.message
    assert "training..." in result.log_tail
    assert execution.cleaned >= 1


def test_ctrl_c_in_wait_kills_and_cleans_up(tmp_path: Path) -> None:
    class Interrupted(RacingExecution):
        def wait(self) -> Exit:
            raise KeyboardInterrupt

    execution = Interrupted()
    with pytest.raises(KeyboardInterrupt):
        FakeBackend(execution).run(spec_with_timeout(tmp_path, 30))
    assert execution.code == 137 and execution.cleaned >= 1


def test_progress_lines_and_chunks() -> None:
    assert parse_event('@@suite {"event": "phase", "phase": "fit"}') == {"event": "phase", "phase": "fit"}
    assert parse_event("@@suite [1, 2]") is None and parse_event("epoch 1") is None
    chunks = [b"first li", b"ne\nsecond\n\xc3", b"\xa9 third"]
    assert list(split_lines(iter(chunks))) == ["first line", "second", "\u00e9 third"]


def test_gpus_can_be_limited_by_index_or_uuid() -> None:
    from suite.backends.gpu_pool import restrict_gpus

    inventory = {"gpus": [{"index": i, "uuid": f"GPU-{i}"} for i in range(4)], "gpu_note": "NVML"}
    kept = restrict_gpus(inventory, ["2", "GPU-0", "7"])
    assert [g["index"] for g in kept["gpus"]] == [0, 2], "in the host's order"
    assert "not on this host: 7" in kept["gpu_note"] and kept["gpu_note"].startswith("NVML")
    assert restrict_gpus(inventory, None) is inventory
