"""Scenario settings and their rules: defaults, allowed values, validation, dotted-path overrides.

Every key set is closed and every value checked against what is allowed; a problem names the file,
the key (as a dotted path), the line where the caller knows it, and what would have been accepted.
Reading files is ``suite.spec.scenario``'s job; this module sees only Python values, so the plan can
resolve matrix points with it without importing the YAML loader.
"""

from __future__ import annotations

import copy
import difflib
import math
import re
import unicodedata
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from suite.safe.markdown import escaped
from suite.spec.yaml_numbers import text_number_advice
from suite.worker import kinds
from suite.worker.kinds import KINDS

MODELS = tuple(KINDS)
ACTIVATIONS = kinds.ACTIVATIONS
OUTPUT_ACTIVATIONS = kinds.OUTPUT_ACTIVATIONS
OPTIMIZERS = ("nadam", "rmsprop", "adam", "adamw", "sgd", "adagrad")
LOSSES = ("categorical_crossentropy", "sparse_categorical_crossentropy")
BATCH_MODES = ("global", "per_replica")
INPUT_PIPELINES = ("numpy", "tf_data")
DATASETS = ("mnist",)
KERAS_BACKENDS = ("tensorflow", "jax", "torch")
VERDICTS = ("none", "gpu_crossover", "scaling", "knobs")
# N at most 256: far more devices than a host has, and a cpu:N of 100,000 logical devices took a
# gigabyte and a core for minutes before its first step.
DEVICE_RE = re.compile(r"^(cpu|gpu)(:(25[0-6]|2[0-4][0-9]|1[0-9]{2}|[1-9][0-9]?))?$")
DEVICE_ALLOWED = "'cpu', 'gpu', 'cpu:N' (N logical CPU devices) or 'gpu:N' (N GPUs), N from 1 to 256"


def _enum(options: tuple[str, ...], default: str, description: str) -> dict[str, Any]:
    return {"enum": list(options), "default": default, "description": description}


def _int(minimum: int, maximum: int, default: int | None, description: str, nullable: bool = False) -> dict[str, Any]:
    return {
        "type": ["integer", "null"] if nullable else "integer",
        "minimum": minimum,
        "maximum": maximum,
        "default": default,
        "description": description,
    }


# Upper bounds: far above any sensible benchmark, low enough that a typo (an extra three zeros) is
# refused before a run instead of exhausting the machine (100,000 intra-op threads took 6.7 GB) or
# running for weeks. A number must also be finite: NaN passes every comparison with a bound.
MAX_BATCH = 1_048_576
MAX_EPOCHS = 10_000
MAX_STEPS_PER_EXECUTION = 1_000_000
MAX_SEED = 2**32 - 1  # numpy's seeds are 32-bit
MAX_SAMPLES = 10_000_000
MAX_THREADS = 1024
MAX_TIMEOUT_S = 7 * 24 * 3600
MAX_REPEATS = 1000


def _flag(default: bool, description: str) -> dict[str, Any]:
    return {"type": "boolean", "default": default, "description": description}


def _section(**keys: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "properties": keys}


# Every setting, one JSON Schema fragment each (type, allowed values, default, description): the checker's
# rules and messages, DEFAULTS and ``python -m suite schema`` are all read from here. The model section
# is the model kind's (``suite.worker.kinds``); "model" below holds the keys every kind shares a meaning
# for only through ``model.kind``.
SETTINGS: dict[str, dict[str, Any]] = {
    "model": _section(kind=_enum(MODELS, kinds.DEFAULT_KIND, "the kind of model; its other keys are the kind's")),
    "training": _section(
        optimizer=_enum(OPTIMIZERS, "rmsprop", "Keras optimizer"),
        learning_rate={
            "type": ["number", "null"],
            "exclusiveMinimum": 0,
            "default": None,
            "description": "null: the optimizer's Keras default",
        },
        loss=_enum(LOSSES, "categorical_crossentropy", "Keras loss"),
        batch_size=_int(1, MAX_BATCH, 128, "examples per step (see batch_mode)"),
        batch_mode=_enum(BATCH_MODES, "global", "global: split across replicas; per_replica: times the replicas"),
        epochs=_int(1, MAX_EPOCHS, 5, "passes over the training data"),
        steps_per_execution=_int(1, MAX_STEPS_PER_EXECUTION, 1, "training steps per call into the compiled function"),
        # Always explicit: Keras' "auto" differs between CPU and GPU.
        jit_compile=_flag(False, "compile the train step with XLA"),
        mixed_precision=_flag(False, "mixed_float16 on GPUs, mixed_bfloat16 on CPUs"),
        input_pipeline=_enum(INPUT_PIPELINES, "numpy", "how batches reach fit: numpy arrays or a prefetching tf.data"),
        shuffle=_flag(True, "shuffle the training data every epoch"),
        seed=_int(0, MAX_SEED, 1234, "seed of weights, shuffling and dropout"),
    ),
    "data": _section(
        dataset=_enum(DATASETS, "mnist", "the data set"),
        train_samples=_int(1, MAX_SAMPLES, None, "training examples; null: all", nullable=True),
        test_samples=_int(1, MAX_SAMPLES, None, "test examples; null: all", nullable=True),
        allow_synthetic=_flag(False, "train on random digits when the real ones are not on this machine"),
        data_dir={
            "type": ["string", "null"],
            "default": None,
            "description": "a folder path of IDX files instead of the Keras cache, or null",
        },
        shuffle_labels=_flag(False, "a control: a correct pipeline must then fail the accuracy gate"),
    ),
    "device": {"type": "string", "pattern": DEVICE_RE.pattern, "default": "cpu", "description": DEVICE_ALLOWED},
    "backend": _enum(KERAS_BACKENDS, "tensorflow", "the Keras backend"),
    "threads": _section(
        intra_op=_int(0, MAX_THREADS, 0, "threads inside one op; 0: the framework's choice"),
        inter_op=_int(0, MAX_THREADS, 0, "ops run at once; 0: the framework's choice"),
    ),
    "timeout_s": {
        "type": "number",
        "exclusiveMinimum": 0,
        "maximum": MAX_TIMEOUT_S,
        "default": 3600,
        "description": "seconds a run may take",
    },
    "image": {
        "type": ["string", "null"],
        "default": None,
        "description": "an image name from docker/images.yaml, or null for the backend's default",
    },
    # Where a pool backend (--backend ray) may place the point: only on nodes offering the custom
    # resource gpu_model:NAME. Not in the fingerprint while null (plan.fingerprint_of), so results
    # recorded before the key existed keep theirs.
    "gpu_model": {
        "type": ["string", "null"],
        "pattern": r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        "default": None,
        "description": "--backend ray: only nodes offering the resource gpu_model:NAME (e.g. H100); null: any "
        "node; the other backends run where they are told",
    },
    # After the timed fit, in the same process: a near-empty model's step time (the fixed cost).
    "measure": _section(step_overhead=_flag(True, "time the model with its arithmetic taken away after the fit")),
}


def _defaults(fragment: dict[str, Any]) -> Any:
    if "properties" in fragment:
        return {key: _defaults(frag) for key, frag in fragment["properties"].items()}
    return copy.deepcopy(fragment["default"])


def model_defaults(kind: str = kinds.DEFAULT_KIND) -> dict[str, Any]:
    """The model section a scenario starts from when it names ``kind`` (every key of that kind)."""
    return KINDS[kind].defaults()


def defaults_for(kind: str = kinds.DEFAULT_KIND) -> dict[str, Any]:
    """The settings every scenario with a model of ``kind`` starts from; a file states only what differs."""
    out = {key: _defaults(frag) for key, frag in SETTINGS.items()}
    out["model"] = model_defaults(kind)
    return out


# The defaults of a scenario that names no model kind (an MLP). Its key sets are the closed sets of
# allowed keys, but for the model section, whose keys are its kind's.
DEFAULTS: dict[str, Any] = defaults_for()
TOP_KEYS = (
    "name",
    "question",
    "description",
    "repeats",
    "precision",
    "max_repeats",
    "matrix",
    "variants",
    "smoke",
    "report",
)
AUTO = "auto"  # repeats: auto, the two-stage rule of report/stats (docs/scenarios.md)
AUTO_FIRST = 4  # runs every point takes before its spread sets its count
AUTO_PRECISION = 0.03  # target half-width of a comparison's interval on the log scale: about +-3%
AUTO_MAX_REPEATS = 10


def auto_settings(precision: Any = None, max_repeats: Any = None) -> dict[str, Any]:
    """The two-stage rule's settings, the defaults of report/stats where not given."""
    return {
        "first": AUTO_FIRST,
        "precision": AUTO_PRECISION if precision is None else float(precision),
        "max_repeats": AUTO_MAX_REPEATS if max_repeats is None else int(max_repeats),
    }


def is_precision(value: Any) -> bool:
    """A ``precision`` a scenario may give: a number in [0.001, 1]."""
    return _is_num(value) and 0.001 <= value <= 1


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
    # ``repeats: auto``: {"first": runs every point takes, "precision": target half-width on the log
    # scale, "max_repeats": the cap}; ``repeats`` is then the first stage. None: a fixed count.
    auto: dict[str, Any] | None = None


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
        problem = escaped(f"{self.source}:{where} key '{key}': {message}")  # keys and values from the file
        if problem not in self.problems:  # a list item can be reached by two checks; say it once
            self.problems.append(problem)

    def closed(self, mapping: Any, allowed: tuple[str, ...] | list[str], prefix: str, what: str = "") -> bool:
        """Whether ``mapping`` is a mapping; each key outside ``allowed`` is a problem naming the closest."""
        if not isinstance(mapping, dict):
            self.fail(prefix, f"must be a mapping, got {type_name(mapping)}")
            return False
        for key in mapping:
            if key not in allowed:
                path = f"{prefix}.{key}" if prefix else str(key)
                close = difflib.get_close_matches(str(key), list(allowed), n=1, cutoff=0.6)
                hint = f"; did you mean {close[0]}?" if close else ""
                self.fail(path, f"unknown key{what}{hint}; allowed: {', '.join(allowed)}")
        return True


def type_name(value: Any) -> str:
    return "null" if value is None else type(value).__name__


def brief(value: Any, limit: int = 80) -> str:
    """``value`` as Python writes it (control characters escaped), cut to ``limit`` characters: a
    message quotes what was given without repeating a megabyte of it."""
    try:
        text = repr(value)
    except ValueError:  # an integer past Python's 4,300-digit limit for text
        return f"an integer of {value.bit_length():,} bits"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def plain_text(text: str, extra: str = "") -> bool:
    """Whether ``text`` holds no control character (those in ``extra`` aside): nothing that a
    terminal or a Markdown page would read as an instruction. Judged by the characters' Unicode
    categories (control, format, surrogate, line and paragraph separators), not by ``isprintable``,
    which also refuses a character its Python's tables do not know yet (a new emoji): a variant
    named so on Python 3.12 would make its results unreadable on 3.11."""
    return all(c in extra or unicodedata.category(c) not in _CONTROL_CATEGORIES for c in text)


_CONTROL_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zl", "Zp"})


def is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


# --------------------------------------------------------------------------- rules from the fragments

_TYPES: dict[str, Callable[[Any], bool]] = {
    "integer": is_int,
    "number": _is_num,
    "boolean": lambda v: isinstance(v, bool),
    "string": lambda v: isinstance(v, str),
    "null": lambda v: v is None,
    "array": lambda v: isinstance(v, list),
    "object": lambda v: isinstance(v, dict),
}


def fragment_for(path: str, kind: str | None = None) -> dict[str, Any] | None:
    """The schema fragment of a dotted setting path (``model.hidden.0``: an item of the list), or None.

    Model keys are the kind's; without ``kind`` the first kind that has the key answers (the kinds
    give a shared key one fragment, so the answer does not depend on which)."""
    parts = path.split(".")
    node: dict[str, Any] | None
    if parts[0] == "model" and len(parts) > 1 and parts[1] != "kind":
        order = [KINDS[kind]] if kind in KINDS else list(KINDS.values())
        node = next((k.keys[parts[1]] for k in order if parts[1] in k.keys), None)
        rest = parts[2:]
    else:
        node, rest = SETTINGS.get(parts[0]), parts[1:]
    for part in rest:
        if node is None:
            return None
        if "properties" in node:
            node = node["properties"].get(part)
        elif "items" in node and part.isdigit():
            node = node["items"]
        else:
            return None
    return node


def _types(frag: dict[str, Any]) -> list[str]:
    t = frag.get("type", [])
    return [t] if isinstance(t, str) else list(t)


def valid(frag: dict[str, Any], value: Any) -> bool:
    """Whether ``value`` meets the fragment (the JSON Schema keywords the settings use)."""
    types = _types(frag)
    if types and not any(_TYPES[t](value) for t in types):
        return False
    if "const" in frag and value != frag["const"]:
        return False
    if "enum" in frag and not any(value == o and type(value) is type(o) for o in frag["enum"]):
        return False
    if _is_num(value):
        if isinstance(value, float) and not math.isfinite(value):
            return False
        if "minimum" in frag and value < frag["minimum"] or "maximum" in frag and value > frag["maximum"]:
            return False
        if "exclusiveMinimum" in frag and value <= frag["exclusiveMinimum"]:
            return False
        if "exclusiveMaximum" in frag and value >= frag["exclusiveMaximum"]:
            return False
    if isinstance(value, str) and "pattern" in frag and not re.search(frag["pattern"], value):
        return False
    if isinstance(value, list):
        if len(value) < frag.get("minItems", 0) or len(value) > frag.get("maxItems", len(value)):
            return False
        return all(valid(frag["items"], item) for item in value) if "items" in frag else True
    return True


def allowed_text(frag: dict[str, Any]) -> str:
    """What the fragment accepts, as the checker's messages say it: 'an integer >= 1 or null'."""
    if "const" in frag:
        return repr(frag["const"])
    if "enum" in frag:
        return ", ".join(map(str, frag["enum"]))
    types = _types(frag)
    null = " or null" if "null" in types else ""
    main = next((t for t in types if t != "null"), "")
    if main == "boolean":
        return "true or false"
    if main in ("integer", "number"):
        noun = "an integer" if main == "integer" else "a finite number"
        lo, hi = frag.get("minimum"), frag.get("maximum")
        xlo, xhi = frag.get("exclusiveMinimum"), frag.get("exclusiveMaximum")
        if (lo is not None or xlo is not None) and (hi is not None or xhi is not None):
            left = f"[{lo}" if lo is not None else f"({xlo}"
            right = f"{hi}]" if hi is not None else f"{xhi})"
            return f"{noun} in {left}, {right}{null}"
        bound = f" >= {lo}" if lo is not None else f" > {xlo}" if xlo is not None else ""
        return f"{noun}{bound}{null}"
    if main == "array":
        lo, hi = frag.get("minItems", 0), frag.get("maxItems")
        if hi is not None:
            size = f"a list of {lo} to {hi} items"
        else:
            size = "a non-empty list" if lo == 1 else f"a list of at least {lo} items" if lo else "a list"
        each = f", each {allowed_text(frag['items'])}" if "items" in frag else ""
        return f"{size}{each}{null}"
    return frag.get("description", main)


def check_value(
    ck: Checker,
    key: str,
    value: Any,
    line_key: str | None = None,
    shown: str | None = None,
    kind: str | None = None,
) -> None:
    """Check one setting by its dotted path ``key``; ``shown`` is the key as the file spells it.

    A list is checked item by item too, so a bad item is named by its own path (or, with ``shown``,
    by the list's). ``kind``: the model kind whose keys apply (default: whichever kind has the key)."""
    frag = fragment_for(key, kind)
    if isinstance(value, str) and not plain_text(value):
        ck.fail(shown or key, f"got {brief(value)}; a control character is not allowed", line_key)
        return
    if frag is None or "properties" in frag or valid(frag, value):
        return
    bad_items = (
        [(i, item) for i, item in enumerate(value) if not valid(frag["items"], item)]
        if isinstance(value, list) and "items" in frag
        else []
    )
    for i, item in bad_items:
        item_key = shown or f"{key}.{i}"
        item_line = line_key if shown else (f"{line_key}.{i}" if line_key else None)
        ck.fail(item_key, _refusal(item, frag["items"]), item_line)
    if not bad_items:
        ck.fail(shown or key, _refusal(value, frag), line_key)


def _refusal(value: Any, frag: dict[str, Any]) -> str:
    """What was given, what the rule allows, and the number to write where YAML read one as text."""
    advice = text_number_advice(value, lambda v: valid(frag, v))
    return f"got {brief(value)} ({type_name(value)}); allowed: {allowed_text(frag)}{advice}"


def check_config(
    ck: Checker, config: dict[str, Any], prefix: str = "", line_of: Callable[[str], str] | None = None
) -> None:
    """Closed keys and value rules over a (possibly partial) config tree; the model's keys are its kind's."""
    line: Callable[[str], str | None] = line_of or (lambda path: None)
    if prefix == "model":
        _check_model(ck, config, line)
        return
    for key, value in config.items():
        path = f"{prefix}.{key}" if prefix else str(key)
        if path == "model":
            _check_model(ck, value, line)
            continue
        frag = fragment_for(path)
        if frag is not None and "properties" in frag:
            if ck.closed(value, tuple(frag["properties"]), path):
                check_config(ck, value, path, line_of)
            continue
        check_value(ck, path, value, line(path))


def _check_model(ck: Checker, model: Any, line: Callable[[str], str | None]) -> None:
    if not isinstance(model, dict):
        ck.fail("model", f"must be a mapping, got {type_name(model)}")
        return
    kind = model.get("kind", kinds.DEFAULT_KIND)
    check_value(ck, "model.kind", kind, line("model.kind"))
    if kind not in KINDS:
        return  # its keys are unknown; the kind's problem is the one to fix first
    allowed = tuple(KINDS[kind].keys)
    ck.closed(model, allowed, "model", f" for model kind {kind!r}")
    for key, value in model.items():
        if key in allowed and key != "kind":
            check_value(ck, f"model.{key}", value, line(f"model.{key}"), kind=kind)


def resolve(own: dict[str, Any]) -> dict[str, Any]:
    """The settings of a file: the defaults for its model kind, with its own sections merged in.

    ``own`` holds the file's setting sections, already checked; keys outside the closed sets are left
    out (they were reported)."""
    model = own.get("model")
    kind = model.get("kind", kinds.DEFAULT_KIND) if isinstance(model, dict) else kinds.DEFAULT_KIND
    config = defaults_for(kind if kind in KINDS else kinds.DEFAULT_KIND)
    for key, value in own.items():
        if key not in config:
            continue
        if isinstance(config[key], dict) and isinstance(value, dict):
            config[key].update({k: copy.deepcopy(v) for k, v in value.items() if k in config[key]})
        elif not isinstance(config[key], dict):
            config[key] = copy.deepcopy(value)
    return config


def cross_checks(ck: Checker, config: dict[str, Any], key: str) -> None:
    """Rules between fields, checked on every resolved point."""
    m = DEVICE_RE.match(str(config["device"]))
    if m and m.group(3) and int(m.group(3)) > 1 and config["backend"] != "tensorflow":
        ck.fail(key, f"device {config['device']!r} runs with MirroredStrategy, which needs backend tensorflow")
    if config["training"]["input_pipeline"] == "tf_data" and config["backend"] == "torch":
        ck.fail(key, "input_pipeline tf_data is not supported with backend torch; use numpy")
