"""The orchestrator (runner.run_plan) driven by a fake backend: order, resume, interruption,
classification and progress, in milliseconds and without TensorFlow."""

from __future__ import annotations

import io
import os
import signal
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from conftest import write_scenario

from suite.record import results
from suite.record.results import FAILED, STATUS_OK, STATUS_SKIPPED, RunResult
from suite.run import progress, results_folder, runner
from suite.spec import plan, scenario
from suite.spec.plan import RunSpec

TEXT = """\
name: fake
question: Does the orchestrator keep its promises?
model: {hidden: [16]}
training: {epochs: 3}
repeats: 2
matrix:
  model.hidden.0: [16, 32]
  device: [cpu, gpu]
smoke:
  training.epochs: 1
"""


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class FakeBackend:
    """Returns what ``outcome(spec, call_number)`` says; ``seconds(spec)`` is how long a run takes on ``clock``.

    An outcome is a status, or "interrupt" / "sigterm" to stop the plan in the middle of that run.
    """

    name = "fake"
    machine = "m"

    def __init__(
        self,
        outcome: Callable[[RunSpec, int], str] = lambda spec, n: STATUS_OK,
        skip: Callable[[RunSpec], str | None] = lambda spec: None,
        clock: FakeClock | None = None,
        seconds: Callable[[RunSpec], float] = lambda spec: 1.0,
    ):
        self.outcome, self.skip, self.clock, self.seconds = outcome, skip, clock, seconds
        self.ran: list[RunSpec] = []
        self.closed = 0
        self.events_given: list[bool] = []

    def inventory(self) -> dict[str, Any]:
        return {"gpus": [], "cpus": 1}

    def skip_reason(self, spec: RunSpec) -> str | None:
        return self.skip(spec)

    def skipped(self, spec: RunSpec, reason: str) -> RunResult:
        return RunResult(status=STATUS_SKIPPED, spec=spec.to_dict(), message=reason, run=self._run_info())

    def run(self, spec: RunSpec, on_event: Callable[[dict], None] | None = None) -> RunResult:
        self.ran.append(spec)
        self.events_given.append(on_event is not None)
        status = self.outcome(spec, len(self.ran))
        epochs = spec.config["training"]["epochs"]
        for k in range(1, epochs + 1):
            if self.clock is not None:
                self.clock.now += self.seconds(spec) / epochs
            if on_event is not None:
                on_event({"event": "epoch", "epoch": k, "epochs": epochs})
        if status == "interrupt":
            raise KeyboardInterrupt
        if status == "sigterm":
            os.kill(os.getpid(), signal.SIGTERM)
        ok = status == STATUS_OK
        return RunResult(
            status=status,
            spec=spec.to_dict(),
            message="" if ok else f"the fake says {status}",
            run=self._run_info(),
            timing={"fit_s": 1.0} if ok else {},
            quality={"test_accuracy": 0.97} if ok else {},
            work={"peak": {"flops_per_s": 1e9}} if ok and spec.calibrate_peak else {},
        )

    def close(self) -> None:
        self.closed += 1

    def _run_info(self) -> dict[str, Any]:
        now = datetime.now(UTC).isoformat(timespec="microseconds")
        return {"backend": self.name, "machine": self.machine, "started_at": now, "finished_at": now}


def _specs(tmp_path: Path, **kw: Any) -> list[RunSpec]:
    return plan.interleave(plan.expand(scenario.load(write_scenario(tmp_path, "fake", TEXT)), **kw))


def _run(specs: list[RunSpec], backend: FakeBackend, res: Path, **kw: Any) -> tuple[runner.Summary, list[str]]:
    lines: list[str] = []
    summary = runner.run_plan(specs, backend, res, "m", say=lines.append, **kw)
    return summary, lines


def _saved(res: Path) -> list[RunResult]:
    folder = res / "m"
    return [r for _, r in results.load_folder(folder)] if folder.is_dir() else []


def _gpu(spec: RunSpec) -> bool:
    return spec.device.startswith("gpu")


# --------------------------------------------------------------------------- order


def test_runs_in_plan_order_every_point_once_before_any_twice(tmp_path: Path) -> None:
    specs = _specs(tmp_path)
    backend = FakeBackend()
    summary, lines = _run(specs, backend, tmp_path / "res")
    assert [(s.fingerprint, s.repetition) for s in backend.ran] == [(s.fingerprint, s.repetition) for s in specs]
    reps = [s.repetition for s in backend.ran]
    assert reps == sorted(reps) and reps.count(0) == 4, "interleaved: the 4 points once, then again"
    assert [s.order for s in backend.ran] == list(range(8))
    assert summary.counts == {STATUS_OK: 8} and not summary.failed
    assert lines[0].startswith("8 runs to run; ETA at most"), "the ETA from the start: the runs' timeout_s"
    assert len(lines) == 9 and lines[1].startswith("[1/8] fake [width=16, device=cpu] run 1 of 2: ok")
    assert backend.closed == 1


def test_peak_is_measured_once_per_device_kind_then_reused(tmp_path: Path) -> None:
    backend = FakeBackend()
    _run(_specs(tmp_path), backend, tmp_path / "res")
    calibrated = [(s.device, s.calibrate_peak) for s in backend.ran]
    assert calibrated[:2] == [("cpu", True), ("gpu", True)]
    assert not any(flag for _, flag in calibrated[2:]), "later runs of the same device kind reuse the peak"
    sources = sorted(r.work["peak"].get("source", "measured") for r in _saved(tmp_path / "res"))
    assert sources == ["cached"] * 6 + ["measured"] * 2


# --------------------------------------------------------------------------- resume


def test_resume_skips_ok_reruns_failed_and_re_evaluates_skipped(tmp_path: Path) -> None:
    specs, res = _specs(tmp_path), tmp_path / "res"
    no_gpu = "needs 1 GPU(s); this machine has no GPU"
    # First pass: the second CPU run fails, every GPU point is skipped.
    first = FakeBackend(
        outcome=lambda spec, n: "error" if n == 2 else STATUS_OK, skip=lambda s: no_gpu if _gpu(s) else None
    )
    summary, _ = _run(specs, first, res)
    assert summary.counts == {STATUS_OK: 3, "error": 1, STATUS_SKIPPED: 4} and summary.failed
    assert len(_saved(res)) == 8

    # Second pass, same machine: ok runs are not run again, the failed one is, the skips stand.
    second = FakeBackend(skip=lambda s: no_gpu if _gpu(s) else None)
    summary, lines = _run(specs, second, res)
    assert [(s.point_label, s.repetition) for s in second.ran] == [("width=32, device=cpu", 0)]
    assert summary.counts == {"already done": 3, STATUS_OK: 1, STATUS_SKIPPED: 4} and not summary.failed
    assert [line for line in lines if "skipped" in line] == [
        "2 GPU points (4 runs) skipped, as recorded before: needs 1 GPU(s); this machine has no GPU"
    ], "one line for every skip of one reason"
    assert len(_saved(res)) == 9, "an unchanged skip is not written again; the rerun adds one file"

    # Third pass, a GPU appeared: the skipped points are asked again and now run.
    third = FakeBackend()
    summary, _ = _run(specs, third, res)
    assert all(_gpu(s) for s in third.ran) and len(third.ran) == 4
    assert summary.counts == {"already done": 4, STATUS_OK: 4}
    latest = results.latest_by_run(_saved(res))
    assert all(r.status == STATUS_OK for r in latest.values()) and len(latest) == 8


def test_a_changed_skip_reason_is_recorded_again(tmp_path: Path) -> None:
    specs, res = _specs(tmp_path), tmp_path / "res"
    _run(specs, FakeBackend(skip=lambda s: "reason one" if _gpu(s) else None), res)
    summary, _ = _run(specs, FakeBackend(skip=lambda s: "reason two" if _gpu(s) else None), res)
    assert summary.counts == {"already done": 4, STATUS_SKIPPED: 4}
    messages = sorted(r.message for r in _saved(res) if r.status == STATUS_SKIPPED)
    assert messages == ["reason one"] * 4 + ["reason two"] * 4


def test_fresh_runs_everything_again(tmp_path: Path) -> None:
    specs, res = _specs(tmp_path), tmp_path / "res"
    _run(specs, FakeBackend(), res)
    again = FakeBackend()
    _run(specs, again, res, fresh=True)
    assert len(again.ran) == 8 and len(_saved(res)) == 16


# --------------------------------------------------------------------------- interruption


@pytest.mark.parametrize("how", ["interrupt", "sigterm"])
def test_interruption_keeps_finished_results_and_closes_the_backend(tmp_path: Path, how: str) -> None:
    specs, res = _specs(tmp_path), tmp_path / "res"
    handler = signal.getsignal(signal.SIGTERM)
    backend = FakeBackend(outcome=lambda spec, n: how if n == 3 else STATUS_OK)
    with pytest.raises(KeyboardInterrupt):
        _run(specs, backend, res)
    assert len(backend.ran) == 3, "nothing runs after the interruption"
    saved = _saved(res)
    assert len(saved) == 2 and all(r.ok for r in saved), "the two finished runs are on disk, the third is not"
    assert backend.closed == 1
    assert signal.getsignal(signal.SIGTERM) == handler, "the previous SIGTERM handler is back"
    # The next invocation picks up where it stopped.
    rest = FakeBackend()
    summary, _ = _run(specs, rest, res)
    assert len(rest.ran) == 6 and summary.counts == {"already done": 2, STATUS_OK: 6}


# --------------------------------------------------------------------------- classification


def test_every_status_is_saved_counted_and_failures_listed(tmp_path: Path) -> None:
    specs = _specs(tmp_path) + _specs(tmp_path, smoke=True)  # 16 runs: enough for every status
    outcomes = [STATUS_OK, *FAILED]
    backend = FakeBackend(
        outcome=lambda spec, n: outcomes[(n - 1) % len(outcomes)],
        skip=lambda s: "no GPU here" if _gpu(s) and s.smoke else None,
    )
    summary, lines = _run(specs, backend, tmp_path / "res")
    saved = _saved(tmp_path / "res")
    assert len(saved) == len(specs)
    statuses = [r.status for r in saved]
    assert set(statuses) == set(results.STATUSES), "every status, each saved as the backend returned it"
    assert summary.counts == {s: statuses.count(s) for s in set(statuses)}
    assert summary.failed
    failed_runs = [r for r in saved if r.status in FAILED]
    assert len(summary.failures) == len(failed_runs)
    for status in FAILED:
        assert any(f": {status}: the fake says {status}" in f for f in summary.failures), status
    assert "some runs failed" in "\n".join(summary.lines())


def test_ok_and_skipped_only_is_not_a_failure(tmp_path: Path) -> None:
    summary, _ = _run(_specs(tmp_path), FakeBackend(skip=lambda s: "no GPU" if _gpu(s) else None), tmp_path / "res")
    assert not summary.failed and summary.failures == []
    assert summary.lines() == ["runs: 4 ok, 4 skipped"]


# --------------------------------------------------------------------------- progress


def test_plain_lines_carry_the_plan_eta_from_the_runs_done(tmp_path: Path) -> None:
    """Widths 16 and 32 on the CPU take 10 s and 30 s; GPU points are skipped and cost nothing."""
    clock = FakeClock()
    backend = FakeBackend(
        skip=lambda s: "no GPU" if _gpu(s) else None,
        clock=clock,
        seconds=lambda s: 10.0 if s.config["model"]["hidden"][0] == 16 else 30.0,
    )
    _, lines = _run(_specs(tmp_path), backend, tmp_path / "res", clock=clock)
    ran = [line for line in lines if ": ok" in line]
    assert len(lines) == 6 and len(ran) == 4, "one plain line per run, one for the skips, one for the plan"
    assert not any("\r" in line or "\x1b" in line for line in lines), "no terminal control in plain mode"
    # After width 16 (10 s) the 3 runs left are guessed at 10 s each; after width 32 (30 s) each
    # point's own time is known: 10 + 30, then 30, then nothing is left.
    assert "(10.0 s; ETA 30 s)" in ran[0]
    assert "(30.0 s; ETA 40 s)" in ran[1]
    assert "(10.0 s; ETA 30 s)" in ran[2]
    assert ran[3].endswith("(30.0 s)")


def test_eta_arithmetic() -> None:
    assert progress.eta_s({}, ["a", "b"]) is None, "no estimate before a run finished"
    assert progress.eta_s({"a": [10.0, 20.0]}, ["a", "b", "b"]) == 45.0  # a: its median; b: the median of all
    assert progress.eta_s({}, ["a", "b"], {"a": 60.0, "b": 30.0}) == 90.0, "before any run: the timeouts"
    assert progress.eta_s({"a": [10.0], "b": [40.0]}, ["b"]) == 40.0
    assert progress.eta_s({"a": [1.0]}, []) == 0.0
    assert [progress.duration_text(s) for s in (None, 4.4, 125, 7260)] == ["?", "4 s", "2 min 5 s", "2 h 1 min"]


def test_on_event_reaches_the_backend(tmp_path: Path) -> None:
    backend = FakeBackend()
    _run(_specs(tmp_path), backend, tmp_path / "a")
    assert backend.events_given and all(backend.events_given)


def test_status_line_shows_point_repetition_epoch_elapsed_and_eta() -> None:
    clock, stream = FakeClock(), io.StringIO()
    prog = progress.Progress(say=lambda _: None, stream=stream, clock=clock)
    prog.plan(["a", "a"])
    prog.start("[1/2] s [width=16] rep 0")
    clock.now += 4
    prog.on_event({"event": "epoch", "epoch": 2, "epochs": 5, "loss": 0.3})
    assert prog.status() == "[1/2] s [width=16] rep 0: epoch 2 of 5, 4 s; ETA ?"
    prog.on_event({"event": "phase", "phase": "evaluate"})
    assert prog.status() == "[1/2] s [width=16] rep 0: evaluate, 4 s; ETA ?"
    prog.on_event({"no": "event"})
    assert "evaluate" in prog.status(), "what is not an event changes nothing"
    clock.now += 6
    prog.finish("a")
    prog.start("[2/2] s [width=16] rep 1")
    assert prog.status() == "[2/2] s [width=16] rep 1: starting, 0 s; ETA 10 s"
    assert stream.getvalue().count(progress.CLEAR_LINE) >= 3, "the line is rewritten in place"
    prog.line("[1/2] ... ok")
    prog.close()
    assert stream.getvalue().endswith(progress.CLEAR_LINE), "the status line is cleared at the end"


def test_live_mode_writes_the_status_line_to_stdout(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    runner.run_plan(_specs(tmp_path), FakeBackend(), tmp_path / "res", "m", say=lambda _: None, live=True)
    out = capsys.readouterr().out
    assert progress.CLEAR_LINE in out and "epoch 3 of 3" in out and "; ETA " in out


# --------------------------------------------------------------------------- the folder lock


def test_a_held_results_folder_is_refused_naming_the_holder(tmp_path: Path) -> None:
    folder = tmp_path / "res" / "m"
    with results_folder.hold_folder(folder):
        with pytest.raises(results_folder.FolderBusy, match=rf"in use by `suite run` process {os.getpid()} on host"):
            with results_folder.hold_folder(folder):
                pass
    with results_folder.hold_folder(folder):  # released on exit
        pass
    assert not _saved(tmp_path / "res"), "the lock file is not a result"


def test_runs_of_an_unreachable_fleet_host_carry_provenance(tmp_path: Path) -> None:
    # Recorded without any backend (no engine answered), yet each names the code that planned it.
    import subprocess

    from suite.run import fleet

    specs = _specs(tmp_path)
    host = fleet.Host("gone", "ssh://nobody@192.0.2.1")
    assert fleet.record_unreachable(specs, host, tmp_path / "res", "refused") == len(specs)
    saved = [r for _, r in results.load_folder(tmp_path / "res" / "gone")]
    repo = Path(__file__).resolve().parent.parent
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], capture_output=True, text=True)
    assert len(saved) == len(specs)
    for r in saved:
        assert r.status == "error" and r.provenance["image"] is None
        assert r.provenance["suite"]["git_revision"] == (head.stdout.strip() or None)
