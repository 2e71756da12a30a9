"""Process faults on the local backend, through the real command line: the orchestrator SIGKILLed
(its worker and temp folder go with it), SIGHUP (handled as SIGTERM), a worker SIGKILLed by hand
(not taken for the kernel's OOM killer), a worker of an earlier run still training on the results
folder (said on the console). The parts these rest on (the temp-folder sweep, the OOM-kill evidence,
the worker's watch of its parent) are also tested alone, without TensorFlow.

Every wait polls with a bound; nothing here is timed for speed. A worker a test could not end
through the suite is killed at the test's end, so a failure never leaves one training.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import select
import signal
import subprocess
import sys
import tempfile
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import REPO, suite_cli, write_scenario

from suite.backends import lifeline, local, oom
from suite.backends.base import classify_exit
from suite.record import results
from suite.spec import plan, scenario
from suite.worker import lifeline as worker_lifeline

# Trains for its whole limit unless something ends it: a worker that outlives its orchestrator shows.
# The first point needs more GPUs than any machine has: its skip record is on file before the run.
ENDLESS = """\
name: {name}
question: Does the worker end with its orchestrator?
model: {{hidden: [16]}}
training: {{epochs: 10000}}
data: {{allow_synthetic: true, train_samples: 256, test_samples: 64}}
repeats: 1
timeout_s: 600
measure: {{step_overhead: false}}
matrix:
  device: [{devices}]
"""
WAIT_S = 120  # for the orchestrator to start its worker (imports, inventory, provenance)
GONE_S = 30  # for a worker to end once its orchestrator is gone


# -- helpers ----------------------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _ended(pid: int) -> bool:
    """Gone, or a zombie nobody reaped yet (in a container, pid 1 may never reap): either way ended."""
    fields = _stat(pid)
    return fields is None or fields[0] in ("Z", "X")


def _children(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and (fields := _stat(int(entry.name))) is not None and fields[1] == str(pid):
            found.append(int(entry.name))
    return found


def _cmdline(pid: int) -> list[str]:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().decode(errors="replace").split("\0")
    except OSError:
        return []


class Orchestrator:
    """A real ``suite run --backend local`` in a session of its own, its output in files."""

    def __init__(self, tmp_path: Path, name: str, devices: str):
        self.tmp = tmp_path / "tmp"  # TMPDIR: where its worker's temp folder goes
        self.tmp.mkdir()
        self.res = tmp_path / "res"
        path = write_scenario(tmp_path, name, ENDLESS.format(name=name, devices=devices))
        cmd = [sys.executable, "-m", "suite", "run", str(path), "--smoke", "--backend", "local"]
        cmd += ["--results", str(self.res), "--machine", "m"]
        self.out, self.err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(self.tmp)}
        with self.out.open("w") as out, self.err.open("w") as err:
            self.proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=out, stderr=err, start_new_session=True)
        self.worker: int | None = None

    def output(self) -> str:
        return self.out.read_text() + self.err.read_text()

    def wait_for_worker(self) -> tuple[int, Path]:
        """The worker's pid and its temp folder, once the orchestrator has started it."""
        deadline = time.monotonic() + WAIT_S
        while time.monotonic() < deadline:
            for child in _children(self.proc.pid):
                args = _cmdline(child)
                if "suite.worker" in args and len(args) >= 3:
                    self.worker = child
                    return child, Path(args[-3]).parent  # [..., spec.json, result.json, ""]
            if self.proc.poll() is not None:
                pytest.fail(f"the run ended before a worker was seen:\n{self.output()}")
            time.sleep(0.1)
        pytest.fail(f"no worker within {WAIT_S} s:\n{self.output()}")

    def stop(self) -> None:
        """Whatever is left: the orchestrator's group and the worker's (a session of its own)."""
        for group in (self.proc.pid, self.worker):
            if group is not None:
                try:
                    os.killpg(group, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        self.proc.wait(timeout=30)


@pytest.fixture
def orchestrator(tmp_path: Path) -> Iterator[list[Orchestrator]]:
    made: list[Orchestrator] = []
    yield made
    for o in made:
        o.stop()


def _until(check: object, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if check():  # type: ignore[operator]
            return True
        time.sleep(0.1)
    return bool(check())  # type: ignore[operator]


def _saved(res: Path) -> list[results.RunResult]:
    return [r for _, r in results.load_folder(res / "m")] if (res / "m").is_dir() else []


# -- through the command line -----------------------------------------------------------------------


def test_sigkill_of_the_orchestrator_ends_its_worker_and_removes_its_temp_folder(
    tmp_path: Path, orchestrator: list[Orchestrator]
) -> None:
    run = Orchestrator(tmp_path, "orphan", "cpu")
    orchestrator.append(run)
    worker, folder = run.wait_for_worker()
    assert folder.parent == run.tmp and folder.name.startswith("suite-run-"), folder
    os.killpg(run.proc.pid, signal.SIGKILL)  # the orchestrator's group; the worker leads a session of its own
    run.proc.wait(timeout=30)
    assert _until(lambda: _ended(worker), GONE_S), f"worker {worker} still runs after its orchestrator died"
    assert _until(lambda: not folder.exists(), GONE_S), f"{folder} left behind"
    assert not list(run.tmp.glob("suite-run-*"))


def test_sighup_stops_the_run_as_sigterm_does(tmp_path: Path, orchestrator: list[Orchestrator]) -> None:
    run = Orchestrator(tmp_path, "hangup", "gpu:64, cpu")
    orchestrator.append(run)
    worker, folder = run.wait_for_worker()
    run.proc.send_signal(signal.SIGHUP)
    code = run.proc.wait(timeout=60)
    # SIGTERM's exit: the in-flight run stopped, what was saved kept, exit code 130 (cli.main).
    assert code == 130, (code, run.output())
    assert "interrupted; results written so far are kept" in run.err.read_text(), run.output()
    assert _until(lambda: _ended(worker), GONE_S), f"worker {worker} still runs"
    assert not folder.exists() and not list(run.tmp.glob("suite-run-*")), "the temp folder was left behind"
    saved = _saved(run.res)
    assert [r.status for r in saved] == ["skipped"], "the skip record is kept, the stopped run is not recorded"


@pytest.mark.parametrize("window", ["before the run holds the worker", "while the telemetry starts"])
def test_a_stop_in_a_runs_first_moments_leaves_no_worker_and_no_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, window: str
) -> None:
    # A stop signal raises KeyboardInterrupt wherever the main thread is; under load it can land just
    # after the worker started, before the code that ends a run holds it. Made to land there: the
    # worker must be ended and its temp folder removed all the same.
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(tmp))
    path = write_scenario(tmp_path, "early", ENDLESS.format(name="early", devices="cpu"))
    (spec,) = plan.expand(scenario.load(path), smoke=True)
    workers: list[int] = []
    before = set(_children(os.getpid()))

    def interrupt(*args: object) -> None:
        workers.extend(c for c in _children(os.getpid()) if c not in before and "suite.worker" in _cmdline(c))
        raise KeyboardInterrupt("a stop signal")

    if window == "while the telemetry starts":
        monkeypatch.setattr(local._Process, "telemetry_sources", interrupt)
    else:
        monkeypatch.setattr(local.OomWitness, "__init__", interrupt)
    try:
        with pytest.raises(KeyboardInterrupt):
            local.LocalBackend(machine="m").run(spec)
        assert len(workers) == 1, "the worker had started when the stop came"
        assert _ended(workers[0]), f"worker {workers[0]} still runs"
        assert not list(tmp.glob("suite-run-*")), "the temp folder was left behind"
    finally:
        for pid in workers:  # none is left when the test passes
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)


def _controlling_terminal() -> None:
    """In the child, before exec: its stdin (a pty) becomes its controlling terminal."""
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def test_a_closed_terminal_stops_the_run_as_sigterm_does(tmp_path: Path) -> None:
    # A real hangup: the run's terminal goes away, the kernel sends SIGHUP, and every later write to
    # that terminal fails; the stop must still clean up and end with SIGTERM's exit code.
    (tmp_path / "tmp").mkdir()
    path = write_scenario(tmp_path, "closed", ENDLESS.format(name="closed", devices="cpu"))
    cmd = [sys.executable, "-m", "suite", "run", str(path), "--smoke", "--backend", "local"]
    cmd += ["--results", str(tmp_path / "res"), "--machine", "m"]
    master, slave = pty.openpty()
    env = {**os.environ, "PYTHONPATH": str(REPO), "TMPDIR": str(tmp_path / "tmp")}
    proc = subprocess.Popen(
        cmd,
        cwd=REPO,
        env=env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=_controlling_terminal,  # this test starts no threads: a preexec_fn is safe here
    )
    os.close(slave)
    worker = None
    try:
        deadline = time.monotonic() + WAIT_S
        while worker is None and time.monotonic() < deadline and proc.poll() is None:
            if select.select([master], [], [], 0.1)[0]:
                os.read(master, 65536)  # a terminal that is read, as a user's is
            worker = next((c for c in _children(proc.pid) if "suite.worker" in _cmdline(c)), None)
        assert worker is not None, "no worker seen"
        os.close(master)  # the terminal is gone: the kernel hangs it up
        master = -1
        code = proc.wait(timeout=60)
        assert code == 130, code
        assert _until(lambda: _ended(worker), GONE_S), f"worker {worker} still runs"
        assert not list((tmp_path / "tmp").glob("suite-run-*"))
    finally:
        if master >= 0:
            os.close(master)
        for group in (proc.pid, worker):
            if group is not None:
                try:
                    os.killpg(group, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
        proc.wait(timeout=30)


def test_a_worker_killed_by_hand_is_not_taken_for_the_oom_killer(
    tmp_path: Path, orchestrator: list[Orchestrator]
) -> None:
    run = Orchestrator(tmp_path, "killed_by_hand", "cpu")
    orchestrator.append(run)
    worker, folder = run.wait_for_worker()
    os.kill(worker, signal.SIGKILL)
    code = run.proc.wait(timeout=120)
    assert code == 1, (code, run.output())
    [result] = _saved(run.res)
    assert result.status == "error", (result.status, result.message)
    assert "SIGKILL" in result.message and "not by the kernel's OOM killer" in result.message, result.message
    assert not folder.exists()


def test_a_worker_still_training_on_the_results_folder_is_said(tmp_path: Path) -> None:
    res = tmp_path / "res"
    # As a worker whose orchestrator died and that did not end with it: it carries the folder it
    # works for in its environment, as every local worker does.
    env = {**os.environ, worker_lifeline.RESULTS_FOLDER_ENV: str((res / "m").resolve())}
    stray = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"], env=env, start_new_session=True)
    try:
        path = write_scenario(tmp_path, "beside", ENDLESS.format(name="beside", devices="gpu:64"))
        proc = suite_cli("run", path, "--smoke", "--backend", "local", "--results", res, "--machine", "m", timeout=120)
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert f"process {stray.pid}" in proc.stderr and "still running" in proc.stderr, proc.stdout + proc.stderr
        assert str((res / "m").resolve()) in proc.stderr
        other = suite_cli("run", path, "--smoke", "--backend", "local", "--results", tmp_path / "other", timeout=120)
        assert other.returncode == 0 and f"process {stray.pid}" not in other.stderr, "only the same folder's"
    finally:
        stray.kill()
        stray.wait()


# -- the parts, alone -------------------------------------------------------------------------------


def _age(folder: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(folder, (then, then))


def test_sweep_removes_only_unheld_old_run_folders(tmp_path: Path) -> None:
    stale, held, fresh = (lifeline.make_run_folder(tmp_path) for _ in range(3))
    for _, fd in (stale, fresh):
        os.close(fd)  # its orchestrator and worker are gone: nobody holds the lock
    plain = tmp_path / "suite-run-without-lock"  # not made by this code: never touched
    plain.mkdir()
    for folder in (stale[0], held[0], plain):
        _age(folder, lifeline.STALE_AFTER_S + 60)
    try:
        removed = lifeline.sweep_stale_run_folders(tmp_path)
        assert removed == [stale[0]] and not stale[0].exists()
        assert held[0].is_dir() and fresh[0].is_dir() and plain.is_dir()
    finally:
        os.close(held[1])


def test_run_folder_lock_is_held_while_a_child_holds_it(tmp_path: Path) -> None:
    folder, fd = lifeline.make_run_folder(tmp_path)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], pass_fds=(fd,))
    try:
        os.close(fd)  # the orchestrator is gone, its worker lives on
        _age(folder, lifeline.STALE_AFTER_S + 60)
        assert lifeline.sweep_stale_run_folders(tmp_path) == [] and folder.is_dir()
    finally:
        child.kill()
        child.wait()
    assert lifeline.sweep_stale_run_folders(tmp_path) == [folder]


def test_worker_watch_removes_its_folder_and_ends_its_group_when_the_pipe_closes(tmp_path: Path) -> None:
    folder = tmp_path / "suite-run-x"
    folder.mkdir()
    (folder / "spec.json").write_text("{}")
    read_fd, write_fd = os.pipe()
    code = (
        "import time; from suite.worker import lifeline; lifeline.end_with_parent(); "
        "import subprocess, sys; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "print('armed', flush=True); time.sleep(60)"
    )
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO),
        worker_lifeline.PARENT_FD_ENV: str(read_fd),
        worker_lifeline.RUN_FOLDER_ENV: str(folder),
    }
    proc = subprocess.Popen(
        [sys.executable, "-c", code], env=env, pass_fds=(read_fd,), stdout=subprocess.PIPE, start_new_session=True
    )
    os.close(read_fd)
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"armed\n"
        grandchildren = _children(proc.pid)
        assert grandchildren
        os.close(write_fd)  # as when the orchestrator dies, by any signal
        assert proc.wait(timeout=GONE_S) == -signal.SIGKILL
        assert not folder.exists()
        assert _until(lambda: all(_ended(p) for p in grandchildren), GONE_S), "its group went with it"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def _counters(tmp_path: Path, vmstat: int | None, group: int | None) -> tuple[Path, Path]:
    machine, memcg = tmp_path / "vmstat", tmp_path / "memory.oom_control"
    for path, value in ((machine, vmstat), (memcg, group)):
        path.unlink(missing_ok=True)
        if value is not None:
            path.write_text(f"under_oom 0\noom_kill {value}\n")
    return machine, memcg


@pytest.mark.parametrize(
    ("before", "after", "expected", "words"),
    [
        ((5, 2), (6, 3), True, "acted in its memory cgroup"),
        ((5, 2), (6, 2), False, "no OOM kill in its memory cgroup"),  # another cgroup's OOM kill
        ((5, None), (5, None), False, "no OOM kill on this machine"),
        ((5, None), (7, None), True, "acted on this machine"),
        ((None, None), (None, None), None, "no OOM-kill counter could be read"),
    ],
    ids=["cgroup-rose", "cgroup-still", "machine-still", "machine-rose", "nothing-readable"],
)
def test_oom_evidence_from_the_counters(
    tmp_path: Path,
    before: tuple[int | None, int | None],
    after: tuple[int | None, int | None],
    expected: bool | None,
    words: str,
) -> None:
    machine, memcg = _counters(tmp_path, *before)
    witness = oom.OomWitness(os.getpid(), vmstat=machine, locate=lambda pid: ("/job", memcg) if before[1] else None)
    _counters(tmp_path, *after)
    acted, evidence = witness.verdict()
    assert acted is expected and words in evidence, evidence


def test_memory_cgroup_of_this_process_is_found_where_the_machine_has_one() -> None:
    found = oom.memory_cgroup(os.getpid())
    if found is None:
        pytest.skip("no memory cgroup controller readable here")
    path, counter = found
    assert path.startswith("/") and counter.name in ("memory.oom_control", "memory.events")
    assert oom.read_counter(counter) is not None


@pytest.mark.parametrize(
    ("oom_killed", "evidence", "status", "words"),
    [
        (True, "the OOM killer acted in its memory cgroup", "host_oom", "did not send"),
        (False, "no OOM kill in its memory cgroup", "error", "not by the kernel's OOM killer"),
        (None, "no OOM-kill counter could be read", "error", "whether the kernel's OOM killer sent it is not known"),
    ],
    ids=["oom", "not-oom", "unknown"],
)
def test_classify_a_sigkill_by_the_evidence(oom_killed: bool | None, evidence: str, status: str, words: str) -> None:
    got, message = classify_exit(
        deadline_fired=False,
        oom_killed=oom_killed,
        oom_evidence=evidence,
        exit_code=-9,
        signum=signal.SIGKILL,
        wrote_result=False,
        timeout_s=60,
    )
    assert got == status and words in message and evidence in message, message


def test_the_run_folder_lock_is_held_and_names_its_maker(tmp_path: Path) -> None:
    folder, fd = lifeline.make_run_folder(tmp_path)
    other = os.open(folder / lifeline.FOLDER_LOCK, os.O_RDONLY)
    try:
        with pytest.raises(BlockingIOError):
            fcntl.flock(other, fcntl.LOCK_EX | fcntl.LOCK_NB)
        assert json.loads((folder / lifeline.FOLDER_LOCK).read_text())["pid"] == os.getpid()
    finally:
        os.close(other)
        os.close(fd)
