"""No measurement is lost after training: a result that cannot be saved where it belongs (a full
disk, a file system without hard links) is kept elsewhere with the command that moves it back,
and the plan stops cleanly."""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from conftest import REPO, suite_cli, write_scenario
from docker_fixtures import SMALL_SCENARIO

from suite.record import results, saving


@pytest.fixture
def tiny_disk(tmp_path: Path):
    """A 1 MiB tmpfs of this test's own (needs the right to mount: root, or skipped with the reason)."""
    mount = tmp_path / "disk"
    mount.mkdir()
    proc = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        pytest.skip(
            f"cannot mount a tmpfs here ({proc.stderr.strip() or proc.returncode}): the full-disk case needs one"
        )
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=False)


def _fill(disk: Path) -> Path:
    """Fill ``disk`` to its last block with a file of its own; that file."""
    filler = disk / "filler"
    with filler.open("wb", buffering=0) as fh, pytest.raises(OSError) as full:
        while True:
            fh.write(b"\0" * 4096)
    assert full.value.errno == errno.ENOSPC
    return filler


def _run_as_the_disk_fills(args: tuple, env: dict[str, str], disk: Path) -> tuple[subprocess.CompletedProcess, Path]:
    """``suite run ARGS`` whose disk fills once the run holds its folder (the lock is taken after
    the folder's check for room), while its first run trains; the run and the filler file."""
    lock = disk / "results" / "box" / ".suite-run.lock"
    proc = subprocess.Popen(
        [sys.executable, "-m", "suite", *map(str, args)],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(REPO), **env},
    )  # fmt: skip
    deadline = time.monotonic() + 120
    while not lock.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    filler = _fill(disk)
    out, err = proc.communicate(timeout=600)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err), filler


def test_a_full_disk_stops_the_plan_before_its_first_run(tmp_path: Path, tiny_disk: Path) -> None:
    # An empty file takes no block: a check that wrote one let a full disk through, and the first run
    # trained (for hours, on a real plan) before its result had nowhere to go.
    scenario = write_scenario(tmp_path, "tiny_full", SMALL_SCENARIO.format(name="tiny_full", widths="[8, 16]"))
    res = tiny_disk / "results"
    (res / "box").mkdir(parents=True)
    _fill(tiny_disk)
    fallback = tmp_path / "tmp"
    fallback.mkdir()
    proc = suite_cli(
        "run", scenario, "--smoke", "--backend", "local", "--results", res, "--machine", "box",
        env={"TMPDIR": str(fallback)},
    )  # fmt: skip
    assert proc.returncode == 2, proc.stdout + proc.stderr
    said = f"results folder {res / 'box'} cannot be created or written: no room for a result file of 64 KiB"
    assert said in proc.stderr and "No space left on device" in proc.stderr, proc.stderr
    assert "run 1 of" not in proc.stdout and list(fallback.rglob("*.json")) == [], "nothing trained"
    assert list(res.rglob("*.json")) == [] and list(res.rglob(".*.tmp")) == [], "the check leaves nothing behind"
    # check, which writes nothing, says so from the disk's free blocks.
    plan = suite_cli("check", scenario, "--smoke", "--backend", "local", "--results", res, "--machine", "box")
    assert "run would refuse this plan: " in plan.stdout and "no room for a result file of 64 KiB" in plan.stdout, (
        plan.stdout + plan.stderr
    )


def test_a_full_disk_keeps_the_measurement_and_stops_the_plan_cleanly(tmp_path: Path, tiny_disk: Path) -> None:
    scenario = write_scenario(tmp_path, "tiny_full", SMALL_SCENARIO.format(name="tiny_full", widths="[8, 16]"))
    res = tiny_disk / "results"
    (res / "box").mkdir(parents=True)
    fallback = tmp_path / "tmp"
    fallback.mkdir()
    env = {"TMPDIR": str(fallback)}  # the fallback folder is the temp folder's: this test's own
    args = ("run", scenario, "--smoke", "--backend", "local", "--results", res, "--machine", "box")
    proc, filler = _run_as_the_disk_fills(args, env, tiny_disk)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    out = proc.stdout + proc.stderr
    assert "No space left on device" in out and "it is kept as" in out, out
    assert "the plan stopped early: a result could not be saved" in out, out
    kept = sorted(fallback.rglob("*.json"))
    assert len(kept) == 1, "one run trained, its result kept; the plan stopped before the second"
    record = results.load(kept[0])
    assert record.ok and record.timing["fit_s"] > 0 and record.spec["scenario"] == "tiny_full"
    assert list(res.rglob("*.json")) == [], "nothing cut off where a reader looks"
    # The message's own command moves it back once there is room; then the run resumes from it.
    filler.unlink()
    command = out.split("Move it back once there is room: ")[1].splitlines()[0]
    subprocess.run(command, shell=True, check=True)
    assert [r.ok for _, r in results.load_folder(res / "box")] == [True]
    again = suite_cli("run", scenario, "--smoke", "--backend", "local", "--results", res, "--machine", "box", env=env)
    assert again.returncode == 0 and "1 already done" in again.stdout, again.stdout + again.stderr
    assert "could not be saved" not in again.stderr, "moved back: nothing is kept elsewhere any more"


def test_a_file_system_without_hard_links_still_gets_the_result(tmp_path: Path, monkeypatch) -> None:
    record = results.load(next((Path(__file__).parent / "fixtures" / "rich").rglob("*.json")))

    def no_links(src: str, dst: str) -> None:
        raise OSError(errno.EPERM, "Operation not permitted")  # what vfat answers to link()

    monkeypatch.setattr(os, "link", no_links)
    first = saving.save(record, tmp_path / "box" / "s", "abc-r0")
    second = saving.save(record, tmp_path / "box" / "s", "abc-r0")
    assert (first.name, second.name) == ("abc-r0.json", "abc-r0.2.json"), "never overwritten"
    assert results.load(second).to_dict() == record.to_dict()
    assert sorted(p.name for p in (tmp_path / "box" / "s").iterdir()) == ["abc-r0.2.json", "abc-r0.json"]


def test_a_number_json_cannot_hold_is_recorded_as_null(tmp_path: Path) -> None:
    record = results.load(next((Path(__file__).parent / "fixtures" / "rich").rglob("*.json")))
    quality = {**record.quality, "final_loss": float("nan"), "train_loss": [1.0, float("inf")]}
    odd = results.RunResult(**{**record.__dict__, "quality": quality})
    path = saving.save(odd, tmp_path, "nan-r0")
    saved = json.loads(path.read_text())
    assert saved["quality"]["final_loss"] is None and saved["quality"]["train_loss"] == [1.0, None]
    assert results.load(path).ok


def test_without_any_fallback_the_record_is_written_to_stderr(tmp_path: Path, capsys, monkeypatch) -> None:
    record = results.load(next((Path(__file__).parent / "fixtures" / "rich").rglob("*.json")))
    blocked = tmp_path / "a-file"
    blocked.write_text("")
    monkeypatch.setattr(saving, "fallback_folders", lambda: [blocked / "x", blocked / "y"])
    stem = f"{uuid.uuid4().hex[:6]}-r0"
    with pytest.raises(saving.Unsaved) as unsaved:
        saving.save(record, blocked / "box" / "s", stem)
    # Saved as the message says, it never overwrites the run's own file, which a rerun may have made since.
    said = str(unsaved.value).split("its record is on stderr above: save it as ")[1].split(" ")[0]
    assert said.startswith(str(blocked / "box" / "s" / f"{stem}.kept-")) and said.endswith(".json"), said
    assert json.loads(capsys.readouterr().err)["spec"] == record.spec


def test_moving_a_kept_result_back_after_a_rerun_loses_neither_measurement(tmp_path: Path, tiny_disk: Path) -> None:
    """The two things the full-disk message says, done in the other order: the plan rerun once there
    is room (it measures the point again), then the kept result moved back by the message's own
    command. The rerun's result must not be overwritten: both measurements are on file after."""
    scenario = write_scenario(tmp_path, "tiny_order", SMALL_SCENARIO.format(name="tiny_order", widths="[8]"))
    res = tiny_disk / "results"
    (res / "box").mkdir(parents=True)
    fallback = tmp_path / "tmp"
    fallback.mkdir()
    env = {"TMPDIR": str(fallback)}
    args = ("run", scenario, "--smoke", "--backend", "local", "--results", res, "--machine", "box")
    proc, filler = _run_as_the_disk_fills(args, env, tiny_disk)
    out = proc.stdout + proc.stderr
    assert proc.returncode == 1 and "it is kept as" in out, out
    command = out.split("Move it back once there is room: ")[1].splitlines()[0]
    filler.unlink()
    again = suite_cli(*args, env=env)  # "rerun when it can, to resume"
    assert again.returncode == 0, again.stdout + again.stderr
    # The run says that a measurement of this machine waits in the fallback folder.
    kept = fallback / f"suite-unsaved-{os.getuid()}" / "box"
    said = f"warning: kept in {kept}: 1 result of box (tiny_order) that a run could not save where it belonged"
    assert said in again.stderr, again.stderr
    rerun = {p.name: p.read_bytes() for p in (res / "box").rglob("*.json")}
    assert len(rerun) == 1, rerun.keys()
    subprocess.run(command, shell=True, check=True)
    after = {p.name: p.read_bytes() for p in (res / "box").rglob("*.json")}
    assert len(after) == 2, f"the move back overwrote the rerun's result: {sorted(after)}"
    assert set(rerun.items()) <= set(after.items()), "the rerun's result is kept as it was"
    assert sorted(r.ok for _, r in results.load_folder(res / "box")) == [True, True]


def test_a_result_file_is_as_readable_as_the_pages_made_from_it(tmp_path: Path) -> None:
    """A results folder is shared (a team's server, a published `reports/`): a result is made with
    the mode any file made here gets (0o666 less the umask), as the pages are, not mkstemp's 0600."""
    scenario = write_scenario(tmp_path, "tiny_mode", SMALL_SCENARIO.format(name="tiny_mode", widths="[8]"))
    res, out = tmp_path / "results", tmp_path / "pages"
    old = os.umask(0o022)
    try:
        proc = suite_cli("run", scenario, "--smoke", "--backend", "local", "--results", res, "--machine", "box")
        assert proc.returncode == 0, proc.stdout + proc.stderr
        assert suite_cli("report", "--results", res, "--out", out).returncode == 0
    finally:
        os.umask(old)
    made = sorted(res.rglob("*.json")) + sorted(out.glob("*.md"))
    assert len(made) > 1 and {oct(p.stat().st_mode & 0o777) for p in made} == {"0o644"}, made
