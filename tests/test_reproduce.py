"""``suite reproduce``: the verdict rule, bad input, and reruns end to end on the local backend and in containers.

The verdict's interval is checked against scipy's own Welch interval (``ttest_ind(equal_var=False)``),
not against the suite's statistics module it is built on.
"""

from __future__ import annotations

import json
import math
import sys
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import suite_cli
from docker_fixtures import SMALL_SCENARIO, engine_client, image_fixture  # noqa: F401 - fixtures
from scipy import stats as sps

from suite import cli, plan, provenance, reproduce, results, scenario
from suite.reproduce import DIFFERS, INCONCLUSIVE, NOT_REPRODUCED, REPRODUCED, verdict

TOL = 0.10


def _samples(center: float, spread: float, n: int) -> list[float]:
    """n times whose logs have mean log(center) and sample standard deviation ``spread`` exactly."""
    z = np.linspace(-1.0, 1.0, n)
    z = (z - z.mean()) / z.std(ddof=1)
    return [float(v) for v in np.exp(math.log(center) + spread * z)]


def _scipy_interval(original: list[float], rerun: list[float]) -> tuple[float, float]:
    """The 95% Welch interval of rerun/original by scipy, on log times."""
    ci = sps.ttest_ind(np.log(rerun), np.log(original), equal_var=False).confidence_interval(0.95)
    return math.exp(ci.low), math.exp(ci.high)


# -- the verdict rule -----------------------------------------------------------------------------


def test_within_tolerance_is_reproduced_and_says_how_close() -> None:
    original, rerun = _samples(1.00, 0.02, 5), _samples(1.02, 0.02, 5)
    v = verdict(original, rerun, TOL)
    low, high = _scipy_interval(original, rerun)
    assert v.kind == REPRODUCED and 0.9 < low < high < 1.1
    within = math.ceil(max(1 - low, high - 1) * 100)
    assert v.text.startswith(f"reproduced within {within}% ")
    assert f"{low:.2f}-{high:.2f}" in v.text


def test_interval_wholly_outside_the_tolerance_differs() -> None:
    original, rerun = _samples(1.0, 0.03, 5), _samples(1.8, 0.03, 5)
    v = verdict(original, rerun, TOL)
    low, high = _scipy_interval(original, rerun)
    assert low > 1.1
    assert v.kind == DIFFERS and v.text.startswith("differs: rerun 1.80x slower")
    assert f"95% interval {low:.2f}-{high:.2f}" in v.text
    faster = verdict(original, _samples(0.5, 0.03, 5), TOL)
    assert faster.kind == DIFFERS and faster.text.startswith("differs: rerun 2.00x faster")


def test_wide_interval_is_inconclusive_with_the_reruns_that_would_settle_it() -> None:
    original, rerun = _samples(1.0, 0.02, 5), _samples(1.02, 0.15, 3)
    v = verdict(original, rerun, TOL)
    low, high = _scipy_interval(original, rerun)
    assert low < 0.9 or high > 1.1
    assert v.kind == INCONCLUSIVE and "is wider than +-10%" in v.text
    n = v.repeats_needed
    assert n is not None and f"rerun with --repeats {n}" in v.text
    # With the same spread and ratio, n reruns settle it and n - 1 do not (scipy's interval).
    low, high = _scipy_interval(original, _samples(1.02, 0.15, n))
    assert 0.9 <= low and high <= 1.1
    low, high = _scipy_interval(original, _samples(1.02, 0.15, n - 1))
    assert low < 0.9 or high > 1.1
    assert verdict(original, _samples(1.02, 0.15, n), TOL).kind == REPRODUCED


def test_original_too_spread_says_more_reruns_cannot_help() -> None:
    original, rerun = _samples(1.0, 0.2, 3), _samples(1.0, 0.01, 3)
    v = verdict(original, rerun, TOL)
    assert v.kind == INCONCLUSIVE and v.repeats_needed is None
    assert "more repetitions of the original are needed" in v.text


def test_below_three_runs_no_interval_is_claimed() -> None:
    v = verdict([1.0, 1.01], [1.0, 1.02], TOL)
    assert v.kind == INCONCLUSIVE and v.ratio is not None and v.ratio.low is None
    assert "the original has 2 run(s)" in v.text and "more reruns cannot make up for it" in v.text
    v = verdict(_samples(1.0, 0.02, 5), [1.0, 1.01], TOL)
    assert v.kind == INCONCLUSIVE and f"--repeats {v.repeats_needed}" in v.text


def test_a_failed_rerun_makes_the_point_not_reproduced() -> None:
    v = verdict(_samples(1.0, 0.01, 3), _samples(1.0, 0.01, 2), TOL, ["rep 2: timeout: killed after 600 s"])
    assert v.kind == NOT_REPRODUCED
    assert v.text == "not reproduced: 1 of 3 reruns did not run ok (rep 2: timeout: killed after 600 s)"


def test_hardware_that_differs_is_listed_above_the_verdict(tmp_path: Path) -> None:
    base = _spec(tmp_path)
    host = {"cpu_model": "Intel Xeon 8375C", "cpu_count": 2, "python": "3.11.7"}
    specs = [plan.RunSpec(**{**base.__dict__, "repetition": i}) for i in range(3)]
    loaded = [(tmp_path / f"r{s.repetition}.json", _record(s, environment={"host": host}), None) for s in specs]
    (point,) = reproduce.group_points(loaded)
    other = {**host, "cpu_model": "AMD EPYC 7B13", "cpu_count": 16}
    reruns = [_record(s, environment={"host": other}) for s in specs]
    compared = reproduce.compare_point(point, reruns, TOL, ([], []), "local")
    assert compared["hardware_differs"] == [
        "CPU: Intel Xeon 8375C (original) vs AMD EPYC 7B13 (rerun)",
        "CPU cores: 2 (original) vs 16 (rerun)",
    ]
    text = reproduce.render(reproduce.collect([compared], TOL, tmp_path / "out", anyway=False))
    assert text.index("hardware differs: CPU: Intel Xeon 8375C") < text.index("\nverdict: ")
    assert "| original | 3/3 ok | 1.010 (1.000-1.020)" in text  # geometric mean of 1.00, 1.01, 1.02


def test_a_rerun_below_the_accuracy_gate_the_original_reached_is_not_reproduced(tmp_path: Path) -> None:
    base = _spec(tmp_path)
    specs = [plan.RunSpec(**{**base.__dict__, "repetition": i}) for i in range(3)]
    loaded = [(tmp_path / f"r{s.repetition}.json", _record(s, quality={"test_accuracy": 0.95}), None) for s in specs]
    (point,) = reproduce.group_points(loaded)
    reruns = [_record(s, quality={"test_accuracy": 0.95 if s.repetition else 0.11}) for s in specs]
    compared = reproduce.compare_point(point, reruns, TOL, ([], []), "local")
    assert compared["verdict"]["kind"] == NOT_REPRODUCED
    assert compared["rerun"]["failures"] == [
        "rep 0: ok, but test accuracy 0.110 is below the 0.80 gate every original run reached (0.950 or more)"
    ]


# -- bad input ------------------------------------------------------------------------------------


def _spec(tmp_path: Path, identity: dict[str, Any] | None = None) -> plan.RunSpec:
    path = tmp_path / "tiny.yaml"
    path.write_text(SMALL_SCENARIO.format(name="tiny", widths="[64]"), encoding="utf-8")
    resolve = (lambda _: dict(identity)) if identity else None
    return plan.expand(scenario.load(path), smoke=True, data=resolve)[0]


def _record(spec: plan.RunSpec, status: str = "ok", machine: str = "m", **extra: Any) -> results.RunResult:
    run = {"backend": "local", "machine": machine, "finished_at": f"2026-01-01T00:00:0{spec.repetition}+00:00"}
    timing = {"fit_s": 1.0 + spec.repetition / 100, "steady_epoch_s": 0.5} if status == "ok" else {}
    return results.RunResult(status=status, spec=spec.to_dict(), run=run, timing=timing, **extra)


def _main(capsys: pytest.CaptureFixture[str], *args: Any) -> tuple[int, str]:
    code = cli.main(["reproduce", *map(str, args)])
    captured = capsys.readouterr()
    return code, captured.out + captured.err


def test_unreadable_and_foreign_files_are_bad_input_naming_the_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    garbage = tmp_path / "garbage.json"
    garbage.write_text("{not json", encoding="utf-8")
    code, out = _main(capsys, garbage)
    assert code == 2 and f"{garbage}: not a readable result file" in out
    foreign = tmp_path / "package.json"
    foreign.write_text('{"name": "x"}', encoding="utf-8")
    code, out = _main(capsys, foreign)
    assert code == 2 and f"{foreign}: no schema_version" in out
    newer = tmp_path / "newer.json"
    newer.write_text('{"schema_version": 99}', encoding="utf-8")
    code, out = _main(capsys, newer)
    assert code == 2 and f"{newer}: schema_version 99 is newer" in out
    ancient = tmp_path / "ancient.json"
    ancient.write_text('{"schema_version": 0}', encoding="utf-8")
    code, out = _main(capsys, ancient)
    assert code == 2 and f"{ancient}: schema_version 0 has no migration" in out
    code, out = _main(capsys, tmp_path / "nowhere.json")
    assert code == 2 and f"{tmp_path / 'nowhere.json'}: no such file or folder" in out
    (tmp_path / "empty").mkdir()
    code, out = _main(capsys, tmp_path / "empty")
    assert code == 2 and "a folder with no result files" in out


def test_no_ok_run_to_compare_with_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path)
    saved = results.save(_record(spec, "timeout", message="killed"), tmp_path / "res", spec.run_id)
    code, out = _main(capsys, tmp_path / "res")
    assert code == 2 and "no ok run to compare with" in out and f"{saved} (timeout)" in out


def test_one_point_from_two_machines_is_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    spec = _spec(tmp_path)
    a = results.save(_record(spec, machine="a"), tmp_path / "a", spec.run_id)
    b = results.save(_record(spec, machine="b"), tmp_path / "b", spec.run_id)
    code, out = _main(capsys, a, b)
    assert code == 2 and "recorded on 2 machines (a, b)" in out


@pytest.mark.parametrize(("flag", "said"), [("--tolerance=0", "--tolerance 0"), ("--repeats=0", "--repeats 0")])
def test_bad_flags_are_bad_input(tmp_path: Path, capsys: pytest.CaptureFixture[str], flag: str, said: str) -> None:
    spec = _spec(tmp_path)
    saved = results.save(_record(spec), tmp_path / "res", spec.run_id)
    code, out = _main(capsys, saved, flag)
    assert code == 2 and said in out


def test_result_without_provenance_is_refused_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    spec = _spec(tmp_path)
    saved = results.save(_record(spec), tmp_path / "res", spec.run_id)
    code, out = _main(capsys, saved)
    assert code == 2 and "provenance: the result records none" in out and "--anyway" in out
    assert not (tmp_path / "reproduce").exists(), "a refusal leaves no results folder behind"


def test_unwritable_results_folder_is_bad_input_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _spec(tmp_path)
    saved = results.save(_record(spec), tmp_path / "res", spec.run_id)
    blocker = tmp_path / "a_file"
    blocker.write_text("", encoding="utf-8")
    code, out = _main(capsys, saved, "--anyway", "--results", blocker)
    assert code == 2 and f"results folder {blocker}" in out and "cannot be created or written" in out
    assert "rerun(s) on backend" not in out


def test_default_results_folder_is_new_every_time(tmp_path: Path) -> None:
    when = datetime(2026, 1, 2, 3, 4, 5, tzinfo=UTC)
    first = reproduce.new_results_dir(tmp_path, when)
    second = reproduce.new_results_dir(tmp_path, when)
    assert first == tmp_path / "reproduce" / "20260102T030405Z"
    assert second == tmp_path / "reproduce" / "20260102T030405Z-2"
    assert first.is_dir() and second.is_dir()


def test_data_this_machine_lacks_is_refused_with_the_fetch_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    spec = _spec(tmp_path, identity={"source": "mnist.npz", "sha256": "0" * 64, "note": "elsewhere"})
    here = {
        "suite": provenance.suite_identity(),
        "environment": provenance.venv_environment(sys.executable),
        "image": None,
    }
    saved = results.save(_record(spec, provenance=here), tmp_path / "res", spec.run_id)
    code, out = _main(capsys, saved, "--results", tmp_path / "out")
    assert code == 2
    assert "data: result trained on mnist.npz sha256 000000000000..." in out
    assert "python -m suite data fetch" in out


# -- end to end, local backend ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two smoke-sized runs of one tiny point, as `suite run` records them."""
    base = tmp_path_factory.mktemp("reproduce")
    path = base / "tiny_repro.yaml"
    path.write_text(SMALL_SCENARIO.format(name="tiny_repro", widths="[64]"), encoding="utf-8")
    res = base / "results"
    proc = suite_cli(
        "run", path, "--smoke", "--repeats", "2", "--backend", "local", "--results", res, "--machine", "box"
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return res


def _files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.rglob("*.json") if not p.name.startswith("."))


def _unchanged_checkout(files: list[Path]) -> None:
    """The suite's tree as the results recorded it: a checkout edited meanwhile is refused, rightly."""
    recorded = json.loads(files[0].read_text())["provenance"]["suite"]
    if recorded != provenance.suite_identity():
        pytest.skip("the checkout changed between the run and the reproduction; a refusal would be right")


@pytest.mark.slow
def test_local_results_are_rerun_and_compared(original: Path, tmp_path: Path) -> None:
    files = _files(original)
    _unchanged_checkout(files)
    proc = suite_cli("reproduce", *files, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr  # timings here are noisy: either verdict
    folder = next((tmp_path / "reproduce").iterdir())
    reruns = [results.load(p) for p in _files(folder)]
    originals = [results.load(p) for p in files]
    assert len(reruns) == len(originals) == 2
    assert {r.fingerprint for r in reruns} == {r.fingerprint for r in originals}
    assert sorted(r.spec["repetition"] for r in reruns) == [0, 1]
    assert all(r.ok and r.run["backend"] == "local" for r in reruns)
    assert "| original | 2/2 ok" in proc.stdout and "| rerun    | 2/2 ok" in proc.stdout
    assert "\nverdict: inconclusive: the original has 2 run(s)" in proc.stdout  # 2 runs: no interval
    assert "0 of 1 point(s) reproduced within +-10%" in proc.stdout
    # The reruns are results like any other: report reads them.
    rep = suite_cli("report", "--results", folder, "--out", tmp_path / "pages")
    assert rep.returncode == 0, rep.stderr


@pytest.mark.slow
def test_modified_tree_is_refused_and_anyway_runs(original: Path, tmp_path: Path) -> None:
    files = _files(original)  # refused for the doctored tree whether or not the checkout changed since
    doctored = tmp_path / "doctored"
    for path in files:
        data = json.loads(path.read_text())
        data["provenance"]["suite"].update(git_dirty=True, dirty_paths=["suite/x.py"], diff_sha256="ab" * 32)
        target = doctored / path.relative_to(original)
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(json.dumps(data), encoding="utf-8")
    proc = suite_cli("reproduce", doctored, cwd=tmp_path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "suite tree: the result's had uncommitted changes (suite/x.py; diff sha256 abababababab)" in proc.stderr
    assert "--anyway" in proc.stderr and not (tmp_path / "reproduce").exists()

    out = tmp_path / "anyway"
    proc = suite_cli("reproduce", doctored, "--anyway", "--repeats", "1", "--json", "--results", out, cwd=tmp_path)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    data = json.loads(proc.stdout)
    assert data["format"] == reproduce.FORMAT and data["version"] == reproduce.VERSION and data["anyway"] is True
    (point,) = data["points"]
    assert any(d.startswith("suite tree: the result's had uncommitted changes") for d in point["differences"])
    assert point["original"]["runs_ok"] == 2 and point["rerun"]["runs_ok"] == 1
    assert point["verdict"]["kind"] == INCONCLUSIVE and data["reproduced"] is False
    assert [Path(f) for f in point["rerun"]["files"]] == _files(out)
    assert len(point["original_files"]) == 2 and len(point["rerun"]["files"]) == 1


# -- in containers --------------------------------------------------------------------------------


@pytest.mark.docker
def test_docker_result_reproduced_in_a_container_and_a_changed_recipe_refused(test_image: str, tmp_path: Path) -> None:
    path = tmp_path / "docker_repro.yaml"
    path.write_text(SMALL_SCENARIO.format(name="docker_repro", widths="[64]"), encoding="utf-8")
    env = {"SUITE_DOCKER_IMAGE": test_image}
    res = tmp_path / "results"
    proc = suite_cli("run", path, "--smoke", "--backend", "docker", "--results", res, "--machine", "box", env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    files = _files(res)
    image = json.loads(files[0].read_text())["provenance"]["image"]
    assert image and image["recipe_hash"], "a docker result records its image's recipe"

    doctored = tmp_path / "doctored.json"
    data = json.loads(files[0].read_text())
    data["provenance"]["image"]["recipe_hash"] = "cd" * 32
    doctored.write_text(json.dumps(data), encoding="utf-8")
    proc = suite_cli("reproduce", doctored, cwd=tmp_path, env=env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "image recipe: result cdcdcdcdcdcd" in proc.stderr
    assert "python -m suite images build tf2.21-cpu" in proc.stderr

    _unchanged_checkout(files)
    proc = suite_cli("reproduce", *files, "--results", tmp_path / "again", cwd=tmp_path, env=env)
    assert proc.returncode in (0, 1), proc.stdout + proc.stderr
    reruns = [results.load(p) for p in _files(tmp_path / "again")]
    assert len(reruns) == 1 and reruns[0].run["backend"] == "docker" and reruns[0].ok
    assert reruns[0].fingerprint == results.load(files[0]).fingerprint
    assert "\nverdict: " in proc.stdout
