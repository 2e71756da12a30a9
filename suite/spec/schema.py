"""A JSON Schema (draft 2020-12) of the scenario format, generated from the checker's own definitions.

Editors validate and complete scenario files with it (``python -m suite schema``). Every setting's
fragment is the one ``suite.spec.settings`` checks values with, and the model section's keys are its
kind's (``suite.worker.kinds``), so the schema cannot drift from the checker. What it cannot say, the
checker still does: rules between fields (a multi-GPU device needs backend tensorflow), that a
matrix path's list index exists, that a baseline names a matrix axis, that variant names differ.
"""

from __future__ import annotations

import copy
import re
from typing import Any

from suite.spec.settings import (
    AUTO,
    AUTO_FIRST,
    AUTO_MAX_REPEATS,
    AUTO_PRECISION,
    MAX_REPEATS,
    SETTINGS,
    VERDICTS,
)
from suite.worker.kinds import DEFAULT_KIND, KINDS, ModelKind

DRAFT = "https://json-schema.org/draft/2020-12/schema"
NAME_PATTERN = r"^[A-Za-z0-9_.-]+$"


def _closed(fragment: dict[str, Any]) -> dict[str, Any]:
    """A section fragment with its key set closed, as the checker holds it, all the way down."""
    out = copy.deepcopy(fragment)
    if "properties" in out:
        out["properties"] = {k: _closed(v) for k, v in out["properties"].items()}
        out["additionalProperties"] = False
    return out


def _model(kind: ModelKind) -> dict[str, Any]:
    return {
        "type": "object",
        "description": f"model kind {kind.name}: {kind.description}",
        "properties": copy.deepcopy(kind.keys),
        "additionalProperties": False,
    }


def _leaves(kind: ModelKind) -> dict[str, dict[str, Any]]:
    """Regex of every setting path a matrix, variant or smoke override may name -> its value's fragment."""
    tree = {**SETTINGS, "model": {"properties": kind.keys}}
    out: dict[str, dict[str, Any]] = {}

    def walk(path: str, frag: dict[str, Any]) -> None:
        if "properties" in frag:
            for key, child in frag["properties"].items():
                walk(f"{path}.{key}" if path else key, child)
            return
        out[f"^{re.escape(path)}$"] = copy.deepcopy(frag)
        if "items" in frag:
            out[f"^{re.escape(path)}\\.[0-9]+$"] = copy.deepcopy(frag["items"])

    walk("", {"properties": tree})
    return out


def _overrides(kind: ModelKind) -> dict[str, Any]:
    return {
        "type": ["object", "null"],
        "description": "setting path -> value, e.g. data.train_samples: 2048",
        "patternProperties": _leaves(kind),
        "additionalProperties": False,
    }


def _for_kind(kind: ModelKind) -> dict[str, Any]:
    """What a file whose model is of ``kind`` must hold: the kind's model keys, and paths into them."""
    leaves = _leaves(kind)
    matrix = {
        "type": ["object", "null"],
        "description": "setting path -> the values to sweep; the runs are their cartesian product",
        "patternProperties": {
            pattern: {"type": "array", "minItems": 1, "uniqueItems": True, "items": frag}
            for pattern, frag in leaves.items()
        },
        "additionalProperties": False,
    }
    variant = {
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "set": _overrides(kind),
        },
        "required": ["name"],
        "additionalProperties": False,
    }
    return {
        "properties": {
            "model": _model(kind),
            "matrix": matrix,
            "variants": {"type": ["array", "null"], "items": variant},
            "smoke": _overrides(kind),
        }
    }


def _when(kind: str) -> dict[str, Any]:
    """The condition 'the file's model is of this kind' (the default kind also when it names none)."""
    names_it: dict[str, Any] = {"properties": {"model": {"properties": {"kind": {"const": kind}}}}}
    if kind == DEFAULT_KIND:
        return names_it
    names_it["properties"]["model"]["required"] = ["kind"]
    return {**names_it, "required": ["model"]}


def scenario_schema() -> dict[str, Any]:
    """The JSON Schema of one scenario file."""
    settings = {key: _closed(frag) for key, frag in SETTINGS.items() if key != "model"}
    return {
        "$schema": DRAFT,
        "title": "Scenario of the Keras training-speed benchmark suite",
        "description": "One question, a model, its training settings, and the matrix of runs that answers it.",
        "type": "object",
        "required": ["name", "question"],
        "properties": {
            "name": {"type": "string", "pattern": NAME_PATTERN, "description": "names the result and report files"},
            "question": {"type": "string", "pattern": r"\S", "description": "the question the report answers"},
            "description": {"type": ["string", "null"]},
            "repeats": {
                "oneOf": [{"type": "integer", "minimum": 1, "maximum": MAX_REPEATS}, {"const": AUTO}],
                "default": 5,
                "description": f"repetitions per point, or {AUTO}: {AUTO_FIRST}, then as many as the first "
                "runs' spread asks for the precision",
            },
            "precision": {
                "type": ["number", "null"],
                "minimum": 0.001,
                "maximum": 1,
                "default": AUTO_PRECISION,
                "description": f"repeats: {AUTO}: target half-width of a ratio's interval on the log scale",
            },
            "max_repeats": {
                "type": ["integer", "null"],
                "minimum": AUTO_FIRST,
                "maximum": MAX_REPEATS,
                "default": AUTO_MAX_REPEATS,
                "description": f"repeats: {AUTO}: the most runs a point takes",
            },
            "model": {
                "type": "object",
                "properties": {"kind": {"enum": list(KINDS), "default": DEFAULT_KIND}},
            },
            **settings,
            "matrix": {"type": ["object", "null"]},
            "variants": {"type": ["array", "null"]},
            "smoke": {"type": ["object", "null"]},
            "report": {
                "type": ["object", "null"],
                "properties": {
                    "baseline": {"type": ["object", "null"], "description": "matrix axis -> value to compare with"},
                    "verdict": {"enum": list(VERDICTS), "default": "none"},
                },
                "additionalProperties": False,
            },
        },
        "additionalProperties": False,
        "dependentSchemas": {
            key: {"required": ["repeats"], "properties": {"repeats": {"const": AUTO}}}
            for key in ("precision", "max_repeats")
        },
        "allOf": [{"if": _when(name), "then": _for_kind(kind)} for name, kind in KINDS.items()],
    }
