"""``check`` plans before anything runs: per point, whether ``run`` would run it here, skip it (and
why) or find it done, and how long it should take, from earlier results or else the timeout."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from conftest import check_rows, check_skipped, said, suite_cli, write_scenario

from suite.record import results, saving
from suite.report import reasons
from suite.spec import plan, scenario

TINY = """\
name: tiny_plan
question: How long will it take?
model: {hidden: [32]}
training: {epochs: 1}
data: {allow_synthetic: true, train_samples: 512, test_samples: 256}
repeats: 3
timeout_s: 200
matrix:
  model.hidden.0: [8, 16, 32]
  device: [cpu, "gpu:64"]
smoke:
  timeout_s: 100
"""


def _rows(stdout: str) -> dict[str, list[str]]:
    """point label -> [plan here, estimate], of the points that run or are done here."""
    return {label: [row["plan here"], row["estimate"]] for label, row in check_rows(stdout).items()}


def _record(folder: Path, spec: plan.RunSpec, status: str, seconds: float) -> None:
    start = datetime(2025, 1, 1, tzinfo=UTC) + timedelta(hours=spec.order)
    run = {
        "machine": "m",
        "started_at": start.isoformat(),
        "finished_at": (start + timedelta(seconds=seconds)).isoformat(),
    }
    saving.save(results.RunResult(status=status, spec=spec.to_dict(), run=run), folder / spec.scenario, spec.run_id)


def _on_file(tmp_path: Path, path: Path, *, walls: dict[tuple[int, int], float], overrides: dict | None = None) -> Path:
    """Results as ``run`` would have left them: {(width, repetition): wall seconds} ok, width 32 rep 0 an error."""
    res = tmp_path / "results"
    specs = plan.expand(scenario.load(path), overrides=overrides)  # this host's data identity, as check resolves it
    for spec in specs:
        key = (spec.point["model.hidden.0"], spec.repetition)
        if spec.device == "cpu" and key in walls:
            _record(res / "m", spec, "ok", walls[key])
        if spec.device == "cpu" and key == (32, 0):
            _record(res / "m", spec, "error", 5.0)  # a failed run says nothing about how long one takes
    return res


def test_each_point_says_what_run_does_with_it_here_and_how_long(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "tiny_plan", TINY)
    walls = {(8, 0): 10.0, (8, 1): 20.0, (8, 2): 60.0, (16, 0): 30.0}
    res = _on_file(tmp_path, path, walls=walls)
    # Full size on synthetic digits (no MNIST here): run would refuse it without --allow-synthetic.
    proc = suite_cli("check", path, "--backend", "local", "--results", res, "--machine", "m", "--allow-synthetic")
    assert proc.returncode == 0, proc.stderr
    rows = _rows(proc.stdout)
    assert "device" not in check_rows(proc.stdout)["width=8, device=cpu"], "each label names its device"
    assert rows["width=8, device=cpu"] == ["done (ok on file)", "-"]
    assert rows["width=16, device=cpu"] == [
        "will run 2 of 3 (1 ok on file)",
        "~1 min 0 s (2 x 30 s, median of 1)",
    ]
    assert rows["width=32, device=cpu"] == ["will run", "<= 10 min 0 s (3 x timeout_s)"]
    # The skipped points leave the table: one line per reason, without its bracketed detail, names
    # them below it; the reason in full follows, once.
    assert proc.stdout.startswith("tiny_plan, 6 points:\n| point "), proc.stdout
    assert all(len(line) <= 120 or str(tmp_path) in line for line in proc.stdout.splitlines()), proc.stdout
    assert not any(label.endswith("gpu:64") for label in rows), rows
    skipped = check_skipped(proc.stdout)
    assert list(skipped) == [f"width={w}, device=gpu:64" for w in (8, 16, 32)], proc.stdout
    (line,) = set(skipped.values())
    assert line.startswith("3 GPU points (9 runs) skipped: needs 64 GPU(s); this machine has")
    assert " (" not in line.split(": ", 1)[1], "the reason without its detail"
    if "this machine has no GPU" in line:  # here: the reason says why (no NVML, no nvidia-smi)
        full = said(proc.stdout, "skipped, in full: ").removeprefix("skipped, in full: ")
        assert full.startswith("needs 64 GPU(s); this machine has no GPU ("), proc.stdout
        assert proc.stdout.count("skipped, in full: ") == 1, proc.stdout
        assert line.endswith(f"skipped: {reasons.short_reason(full)}")
    assert "6 points, 18 runs" in proc.stdout
    assert said(proc.stdout, "backend: ") == f"backend: local (--backend); earlier results: {res / 'm'}"
    assert said(proc.stdout, "here: ") == (
        "here: 5 runs will run, 9 skipped, 4 already done (ok on file); estimated time: about 1 min 0 s from "
        "earlier results + at most 10 min 0 s for 3 runs without an earlier result (timeout_s each)"
    )

    fresh = _rows(
        suite_cli(
            "check", path, "--backend", "local", "--results", res, "--machine", "m", "--fresh", "--allow-synthetic"
        ).stdout
    )
    assert fresh["width=8, device=cpu"] == ["will run", "~1 min 0 s (3 x 20 s, median of 3)"]


@pytest.mark.parametrize("seconds", [-63_072_000.0, 1e9], ids=["ends-before-it-starts", "thirty-years"])
def test_times_no_run_could_take_are_not_an_estimate(tmp_path: Path, seconds: float) -> None:
    """A result may come from anyone: a run that ends before it starts, or lasts longer than its
    timeout allows, gives no estimate; the point is estimated by its timeout, as with none on file."""
    path = write_scenario(tmp_path, "tiny_plan", TINY)
    res = _on_file(tmp_path, path, walls={(16, 0): seconds})
    proc = suite_cli("check", path, "--backend", "local", "--results", res, "--machine", "m", "--allow-synthetic")
    assert proc.returncode == 0, proc.stderr
    assert _rows(proc.stdout)["width=16, device=cpu"] == [
        "will run 2 of 3 (1 ok on file)",
        "<= 6 min 40 s (2 x timeout_s)",
    ], proc.stdout


def test_a_point_done_on_file_gives_no_skip_reason_under_the_table(tmp_path: Path) -> None:
    """A point this machine cannot run, whose runs are all ok on file (run elsewhere, copied here): done."""
    path = write_scenario(tmp_path, "tiny_plan", TINY)
    res = tmp_path / "results"
    for spec in plan.expand(scenario.load(path)):
        if spec.device == "gpu:64":
            _record(res / "m", spec, "ok", 10.0)
    proc = suite_cli("check", path, "--backend", "local", "--results", res, "--machine", "m", "--allow-synthetic")
    assert proc.returncode == 0, proc.stderr
    assert _rows(proc.stdout)["width=8, device=gpu:64"][0] == "done (ok on file)"
    assert "0 skipped" in proc.stdout and "skipped, in full" not in proc.stdout, proc.stdout
    # One of a point's runs on file: the point is skipped, its runs left counted, what is on file said.
    for file in sorted((res / "m" / "tiny_plan").glob("*-r[12].json")):
        file.unlink()
    proc = suite_cli("check", path, "--backend", "local", "--results", res, "--machine", "m", "--allow-synthetic")
    skipped = check_skipped(proc.stdout)
    assert list(skipped) == [f"width={w}, device=gpu:64 (1 of 3 ok on file)" for w in (8, 16, 32)], proc.stdout
    assert next(iter(skipped.values())).startswith("3 GPU points (6 runs) skipped: "), proc.stdout


def test_budget_says_how_many_runs_start_before_it_is_spent(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "tiny_plan", TINY)
    res = _on_file(tmp_path, path, walls={(8, 0): 10.0, (8, 1): 20.0, (8, 2): 60.0, (16, 0): 30.0})
    args = ("--backend", "local", "--results", res, "--machine", "m", "--allow-synthetic")

    def budget_line(*more: str) -> str:
        proc = suite_cli("check", path, *args, *more)
        assert proc.returncode == 0, proc.stderr
        return said(proc.stdout, "--budget")

    # Left to run, in the plan's interleaved order (repetition by repetition): width 32 r0 (no
    # earlier result: its 200 s timeout), width 16 r1 (30 s, the median of its one ok run), width 32
    # r1, width 16 r2, width 32 r2. A run starts while the time spent before it is under the budget.
    bound = " (runs with no earlier result counted at their timeout_s: more may start)"
    assert (
        budget_line("--budget", "1m")
        == f"--budget 1m: by these estimates, 1 of the 5 runs starts within it, 4 wait for the next run{bound}"
    )
    assert (
        budget_line("--budget", "4m")
        == f"--budget 4m: by these estimates, 3 of the 5 runs start within it, 2 wait for the next run{bound}"
    )
    assert budget_line("--budget", "10h") == "--budget 10h: by these estimates, all 5 runs start within it"
    # Every estimate from earlier runs (widths 8 and 16, medians 20 s and 30 s): no bound to add.
    # Started at 0, 20, 50 and 70 s; the fifth would start at 100 s, when the budget is spent.
    picked = budget_line("--fresh", "-k", "width=8 or width=16", "--budget", "100s")
    assert picked == "--budget 100s: by these estimates, 4 of the 6 runs start within it, 2 wait for the next run"
    one = budget_line("-k", "width=16", "--budget", "1h", "--repeats", "2")  # r0 on file: r1 left
    assert one == "--budget 1h: by these estimates, the one run starts within it"
    proc = suite_cli("check", path, *args, "--budget", "soon")
    assert (
        proc.returncode == 2
        and "--budget: got 'soon'; allowed: a duration such as 2h, 90m, 1h30m or 600s" in proc.stderr
    )


def test_smoke_size_and_another_machine_have_their_own_results(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "tiny_plan", TINY)
    res = _on_file(tmp_path, path, walls={(8, 0): 10.0})
    smoke = _rows(suite_cli("check", path, "--smoke", "--backend", "local", "--results", res, "--machine", "m").stdout)
    assert smoke["width=8, device=cpu"] == ["will run", "<= 1 min 40 s (timeout_s)"]
    other = _rows(suite_cli("check", path, "--backend", "local", "--results", res, "--machine", "other").stdout)
    assert other["width=8, device=cpu"][0] == "run refuses (below)", "full size on synthetic digits"
    other = _rows(
        suite_cli(
            "check", path, "--backend", "local", "--results", res, "--machine", "other", "--allow-synthetic"
        ).stdout
    )
    assert other["width=8, device=cpu"][0] == "will run"


def test_set_makes_other_runs_and_k_plans_only_its_points(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "tiny_plan", TINY)
    res = _on_file(tmp_path, path, walls={(8, 0): 10.0, (8, 1): 10.0, (8, 2): 10.0})
    where = ["--backend", "local", "--results", res, "--machine", "m", "--allow-synthetic"]
    changed = suite_cli("check", path, *where, "--set", "training.epochs=2", "-k", "width=8")
    assert changed.returncode == 0, changed.stderr
    rows = _rows(changed.stdout)
    assert list(rows) == ["width=8, device=cpu"] and list(check_skipped(changed.stdout)) == ["width=8, device=gpu:64"]
    assert rows["width=8, device=cpu"][0] == "will run", "two epochs are not the one measured"
    assert "2 of 6 points, 6 of 18 runs match -k 'width=8'" in changed.stdout
    assert "--set, for every point: training.epochs=2" in changed.stdout
    same = _on_file(tmp_path / "again", path, walls={(8, 0): 10.0}, overrides={"training.epochs": 2})
    rows = _rows(
        suite_cli(
            "check",
            path,
            *where[:2],
            "--results",
            same,
            "--machine",
            "m",
            "--set",
            "training.epochs=2",
            "--allow-synthetic",
        ).stdout
    )
    assert rows["width=8, device=cpu"][0] == "will run 2 of 3 (1 ok on file)"


def test_an_unusable_backend_is_bad_input(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "tiny_plan", TINY)
    proc = suite_cli("check", path, "--backend", "docker", "--docker-host", "tcp://127.0.0.1:9")
    assert proc.returncode == 2 and proc.stderr.startswith("error: --backend docker: no Docker engine answers")
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_check_after_a_real_run(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "tiny_plan", TINY)
    where = ["--smoke", "--backend", "local", "--results", tmp_path / "r", "--machine", "m", "-k", "width=8"]
    before = _rows(suite_cli("check", path, *where).stdout)
    assert before["width=8, device=cpu"] == ["will run", "<= 1 min 40 s (timeout_s)"]
    proc = suite_cli("run", path, *where)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    after = suite_cli("check", path, *where)
    assert _rows(after.stdout)["width=8, device=cpu"][0] == "done (ok on file)"
    assert "here: 0 runs will run, 1 skipped, 1 already done (ok on file); nothing to run" in after.stdout
    fresh = _rows(suite_cli("check", path, *where, "--fresh").stdout)
    status, estimate = fresh["width=8, device=cpu"]
    assert status == "will run" and estimate.startswith("~") and estimate.endswith("(median of 1)")
