"""``-k EXPR``: the expression language, and selecting points through the real CLI (run, check, report)."""

from __future__ import annotations

import argparse
import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import SCENARIOS, check_points, suite_cli, write_scenario

from suite import cli
from suite.record import results
from suite.spec import plan, scenario, select

FIXTURE_RESULTS = Path(__file__).parent / "fixtures" / "results"
SHIPPED = [SCENARIOS / f"{name}.yaml" for name in ("mnist_mlp_width", "mlp4096_gpus", "gpu_knobs")]

TINY = """\
name: tiny_select
question: Does -k pick the points?
model: {hidden: [32]}
training: {epochs: 1}
data: {allow_synthetic: true, train_samples: 512, test_samples: 256}
repeats: 1
timeout_s: 300
matrix:
  model.hidden.0: [8, 16]
  device: [cpu, "gpu:64"]
"""


def _item(label_point: dict, scenario: str = "s") -> select.Item:
    return select.item_of(scenario, label_point, plan._label(label_point))


KNOB = {"variant": "steps_per_execution=10", "training.batch_size": 1024}
XLA = {"variant": "jit_compile", "training.batch_size": 128}
WIDE_GPU = {"model.hidden.0": 750, "device": "gpu"}
WIDE_CPU = {"model.hidden.0": 750, "device": "cpu"}
MIXED = {"variant": "tf.data prefetch", "training.mixed_precision": True}


@pytest.mark.parametrize(
    ("expr", "point", "expected"),
    [
        ("width=750 and device=gpu", WIDE_GPU, True),
        ("width=750 and device=gpu", WIDE_CPU, False),
        ("width=750 and not device=gpu", WIDE_CPU, True),
        ("device=cpu or device=gpu", WIDE_GPU, True),
        ("not (device=cpu or device=gpu)", WIDE_GPU, False),
        ("not device=cpu and width=750", WIDE_GPU, True),  # not binds tighter than and
        ("device=cpu and width=1 or width=750", WIDE_GPU, True),  # and binds tighter than or
        ("model.hidden.0=750", WIDE_GPU, True),  # the full setting path works as the key too
        ("WIDTH=750 AND Device=GPU", WIDE_GPU, True),  # case does not matter, as in pytest
        ("device=g*", WIDE_GPU, True),
        ("device=g*", WIDE_CPU, False),
        ("gpu", WIDE_GPU, True),  # a bare word: part of the label
        ("not jit_compile", XLA, False),
        ("not jit_compile", KNOB, True),
        ("variant=steps_per_execution=10", KNOB, True),  # the first '=' splits key from value
        ("variant=steps_per_execution", KNOB, False),  # a value matches whole, not in part
        ("batch_size=1024", KNOB, True),
        ("variant='tf.data prefetch'", MIXED, True),
        ('variant="tf.data prefetch" and mixed_precision=on', MIXED, True),  # booleans as the label shows them
        ("scenario=s and prefetch", MIXED, True),
        ("scenario=other", MIXED, False),
        ("'and'", {"variant": "this and that"}, True),  # a quoted keyword is a word
        ("variant=[ab]*", {"variant": "a"}, False),  # only * is a wildcard: brackets are themselves
        ("variant=[ab]*", {"variant": "[ab] prefetch"}, True),
        ("variant=?*", {"variant": "xy"}, False),  # ? is itself, not any one character
        ("variant=a*b*c", {"variant": "a.b-c"}, True),
    ],
)
def test_expression_matches_labels(expr: str, point: dict, expected: bool) -> None:
    assert select.parse(expr)(_item(point)) is expected


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("", "empty expression"),
        ("width=750 and", "ends where a term was expected"),
        ("(width=750", "the '(' at character 1 is not closed"),
        ("width=750)", "unexpected ')' at character 10"),
        ("width=750 device=gpu", "unexpected 'device=gpu' at character 11; join terms with and, or"),
        ("and width=750", "unexpected 'and' at character 1"),
        ("variant='tf.data", "the quote at character 9 is not closed"),
        ("=750", "'=750' at character 1 needs a key and a value"),
        ("width=", "needs a key and a value"),
        ("''", "the empty quotes at character 1 name nothing"),
        ('width=750 or ""', "the empty quotes at character 14 name nothing"),
    ],
)
def test_bad_expressions_say_where(expr: str, message: str) -> None:
    with pytest.raises(select.SelectError, match=None) as err:
        select.parse(expr)
    assert message in str(err.value)


def test_nothing_is_evaluated() -> None:
    """Python in an expression is a syntax error or a word to look for in labels, never code."""
    with pytest.raises(select.SelectError, match="unexpected '\\(' at character 11"):
        select.parse("__import__('os').system('false')")
    sel = select.parse("'__import__(\"os\").getcwd()'")
    assert sel(_item(WIDE_GPU)) is False
    assert sel.keys == ()


def test_unknown_key_names_the_keys_there_are() -> None:
    items = [_item(WIDE_GPU), _item(WIDE_CPU)]
    with pytest.raises(select.SelectError) as err:
        select.choose(items, "widht=750")
    text = str(err.value)
    assert "no point has the key 'widht' (did you mean width?)" in text
    assert "keys: scenario, device, width, model.hidden.0" in text


def test_a_filter_matching_nothing_lists_the_labels() -> None:
    items = [_item(WIDE_GPU, "a"), _item(WIDE_CPU, "b")]
    with pytest.raises(select.SelectError) as err:
        select.choose(items, "width=751")
    assert "-k 'width=751' matches none of the 2 points" in str(err.value)
    assert "  a: width=750, device=gpu\n  b: width=750, device=cpu" in str(err.value)


@pytest.mark.parametrize("path", [*SHIPPED, SCENARIOS / "mnist_cnn_filters.yaml"], ids=lambda p: p.stem)
def test_expression_for_takes_exactly_its_points(path: Path) -> None:
    """The -k a Reproduce command carries selects the points it was made from, and no other."""
    specs = plan.expand(scenario.load(path), repeats=1, data=lambda d: {"source": "synthetic"})
    items = [(s.point, s.point_label) for s in specs]
    for subset in (items[:1], items[1::3], items[-2:]):
        expr = select.expression_for(subset)
        taken = select.select_specs(specs, expr)
        assert [s.point_label for s in taken] == [label for _, label in subset], expr


DENSE = """\
name: cnn_dense
question: Does the dense layer's width matter?
model: {kind: cnn, filters: [8, 16], dense: 32}
training: {epochs: 1}
data: {allow_synthetic: true, train_samples: 512, test_samples: 256}
repeats: 1
timeout_s: 300
matrix:
  model.dense: [16, 64]
  model.filters.0: [4, 8]
  model.filters.1: [16, 32]
  device: [cpu, gpu]
"""


def _round_trips(specs: list[plan.RunSpec]) -> None:
    items = [(s.point, s.point_label) for s in specs]
    for subset in ([item] for item in items):
        expr = select.expression_for(subset)
        assert [s.point_label for s in select.select_specs(specs, select.parse(expr).text)] == [subset[0][1]], expr


def test_expression_for_round_trips_a_cnn_sweeping_model_dense(tmp_path: Path) -> None:
    sc = scenario.load(write_scenario(tmp_path, "cnn_dense", DENSE))
    specs = plan.expand(sc, repeats=1, data=lambda d: {"source": "synthetic"})
    assert specs[0].point_label == "dense=16, filters=4, filters.1=16, device=cpu"
    expr = select.expression_for([(specs[0].point, specs[0].point_label)])
    assert expr == "dense=16 and filters=4 and filters.1=16 and device=cpu"
    _round_trips(specs)


def test_expression_for_quotes_a_key_that_needs_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from suite.worker import kinds

    monkeypatch.setitem(kinds.CNN.axis_names, "model.dense", "dense width")
    sc = scenario.load(write_scenario(tmp_path, "cnn_dense", DENSE))
    specs = plan.expand(sc, repeats=1, data=lambda d: {"source": "synthetic"})
    assert select.expression_for([(specs[0].point, specs[0].point_label)]).startswith("'dense width'=16 and ")
    _round_trips(specs)


# --------------------------------------------------------------------------- through the CLI


def _table_labels(stdout: str) -> list[str]:
    return check_points(stdout)


def test_check_k_says_how_many_points_and_runs_match() -> None:
    files = [str(p) for p in SHIPPED]
    proc = suite_cli("check", *files, "--backend", "local", "-k", "width=750 and device=gpu")
    assert proc.returncode == 0, proc.stderr
    assert _table_labels(proc.stdout) == ["width=750, device=gpu"]
    assert "1 of 39 points, 5 of 195 runs match -k 'width=750 and device=gpu'" in proc.stdout
    proc = suite_cli("check", *files, "--backend", "local", "--smoke", "-k", "not jit_compile and batch_size=128")
    assert proc.returncode == 0, proc.stderr
    labels = _table_labels(proc.stdout)
    assert len(labels) == 6 and not any("jit_compile" in label for label in labels)  # gpu_knobs' 7 variants less one
    assert "6 of 39 points, 6 of 39 runs match" in proc.stdout


@pytest.mark.parametrize(
    ("expr", "expected"),
    [
        ("widht=750", "-k 'widht=750': no point has the key 'widht' (did you mean width?); keys: scenario,"),
        ("width=751", "-k 'width=751' matches none of the 39 points; the points are:\n  mnist_mlp_width: width=100,"),
        ("width=750 and (", "-k 'width=750 and (': ends where a term was expected"),
    ],
)
def test_bad_filters_exit_2_naming_the_flag(expr: str, expected: str) -> None:
    for command in ("check", "run"):
        proc = suite_cli(command, *map(str, SHIPPED), "--backend", "local", "--smoke", "-k", expr)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert proc.stderr.startswith("error: " + expected), proc.stderr
        assert "Traceback" not in proc.stderr
        assert "runs on backend" not in proc.stdout, "nothing ran"


def test_a_filter_matching_nothing_counts_points_not_runs() -> None:
    # mnist_mlp_width: 12 points of 5 repetitions each, 60 runs.
    proc = suite_cli("check", SCENARIOS / "mnist_mlp_width.yaml", "--backend", "local", "-k", "width=751")
    assert proc.returncode == 2, proc.stdout
    assert proc.stderr.startswith("error: -k 'width=751' matches none of the 12 points; the points are:\n"), proc.stderr
    assert proc.stderr.count("\n  mnist_mlp_width: ") == 12, proc.stderr


def test_report_k_shows_only_matching_points_and_leaves_the_full_report_as_it_was(tmp_path: Path) -> None:
    full = suite_cli("report", "--results", FIXTURE_RESULTS, "--out", tmp_path)
    assert full.returncode == 0, full.stderr
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert {"README.md", "fx_width.md", "fx_knobs.md", "fx_scaling.md", "hardware.md"} <= set(before)
    proc = suite_cli(
        "report", "--results", FIXTURE_RESULTS, "--out", tmp_path, "-k", "scenario=fx_width and device=cpu"
    )
    assert proc.returncode == 0, proc.stderr
    after = {p.name: p.read_bytes() for p in tmp_path.iterdir() if p.is_file()}
    assert after == before, "a cut neither replaces nor drops a page or an index entry of the full report"
    cut = tmp_path / "selected"
    assert f"the pages it takes are in {cut}; the full report in {tmp_path} is as it was" in proc.stdout
    alone = suite_cli("report", "--results", FIXTURE_RESULTS, "--out", tmp_path / "new", "-k", "device=cpu")
    assert alone.returncode == 0 and f"{tmp_path / 'new'} holds no full report" in alone.stdout, alone.stdout
    page = (cut / "fx_width.md").read_text()
    assert "| width=100, device=cpu " in page and "device=gpu" not in page.split("### Results")[1].split("###")[0]
    assert "2 of 4 points, not shown: the page was made with -k 'scenario=fx_width and device=cpu'" in page
    assert "python -m suite report --results tests/fixtures/results -k 'scenario=fx_width and device=cpu'`" in page
    assert "-k 'scenario=fx_width and device=cpu' && python -m suite report" in page, "Reproduce runs the same points"
    assert not (cut / "fx_knobs.md").exists(), "a scenario with no matching point gets no page"
    index = (cut / "README.md").read_text()
    assert "the points `-k scenario=fx_width and device=cpu` takes" in index and "fx_knobs" not in index
    bad = suite_cli("report", "--results", FIXTURE_RESULTS, "--out", tmp_path, "-k", "device=tpu")
    assert (
        bad.returncode == 2 and "matches none of the" in bad.stderr and "fx_width: width=100, device=cpu" in bad.stderr
    )
    assert "Traceback" not in bad.stderr


def test_report_without_k_is_unchanged(tmp_path: Path) -> None:
    """Pages without -k are what they were (the golden tests hold the bytes); no note, no -k in Reproduce."""
    shutil.copytree(FIXTURE_RESULTS, tmp_path / "results")
    proc = suite_cli("report", "--results", tmp_path / "results", "--out", tmp_path / "out")
    assert proc.returncode == 0, proc.stderr
    page = (tmp_path / "out" / "fx_width.md").read_text()
    assert "not shown: the page was made with -k" not in page and " -k " not in page


@pytest.mark.slow
def test_run_k_runs_only_the_matching_points(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "tiny_select", TINY)
    res = tmp_path / "results"
    proc = suite_cli("run", path, "--smoke", "--backend", "local", "--results", res, "--machine", "m", "-k", "width=8")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "2 of 4 points, 2 of 4 runs match -k 'width=8'" in proc.stdout
    loaded = [r for _, r in results.load_folder(res / "m")]
    assert sorted((r.spec["point_label"], r.status) for r in loaded) == [
        ("width=8, device=cpu", "ok"),
        ("width=8, device=gpu:64", "skipped"),
    ]
    # The same fingerprints as without -k: the rest of the plan finds them done.
    rest = suite_cli(
        "run", path, "--smoke", "--backend", "local", "--results", res, "--machine", "m", "-k", "device=cpu"
    )
    assert rest.returncode == 0, rest.stdout + rest.stderr
    assert "1 run already done (ok result on file; --fresh reruns)" in rest.stdout.splitlines()
    ran = [line for line in rest.stdout.splitlines() if line.startswith("[")]
    assert len(ran) == 1 and ran[0].startswith("[1/1] tiny_select [width=16, device=cpu] run 1 of 1: "), rest.stdout
    spec = json.loads(next((res / "m" / "tiny_select").glob("*.json")).read_text())["spec"]
    assert spec["overrides"] == {}


def _examples(text: str) -> list[str]:
    """The -k examples a text gives: ``KEY=VALUE`` in backticks or in the help's parentheses."""
    found = re.findall(r"`{1,2}((?:-k )?[^`]+?)`{1,2}", text) + re.findall(r"[(, ]([\w.]+=[\w:*]+)", text)
    found = [" ".join(e.removeprefix("-k ").strip('"').split()) for e in found if "=" in e or e.startswith("-k ")]
    return sorted(set(found) - {"scenario=NAME", "KEY=VALUE", "EXPR"})


def test_the_documented_examples_match_shipped_points() -> None:
    """Every -k example in docs/scenarios.md, the -k help and this module's docstring takes some
    shipped point."""
    page = (Path(__file__).resolve().parents[1] / "docs" / "scenarios.md").read_text()
    section = page.split("### Run some points", 1)[1].split("```", 1)[0]
    commands = next(a for a in cli._parser()._actions if isinstance(a, argparse._SubParsersAction))
    help_text = next(a.help for a in commands.choices["check"]._actions if a.dest == "select") or ""
    specs = [s for path in sorted(SCENARIOS.glob("*.yaml")) for s in plan.expand(scenario.load(path), repeats=1)]
    examples = _examples(section) + _examples(help_text) + _examples(select.__doc__ or "")
    assert "variant=jit_compile" in examples and "prefetch" in examples, examples
    for expr in examples:
        assert select.select_specs(specs, expr), expr
