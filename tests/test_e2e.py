"""End to end on the local backend, real TensorFlow on the CPU: scenario -> results -> report."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
import yaml
from conftest import SCENARIOS, QuickStart, check_points, suite_cli

from suite.record import results

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def smoke_run(quick_start: QuickStart, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, str]:
    """The quick start's results (every shipped scenario at smoke size, machine testbox), and pages
    made from them here, as ``report`` makes them from this checkout (the rerun below compares)."""
    assert quick_start.returncode == 0, quick_start.output
    res, out = quick_start.tree / "reports" / "results", tmp_path_factory.mktemp("e2e") / "reports"
    rep = suite_cli("report", "--results", res, "--out", out)
    assert rep.returncode == 0, rep.stderr
    return res, out, quick_start.output


def test_every_scenario_gets_a_report_with_its_matrix_points(smoke_run) -> None:
    res, out, _ = smoke_run
    for path in sorted(SCENARIOS.glob("*.yaml")):
        check = suite_cli("check", "--smoke", path)
        points = check_points(check.stdout)
        page = (out / f"{path.stem}.md").read_text()
        assert page.startswith(f"# {path.stem}\n")
        assert "- **On `testbox`, smoke size:**" in page and "**Question:**" in page  # the verdict's caveat
        # Each point is a row of the results table or counted under Skips and failures (which names
        # the first few of a group and says how many more).
        missing = [point for point in points if f"| {point} " not in page]
        skipped = sum(int(n) for n in re.findall(r"^- `skipped`, \d+ runs? of (\d+) points?", page, re.M))
        assert len(missing) == skipped, f"{path.stem}.md: {missing} not in the table, {skipped} counted as skipped"
    index = (out / "README.md").read_text()
    assert all(f"[{p.stem}]({p.stem}.md)" in index for p in SCENARIOS.glob("*.yaml"))
    rows = [line for line in index.splitlines() if line.startswith("| [")]
    assert rows and all("| testbox, smoke size " in row for row in rows), index


def test_cpu_points_measured_gpu_points_skipped_with_reason(smoke_run) -> None:
    res, out, _ = smoke_run
    loaded = [r for _, r in results.load_folder(res / "testbox")]
    cpu = [r for r in loaded if r.spec["config"]["device"] == "cpu"]
    gpu = [r for r in loaded if r.spec["config"]["device"].startswith("gpu")]
    assert len(cpu) == 6 + 4 and all(r.ok for r in cpu)  # mnist_mlp_width, mnist_cnn_filters
    for r in cpu:
        assert r.timing["fit_s"] > 0 and len(r.timing["epoch_s"]) == 2
        assert r.quality["data_source"] in ("synthetic", "mnist.npz", "download")
        assert r.environment["versions"]["tensorflow"]
        assert r.work["flops_per_example_train"] > 0
    assert len(gpu) == 6 + 6 + 21 + 4
    assert all(r.status == "skipped" and "GPU" in r.message for r in gpu)
    page = (out / "mnist_mlp_width.md").read_text()
    skips = next(line for line in page.splitlines() if line.startswith("- `skipped`, 6 runs of 6 points"))
    assert skips.count("device=gpu") == 6 and "needs 1 GPU(s); this machine has no GPU" in skips
    assert "No CPU-GPU comparison on this machine" in page
    # One run a point: a figure with no range to show says so, rather than "1.87 (1.87-1.87)".
    row = next(line for line in page.splitlines() if line.startswith("| width=100, device=cpu "))
    assert re.search(r"\| [0-9.]+ \(1 run\) +\| [0-9.]+ \(1 run\) +\|", row), row
    # A page of skips only: Skips and failures names a few of the 21 points, no Not compared section
    # says it again, and it offers no check of numbers it does not have.
    knobs = (out / "gpu_knobs.md").read_text()
    assert re.search(
        r"^- `skipped`, 21 runs of 21 points \(variant=default, batch_size=128; .*; and 13 more\): ", knobs, re.M
    )
    assert "### Not compared" not in knobs
    assert "To check these numbers" not in knobs and "To check these numbers" in page
    # The scaling scenario's points need 1, 2 and 4 GPUs: its verdict names every count, not the first.
    scaling = (out / "mlp4096_gpus.md").read_text()
    assert "No multi-GPU comparison on this machine: needs 1, 2 or 4 GPU(s); this machine has no GPU" in scaling


def test_synthetic_data_is_said_in_the_report(smoke_run) -> None:
    res, out, _ = smoke_run
    first = next(r for _, r in results.load_folder(res / "testbox") if r.ok)
    if first.quality["data_source"] != "synthetic":
        pytest.skip("MNIST was available on this machine")
    page = (out / "mnist_mlp_width.md").read_text()
    assert "- Data: **synthetic** (MNIST's shapes, not its digits; " in page
    # Said above the numbers too, where a reader starts: the first line under the machine's heading.
    assert "## On `testbox`\n\n**Smoke size, on synthetic digits**: a check that the scenario runs" in page


def test_a_smoke_page_names_the_settings_its_runs_used(smoke_run) -> None:
    """The CNN scenario's description gives the full size (a dense layer of 128, 10 epochs); its
    smoke block sets 32 and 2, as the records hold: the page names each smoke setting with the
    value the runs used."""
    res, out, _ = smoke_run
    records = [r for _, r in results.load_folder(res / "testbox" / "mnist_cnn_filters")]
    assert {r.spec["config"]["model"]["dense"] for r in records} == {32}
    assert {r.spec["config"]["training"]["epochs"] for r in records} == {2}
    page = (out / "mnist_cnn_filters.md").read_text()
    assert "a dense layer of 128" in page and "10 epochs" in page  # the description, of the full size
    line = next(line for line in page.splitlines() if line.startswith("- **Smoke size**"))
    for setting in ("model.dense=32", "data.train_samples=2048", "data.test_samples=256", "training.epochs=2"):
        assert f"`{setting}`" in line, line
    assert "not at the full size the description above gives" in line, line


def test_a_smoke_page_whose_scenario_file_is_gone_names_the_sizes_the_runs_used(smoke_run, tmp_path: Path) -> None:
    res, _, _ = smoke_run
    copy = tmp_path / "results" / "testbox" / "mnist_mlp_width"
    shutil.copytree(res / "testbox" / "mnist_mlp_width", copy)
    for path in copy.glob("*.json"):
        record = json.loads(path.read_text())
        record["spec"]["scenario_file"] = "scenarios/gone.yaml"
        path.write_text(json.dumps(record))
    rep = suite_cli("report", "--results", tmp_path / "results", "--out", tmp_path / "out")
    assert rep.returncode == 0, rep.stdout + rep.stderr
    page = (tmp_path / "out" / "mnist_mlp_width.md").read_text()
    line = next(line for line in page.splitlines() if line.startswith("- **Smoke size**"))
    assert "the runs used `data.train_samples=2048`, `data.test_samples=512`, `training.epochs=2`" in line
    assert "(the scenario file they name, which lists every `smoke` setting, cannot be read" in line


def _smoke_line_after(smoke_run, tmp_path: Path, edit_file, edit_record=None) -> str:
    """The CNN scenario's smoke line, its results naming a copy of its file that ``edit_file``
    changed (a path a result names is taken as given), each record changed by ``edit_record``."""
    res, _, _ = smoke_run
    scenario = yaml.safe_load((SCENARIOS / "mnist_cnn_filters.yaml").read_text())
    edit_file(scenario)
    (tmp_path / "scenario.yaml").write_text(yaml.safe_dump(scenario))
    copy = tmp_path / "results" / "testbox" / "mnist_cnn_filters"
    shutil.copytree(res / "testbox" / "mnist_cnn_filters", copy)
    for path in copy.glob("*.json"):
        record = json.loads(path.read_text())
        record["spec"]["scenario_file"] = str(tmp_path / "scenario.yaml")
        if edit_record:
            edit_record(record)
        path.write_text(json.dumps(record))
    rep = suite_cli("report", "--results", tmp_path / "results", "--out", tmp_path / "out")
    assert rep.returncode == 0, rep.stdout + rep.stderr
    page = (tmp_path / "out" / "mnist_cnn_filters.md").read_text()
    return next(line for line in page.splitlines() if line.startswith("- **Smoke size**"))


def _set_in(section: str, key: str, value: object):
    return lambda d: d.setdefault(section, {}).__setitem__(key, value)


@pytest.mark.parametrize(
    "edit_file, edit_record, said",
    [
        (lambda s: s.pop("smoke"), None, "one run of each point; the scenario has no `smoke` settings"),
        (
            _set_in("smoke", "training.batch_size", 64),
            None,
            "`training.batch_size=128` (the file, edited since, now says `training.batch_size=64`)",
        ),
        (
            _set_in("smoke", "training.learning_rate", None),
            lambda r: r["spec"]["config"]["training"].__setitem__("learning_rate", None),
            "`training.learning_rate=null`",
        ),
        (
            lambda s: s.__setitem__("name", "another"),
            None,
            "the runs used `data.train_samples=2048`, `data.test_samples=256`, `training.epochs=2`",
        ),
    ],
    ids=["no-smoke-block", "edited-since", "null-value", "another-scenario"],
)
def test_a_smoke_line_says_only_what_the_runs_used(smoke_run, tmp_path: Path, edit_file, edit_record, said) -> None:
    line = _smoke_line_after(smoke_run, tmp_path, edit_file, edit_record)
    assert said in line, line


def test_a_smoke_line_says_more_than_one_run_where_repeats_asked_for_more(smoke_run, tmp_path: Path) -> None:
    """``--smoke --repeats 2`` (each record copied as a second repetition), and ``--repeats auto``
    (its rule in the records): not "one run of each point"."""
    res, _, _ = smoke_run
    src = res / "testbox" / "mnist_cnn_filters"
    without_smoke = yaml.safe_load((SCENARIOS / "mnist_cnn_filters.yaml").read_text())
    without_smoke.pop("smoke")
    for case, rule in (("fixed", None), ("auto", {"first": 4, "precision": 0.03, "max_repeats": 10})):
        copy = tmp_path / case / "testbox" / "mnist_cnn_filters"
        copy.mkdir(parents=True)
        (tmp_path / case / "scenario.yaml").write_text(yaml.safe_dump(without_smoke))
        for path in src.glob("*.json"):
            record = json.loads(path.read_text())
            record["spec"]["scenario_file"] = str(tmp_path / case / "scenario.yaml")
            if rule:
                record["spec"]["report"]["repeats"] = {"auto": rule}
            for repetition in (0,) if rule else (0, 1):
                record["spec"]["repetition"] = repetition
                (copy / f"{path.stem}-r{repetition}.json").write_text(json.dumps(record))
        rep = suite_cli("report", "--results", tmp_path / case, "--out", tmp_path / case / "out")
        assert rep.returncode == 0, rep.stdout + rep.stderr
        page = (tmp_path / case / "out" / "mnist_cnn_filters.md").read_text()
        line = next(line for line in page.splitlines() if line.startswith("- **Smoke size**"))
        said = "the runs `--repeats auto` asked for" if rule else "the runs `--repeats` asked for"
        assert f"**Smoke size**: {said}; the scenario has no `smoke` settings" in line, (case, line)


def test_a_smoke_setting_changed_with_set_is_not_called_a_smoke_setting(smoke_run, tmp_path: Path) -> None:
    """``--set`` wins over the smoke block; the page says it on the line of its own."""

    def overridden(record: dict) -> None:
        record["spec"]["overrides"] = {"training.epochs": 2}

    line = _smoke_line_after(smoke_run, tmp_path, lambda s: None, overridden)
    assert "`model.dense=32`" in line and "training.epochs" not in line, line


def test_rerun_skips_done_runs_and_report_is_byte_identical(smoke_run, tmp_path: Path) -> None:
    res, out, _ = smoke_run
    again = suite_cli(
        "run",
        "--smoke",
        "--backend",
        "local",
        SCENARIOS / "mnist_mlp_width.yaml",
        "--results",
        res,
        "--machine",
        "testbox",
    )
    assert again.returncode == 0
    assert "6 runs already done (ok result on file; --fresh reruns)" in again.stdout.splitlines()
    assert "nothing to run" in again.stdout.splitlines(), "a fixed count has no first stage to speak of"
    assert "6 GPU points skipped, as recorded before: " in again.stdout, "an unchanged skip is not written again"
    rep = suite_cli("report", "--results", res, "--out", tmp_path)
    assert rep.returncode == 0
    for page in out.glob("*.md"):
        assert (tmp_path / page.name).read_bytes() == page.read_bytes(), page.name


def test_result_files_hold_the_spec_and_schema(smoke_run) -> None:
    res, _, _ = smoke_run
    path = next((res / "testbox" / "mnist_mlp_width").glob("*.json"))
    data = json.loads(path.read_text())
    assert data["schema_version"] == results.SCHEMA_VERSION
    assert data["spec"]["scenario"] == "mnist_mlp_width" and data["spec"]["smoke"] is True
    assert path.name.startswith(data["spec"]["fingerprint"][:12])


def test_every_result_says_which_code_and_environment_made_it(smoke_run, quick_start: QuickStart) -> None:
    res, _, _ = smoke_run
    loaded = [r for _, r in results.load_folder(res / "testbox")]
    assert {r.status for r in loaded} == {"ok", "skipped"}, "both kinds are checked"
    for r in loaded:
        assert r.provenance["suite"]["git_revision"] == quick_start.revision, r.provenance
        assert isinstance(r.provenance["suite"]["git_dirty"], bool)
        assert r.provenance["environment"]["kind"] == "venv" and r.provenance["image"] is None
