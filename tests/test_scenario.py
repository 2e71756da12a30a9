"""Scenario parsing: valid files resolve fully; every kind of bad input names file, key and line."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import SCENARIOS, suite_cli, write_scenario

from suite.spec import scenario
from suite.spec.scenario import ScenarioError

GOOD = """\
name: tiny
question: Does it parse?
model:
  hidden: [64, 32]
training:
  optimizer: nadam
  epochs: 2
matrix:
  model.hidden.0: [16, 64]
  device: [cpu, gpu]
smoke:
  data.train_samples: 256
"""


def test_good_file_resolves_defaults_and_matrix(tmp_path: Path) -> None:
    sc = scenario.load(write_scenario(tmp_path, "tiny", GOOD))
    assert sc.name == "tiny"
    assert sc.config["model"]["hidden"] == [64, 32]
    assert sc.config["training"]["optimizer"] == "nadam"
    assert sc.config["training"]["jit_compile"] is False  # explicit default, never Keras' "auto"
    assert sc.config["training"]["batch_size"] == 128
    assert sc.matrix == {"model.hidden.0": [16, 64], "device": ["cpu", "gpu"]}
    assert sc.smoke == {"data.train_samples": 256}


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.name)
def test_shipped_scenarios_load(path: Path) -> None:
    sc = scenario.load(path)
    assert sc.question.endswith("?")
    assert sc.smoke, "every shipped scenario has a smoke size"
    assert sc.verdict != "none"


def _problems(tmp_path: Path, text: str) -> list[str]:
    path = write_scenario(tmp_path, "bad", text)
    with pytest.raises(ScenarioError) as info:
        scenario.load(path)
    assert all(str(path) in p for p in info.value.problems), info.value.problems
    return info.value.problems


def _replace(old: str, new: str) -> str:
    assert old in GOOD
    return GOOD.replace(old, new)


BAD = {
    "unknown top key": (_replace("question:", "speed: fast\nquestion:"), "'speed'", "line 2", "allowed: name"),
    "unknown nested key": (_replace("  epochs: 2", "  epoch: 2"), "'training.epoch'", "line 7", "allowed:"),
    "wrong type": (_replace("epochs: 2", "epochs: two"), "'training.epochs'", "line 7", "an integer in [1, 10000]"),
    "bool is not an int": (_replace("epochs: 2", "epochs: true"), "'training.epochs'", "line 7", "integer"),
    "unknown model": (_replace("model:\n", "model:\n  kind: rnn\n"), "'model.kind'", "line 4", "allowed: mlp, cnn"),
    "mlp key under kind cnn": (
        _replace("model:\n", "model:\n  kind: cnn\n").replace("model.hidden.0: [16, 64]", "model.filters.0: [8, 16]"),
        "'model.hidden'",
        "line 5",
        "unknown key for model kind 'cnn'; allowed: kind, filters, kernel_size, pool, dense",
    ),
    "misspelt key": (_replace("  epochs: 2", "  epohcs: 2"), "'training.epohcs'", "line 7", "did you mean epochs?"),
    "bad list item": (_replace("[64, 32]", "[64, 0]"), "'model.hidden.1'", "line 4", "an integer in [1, 65536]"),
    "unknown optimizer": (_replace("optimizer: nadam", "optimizer: lion"), "'training.optimizer'", "line 6", "rmsprop"),
    "unknown loss": (_replace("  epochs: 2", "  epochs: 2\n  loss: mse"), "'training.loss'", "line 8", "categorical"),
    "two variants of the same settings": (
        _replace(
            "smoke:",
            "variants:\n  - name: a\n    set: {training.epochs: 3}\n  - name: b\n    set: {training.epochs: 3}\nsmoke:",
        ),
        "'variants.1.set'",
        "line 15",
        "the same settings as variant 'a'",
    ),
    "a variant setting what the matrix sweeps": (
        GOOD + "variants:\n  - name: a\n  - name: wide\n    set: {model.hidden: [512, 32]}\n",
        "'variants.1.set.model.hidden'",
        "line 16",
        "the matrix sweeps model.hidden.0; its value would overrule the variant's; allowed: settings the matrix",
    ),
    "two matrix axes over one setting": (
        _replace("  device: [cpu, gpu]", "  model.hidden: [[8, 8], [9, 9]]"),
        "'matrix.model.hidden'",
        "line 10",
        "sweeps a value matrix.model.hidden.0 sweeps too; allowed: one axis per setting",
    ),
    "a smoke setting the matrix sweeps": (
        _replace("data.train_samples: 256", "model.hidden.0: 8"),
        "'smoke.model.hidden.0'",
        "line 12",
        "the matrix sweeps model.hidden.0; at smoke size every point would run the smoke value",
    ),
    "variants the same at smoke size": (
        GOOD + "variants:\n  - name: a\n  - name: long\n    set: {data.train_samples: 512}\n",
        "matrix points [variant=a, width=16, device=cpu] and [variant=long, width=16, device=cpu]",
        "",
        "run the same settings at smoke size (its smoke settings overrule what tells them apart); allowed:",
    ),
    "unknown device in matrix": (
        _replace("[cpu, gpu]", "[cpu, tpu]"),
        "'matrix.device'",
        "line 10",
        "'gpu:N'",
    ),
    "unknown device": (GOOD + "device: gpu:0\n", "'device'", "line 13", "N from 1 to 256"),
    "empty matrix values": (_replace("[cpu, gpu]", "[]"), "'matrix.device'", "line 10", "non-empty list"),
    "matrix values not a list": (_replace("[cpu, gpu]", "cpu"), "'matrix.device'", "line 10", "non-empty list"),
    "matrix path missing": (
        _replace("model.hidden.0:", "model.hidden.5:"),
        "'matrix.model.hidden.5'",
        "line 9",
        "no such setting",
    ),
    "matrix index with a leading zero": (
        _replace("model.hidden.0:", "model.hidden.00:"),
        "'matrix.model.hidden.00'",
        "line 9",
        "a list index is written without leading zeros: write model.hidden.0",
    ),
    "smoke index with a leading zero": (
        _replace("data.train_samples: 256", "model.hidden.01: 8"),
        "'smoke.model.hidden.01'",
        "line 12",
        "write model.hidden.1",
    ),
    "variant index with a leading zero": (
        GOOD + "variants:\n  - name: narrow\n    set: {model.hidden.01: 8}\n",
        "model.hidden.01",
        "",
        "write model.hidden.1",
    ),
    "matrix value wrong type": (_replace("[16, 64]", "[16, wide]"), "'matrix.model.hidden.0'", "line 9", "integer"),
    "smoke path missing": (
        _replace("data.train_samples", "data.train_sample"),
        "'smoke.data.train_sample'",
        "line 12",
        "did you mean data.train_samples",
    ),
    "matrix names a section": (
        _replace("device: [cpu, gpu]", "training: [1, 2]"),
        "'matrix.training'",
        "line 10",
        "names a whole section",
    ),
    "missing question": (_replace("question: Does it parse?\n", ""), "'question'", "", "required"),
    "unknown verdict": (GOOD + "report: {verdict: magic}\n", "'report.verdict'", "line 13", "gpu_crossover"),
    "baseline not an axis": (GOOD + "report: {baseline: {training.epochs: 2}}\n", "'report.baseline", "", "axis"),
    "unknown keras backend": (GOOD + "backend: mxnet\n", "'backend'", "line 13", "tensorflow, jax, torch"),
    "multi-device needs tensorflow": (
        GOOD.replace("[cpu, gpu]", "[cpu, 'gpu:2']") + "backend: jax\n",
        "matrix point",
        "",
        "MirroredStrategy",
    ),
}


@pytest.mark.parametrize("case", list(BAD), ids=list(BAD))
def test_bad_input_names_file_key_and_line(tmp_path: Path, case: str) -> None:
    text, key, line, allowed = BAD[case]
    problems = _problems(tmp_path, text)
    joined = "\n".join(problems)
    assert key in joined, joined
    assert line in joined, joined
    assert allowed in joined, joined


def test_malformed_yaml_names_line(tmp_path: Path) -> None:
    problems = _problems(tmp_path, "name: x\nquestion: [unclosed\n")
    assert "malformed YAML" in problems[0] and "line" in problems[0]


def test_duplicate_yaml_key(tmp_path: Path) -> None:
    problems = _problems(tmp_path, GOOD + "name: again\n")
    assert "duplicate key 'name'" in problems[0] and "line 13" in problems[0]


def test_not_a_mapping(tmp_path: Path) -> None:
    assert "must hold a mapping" in _problems(tmp_path, "- a\n- b\n")[0]


def test_all_problems_reported_at_once(tmp_path: Path) -> None:
    text = _replace("epochs: 2", "epochs: 0").replace("optimizer: nadam", "optimizer: lion")
    assert len(_problems(tmp_path, text)) == 2


def test_duplicate_scenario_names(tmp_path: Path) -> None:
    a = write_scenario(tmp_path, "a", GOOD)
    b = write_scenario(tmp_path, "b", GOOD)
    with pytest.raises(ScenarioError) as info:
        scenario.load_all([a, b])
    assert str(b) in str(info.value) and "'tiny' is already used by" in str(info.value)


def test_cli_bad_input_exit_2_without_traceback(tmp_path: Path) -> None:
    path = write_scenario(tmp_path, "bad", _replace("optimizer: nadam", "optimizer: lion"))
    for args in (("check",), ("run", "--results", tmp_path / "res")):
        proc = suite_cli(*args, path)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert f"{path}: line 6 key 'training.optimizer'" in proc.stderr
    assert not (tmp_path / "res").exists(), "nothing runs when the input is bad"


def test_cli_file_not_utf8_exit_2_names_file_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "latin1.yaml"
    path.write_bytes(b"name: x\xff\n")
    for args in (("check",), ("run", "--results", tmp_path / "res")):
        proc = suite_cli(*args, path)
        assert proc.returncode == 2, proc.stderr
        assert "Traceback" not in proc.stderr
        assert f"{path}: not UTF-8 text" in proc.stderr and "byte offset 7" in proc.stderr, proc.stderr
    assert not (tmp_path / "res").exists(), "nothing runs when the input is bad"


def test_cli_check_prints_plan() -> None:
    proc = suite_cli("check", SCENARIOS / "mnist_mlp_width.yaml")
    assert proc.returncode == 0, proc.stderr
    assert "width=2000, device=gpu" in proc.stdout
    assert "12 points, 60 runs" in proc.stdout  # 5 repetitions each


def test_a_scenario_cannot_state_the_data_identity_itself(tmp_path: Path) -> None:
    # The host resolves config.data.identity from what it has; a file that names one would forge it.
    text = GOOD + "data:\n  identity: {source: mnist.npz, sha256: abc}\n"
    (problem,) = _problems(tmp_path, text)
    assert "key 'data.identity': unknown key" in problem and "allow_synthetic" in problem


def test_a_number_yaml_reads_as_text_is_refused_with_how_to_write_it(tmp_path: Path) -> None:
    """PyYAML reads YAML 1.1, where 1e-3 is a string (JSON and YAML 1.2 read a number): the error
    says so and gives the number to write, for a setting, a --set value and repeats: auto's precision."""
    text = GOOD.replace("  epochs: 2\n", "  epochs: 2\n  learning_rate: 1e-3\n") + "repeats: auto\nprecision: 2E-2\n"
    path = write_scenario(tmp_path, "tiny", text)
    proc = suite_cli("check", path, "--backend", "local")
    assert proc.returncode == 2, proc.stdout
    assert "key 'training.learning_rate': got '1e-3' (str)" in proc.stderr and "write 0.001" in proc.stderr
    assert "key 'precision': got '2E-2'" in proc.stderr and "write 0.02" in proc.stderr, proc.stderr
    fixed = write_scenario(tmp_path, "tiny", GOOD)
    for given, written in (("5e-4", "0.0005"), ("1e-5", "1.0e-05"), ("2E+1", "20")):
        flag = f"training.learning_rate={given}"
        proc = suite_cli("check", fixed, "--backend", "local", "--set", flag)
        assert proc.returncode == 2 and f"got {given!r} (str)" in proc.stderr, proc.stderr
        assert proc.stderr.rstrip().endswith(f"write {written}"), proc.stderr
        again = suite_cli("check", fixed, "--backend", "local", "--set", f"training.learning_rate={written}")
        assert again.returncode == 0, (written, again.stderr)  # what it advises is read as that number
    # An integer setting is told an integer; a setting of text, or a number it refuses anyway, no number.
    for flag, advice in (
        ("training.epochs=1e1", "write 10"),
        ("training.optimizer=1e3", None),
        ("training.epochs=1e9", None),
    ):
        proc = suite_cli("check", fixed, "--backend", "local", "--set", flag)
        assert proc.returncode == 2 and (advice in proc.stderr if advice else "YAML reads" not in proc.stderr), (
            proc.stderr
        )


def test_the_plan_size_counts_the_repeats_given_on_the_command_line(tmp_path: Path) -> None:
    """8 points x the file's 5 repetitions is over --max-runs 20; --repeats 2 or --smoke (1 a point) is not."""
    path = write_scenario(tmp_path, "tiny", GOOD.replace("[16, 64]", "[16, 32, 48, 64]"))
    refused = suite_cli("check", path, "--backend", "local", "--max-runs", "20")
    assert refused.returncode == 2 and "x 5 repetitions = 40 runs" in refused.stderr, refused.stderr
    for extra in (["--repeats", "2"], ["--smoke"]):
        proc = suite_cli("check", path, "--backend", "local", "--max-runs", "20", *extra)
        assert proc.returncode == 0, (extra, proc.stderr)


@pytest.mark.parametrize(("first", "second"), [("A", "a"), ('"x y"', '"x\\ny"'), ('"x\\ty"', '"X y"')])
def test_variant_names_that_read_alike_are_refused(tmp_path: Path, first: str, second: str) -> None:
    """-k matches a variant's name whatever its case, and pages show a line break or tab as a space:
    two variants named so would be points that no -k, page or Reproduce command can tell apart."""
    variants = f"variants:\n  - name: {first}\n  - name: {second}\n    set: {{training.epochs: 3}}\n"
    path = write_scenario(tmp_path, "alike", GOOD + variants)
    proc = suite_cli("check", path, "--backend", "local")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert f"{path}: line 15 key 'variants.1.name'" in proc.stderr and "reads as variant" in proc.stderr, proc.stderr
    assert "allowed: a name that differs" in proc.stderr, proc.stderr


def test_variant_names_that_k_tells_apart_are_kept(tmp_path: Path) -> None:
    # -k compares lower-cased names: 'straße' and 'strasse' differ there, though casefold makes them one.
    variants = "variants:\n  - name: straße\n  - name: strasse\n    set: {training.epochs: 3}\n"
    path = write_scenario(tmp_path, "apart", GOOD + variants)
    proc = suite_cli("check", path, "--backend", "local")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_a_matrix_listing_a_whole_float_and_its_int_lists_a_value_twice(tmp_path: Path) -> None:
    """model.dropout: [0, 0.0] is one setting under two labels (and two fingerprints): the same
    measurement twice, as [8, 8] would be."""
    path = write_scenario(tmp_path, "twice", GOOD.replace("  device: [cpu, gpu]\n", "  model.dropout: [0, 0.0, 0.5]\n"))
    proc = suite_cli("check", path, "--backend", "local")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr, proc.stdout + proc.stderr
    assert f"{path}: line 10 key 'matrix.model.dropout': lists a value twice; allowed: each value once" in proc.stderr


def test_a_variant_named_with_a_character_newer_than_this_python_is_taken(tmp_path: Path) -> None:
    """Control characters are refused by their Unicode category, not by ``isprintable``, which also
    refuses a character this Python's tables do not know (U+1FAE8, of Unicode 15, on Python 3.11): a
    scenario and its results read the same on every supported Python."""
    text = (
        (Path(__file__).parent / "fixtures" / "scenarios" / "fx_knobs.yaml")
        .read_text()
        .replace("name: jit_compile", "name: jit \U0001fae8")
    )
    path = write_scenario(tmp_path, "newer", text.replace("name: fx_knobs", "name: newer"))
    proc = suite_cli("check", path, "--backend", "local", "--allow-synthetic", "--results", tmp_path / "r")
    # (The console writes what this Python calls unprintable as its escape: shown, either way.)
    assert proc.returncode == 0 and "| variant=jit " in proc.stdout, proc.stdout + proc.stderr
