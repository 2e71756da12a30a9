"""Scenario settings and their rules: defaults, allowed values, validation, dotted-path overrides.

Every key set is closed and every value checked against what is allowed; a problem names the file,
the key (as a dotted path), the line where the caller knows it, and what would have been accepted.
Reading files is ``suite.scenario``'s job; this module sees only Python values, so the plan can
resolve matrix points with it without importing the YAML loader.
"""

from __future__ import annotations

import copy
import difflib
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MODELS = ("mlp",)
ACTIVATIONS = ("relu", "tanh", "sigmoid", "gelu", "elu", "linear")
OUTPUT_ACTIVATIONS = ("softmax",)
OPTIMIZERS = ("nadam", "rmsprop", "adam", "adamw", "sgd", "adagrad")
LOSSES = ("categorical_crossentropy", "sparse_categorical_crossentropy")
BATCH_MODES = ("global", "per_replica")
INPUT_PIPELINES = ("numpy", "tf_data")
DATASETS = ("mnist",)
KERAS_BACKENDS = ("tensorflow", "jax", "torch")
VERDICTS = ("none", "gpu_crossover", "scaling", "knobs")
DEVICE_RE = re.compile(r"^(cpu|gpu)(:([1-9][0-9]*))?$")
DEVICE_ALLOWED = "'cpu', 'gpu', 'cpu:N' (N logical CPU devices) or 'gpu:N' (N >= 1)"

# The defaults every scenario starts from; a file states only what differs. The key sets here are
# also the closed sets of allowed keys.
DEFAULTS: dict[str, Any] = {
    "model": {
        "kind": "mlp",
        "hidden": [512],
        "activation": "relu",
        "dropout": 0.0,
        "output_activation": "softmax",
    },
    "training": {
        "optimizer": "rmsprop",
        "learning_rate": None,  # None: the optimizer's Keras default
        "loss": "categorical_crossentropy",
        "batch_size": 128,
        "batch_mode": "global",  # global: split across replicas; per_replica: x replicas
        "epochs": 5,
        "steps_per_execution": 1,
        "jit_compile": False,  # always explicit: Keras' "auto" differs between CPU and GPU
        "mixed_precision": False,
        "input_pipeline": "numpy",
        "shuffle": True,
        "seed": 1234,
    },
    "data": {
        "dataset": "mnist",
        "train_samples": None,  # None: all
        "test_samples": None,
        "allow_synthetic": False,
        "data_dir": None,  # a folder of IDX files instead of the Keras cache
        "shuffle_labels": False,  # a control: a correct pipeline must then fail the accuracy gate
    },
    "device": "cpu",
    "backend": "tensorflow",
    "threads": {"intra_op": 0, "inter_op": 0},  # 0: TensorFlow's choice
    "timeout_s": 3600,
    "image": None,  # name from docker/images.yaml; None: the backend's default
    # After the timed fit, in the same process: a near-empty model's step time (the fixed cost).
    "measure": {"step_overhead": True},
}
TOP_KEYS = ("name", "question", "description", "repeats", "matrix", "variants", "smoke", "report")
REPORT_KEYS = ("baseline", "verdict")


class ScenarioError(Exception):
    """Bad scenario input. ``problems`` holds one line per problem, each naming file and key."""

    def __init__(self, problems: list[str]):
        super().__init__("\n".join(problems))
        self.problems = problems


@dataclass(frozen=True)
class Scenario:
    name: str
    question: str
    description: str
    source: str  # the file, as given
    config: dict[str, Any]  # DEFAULTS merged with the file
    repeats: int
    matrix: dict[str, list[Any]]  # dotted path -> values
    variants: list[tuple[str, dict[str, Any]]]  # (name, {path: value}); empty: no variant axis
    smoke: dict[str, Any]
    baseline: dict[str, Any]
    verdict: str


# --------------------------------------------------------------------------- validation


class Checker:
    """Collects every problem of a file, each with its key and line, so one run reports them all."""

    def __init__(self, source: str, lines: dict[str, int]):
        self.source = source
        self.lines = lines
        self.problems: list[str] = []

    def fail(self, key: str, message: str, line_key: str | None = None) -> None:
        line = self.lines.get(line_key or key)
        where = f" line {line}" if line else ""
        self.problems.append(f"{self.source}:{where} key '{key}': {message}")

    def closed(self, mapping: Any, allowed: tuple[str, ...] | list[str], prefix: str) -> bool:
        if not isinstance(mapping, dict):
            self.fail(prefix, f"must be a mapping, got {type_name(mapping)}")
            return False
        for key in mapping:
            if key not in allowed:
                path = f"{prefix}.{key}" if prefix else str(key)
                self.fail(path, f"unknown key; allowed: {', '.join(allowed)}")
        return True


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def check_value(ck: Checker, key: str, value: Any, line_key: str | None = None, shown: str | None = None) -> None:
    """Check one leaf of the config by its dotted path ``key``; ``shown`` is the key as the file spells it."""
    rule = _RULES.get(re.sub(r"\.\d+$", ".N", key))
    if rule is None:
        return
    ok, allowed = rule(value)
    if not ok:
        ck.fail(shown or key, f"got {value!r} ({type_name(value)}); allowed: {allowed}", line_key)


def _choice(options: tuple[str, ...]):
    return lambda v: (v in options, ", ".join(options))


def _int_min(lo: int, nullable: bool = False):
    text = f"an integer >= {lo}" + (" or null" if nullable else "")
    return lambda v: ((v is None and nullable) or (is_int(v) and v >= lo), text)


def _bool(v: Any) -> tuple[bool, str]:
    return isinstance(v, bool), "true or false"


_RULES = {
    "model.kind": _choice(MODELS),
    "model.hidden": lambda v: (isinstance(v, list) and len(v) > 0, "a non-empty list of integers >= 1"),
    "model.hidden.N": _int_min(1),
    "model.activation": _choice(ACTIVATIONS),
    "model.dropout": lambda v: (_is_num(v) and 0 <= v < 1, "a number in [0, 1)"),
    "model.output_activation": _choice(OUTPUT_ACTIVATIONS),
    "training.optimizer": _choice(OPTIMIZERS),
    "training.learning_rate": lambda v: (v is None or (_is_num(v) and v > 0), "a number > 0 or null"),
    "training.loss": _choice(LOSSES),
    "training.batch_size": _int_min(1),
    "training.batch_mode": _choice(BATCH_MODES),
    "training.epochs": _int_min(1),
    "training.steps_per_execution": _int_min(1),
    "training.jit_compile": _bool,
    "training.mixed_precision": _bool,
    "training.input_pipeline": _choice(INPUT_PIPELINES),
    "training.shuffle": _bool,
    "training.seed": _int_min(0),
    "data.dataset": _choice(DATASETS),
    "data.train_samples": _int_min(1, nullable=True),
    "data.test_samples": _int_min(1, nullable=True),
    "data.allow_synthetic": _bool,
    "data.data_dir": lambda v: (v is None or isinstance(v, str), "a folder path or null"),
    "data.shuffle_labels": _bool,
    "device": lambda v: (isinstance(v, str) and bool(DEVICE_RE.match(v)), DEVICE_ALLOWED),
    "backend": _choice(KERAS_BACKENDS),
    "threads.intra_op": _int_min(0),
    "threads.inter_op": _int_min(0),
    "timeout_s": lambda v: (_is_num(v) and v > 0, "a number of seconds > 0"),
    "image": lambda v: (v is None or isinstance(v, str), "an image name from docker/images.yaml or null"),
    "measure.step_overhead": _bool,
}


def check_config(
    ck: Checker, config: dict[str, Any], prefix: str = "", line_of: Callable[[str], str] | None = None
) -> None:
    """Closed keys and value rules over a (possibly partial) config tree."""
    defaults = _get(DEFAULTS, prefix) if prefix else DEFAULTS
    for key, value in config.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(defaults, dict) and isinstance(defaults.get(key), dict):
            if ck.closed(value, tuple(defaults[key]), path):
                check_config(ck, value, path, line_of)
            continue
        check_value(ck, path, value, line_of(path) if line_of else None)
        if path == "model.hidden" and isinstance(value, list):
            for i, item in enumerate(value):
                check_value(ck, f"{path}.{i}", item, line_of(f"{path}.{i}") if line_of else None)


def cross_checks(ck: Checker, config: dict[str, Any], key: str) -> None:
    """Rules between fields, checked on every resolved point."""
    m = DEVICE_RE.match(str(config["device"]))
    if m and m.group(3) and int(m.group(3)) > 1 and config["backend"] != "tensorflow":
        ck.fail(key, f"device {config['device']!r} runs with MirroredStrategy, which needs backend tensorflow")
    if config["training"]["input_pipeline"] == "tf_data" and config["backend"] == "torch":
        ck.fail(key, "input_pipeline tf_data is not supported with backend torch; use numpy")


# --------------------------------------------------------------------------- paths and overrides


def _get(tree: Any, path: str) -> Any:
    node = tree
    for part in path.split("."):
        node = node[int(part)] if isinstance(node, list) else node[part]
    return node


def path_exists(tree: Any, path: str) -> bool:
    node = tree
    for part in path.split("."):
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            return False
    return True


def _set(tree: Any, path: str, value: Any) -> None:
    *parents, last = path.split(".")
    node = tree
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    if isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value


def apply_overrides(config: dict[str, Any], overrides: dict[str, Any], source: str, section: str) -> dict[str, Any]:
    """A copy of ``config`` with dotted-path overrides applied, each path and value checked."""
    ck = Checker(source, {})
    out = copy.deepcopy(config)
    for path, value in overrides.items():
        problem = path_problem(out, path)
        if problem:
            ck.fail(f"{section}.{path}", problem)
            continue
        _set(out, path, copy.deepcopy(value))
        check_config(ck, {path.split(".")[0]: _get(out, path.split(".")[0])})
    if ck.problems:
        raise ScenarioError(ck.problems)
    return out


def path_problem(config: dict[str, Any], path: Any) -> str | None:
    """Why ``path`` does not name one setting of ``config`` (with the closest real ones), or None."""
    if isinstance(path, str) and path_exists(config, path):
        if isinstance(_get(config, path), dict):
            return "names a whole section; give a path to one setting, e.g. data.train_samples"
        return None
    leaves = [p for p in _leaf_paths(config) if "." in p or not isinstance(config.get(p), dict)]
    close = difflib.get_close_matches(str(path), leaves, n=3, cutoff=0.6)
    sections = ", ".join(sorted(config))
    hint = f"did you mean {' or '.join(close)}?" if close else f"settings are {sections} and their keys"
    return f"no such setting in the scenario; {hint}"


def _leaf_paths(tree: Any, prefix: str = "") -> list[str]:
    """Every path into the settings: sections, leaves, and list items (model.hidden.0)."""
    if isinstance(tree, dict):
        children = [p for k, v in tree.items() for p in _leaf_paths(v, f"{prefix}.{k}" if prefix else k)]
    elif isinstance(tree, list):
        children = [f"{prefix}.{i}" for i in range(len(tree))]
    else:
        children = []
    return children + ([prefix] if prefix else [])
