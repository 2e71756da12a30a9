"""Model kinds: one registry; a CNN scenario checks, trains on real digits and reports, through the CLI."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import REPO, SCENARIOS, QuickStart, suite_cli, write_scenario

from suite.record import results
from suite.spec import plan, scenario, settings
from suite.spec.plan import axis_name
from suite.worker import kinds, probes, train

CNN_TEXT = """\
name: cnn_digits
question: Does a small CNN train on the real digits?
model:
  kind: cnn
  filters: [8, 16]
  dense: 32
training: {optimizer: adam, epochs: 3, batch_size: 64}
data: {data_dir: "DIR", test_samples: 2000}
repeats: 1
"""


def test_kinds_share_a_key_only_with_one_meaning() -> None:
    """check_value looks a model key up by path alone, so a key two kinds share must mean one thing."""
    for a in kinds.KINDS.values():
        for b in kinds.KINDS.values():
            for key in set(a.keys) & set(b.keys) - {"kind"}:
                assert {**a.keys[key], "description": ""} == {**b.keys[key], "description": ""}, key


@pytest.mark.parametrize("name", list(kinds.KINDS))
def test_defaults_meet_their_own_rules_and_floor_keeps_the_keys(name: str) -> None:
    kind = kinds.KINDS[name]
    cfg = kind.defaults()
    assert cfg["kind"] == name
    ck = settings.Checker("x.yaml", {})
    settings.check_config(ck, {"model": cfg})
    assert ck.problems == []
    floor = probes.floor_config(cfg)
    assert set(floor) == set(cfg)
    assert kind.flops_per_example(floor)["train"] < kind.flops_per_example(cfg)["train"] / 100


def test_cnn_floor_is_one_filter_per_conv_and_a_dense_width_of_one() -> None:
    cfg = {**kinds.CNN.defaults(), "filters": [8, 16, 32], "kernel_size": 5, "pool": "none"}
    assert probes.floor_config(cfg) == {**cfg, "filters": [1, 1, 1], "dense": 1}


def test_parameter_counts_match_keras() -> None:
    keras = pytest.importorskip("keras")
    cfgs = [
        {**kinds.MLP.defaults(), "hidden": [64, 32]},
        {**kinds.CNN.defaults(), "filters": [4, 8, 16, 32]},
        {**kinds.CNN.defaults(), "filters": [6], "kernel_size": 5, "pool": "none", "dense": 10, "dropout": 0.5},
    ]
    for cfg in cfgs:
        assert kinds.kind_of(cfg).build(keras, cfg).count_params() == kinds.kind_of(cfg).parameter_count(cfg), cfg


def test_axis_names_come_from_the_kinds() -> None:
    assert axis_name("model.hidden.0") == "width"
    assert axis_name("model.filters.0") == "filters" and axis_name("model.filters") == "filters"
    assert axis_name("training.batch_size") == "batch_size"
    # Another layer than the first keeps its index: its label must not read like the first layer's.
    assert axis_name("model.hidden.1") == "hidden.1"
    assert axis_name("model.filters.1") == "filters.1"


def test_two_filter_axes_get_labels_that_differ() -> None:
    point = {"model.filters.0": 8, "model.filters.1": 16, "device": "cpu"}
    assert plan._label(point) == "filters=8, filters.1=16, device=cpu"


def test_axes_that_would_read_alike_go_by_their_paths() -> None:
    point = {"training.seed": 1, "data.seed": 2}
    assert plan._label(point) == "training.seed=1, data.seed=2"


def test_cnn_scenario_resolves_to_the_cnn_defaults(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "c", "name: c\nquestion: q?\nmodel: {kind: cnn, filters: [4]}\n")
    model = scenario.load(path).config["model"]
    assert model == {**kinds.CNN.defaults(), "filters": [4]}


def test_mlp_key_under_cnn_exits_2_naming_file_key_line_and_cnn_keys(tmp_path: Path) -> None:
    text = "name: c\nquestion: q?\nmodel:\n  kind: cnn\n  hidden: [64]\n"
    path = write_scenario(tmp_path, "c", text)
    proc = suite_cli("check", path)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "Traceback" not in proc.stderr
    assert str(path) in proc.stderr and "line 5 key 'model.hidden'" in proc.stderr, proc.stderr
    assert "allowed: " + ", ".join(kinds.CNN.keys) in proc.stderr


def test_bad_cnn_value_exits_2(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "c", "name: c\nquestion: q?\nmodel: {kind: cnn, filters: [8, 16, 32, 64, 128]}\n")
    proc = suite_cli("check", path)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "'model.filters'" in proc.stderr and "a list of 1 to 4 items" in proc.stderr, proc.stderr


def test_result_records_what_its_kind_counts() -> None:
    for kind in kinds.KINDS.values():
        record: dict = {"timing": {"epoch_s": [2.0, 1.0, 1.0]}, "work": {}}
        train._derive(record, kind.defaults(), 1000, 100)
        assert record["work"]["flops_counted"] == kind.flops_counted
        assert record["work"]["flops_per_example_train"] == kind.flops_per_example(kind.defaults())["train"]


@pytest.mark.slow
def test_cnn_trains_on_real_digits_above_the_gate(tmp_path: Path, mnist_dir: Path) -> None:
    path = write_scenario(tmp_path, "cnn_digits", CNN_TEXT.replace("DIR", str(mnist_dir)))
    proc = suite_cli("run", path, "--backend", "local", "--results", tmp_path / "res", "--machine", "m")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    [(_, run)] = results.load_folder(tmp_path / "res")
    cfg = run.spec["config"]["model"]
    assert cfg == {**kinds.CNN.defaults(), "filters": [8, 16], "dense": 32}
    assert run.quality["data_source"] == "idx-t10k-split" and run.quality["train_samples"] == 8000
    assert run.quality["test_accuracy"] >= 0.95, run.quality
    assert run.work["flops_per_example_train"] == kinds.CNN.flops_per_example(cfg)["train"]
    assert run.work["parameters"] == kinds.CNN.parameter_count(cfg)
    assert run.work["flops_counted"] == kinds.CNN_FLOPS_COUNTED


@pytest.mark.slow
def test_shipped_cnn_scenario_smoke_report_names_the_filters_axis(quick_start: QuickStart) -> None:
    # The quick start's smoke run of every shipped scenario, this one among them, on machine testbox.
    assert quick_start.returncode == 0, quick_start.output
    res, out = quick_start.tree / "reports" / "results" / "testbox", quick_start.tree / "reports"
    page = (out / "mnist_cnn_filters.md").read_text()
    assert "**Question:** Does a convolutional network move the point where the GPU wins?" in page
    for filters in (8, 16, 32, 64):
        assert f"| filters={filters}, device=cpu " in page, page
    skips = next(line for line in page.splitlines() if line.startswith("- `skipped`, 4 runs of 4 points"))
    assert all(f"filters={filters}, device=gpu" in skips for filters in (8, 16, 32, 64)), skips
    verdict = next(line for line in page.splitlines() if line.startswith("- **On `testbox`, smoke size:**"))
    assert "at filters 8, " in verdict and "at filters 64" in verdict, verdict
    assert "width" not in verdict
    assert "[reading a report](../docs/reading-a-report.md)" in page  # the column definitions, CNN's included
    assert "a CNN with one filter per conv layer" in (REPO / "docs" / "reading-a-report.md").read_text()
    runs = [r for _, r in results.load_folder(res / "mnist_cnn_filters")]
    cpu = [r for r in runs if r.spec["config"]["device"] == "cpu"]
    assert len(cpu) == 4 and all(r.ok for r in cpu)
    assert all(r.work["flops_counted"] == kinds.CNN_FLOPS_COUNTED for r in cpu)
    assert sorted(r.spec["config"]["model"]["filters"][0] for r in cpu) == [8, 16, 32, 64]
    assert all(r.spec["config"]["model"]["dense"] == 32 for r in cpu)


def test_an_override_cannot_change_the_model_kind(tmp_path: Path) -> None:
    text = "name: c\nquestion: q?\nmatrix:\n  model.kind: [mlp, cnn]\n"
    proc = suite_cli("check", write_scenario(tmp_path, "c", text))
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    assert "key 'matrix.model.kind'" in proc.stderr, proc.stderr
    assert "model.kind cannot be changed by the scenario's matrix" in proc.stderr, proc.stderr


@pytest.mark.parametrize(("path", "kind"), [("mnist_cnn_filters", "mlp"), ("mnist_mlp_width", "cnn")])
def test_set_cannot_change_the_model_kind_in_one_line(path: str, kind: str) -> None:
    proc = suite_cli("check", SCENARIOS / f"{path}.yaml", "--set", f"model.kind={kind}")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    flag = f"error: --set model.kind={kind}: key 'model.kind': "
    assert lines[0].startswith(flag + "model.kind cannot be changed by --set ("), proc.stderr
    assert "set.model.kind" not in proc.stderr


def test_set_to_the_scenario_own_kind_is_fine() -> None:
    proc = suite_cli("check", SCENARIOS / "mnist_cnn_filters.yaml", "--set", "model.kind=cnn")
    assert proc.returncode == 0, proc.stderr
