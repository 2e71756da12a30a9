"""``python -m suite schema`` against a JSON Schema validator library: schema and checker agree on files."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from conftest import SCENARIOS, suite_cli, write_scenario
from test_scenario import GOOD

from suite.spec import scenario
from suite.spec.scenario import ScenarioError

jsonschema = pytest.importorskip("jsonschema", reason="requirements/dev.txt installs jsonschema")

BASE = GOOD  # the checker's own minimal good file: the schema must accept what it accepts
CNN = """\
name: conv
question: Does a CNN parse?
model: {kind: cnn, filters: [8, 16], kernel_size: 5, pool: none}
matrix:
  model.filters.0: [4, 8]
  model.dense: [16, 32]
variants:
  - name: plain
  - name: xla
    set: {training.jit_compile: true, model.filters.1: 32}
smoke: {model.filters.1: 4, data.train_samples: 128}
report: {baseline: {model.dense: 16}, verdict: gpu_crossover}
"""

# Loads only once suite/spec/scenario.py builds a file's settings for its model kind (settings.resolve).
GOOD = {
    "mlp": BASE,
    "cnn": CNN,
    "minimal": "name: m\nquestion: q?\n",
    "nulls": BASE + "data: {train_samples: null, data_dir: null}\nimage: null\n",
    "cnn defaults": "name: c\nquestion: q?\nmodel: {kind: cnn}\n",
    "mlp named": "name: c\nquestion: q?\nmodel: {kind: mlp, dropout: 0.5}\nthreads: {intra_op: 2}\n",
    "repeats auto": BASE + "repeats: auto\n",
    "repeats auto, its settings": BASE + "repeats: auto\nprecision: 0.05\nmax_repeats: 20\n",
}
BAD = {
    "unknown top key": BASE + "speed: fast\n",
    "unknown nested key": BASE.replace("  epochs: 2", "  epoch: 2"),
    "wrong type": BASE.replace("epochs: 2", "epochs: two"),
    "bool is not an int": BASE.replace("epochs: 2", "epochs: true"),
    "below minimum": BASE.replace("epochs: 2", "epochs: 0"),
    "unknown kind": BASE.replace("model:\n", "model:\n  kind: rnn\n"),
    "mlp key under cnn": CNN.replace("pool: none}", "pool: none, hidden: [64]}"),
    "cnn key under mlp": BASE.replace("model:\n", "model:\n  filters: [8]\n"),
    "too many filters": CNN.replace("filters: [8, 16]", "filters: [8, 16, 32, 64, 128]"),
    "no filters": CNN.replace("filters: [8, 16]", "filters: []"),
    "bad filter": CNN.replace("filters: [8, 16]", "filters: [8, 0]"),
    "bad pool": CNN.replace("pool: none", "pool: average"),
    "dropout 1": BASE.replace("model:\n", "model:\n  dropout: 1.0\n"),
    "bad device": BASE + "device: tpu\n",
    "gpu:0": BASE + "device: 'gpu:0'\n",
    "bad matrix device": BASE.replace("[cpu, gpu]", "[cpu, tpu]"),
    "matrix values not a list": BASE.replace("[cpu, gpu]", "cpu"),
    "empty matrix values": BASE.replace("[cpu, gpu]", "[]"),
    "matrix value twice": BASE.replace("[cpu, gpu]", "[cpu, cpu]"),
    "matrix path unknown": BASE.replace("device: [cpu, gpu]", "training.epoch: [1, 2]"),
    "matrix names a section": BASE.replace("device: [cpu, gpu]", "training: [1, 2]"),
    "mlp path in a cnn matrix": CNN.replace("model.dense: [16, 32]", "model.hidden.0: [16, 32]"),
    "matrix item wrong type": CNN.replace("[4, 8]", "[4, wide]"),
    "smoke path unknown": BASE.replace("data.train_samples", "data.train_sample"),
    "smoke value wrong": BASE.replace("data.train_samples: 256", "data.train_samples: -1"),
    "variant without name": CNN.replace("  - name: plain\n", "  - set: {training.epochs: 1}\n"),
    "variant unknown key": CNN.replace("  - name: plain\n", "  - name: plain\n    sets: {}\n"),
    "unknown verdict": BASE + "report: {verdict: magic}\n",
    "missing question": BASE.replace("question: Does it parse?\n", ""),
    "blank question": BASE.replace("question: Does it parse?", "question: '  '"),
    "bad name": BASE.replace("name: tiny", "name: tiny file"),
    "repeats 0": BASE + "repeats: 0\n",
    "repeats another word": BASE + "repeats: many\n",
    "precision without auto": BASE + "repeats: 5\nprecision: 0.05\n",
    "max_repeats without repeats": BASE + "max_repeats: 8\n",
    "precision 0": BASE + "repeats: auto\nprecision: 0\n",
    "precision a word": BASE + "repeats: auto\nprecision: tight\n",
    "max_repeats below the first stage": BASE + "repeats: auto\nmax_repeats: 3\n",
    "unknown backend": BASE + "backend: mxnet\n",
    "learning rate 0": BASE.replace("  epochs: 2", "  epochs: 2\n  learning_rate: 0"),
    "timeout 0": BASE + "timeout_s: 0\n",
}


@pytest.fixture(scope="module")
def schema() -> dict:
    proc = suite_cli("schema")
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    jsonschema.Draft202012Validator.check_schema(out)
    assert out["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    return out


def _schema_ok(schema: dict, text: str) -> bool:
    return jsonschema.Draft202012Validator(schema).is_valid(yaml.safe_load(text))


def _checker_ok(tmp_path: Path, text: str) -> bool:
    try:
        scenario.load(write_scenario(tmp_path, "s", text))
    except ScenarioError:
        return False
    return True


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_scenario_meets_the_schema(schema: dict, path: Path) -> None:
    scenario.load(path)
    errors = [e.message for e in jsonschema.Draft202012Validator(schema).iter_errors(yaml.safe_load(path.read_text()))]
    assert errors == []


@pytest.mark.parametrize("case", list(GOOD))
def test_schema_and_checker_accept_the_same_good_files(schema: dict, tmp_path: Path, case: str) -> None:
    assert _checker_ok(tmp_path, GOOD[case]), case
    assert _schema_ok(schema, GOOD[case]), case


@pytest.mark.parametrize("case", list(BAD))
def test_schema_and_checker_refuse_the_same_bad_files(schema: dict, tmp_path: Path, case: str) -> None:
    assert not _checker_ok(tmp_path, BAD[case]), f"the checker accepts {case}"
    assert not _schema_ok(schema, BAD[case]), f"the schema accepts {case}"


def test_schema_carries_the_checkers_defaults_and_descriptions(schema: dict) -> None:
    from suite.spec.settings import DEFAULTS

    training = schema["properties"]["training"]["properties"]
    assert {k: v["default"] for k, v in training.items()} == DEFAULTS["training"]
    cnn_then = next(b["then"] for b in schema["allOf"] if b["if"].get("required") == ["model"])
    filters = cnn_then["properties"]["model"]["properties"]["filters"]
    assert filters["items"] == {"type": "integer", "minimum": 1, "maximum": 4096} and filters["description"]
