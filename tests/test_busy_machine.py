"""A busy machine is detected and said: the load around a run, its note, and ``suite env``'s verdict.

The figures are checked against truths the kernel or the program itself reports: a CPU hog started
and stopped here beside a real local run, and a child that reports its own ``process_time``. This
machine may be busy with other work while these tests run, so no test asserts that it is quiet.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import suite_cli, write_scenario

from suite import telemetry
from suite.record import results, under_load
from suite.record.results import RunResult
from suite.report import show

HOG = "while True: pass"
NOT_YET = telemetry.load.Process("", 0, 0, 0, 0)  # a process not yet in /proc: no ticks

TINY = """\
name: busy_tiny
question: Is a run beside a CPU hog said to be measured under load?
model: {hidden: [32]}
training: {epochs: 2, optimizer: sgd}
data: {allow_synthetic: true, train_samples: 1024, test_samples: 256}
repeats: 1
"""

# A child that burns CPU when told and reports its own CPU time before and after.
BURNER = """\
import sys, time
sys.stdin.readline()
start = time.process_time()
while time.process_time() - start < 1.0:
    pass
print(start, time.process_time(), flush=True)
sys.stdin.readline()
"""


def _hog() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", HOG])


def _stop(proc: subprocess.Popen) -> None:
    proc.kill()
    proc.wait()


def _with_load(block: dict) -> RunResult:
    return RunResult(status="ok", spec={}, telemetry={"load": block})


# ---------------------------------------------------------------------------------------------
# The /proc arithmetic against a process that reports its own CPU time


def test_cpu_time_read_from_proc_is_what_the_process_itself_counted() -> None:
    child = subprocess.Popen([sys.executable, "-c", BURNER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        tracker = telemetry.LoadTracker(telemetry.Ownership(singles=[os.getpid()]))
        tracker.scan()
        assert child.stdin is not None and child.stdout is not None
        child.stdin.write("go\n")
        child.stdin.flush()
        start, end = map(float, child.stdout.readline().split())
        tracker.scan()
        # Still alive: its /proc entry holds everything it used.
        info = telemetry.read_process(child.pid)
        assert info is not None and info.ticks / telemetry.CLK_TCK == pytest.approx(end, abs=0.05)
        figures = tracker.figures()
        (mine,) = [p for p in figures["top_others"] if p["pid"] == child.pid]
        used_s = mine["cores"] * figures["window_s"]
        # It was alive at the first scan: only what it used since then counts, which is its burn.
        assert used_s == pytest.approx(end - start, abs=0.05), (used_s, end - start)
        assert figures["other_cores"] >= mine["cores"]
    finally:
        _stop(child)


def test_the_runs_own_tree_is_not_counted_and_a_process_started_later_is_counted_whole() -> None:
    # A parent whose child spins is the run's own tree; a hog started after the first scan is not.
    spawn = f"import subprocess, sys; subprocess.run([sys.executable, '-c', {HOG!r}])"
    tree = subprocess.Popen([sys.executable, "-c", spawn], start_new_session=True)
    hog = None
    try:
        tracker = telemetry.LoadTracker(telemetry.Ownership(singles=[os.getpid()], trees=[tree.pid]))
        tracker.scan()
        hog = _hog()
        burner = None
        while burner is None or (telemetry.read_process(hog.pid) or NOT_YET).ticks < telemetry.CLK_TCK // 2:
            time.sleep(0.05)
            tracker.scan()
            burner = next((pid for pid, p in tracker.table.items() if p.ppid == tree.pid), burner)
        os.kill(hog.pid, signal.SIGSTOP)  # its time stands still between the last scan and the read below
        tracker.scan()
        hog_ticks = telemetry.read_process(hog.pid).ticks
        figures = tracker.figures()
        pids = {p["pid"]: p["cores"] for p in figures["top_others"]}
        assert tree.pid not in pids and burner not in pids, figures["top_others"]
        assert burner in tracker.own_now
        # Started after the first scan: every tick it used is in the window.
        assert pids[hog.pid] * figures["window_s"] == pytest.approx(hog_ticks / telemetry.CLK_TCK, abs=0.01)
    finally:
        if hog is not None:
            _stop(hog)
        os.killpg(tree.pid, signal.SIGKILL)  # the parent and its spinning child
        tree.wait()


def test_steal_and_busy_come_from_the_cpu_line() -> None:
    #                   user nice system idle iowait irq softirq steal guest guest_nice
    times = telemetry.parse_cpu_line("cpu  600 100 200 8000 50 10 40 1000 300 0\n")
    assert times.total == 600 + 100 + 200 + 8000 + 50 + 10 + 40 + 1000  # guest is inside user already
    assert times.busy == 600 + 100 + 200 + 10 + 40
    assert times.steal == 1000


def test_container_processes_are_told_by_their_cgroup(tmp_path: Path) -> None:
    """A Docker run's own processes are those whose /proc/PID/cgroup names the container (a /proc
    laid out here: the container's processes are not the orchestrator's descendants)."""
    cid = "4f" * 32

    def process(pid: int, ppid: int, ticks: int, cgroup: str) -> None:
        (tmp_path / str(pid)).mkdir()
        fields = ["S", ppid, pid, pid] + [0] * 7 + [ticks, 0, 0, 0] + [0] * 4 + [100] + [0] * 5
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (p {pid}) " + " ".join(map(str, fields)) + "\n")
        (tmp_path / str(pid) / "cgroup").write_text(cgroup)

    process(10, 1, 50, f"12:cpu:/docker/{cid}\n")  # the worker in its container
    process(11, 10, 70, f"0::/system.slice/docker-{cid}.scope\n")  # cgroup v2 with systemd
    process(20, 1, 30, "0::/user.slice\n")  # someone else
    own = telemetry.Ownership(singles=[99], cgroup=cid, proc=str(tmp_path))
    table = telemetry.load.read_processes(str(tmp_path))
    assert own.own(table) == {10, 11} and own.cgroup_seen


def test_a_process_started_in_the_tick_of_the_first_scan_is_counted_whole(tmp_path: Path) -> None:
    """/proc/uptime says 70.01 s and a process started just after it says 7001 ticks: the same tick.
    In floats 70.01 * 100 is 7001.000000000001, which once put such a process before the first scan
    and dropped what it used before it was first seen (a flaky count of a hog under a busy CI)."""

    def process(pid: int, ticks: int, start: int) -> None:
        (tmp_path / str(pid)).mkdir(exist_ok=True)
        fields = ["R", 1, pid, pid] + [0] * 7 + [ticks, 0, 0, 0] + [0] * 4 + [start] + [0] * 5
        (tmp_path / str(pid) / "stat").write_text(f"{pid} (p {pid}) " + " ".join(map(str, fields)) + "\n")

    (tmp_path / "uptime").write_text("70.01 120.00\n")
    (tmp_path / "stat").write_text("cpu  100 0 0 900 0 0 0 0 0 0\n")
    process(20, 30, 5000)  # alive before the first scan: only what it uses after counts
    times = iter([0.0, 1.0])
    own = telemetry.Ownership(singles=[99], proc=str(tmp_path))
    tracker = telemetry.LoadTracker(own, str(tmp_path), lambda: next(times))
    tracker.scan()
    process(20, 40, 5000)
    process(30, 52, 7001)  # started after the first scan, in the same tick
    (tmp_path / "uptime").write_text("71.01 121.00\n")
    (tmp_path / "stat").write_text("cpu  200 0 0 1000 0 0 0 0 0 0\n")
    tracker.scan()
    cores = {p["pid"]: p["cores"] for p in tracker.figures()["top_others"]}
    assert cores == {30: 0.52, 20: 0.1}


# ---------------------------------------------------------------------------------------------
# The note: one place for its words and thresholds


def test_load_note_words_and_thresholds() -> None:
    quiet = {"other_cores": 0.02, "steal_share": 0.001, "cores": 2}
    assert under_load.load_note(_with_load(quiet)) is None
    assert under_load.load_note(RunResult(status="ok", spec={})) is None  # not recorded: nothing said
    assert under_load.load_note(_with_load({**quiet, "other_cores": 0.85})) == (
        "measured while other processes used 85% of a core"
    )
    assert (
        under_load.load_note(_with_load({**quiet, "other_cores": 1.6}))
        == "measured while other processes used 1.6 cores"
    )
    # The timed fit's figure where the scans covered it, not the whole run's.
    fit = {**quiet, "other_cores": 0.05, "fit": {"other_cores": 0.4, "steal_share": 0.0, "covered_s": 3.0}}
    assert under_load.load_note(_with_load(fit)) == "measured while other processes used 40% of a core"
    assert under_load.load_note(_with_load({**quiet, "other_cores": under_load.OTHERS_BUSY_CORES - 0.001})) is None
    steal = {**quiet, "other_cores": 0.3, "steal_share": 0.07}
    assert under_load.load_note(_with_load(steal)) == (
        "measured while other processes used 30% of a core and the hypervisor took 7% of the CPU time (steal)"
    )
    gpu = {**quiet, "gpu_others": {"GPU-1": [{"pid": 7, "name": "python", "used_memory_bytes": 2**30}], "GPU-2": []}}
    assert under_load.load_note(_with_load(gpu)) == "measured while 1 other process used the GPU"
    runs = [_with_load(quiet), _with_load({**quiet, "other_cores": 1.6}), _with_load({**quiet, "other_cores": 0.5})]
    assert under_load.point_load_note(runs) == (
        "2 of 3 runs measured under load (the most: other processes used 1.6 cores)"
    )
    assert under_load.point_load_note(runs[:1]) is None
    assert under_load.point_load_note(runs[1:2]) == "measured while other processes used 1.6 cores"


# ---------------------------------------------------------------------------------------------
# End to end: a real local run beside a hog, and `suite env` beside one


@pytest.mark.slow
def test_a_run_beside_a_cpu_hog_is_recorded_and_said_to_be_under_load(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "busy_tiny", TINY)
    out = tmp_path / "results"
    hog = _hog()
    try:
        proc = suite_cli(
            "run",
            path,
            "--smoke",
            "--backend",
            "local",
            "--results",
            out,
            "--machine",
            "testbox",
            env={"KERAS_HOME": str(tmp_path / "keras")},
        )
    finally:
        _stop(hog)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ((file, result),) = results.load_folder(out)
    assert result.ok, result.message
    load = result.telemetry["load"]
    assert load["scans"] >= 2 and load["cores"] == os.cpu_count()
    # A hog spins all the time: on any machine it gets far more than the threshold, shared or not.
    assert load["other_cores"] >= 3 * under_load.OTHERS_BUSY_CORES, load
    assert hog.pid in [p["pid"] for p in load["top_others"]], load["top_others"]
    assert len(load["loadavg_start"]) == len(load["loadavg_end"]) == 3
    assert {s["name"] for s in result.telemetry["sources"]} == {"proc", "load"}
    note = under_load.load_note(result)
    assert note is not None and note.startswith("measured while other processes used"), note
    shown = suite_cli("show", file)
    assert shown.returncode == 0, shown.stderr
    assert "\nload:\n" in shown.stdout and note in shown.stdout and f"(pid {hog.pid})" in shown.stdout
    assert show.render(file, result) == shown.stdout
    assert note in " ".join(proc.stdout.split()), proc.stdout
    assert all(len(line) <= 120 or str(out) in line for line in proc.stdout.splitlines()), "prose wrapped, paths whole"
    pages = suite_cli("report", "--results", out, "--out", tmp_path / "pages")
    assert pages.returncode == 0, pages.stderr
    assert note in (tmp_path / "pages" / "busy_tiny.md").read_text(), "the page's notes say it"


def test_env_keeps_a_long_load_verdict_within_120_columns() -> None:
    """The verdict of a busy virtual machine (as a CI machine printed it) goes on under the facts' column."""
    from suite import envinfo

    verdict = (
        "busy: load 2.4 on 2 cores; other processes use 88% of a core, most fuse-overlayfs (pid 21814); "
        "the hypervisor takes 38% of the CPU time (steal) (results will be noisy)"
    )
    facts = {"machine": "vm", "python": "p", "cpu": "c", "packages": {}, "gpus": [], "gpu_note": "none"}
    governors = {"powersave": 2}
    text = envinfo.render({**facts, "load": {"verdict": verdict, "governors": governors}, "docker": {"error": "e"}})
    lines = text.splitlines()
    assert all(len(line) <= 120 for line in lines), text
    start = next(i for i, line in enumerate(lines) if line.startswith("load:     busy: "))
    assert lines[start + 1].startswith(" " * 10) and not lines[start + 1].startswith(" " * 11), text
    assert " ".join(" ".join(lines[start : start + 2]).split()) == f"load: {verdict}", text
    assert lines[start + 2].startswith("  CPU frequency governor: powersave on 2 of 2 CPUs;"), text
    assert lines[start + 3].startswith("    ") and lines[start + 3].endswith("holds them)"), text


def test_env_says_whether_the_machine_is_quiet_enough_to_benchmark() -> None:
    text, as_json = suite_cli("env"), suite_cli("env", "--json")
    assert text.returncode == as_json.returncode == 0, text.stderr + as_json.stderr
    (line,) = [ln for ln in text.stdout.splitlines() if ln.startswith("load:")]
    assert line.startswith(("load:     quiet enough to benchmark (", "load:     busy: ")), line
    facts = json.loads(as_json.stdout)["load"]
    assert isinstance(facts["quiet"], bool) and facts["verdict"]
    assert facts["cores"] == os.cpu_count() and len(facts["loadavg"]) == 3
    hog = _hog()
    try:
        busy = suite_cli("env")
    finally:
        _stop(hog)
    assert busy.returncode == 0, busy.stderr
    # Within 120 columns: the load fact goes on under the facts' column.
    assert all(len(ln) <= 120 for ln in busy.stdout.splitlines()), busy.stdout
    block = busy.stdout.split("\nload:", 1)[1].split("\n")
    fact = [block[0], *itertools.takewhile(lambda ln: ln.startswith(" " * 10), block[1:])]
    line = "load: " + " ".join(" ".join(fact).split())
    assert (
        line.startswith("load: busy: ") and "other processes use" in line and line.endswith("(results will be noisy)")
    ), line
