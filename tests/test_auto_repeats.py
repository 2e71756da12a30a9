"""``repeats: auto`` through the CLI: the scenario keys, ``check``'s counts, a real two-stage run on
the local backend, and the report's intervals and notes, against numbers computed here with scipy."""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path

import numpy as np
import pytest
from conftest import check_rows, suite_cli, write_scenario
from scipy import stats as scipy_stats

from suite.record import results

TINY = """\
name: tiny_auto
question: Does a wider first layer slow this tiny MLP down?
model: {kind: mlp, hidden: [32, 16]}
training: {epochs: 2, batch_size: 128}
data: {dataset: mnist, allow_synthetic: true, train_samples: 1024, test_samples: 256}
device: cpu
repeats: auto
timeout_s: 300
matrix:
  model.hidden.0: [32, 128]
smoke: {data.train_samples: 1024}
report:
  baseline: {model.hidden.0: 32}
  verdict: knobs
"""


def _needed(first_fits: list[float], precision: float) -> int:
    """The two-stage count, from its definition: the fewest n with t(3) * sqrt(2 var / n) <= precision."""
    t = scipy_stats.t.ppf(0.975, len(first_fits) - 1)
    return math.ceil(2 * t**2 * np.var(np.log(first_fits), ddof=1) / precision**2 - 1e-9)


@pytest.mark.parametrize(
    ("extra", "key", "allowed"),
    [
        ("repeats: auto\nprecision: 0\n", "precision", "a number in [0.001, 1]"),
        ("repeats: auto\nprecision: .nan\n", "precision", "a number in [0.001, 1]"),
        ("repeats: auto\nmax_repeats: 3\n", "max_repeats", "an integer in [4, 1000]"),
        ("repeats: 5\nprecision: 0.05\n", "precision", "only with repeats: auto"),
        ("max_repeats: 8\n", "max_repeats", "only with repeats: auto"),
        ("repeats: many\n", "repeats", "an integer in [1, 1000], or auto"),
    ],
)
def test_bad_auto_settings_are_refused_naming_the_file_and_key(
    tmp_path: Path, extra: str, key: str, allowed: str
) -> None:
    text = TINY.replace("repeats: auto\n", "") + extra
    path = write_scenario(tmp_path, "bad", text)
    proc = suite_cli("check", path, "--results", tmp_path / "results")
    assert proc.returncode == 2
    assert "bad.yaml" in proc.stderr and f"key '{key}'" in proc.stderr and allowed in proc.stderr, proc.stderr


def test_check_shows_the_range_of_runs_before_the_first_stage(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "tiny_auto", TINY)
    proc = suite_cli("check", path, "--results", tmp_path / "results", "--backend", "local")
    assert proc.returncode == 0, proc.stderr
    rows = check_rows(proc.stdout)
    assert len(rows) == 2 and all(row["reps"] == "4-10 (auto)" for row in rows.values()), proc.stdout
    assert "2 points without a count yet" in proc.stdout and "up to 12 runs more in all" in proc.stdout
    assert "2 points, 8 runs (repeats: auto: the runs of the first stage; more follow" in proc.stdout
    # --repeats auto makes any scenario's counts adaptive; --repeats N a fixed count, for this one too.
    fixed = write_scenario(
        tmp_path, "fixed", TINY.replace("repeats: auto\n", "repeats: 3\n").replace("tiny_auto", "fixed")
    )
    proc = suite_cli("check", fixed, "--results", tmp_path / "results", "--backend", "local", "--repeats", "auto")
    assert proc.returncode == 0 and "| 4-10 (auto) " in proc.stdout, proc.stdout + proc.stderr
    proc = suite_cli("check", path, "--results", tmp_path / "results", "--backend", "local", "--repeats", "2")
    assert proc.returncode == 0 and "(auto)" not in proc.stdout and "2 points, 4 runs\n" in proc.stdout
    proc = suite_cli("check", path, "--repeats", "some")
    assert proc.returncode == 2 and "--repeats: got 'some'; allowed: an integer in [1, 1000], or auto" in proc.stderr


def test_the_plan_counts_auto_points_at_their_own_cap_against_max_runs(tmp_path: Path) -> None:
    capped = write_scenario(tmp_path, "capped", TINY.replace("repeats: auto\n", "repeats: auto\nmax_repeats: 5\n"))
    ok = suite_cli(
        "check", capped, "--repeats", "auto", "--max-runs", "10", "--backend", "local", "--results", tmp_path
    )
    assert ok.returncode == 0, ok.stderr  # 2 points x at most 5
    refused = suite_cli("check", capped, "--repeats", "auto", "--max-runs", "9", "--backend", "local")
    assert refused.returncode == 2 and "the plan holds 10 runs" in refused.stderr, refused.stderr
    wide = TINY.replace("repeats: auto\n", "repeats: auto\nmax_repeats: 1000\n").replace("[32, 128]", "[8, 16, 32]")
    big = write_scenario(tmp_path, "big", wide)
    for extra in ([], ["--repeats", "auto"]):
        proc = suite_cli("check", big, *extra, "--max-runs", "2999", "--backend", "local")
        assert proc.returncode == 2 and "3,000 runs" in proc.stderr, (extra, proc.stderr)


@pytest.fixture(scope="module")
def auto_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """Two points at smoke size, run for real by the two-stage rule with a precision no spread
    meets, so each takes its first 4 runs and then more, to the cap of 5."""
    folder = tmp_path_factory.mktemp("auto")
    path = write_scenario(
        folder, "tiny_auto", TINY.replace("repeats: auto\n", "repeats: auto\nprecision: 0.001\nmax_repeats: 5\n")
    )
    res = folder / "results"
    proc = suite_cli(
        "run", path, "--smoke", "--repeats", "auto", "--backend", "local", "--machine", "box", "--results", res
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return path, res, proc.stdout


@pytest.mark.slow
def test_a_point_runs_its_first_stage_then_as_many_more_as_its_spread_asks(auto_run, tmp_path: Path) -> None:
    path, res, out = auto_run
    assert "repeats: auto: the first stage's spreads ask for 2 runs more" in out
    assert "tiny_auto, 2 points: 10 ok" in out and "geo. mean of 5 runs" in out
    loaded = [r for _, r in results.load_folder(res / "box")]
    # The console's figure is the page's table's: the geometric mean of the point's fit times.
    [(label, said)] = re.findall(r"lowest fit time: \[(.+)\] (\d+\.\d\d) s \(geo\. mean of 5 runs", out)
    fits = [r.timing["fit_s"] for r in loaded if r.spec["point_label"] == label]
    assert said == f"{math.exp(sum(map(math.log, fits)) / len(fits)):.2f}", (said, fits)
    by_point: dict[str, list[int]] = {}
    for r in loaded:
        assert r.ok and r.spec["report"]["repeats"] == {"auto": {"first": 4, "precision": 0.001, "max_repeats": 5}}
        by_point.setdefault(r.spec["point_label"], []).append(r.spec["repetition"])
    assert {k: sorted(v) for k, v in by_point.items()} == {"width=32": [0, 1, 2, 3, 4], "width=128": [0, 1, 2, 3, 4]}
    # Resumed, nothing runs again; check knows each point's count now.
    again = suite_cli(
        "run", path, "--smoke", "--repeats", "auto", "--backend", "local", "--machine", "box", "--results", res
    )
    assert again.returncode == 0 and "runs: 10 already done" in again.stdout, again.stdout
    assert "nothing to run in the first stage of repeats: auto" in again.stdout, "more may follow it"
    check = suite_cli(
        "check", path, "--smoke", "--repeats", "auto", "--backend", "local", "--machine", "box", "--results", res
    )
    rows = check_rows(check.stdout).values()
    assert len(rows) == 2, check.stdout
    assert all(row["reps"] == "5 (auto)" and row["plan here"] == "done (ok on file)" for row in rows), check.stdout
    assert "without a count yet" not in check.stdout


@pytest.mark.slow
def test_the_report_prints_the_two_stage_interval_and_why_each_point_stopped(auto_run, tmp_path: Path) -> None:
    _, res, _ = auto_run
    out = tmp_path / "reports"
    proc = suite_cli("report", "--results", res, "--out", out, "--format", "md,json")
    assert proc.returncode == 0, proc.stderr
    fits = {}
    for _, r in sorted(results.load_folder(res / "box"), key=lambda pr: pr[1].spec["repetition"]):
        fits.setdefault(r.spec["point_label"], []).append(r.timing["fit_s"])
    page = (out / "tiny_auto.md").read_text()
    for label, times in fits.items():
        need = _needed(times[:4], 0.001)
        assert need > 5
        assert (
            f"- {label}: " in page
            and f"repeats: auto: 5 runs, the cap (max_repeats; its first 4 asked for {need})" in page
        )
    # The baseline's time over the point's: means of every run, variances of the first 4 alone.
    base, point = np.log(fits["width=32"]), np.log(fits["width=128"])
    va, vb = base[:4].var(ddof=1) / 5, point[:4].var(ddof=1) / 5
    dof = (va + vb) ** 2 / (va**2 / 3 + vb**2 / 3)
    half = scipy_stats.t.ppf(0.975, dof) * math.sqrt(va + vb)
    diff = base.mean() - point.mean()
    doc = json.loads((out / "report.json").read_text())
    row = next(p for p in doc["points"] if p["point"] == "width=128")
    assert row["speedup"] == pytest.approx(math.exp(diff))
    assert (row["speedup_ci_low"], row["speedup_ci_high"]) == pytest.approx(
        (math.exp(diff - half), math.exp(diff + half))
    )
    assert "--repeats auto" in page  # the command under the page measures them again the same way


@pytest.mark.slow
def test_the_note_says_precision_reached_or_stopped_short_from_the_files(auto_run, tmp_path: Path) -> None:
    # The same runs with their fit times set here: a first stage quiet enough for 4 runs, and a
    # point whose fifth run is gone (the plan stopped before it).
    _, res, _ = auto_run
    copy = tmp_path / "results"
    shutil.copytree(res, copy)
    for path in sorted((copy / "box").rglob("*.json")):
        data = json.loads(path.read_text())
        if "spec" not in data:
            continue
        label, rep = data["spec"]["point_label"], data["spec"]["repetition"]
        if label == "width=128" and rep == 4:
            path.unlink()
            continue
        data["spec"]["report"]["repeats"]["auto"]["precision"] = 0.05
        spread = 0.001 if label == "width=32" else 0.1
        data["timing"]["fit_s"] = 1.0 + spread * (rep % 2)
        path.write_text(json.dumps(data))
    proc = suite_cli("report", "--results", copy, "--out", tmp_path / "reports")
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "reports" / "tiny_auto.md").read_text()
    assert _needed([1.0, 1.001, 1.0, 1.001], 0.05) <= 4
    assert "- width=32: " in page and "repeats: auto: 5 runs, precision reached" in page
    need = _needed([1.0, 1.1, 1.0, 1.1], 0.05)
    assert 4 < need
    assert f"repeats: auto: 4 of the {min(need, 5)} runs its first 4 asked for: the plan stopped short" in page


@pytest.mark.slow
def test_reproduce_takes_the_originals_first_stage_and_reruns_a_fixed_count(auto_run) -> None:
    from suite.reproduce import equivalence, originals

    _, res, _ = auto_run
    points = originals.group_points(originals.load_inputs([res / "box"]))
    specs = originals.rerun_specs(points, None)
    assert len(specs) == 10 and all("repeats" not in s.report for s in specs)  # 5 reruns a point, no rule
    original = [r.timing["fit_s"] for r in points[0].ok_runs]
    rerun = [t * 1.01 for t in original[:3]] + [original[0]]
    v = equivalence.verdict(original, rerun, 0.1, original_first=4)
    lo, lr = np.log(original), np.log(rerun)
    va, vb = lo[:4].var(ddof=1) / len(lo), lr.var(ddof=1) / len(lr)
    dof = (va + vb) ** 2 / (va**2 / 3 + vb**2 / (len(lr) - 1))
    half = scipy_stats.t.ppf(0.975, dof) * math.sqrt(va + vb)
    diff = lr.mean() - lo.mean()
    assert v.ratio is not None
    assert (v.ratio.low, v.ratio.high) == pytest.approx((math.exp(diff - half), math.exp(diff + half)))


def _edit(folder: Path, change) -> None:
    """Apply ``change(data, label, repetition)`` to every result file under ``folder``; it returns
    False to delete the file."""
    for path in sorted(folder.rglob("*.json")):
        data = json.loads(path.read_text())
        if "spec" not in data:
            continue
        if change(data, data["spec"]["point_label"], data["spec"]["repetition"]) is False:
            path.unlink()
        else:
            path.write_text(json.dumps(data))


@pytest.mark.slow
def test_a_first_stage_not_whole_on_file_is_read_as_a_fixed_count(auto_run, tmp_path: Path) -> None:
    # Run 2 of the baseline is gone while its run 5 is there: the count was not set from what is on
    # file, so the interval is Welch's over every run, and the note says why.
    _, res, _ = auto_run
    copy = tmp_path / "results"
    shutil.copytree(res, copy)
    _edit(copy, lambda data, label, rep: not (label == "width=32" and rep == 1))
    proc = suite_cli("report", "--results", copy, "--out", tmp_path / "out", "--format", "md,json")
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "out" / "tiny_auto.md").read_text()
    assert "repeats: auto: 4 runs; its first stage (runs 1-4) is not all ok in this machine's folder" in page
    fits: dict[str, list[float]] = {}
    for _, r in sorted(results.load_folder(copy / "box"), key=lambda pr: pr[1].spec["repetition"]):
        fits.setdefault(r.spec["point_label"], []).append(r.timing["fit_s"])
    base, point = np.log(fits["width=32"]), np.log(fits["width=128"])
    welch = scipy_stats.ttest_ind(base, point, equal_var=False).confidence_interval(0.95)
    row = next(
        p for p in json.loads((tmp_path / "out" / "report.json").read_text())["points"] if p["point"] == "width=128"
    )
    assert (row["speedup_ci_low"], row["speedup_ci_high"]) != pytest.approx((math.exp(welch.low), math.exp(welch.high)))
    # The point side still has its whole first stage: the two sides' own rules, one interval.
    va, vb = base.var(ddof=1) / len(base), point[:4].var(ddof=1) / len(point)
    dof = (va + vb) ** 2 / (va**2 / (len(base) - 1) + vb**2 / 3)
    half = scipy_stats.t.ppf(0.975, dof) * math.sqrt(va + vb)
    diff = base.mean() - point.mean()
    assert (row["speedup_ci_low"], row["speedup_ci_high"]) == pytest.approx(
        (math.exp(diff - half), math.exp(diff + half))
    )


@pytest.mark.slow
def test_a_point_below_the_accuracy_gate_takes_no_second_stage(auto_run, tmp_path: Path) -> None:
    # The first stages on file, one run of width=128 at a test accuracy under the gate: that point
    # is kept out of every verdict, so its first 4 runs are all it is asked for.
    path, res, _ = auto_run
    copy = tmp_path / "results"
    shutil.copytree(res, copy)

    def below(data: dict, label: str, rep: int) -> bool:
        if label == "width=128" and rep == 1:
            data["quality"]["test_accuracy"] = 0.5
        return rep < 4

    _edit(copy, below)
    check = suite_cli(
        "check", path, "--smoke", "--repeats", "auto", "--backend", "local", "--machine", "box", "--results", copy
    )
    assert check.returncode == 0, check.stderr
    rows = check_rows(check.stdout)
    assert rows["width=128"]["reps"] == "4 (auto)" and rows["width=32"]["reps"] == "5 (auto)", check.stdout
    proc = suite_cli("report", "--results", copy, "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "out" / "tiny_auto.md").read_text()
    assert "repeats: auto: 4 runs; below the accuracy gate in its first stage, which asks for no more" in page


@pytest.mark.slow
def test_a_rule_from_elsewhere_is_checked_before_it_is_used(auto_run, tmp_path: Path) -> None:
    _, res, _ = auto_run
    bad = tmp_path / "bad"
    shutil.copytree(res, bad)

    def garbage(data: dict, label: str, rep: int) -> None:
        if label == "width=32" and rep == 0:
            data["spec"]["report"]["repeats"] = "x"

    _edit(bad, garbage)
    proc = suite_cli("report", "--results", bad, "--out", tmp_path / "out")
    assert proc.returncode == 2 and "field spec.report.repeats: got 'x' (str); allowed: a mapping" in proc.stderr
    odd = tmp_path / "odd"
    shutil.copytree(res, odd)

    def out_of_range(data: dict, label: str, rep: int) -> None:
        data["spec"]["report"]["repeats"]["auto"]["first"] = 1_000_000  # not a rule this suite writes

    _edit(odd, out_of_range)
    proc = suite_cli("report", "--results", odd, "--out", tmp_path / "out2")
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "out2" / "tiny_auto.md").read_text()
    assert "repeats: auto" not in page.split("### Reproduce")[0] and "--repeats 5" in page


@pytest.mark.slow
def test_a_budget_starts_no_run_once_spent_and_the_next_run_goes_on(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "tiny_auto", TINY.replace("repeats: auto\n", "repeats: 2\n"))
    res = tmp_path / "results"
    args = ("run", path, "--smoke", "--repeats", "2", "--backend", "local", "--machine", "box", "--results", res)
    first = suite_cli(*args, "--budget", "1s")
    assert first.returncode == 0, first.stdout + first.stderr
    assert (
        "runs: 1 ok" in first.stdout and "--budget 1s spent: 3 runs not started; run the same command" in first.stdout
    )
    assert len([r for _, r in results.load_folder(res / "box")]) == 1  # the runs not started left no record
    # The closing lines name the point that never started: its scenario's count and verdict are of one point.
    done = next(r for _, r in results.load_folder(res / "box")).spec["point_label"]
    other = "width=128" if done == "width=32" else "width=32"
    assert "tiny_auto, 1 point: 1 ok\n" in first.stdout, first.stdout
    assert f"  no result on file: 1 point of the plan: [{other}]\n" in first.stdout, first.stdout
    again = suite_cli(*args)
    assert again.returncode == 0 and "runs: 3 ok, 1 already done" in again.stdout, again.stdout
    assert "no result on file:" not in again.stdout, again.stdout
    assert suite_cli("run", path, "--budget", "1x").returncode == 2


@pytest.mark.slow
def test_a_scenario_the_budget_left_without_a_run_is_named_in_the_closing_lines(tmp_path: Path) -> None:
    first = write_scenario(tmp_path, "tiny_auto", TINY.replace("repeats: auto\n", "repeats: 1\n"))
    second = write_scenario(tmp_path, "tiny_later", TINY.replace("name: tiny_auto", "name: tiny_later"))
    res = tmp_path / "results"
    proc = suite_cli(
        "run", first, second, "--smoke", "--repeats", "1", "--backend", "local", "--machine", "box", "--results", res,
        "--budget", "1s",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ran = {r.spec["scenario"] for _, r in results.load_folder(res / "box")}
    assert len(ran) == 1, ran
    (left,) = {"tiny_auto", "tiny_later"} - ran
    assert f"\n{left}: no result on file: 2 points of the plan: [width=32], [width=128]\n" in (proc.stdout)
