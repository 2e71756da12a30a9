"""The result record's shape: the type of every field a reader of results uses, checked once when a
file is read, so that a record from another machine (edited, truncated by hand, or made to harm) is
refused with the field's name instead of failing deep inside a report with a traceback.

A shape is a type word, a mapping of keys to shapes, or a one-item list (every item has that shape).
Type words: ``str``, ``int``, ``number`` (an int or a float of magnitude at most MAX_MAGNITUDE,
never a boolean), ``positive`` (from MIN_POSITIVE: times a ratio divides by) and ``nonneg`` (>= 0:
other times, rates, counts of work), ``index`` (an integer from 0), ``hex`` (hex digits: a
fingerprint, a revision), ``share`` (a number in [0, 1]), ``bool``, ``dict``, ``list``, ``any``, or
a set of the allowed values; a trailing ``?`` also allows null (on a key of a mapping: that key's
mapping or list may be null). In a mapping, a key that starts with ``!`` is required; every other
key may be missing (older records lack newer fields); keys the shape does not name are left alone (a
newer record's optional fields), and ``*`` gives the shape of every key.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from suite.spec import names
from suite.spec.settings import DEVICE_ALLOWED, DEVICE_RE, VERDICTS, brief, plain_text

Shape = str | frozenset[str] | dict[str, Any] | list[Any]
# No figure a run records comes near this (a GPU's peak is about 1e15 FLOP/s); below it, products
# and sums of two figures stay finite, so no page or export meets an infinity of its own making.
MAX_MAGNITUDE = 1e18
MIN_POSITIVE = 1e-12

NUM = "number?"
NUMS = [NUM]
STRS = ["str?"]
# mean, p95, max, n over one window; for clock event reasons, each reason's share of the samples
STAT = {"reasons": {"*": NUM}, "*": NUM}
SECONDS = "nonneg?"
RATIO_TIME = "positive?"  # a time of real work that ratios divide by
TIMING: dict[str, Shape] = {
    "fit_s": RATIO_TIME,
    "steady_epoch_s": RATIO_TIME,
    "step_s": RATIO_TIME,
    "epoch_s": [RATIO_TIME],
    "first_epoch_overhead_s": NUM,  # the first epoch's extra can be below a steady one's time
    "worker_start_unix": NUM,
    "build_compile_s": SECONDS,
    "data_load_s": SECONDS,
    "evaluate_s": SECONDS,
    "first_step_s": SECONDS,
    "launch_to_ready_s": SECONDS,
    "overhead_share": SECONDS,
    "steady_examples_per_s": SECONDS,
    "step_floor_s": SECONDS,
    "steps_per_epoch": SECONDS,
    "step_floor_epochs_s": [SECONDS],
    "steady_includes_first_epoch": "bool?",
}

RECORD: dict[str, Shape] = {
    "!schema_version": "int",
    "!status": "str",
    "message": "str?",
    "log_tail": "str?",
    "!spec": {
        "!scenario": "name",  # names the folder of its pages and reruns
        "scenario_file": "str?",
        "question": "str?",
        "point": {"*": "any"},
        "!point_label": "label",  # printed on lines of their own by run, check and reproduce
        "!repetition": "index",
        "smoke": "bool?",
        "!config": {
            "!device": "device",  # parsed by the pages (cpu:N, gpu:N), as a scenario gives it
            "backend": "str?",
            "image": "str?",
            "gpu_model": "str?",
            "timeout_s": NUM,
            "model": {"kind": "str?", "hidden": ["int"], "filters": ["int"], "dense": "int?", "dropout": NUM},
            "training": {
                "batch_size": "int?",
                "batch_mode": "str?",
                "epochs": "int?",
                "steps_per_execution": "int?",
                "learning_rate": NUM,
                "optimizer": "str?",
                "jit_compile": "bool?",
                "mixed_precision": "bool?",
                "input_pipeline": "str?",
            },
            "data": {
                "train_samples": "int?",
                "test_samples": "int?",
                "identity": {"source": "str?", "note": "str?", "sha256": "str?", "*": "any"},
                "*": "any",
            },
            "threads": {"*": "int?"},
            "measure": {"*": "bool?"},
        },
        "order": "index",
        "report": {
            "verdict": frozenset(VERDICTS),
            "baseline": {"device": "device", "*": "any"},  # scaling divides by its count
            "description": "str?",
            "repeats": {"auto": {"!first": "index", "!precision": "positive", "!max_repeats": "index"}},
        },
        "calibrate_peak": "bool?",
        "overrides": {"*": "any"},
        "!fingerprint": "hex",  # names the result's file: hex digits only
    },
    "run": {
        "backend": "str?",
        "machine": "name?",  # names the folder of its pages and reruns
        "started_at": "str?",
        "finished_at": "str?",
        "image": "str?",
        "image_id": "str?",
        "image_labels": {"*": "str?"},
        "image_tags": STRS,
        "repo_digests": STRS,
        "engine_version": "str?",
        "daemon": "str?",
        "exit_code": "int?",
        "oom_killed": "bool?",
        "gpu_ids": ["any"],
        "gpu_uuids": STRS,
        "container_s": {"*": NUM},
        "settings": {"*": "any", "global_batch": "int?", "replicas": "int?", "per_replica_batch": NUM},
        "ray": {"attempt": "int?", "*": "any"},
        "*": "any",
    },
    "timing": TIMING,
    "quality": {
        "test_accuracy": "share?",
        "test_loss": NUM,
        "final_loss": NUM,
        "train_loss": NUMS,
        "train_samples": "int?",
        "test_samples": "int?",
        "data_source": "str",
        "data_detail": "str?",
        "synthetic": "bool?",
    },
    "work": {
        "flops_per_example_train": "nonneg?",
        "flops_per_example_forward": "nonneg?",
        "achieved_flops_per_s": "nonneg?",
        "parameters": "int?",
        "flops_counted": "str?",
        "peak": {"flops_per_s": "positive?", "source": "str?", "batches_flops_per_s": NUMS, "*": "any"},
        "peak_schema1": "any",
    },
    "environment": {
        "host": {"*": "any", "cpu_count": "int?", "cpu_model": "str?", "hostname": "str?", "env": {"*": "str?"}},
        "versions": {"*": "any"},
        "devices": {"*": "any", "logical": STRS, "gpus": ["any"]},
        "devices_used": ["str"],
        "gpus_driver": [{"*": "any"}],
        "gpu_identity": "any",
    },
    "telemetry": {
        "interval_s": NUM,
        "metrics": [
            {
                "!name": "str",
                "unit": "str?",
                "source": "str?",
                "device": "any",
                "summary": {"*": STAT},
                "series": {"t": NUMS, "v": NUMS},
            }
        ],
        "sources": [{"name": "str?", "method": "str?", "rate_hz": NUM, "samples": "int?", "error": "str?"}],
        "windows": {"*": NUMS},
        "load": {
            "cores": "int?",
            "other_cores": NUM,
            "steal_share": NUM,
            "machine_busy_cores": NUM,
            "window_s": NUM,
            "scans": "int?",
            "method": "str?",
            "own": "str?",
            "loadavg_start": ["nonneg"],
            "loadavg_end": ["nonneg"],
            "fit": {"other_cores": NUM, "steal_share": NUM, "covered_s": NUM},
            "top_others": [{"!name": "str", "!cores": "nonneg", "pid": "int?"}],
            "gpu_others": {"*": [{"pid": "int?", "name": "str?", "used_memory_bytes": NUM, "*": "any"}]},
        },
    },
    "provenance": {
        "suite": {
            "version": "str?",
            "git_revision": "hex?",  # shown in a git checkout command
            "git_dirty": "bool?",
            "dirty_paths": ["str"],
            "diff_sha256": "str?",
            "code_tree": "str?",
            "suite_identity": "str?",
        },
        "environment": {
            "kind": "str?",
            "lock_file": "str?",
            "lock_sha256": "str?",
            "matches_lock": "bool?",
            "lock_differences": ["str"],
        },
        "image?": {"*": "str?"},
        "suite_changed_during_run": {"*": "any", "dirty_paths": ["str"]},
    },
}

# How deep a record may nest, wherever its shape leaves a value open (a matrix coordinate, a --set
# value, a backend's own facts, a key the shape does not name). The suite writes fewer than 10
# levels; a record may come from anyone, and every function that walks a value by recursion (JSON
# writing, dataclasses.asdict, a copy) stops near Python's limit of 1,000 frames, so a record of
# hundreds of levels would fail the command that reads it, or lose the measurement of one that
# reruns it, long after the file was taken.
MAX_DEPTH = 32

_WORDS = {
    "str": "text",
    "int": "an integer",
    "number": "a number of magnitude at most 1e18",
    "positive": "a number from 1e-12 to 1e18",
    "index": "an integer from 0 to 1e9",
    "hex": "7 to 64 hexadecimal digits (0-9, a-f)",
    "name": names.ALLOWED,
    "device": DEVICE_ALLOWED,
    "nonneg": "a number >= 0 and at most 1e18",
    "share": "a number in [0, 1]",
    "bool": "true or false",
    "dict": "a mapping",
    "list": "a list",
    "label": "text with line breaks and tabs but no other control or format character (as a scenario's variant names)",
}


def valid(data: Any) -> bool:
    """Whether ``problem(data)`` is None, without building a path or a message for every field:
    the shape compiled once into nested checks (a report reads thousands of records; the words of
    a refusal come from ``problem``, which says the same yes or no)."""
    return _RECORD_CHECK(data) and _too_deep(data) is None


def _too_deep(data: Any) -> str | None:
    """The path of the first value nested more than MAX_DEPTH levels deep; None where none is.
    Walked with a stack of its own (the record may nest deeper than Python's recursion allows); a
    list of numbers (a telemetry series) is passed over by the types it holds, in C."""
    stack: list[tuple[Any, int, str]] = [(data, 1, "")]
    while stack:
        item, depth, path = stack.pop()
        if depth > MAX_DEPTH:
            return path
        if isinstance(item, dict):
            stack += [(v, depth + 1, f"{path}.{k}" if path else str(k)) for k, v in item.items() if type(v) in _NESTS]
        elif _NESTS & set(map(type, item)):
            stack += [(v, depth + 1, f"{path}.{i}") for i, v in enumerate(item) if type(v) in _NESTS]
    return None


_NESTS = {dict, list}


Check = Callable[[Any], bool]


def _compiled(shape: Shape) -> Check:
    if isinstance(shape, frozenset):
        return lambda data: isinstance(data, str) and data in shape
    if isinstance(shape, str):
        return _word_check(shape)
    if isinstance(shape, list):
        item = _compiled(shape[0])
        if isinstance(shape[0], str) and shape[0].rstrip("?") in _NUMBER_WORDS:
            return _numbers_check(shape[0], item)
        return lambda data: isinstance(data, list) and all(map(item, data))
    fields = []
    for key, sub in shape.items():
        name = key.lstrip("!").rstrip("?")
        if name != "*":
            fields.append((name, key.startswith("!"), key.endswith("?"), _compiled(sub)))
    every = _compiled(shape["*"]) if shape.get("*") is not None else None
    # A key of the data that the shape names in any spelling (as problem's ``{name, !name, name?}``).
    named = {*shape, *(k[1:] for k in shape if k.startswith("!")), *(k[:-1] for k in shape if k.endswith("?"))}

    def check(data: Any) -> bool:
        if not isinstance(data, dict):
            return False
        for name, required, nullable, sub_check in fields:
            if name not in data:
                if required:
                    return False
                continue
            value = data[name]
            if nullable and value is None:
                continue
            if not sub_check(value):
                return False
        if every is not None and every is not _anything:
            return all(every(value) for name, value in data.items() if name not in named)
        return True

    return check


_NUMBER_WORDS = ("number", "positive", "nonneg", "share")


def _bounds(base: str) -> tuple[float, float]:
    low = MIN_POSITIVE if base == "positive" else 0 if base in ("nonneg", "share") else -MAX_MAGNITUDE
    return low, 1 if base == "share" else MAX_MAGNITUDE


def _numbers_check(word: str, item: Check) -> Check:
    """A list of numbers (a telemetry series: hundreds per metric), checked as ``item`` checks each,
    with loops that run in C: the types seen, the least and the greatest, any NaN. A list with
    another type in it (a bool, a text, a subclass) is checked item by item."""
    low, high = _bounds(word.rstrip("?"))
    allowed = {int, float, type(None)} if word.endswith("?") else {int, float}

    def check(data: Any) -> bool:
        if not isinstance(data, list):
            return False
        kinds = set(map(type, data))
        if not kinds <= allowed:
            return all(map(item, data))
        nums = [v for v in data if v is not None] if type(None) in kinds else data
        # Bounds first: past them, no integer is too large for isnan.
        return not nums or (low <= min(nums) and max(nums) <= high and not any(map(math.isnan, nums)))

    return check


def _word_check(word: str) -> Check:
    nullable = word.endswith("?")
    base = word[:-1] if nullable else word
    if base.endswith("?"):
        inner = _word_check(base)
        return lambda value: value is None or inner(value)
    if base in _NUMBER_WORDS:
        low, high = _bounds(base)
        # A NaN fails both comparisons, an infinity the bound; a bool is an int to isinstance.
        if nullable:
            return lambda v: v is None or (not isinstance(v, bool) and isinstance(v, (int, float)) and low <= v <= high)
        return lambda v: not isinstance(v, bool) and isinstance(v, (int, float)) and low <= v <= high
    if base == "any":
        return _anything
    if base in ("str", "dict", "list", "bool"):
        kind = {"str": str, "dict": dict, "list": list, "bool": bool}[base]
        return (lambda v: v is None or isinstance(v, kind)) if nullable else (lambda v: isinstance(v, kind))
    if base == "int":
        if nullable:
            return lambda v: v is None or (isinstance(v, int) and not isinstance(v, bool))
        return lambda v: isinstance(v, int) and not isinstance(v, bool)
    return (lambda v: v is None or _is(v, base)) if nullable else (lambda v: _is(v, base))


def _anything(value: Any) -> bool:
    return True


def problem(data: Any) -> str | None:
    """The first field of the record ``data`` that does not have its shape, in words ("field
    timing.fit_s: got 'x' (str); allowed: a finite number or null"), or that nests too deep; None
    when every field does."""
    if (found := _problem(data)) is not None:
        return found
    if (deep := _too_deep(data)) is not None:
        parts = deep.split(".")  # as deep as the value: its first steps name it
        where = ".".join(parts[:4]) + ("..." if len(parts) > 4 else "")
        return f"field {where}: nested more than {MAX_DEPTH} levels deep (a result nests fewer than 10)"
    return None


def _problem(data: Any, shape: Shape = RECORD, path: str = "") -> str | None:
    """The first field of ``data`` that does not have its shape, in words ("field timing.fit_s:
    got 'x' (str); allowed: a finite number or null"); None when every field does. It descends
    only as deep as the shape names, whatever the record's own depth."""
    if isinstance(shape, frozenset):
        return (
            None if isinstance(data, str) and data in shape else _said(path, data, "one of " + ", ".join(sorted(shape)))
        )
    if isinstance(shape, str):
        return None if _is(data, shape) else _said(path, data, _allowed(shape))
    if isinstance(shape, list):
        if not isinstance(data, list):
            return _said(path, data, "a list")
        for i, item in enumerate(data):
            if (found := _problem(item, shape[0], f"{path}.{i}")) is not None:
                return found
        return None
    if not isinstance(data, dict):
        return _said(path, data, "a mapping")
    for key, sub in shape.items():
        name = key.lstrip("!").rstrip("?")
        if name == "*":
            continue
        if name not in data:
            if key.startswith("!"):
                return f"field {path + '.' if path else ''}{name}: missing; every result has it"
            continue
        if key.endswith("?") and data[name] is None:
            continue
        if (found := _problem(data[name], sub, f"{path}.{name}" if path else name)) is not None:
            return found
    if (every := shape.get("*")) is not None:
        for name, value in data.items():
            if not {name, f"!{name}", f"{name}?"} & set(shape):
                if (found := _problem(value, every, f"{path}.{name}" if path else str(name))) is not None:
                    return found
    return None


def _is(value: Any, word: str) -> bool:
    if word.endswith("?"):
        return value is None or _is(value, word[:-1])
    if word == "any":
        return True
    if word == "name":
        return names.is_safe(value)
    if word == "label":
        return isinstance(value, str) and plain_text(value, "\n\t")
    if word == "device":
        return isinstance(value, str) and DEVICE_RE.fullmatch(value) is not None
    if word == "hex":
        return isinstance(value, str) and 7 <= len(value) <= 64 and all(c in "0123456789abcdef" for c in value)
    if word == "index":
        return isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= 10**9
    if word in ("number", "positive", "nonneg", "share"):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if isinstance(value, float) and not math.isfinite(value) or abs(value) > MAX_MAGNITUDE:
            return False
        # A positive figure divides others: one below 1e-12 (a denormal) would make their ratio infinite.
        low_ok = value >= MIN_POSITIVE if word == "positive" else value >= 0 if word in ("nonneg", "share") else True
        return low_ok and (value <= 1 if word == "share" else True)
    return isinstance(value, {"str": str, "int": int, "bool": bool, "dict": dict, "list": list}[word]) and not (
        word == "int" and isinstance(value, bool)
    )


def _allowed(word: str) -> str:
    base = word.rstrip("?")
    text = _WORDS.get(base, base)
    return f"{text} or null" if word.endswith("?") else text


def _said(path: str, value: Any, allowed: str) -> str:
    kind = "null" if value is None else type(value).__name__
    return f"field {path or '(the record)'}: got {brief(value)} ({kind}); allowed: {allowed}"


_RECORD_CHECK = _compiled(RECORD)
