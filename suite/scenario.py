"""Scenario files: YAML -> validated, fully resolved settings, with errors a user can act on.

Every key set is closed and every value checked against what is allowed; an error names the file,
the key (as a dotted path), the YAML line where known, and what would have been accepted. YAML
holds values only: models, optimizers, losses and verdicts are chosen by name from registries.
"""

from __future__ import annotations

import copy
import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

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


# --------------------------------------------------------------------------- YAML with lines


class _Loader(yaml.SafeLoader):
    pass


def _construct_mapping(loader: _Loader, node: yaml.MappingNode) -> dict:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node)
        if key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicate key {key!r} (first on line {seen[key] + 1})", key_node.start_mark
            )
        seen[key] = key_node.start_mark.line
    return loader.construct_mapping(node)


_Loader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _lines(node: yaml.Node, prefix: str = "", out: dict[str, int] | None = None) -> dict[str, int]:
    """Dotted path -> 1-based line, for every key and list item in the document."""
    out = {} if out is None else out
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            path = f"{prefix}.{key_node.value}" if prefix else str(key_node.value)
            out[path] = key_node.start_mark.line + 1
            _lines(value_node, path, out)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            path = f"{prefix}.{i}"
            out[path] = item.start_mark.line + 1
            _lines(item, path, out)
    return out


def _read_yaml(path: Path) -> tuple[Any, dict[str, int]]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ScenarioError([f"{path}: cannot read: {exc.strerror}"]) from None
    except UnicodeDecodeError as exc:
        # YAML is read as UTF-8; the offset lets the user find the stray byte (a Latin-1 accent,
        # a file saved as UTF-16) without a traceback.
        raise ScenarioError(
            [f"{path}: not UTF-8 text: byte {exc.object[exc.start]:#04x} at byte offset {exc.start} ({exc.reason})"]
        ) from None
    try:
        node = yaml.compose(text, Loader=_Loader)
        data = yaml.load(text, Loader=_Loader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1}, column {mark.column + 1})" if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ScenarioError([f"{path}{where}: malformed YAML: {problem}"]) from None
    return data, (_lines(node) if node is not None else {})


# --------------------------------------------------------------------------- validation


class _Checker:
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
            self.fail(prefix, f"must be a mapping, got {_type(mapping)}")
            return False
        for key in mapping:
            if key not in allowed:
                path = f"{prefix}.{key}" if prefix else str(key)
                self.fail(path, f"unknown key; allowed: {', '.join(allowed)}")
        return True


def _type(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _check_value(ck: _Checker, key: str, value: Any, line_key: str | None = None, shown: str | None = None) -> None:
    """Check one leaf of the config by its dotted path ``key``; ``shown`` is the key as the file spells it."""
    rule = _RULES.get(re.sub(r"\.\d+$", ".N", key))
    if rule is None:
        return
    ok, allowed = rule(value)
    if not ok:
        ck.fail(shown or key, f"got {value!r} ({_type(value)}); allowed: {allowed}", line_key)


def _choice(options: tuple[str, ...]):
    return lambda v: (v in options, ", ".join(options))


def _int_min(lo: int, nullable: bool = False):
    text = f"an integer >= {lo}" + (" or null" if nullable else "")
    return lambda v: ((v is None and nullable) or (_is_int(v) and v >= lo), text)


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


def _check_config(ck: _Checker, config: dict[str, Any], prefix: str = "", line_of=None) -> None:
    """Closed keys and value rules over a (possibly partial) config tree."""
    defaults = _get(DEFAULTS, prefix) if prefix else DEFAULTS
    for key, value in config.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(defaults, dict) and isinstance(defaults.get(key), dict):
            if ck.closed(value, tuple(defaults[key]), path):
                _check_config(ck, value, path, line_of)
            continue
        _check_value(ck, path, value, line_of(path) if line_of else None)
        if path == "model.hidden" and isinstance(value, list):
            for i, item in enumerate(value):
                _check_value(ck, f"{path}.{i}", item, line_of(f"{path}.{i}") if line_of else None)


def _cross_checks(ck: _Checker, config: dict[str, Any], key: str) -> None:
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
    ck = _Checker(source, {})
    out = copy.deepcopy(config)
    for path, value in overrides.items():
        problem = _path_problem(out, path)
        if problem:
            ck.fail(f"{section}.{path}", problem)
            continue
        _set(out, path, copy.deepcopy(value))
        _check_config(ck, {path.split(".")[0]: _get(out, path.split(".")[0])})
    if ck.problems:
        raise ScenarioError(ck.problems)
    return out


def _path_problem(config: dict[str, Any], path: Any) -> str | None:
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


# --------------------------------------------------------------------------- loading


def load(path: str | Path) -> Scenario:
    """Read and validate one scenario file. Raises ScenarioError listing every problem found."""
    source = str(path)
    data, lines = _read_yaml(Path(path))
    ck = _Checker(source, lines)
    if not isinstance(data, dict):
        raise ScenarioError([f"{source}: the file must hold a mapping of settings, got {_type(data)}"])
    ck.closed(data, TOP_KEYS + tuple(DEFAULTS), "")
    for key in ("name", "question"):
        if not isinstance(data.get(key), str) or not data.get(key, "").strip():
            ck.fail(key, "required; a non-empty string")
    if isinstance(data.get("name"), str) and not re.match(r"^[A-Za-z0-9_.-]+$", data["name"]):
        ck.fail("name", "letters, digits, '_', '.', '-' only (it names files)")
    repeats = data.get("repeats", 5)
    if not (_is_int(repeats) and repeats >= 1):
        ck.fail("repeats", f"got {repeats!r}; allowed: an integer >= 1")

    config = copy.deepcopy(DEFAULTS)
    own = {k: v for k, v in data.items() if k in DEFAULTS}
    _check_config(ck, own, line_of=lambda p: p)
    for key, value in own.items():
        if isinstance(DEFAULTS[key], dict) and isinstance(value, dict):
            config[key].update({k: v for k, v in value.items() if k in DEFAULTS[key]})
        elif not isinstance(DEFAULTS[key], dict):
            config[key] = value

    matrix = _load_matrix(ck, data.get("matrix", {}), config)
    variants = _load_variants(ck, data.get("variants", []), config)
    smoke = _load_overrides(ck, data.get("smoke", {}), config, "smoke")
    baseline, verdict = _load_report(ck, data.get("report", {}), matrix, bool(variants))
    if ck.problems:
        raise ScenarioError(ck.problems)

    scenario = Scenario(
        name=data["name"],
        question=data["question"].strip(),
        description=str(data.get("description") or "").strip(),
        source=source,
        config=config,
        repeats=repeats,
        matrix=matrix,
        variants=variants,
        smoke=smoke,
        baseline=baseline,
        verdict=verdict,
    )
    _check_points(scenario)
    return scenario


def _load_overrides(ck: _Checker, raw: Any, config: dict[str, Any], section: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        ck.fail(section, f"must be a mapping of setting paths to values, got {_type(raw)}")
        return {}
    out = {}
    for path, value in raw.items():
        key = f"{section}.{path}"
        problem = _path_problem(config, path)
        if problem:
            ck.fail(key, problem)
            continue
        _check_value(ck, path, value, key, key)
        if isinstance(value, list) and path == "model.hidden":
            for i, item in enumerate(value):
                _check_value(ck, f"{path}.{i}", item, key, key)
        out[path] = value
    return out


def _load_matrix(ck: _Checker, raw: Any, config: dict[str, Any]) -> dict[str, list[Any]]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        ck.fail("matrix", f"must be a mapping of setting paths to lists of values, got {_type(raw)}")
        return {}
    out: dict[str, list[Any]] = {}
    for path, values in raw.items():
        key = f"matrix.{path}"
        if not isinstance(values, list) or not values:
            ck.fail(key, f"must be a non-empty list of values, got {values!r}")
            continue
        problem = _path_problem(config, path)
        if problem:
            ck.fail(key, problem)
            continue
        if len({repr(v) for v in values}) != len(values):
            ck.fail(key, "lists a value twice")
        for i, value in enumerate(values):
            _check_value(ck, path, value, f"{key}.{i}", key)
        out[path] = values
    return out


def _load_variants(ck: _Checker, raw: Any, config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    if raw is None or raw == []:
        return []
    if not isinstance(raw, list):
        ck.fail("variants", f"must be a list of {{name, set}} mappings, got {_type(raw)}")
        return []
    out, names = [], set()
    for i, item in enumerate(raw):
        key = f"variants.{i}"
        if not ck.closed(item, ("name", "set"), key):
            continue
        name = item.get("name")
        if not isinstance(name, str) or not name:
            ck.fail(f"{key}.name", "required; a non-empty string")
            continue
        if name in names:
            ck.fail(f"{key}.name", f"variant {name!r} is named twice")
        names.add(name)
        out.append((name, _load_overrides(ck, item.get("set") or {}, config, f"{key}.set")))
    return out


def _load_report(ck: _Checker, raw: Any, matrix: dict[str, list[Any]], has_variants: bool) -> tuple[dict, str]:
    if raw is None:
        raw = {}
    if not ck.closed(raw, REPORT_KEYS, "report"):
        return {}, "none"
    verdict = raw.get("verdict", "none")
    if verdict not in VERDICTS:
        ck.fail("report.verdict", f"got {verdict!r}; allowed: {', '.join(VERDICTS)}")
    baseline = raw.get("baseline") or {}
    if not isinstance(baseline, dict):
        ck.fail("report.baseline", f"must be a mapping of matrix axis to value, got {_type(baseline)}")
        return {}, verdict
    axes = dict(matrix)
    if has_variants:
        axes["variant"] = None  # any variant name
    for path, value in baseline.items():
        if path not in axes:
            ck.fail(f"report.baseline.{path}", f"not a matrix axis; axes: {', '.join(axes) or 'none'}")
        elif axes[path] is not None and value not in axes[path]:
            ck.fail(f"report.baseline.{path}", f"{value!r} is not one of the axis values {axes[path]}")
    return baseline, verdict


def _check_points(scenario: Scenario) -> None:
    """Resolve every point once (also with smoke) so cross-field errors surface at load time."""
    from suite.plan import expand  # plan imports this module

    problems: list[str] = []
    for smoke in (False, True):
        for spec in expand(scenario, smoke=smoke, repeats=1):
            ck = _Checker(scenario.source, {})
            _cross_checks(ck, spec.config, f"matrix point [{spec.point_label}]")
            problems += [p for p in ck.problems if p not in problems]
    if problems:
        raise ScenarioError(problems)


def load_all(paths: list[str | Path]) -> list[Scenario]:
    """Load several files; also refuses two scenarios with the same name."""
    scenarios, problems, seen = [], [], {}
    for path in paths:
        try:
            sc = load(path)
        except ScenarioError as exc:
            problems += exc.problems
            continue
        if sc.name in seen:
            problems.append(f"{path}: key 'name': scenario name {sc.name!r} is already used by {seen[sc.name]}")
            continue
        seen[sc.name] = str(path)
        scenarios.append(sc)
    if problems:
        raise ScenarioError(problems)
    return scenarios
