"""Scenario files: YAML -> validated, fully resolved settings, with errors a user can act on.

This module reads files: YAML with the line of every key, the file's sections (matrix, variants,
smoke, report), and errors that name the file and the line. What the settings are and which values
they allow is ``suite.settings``. YAML holds values only: models, optimizers, losses and verdicts
are chosen by name from registries.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import yaml

from suite.plan import expand
from suite.settings import (
    DEFAULTS,
    REPORT_KEYS,
    TOP_KEYS,
    VERDICTS,
    Checker,
    Scenario,
    ScenarioError,
    check_config,
    check_value,
    cross_checks,
    is_int,
    path_problem,
    type_name,
)

__all__ = ["DEFAULTS", "Checker", "Scenario", "ScenarioError", "load", "load_all"]



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


def read_yaml(path: Path) -> tuple[Any, dict[str, int]]:
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


# --------------------------------------------------------------------------- loading


def load(path: str | Path) -> Scenario:
    """Read and validate one scenario file. Raises ScenarioError listing every problem found."""
    source = str(path)
    data, lines = read_yaml(Path(path))
    ck = Checker(source, lines)
    if not isinstance(data, dict):
        raise ScenarioError([f"{source}: the file must hold a mapping of settings, got {type_name(data)}"])
    ck.closed(data, TOP_KEYS + tuple(DEFAULTS), "")
    for key in ("name", "question"):
        if not isinstance(data.get(key), str) or not data.get(key, "").strip():
            ck.fail(key, "required; a non-empty string")
    if isinstance(data.get("name"), str) and not re.match(r"^[A-Za-z0-9_.-]+$", data["name"]):
        ck.fail("name", "letters, digits, '_', '.', '-' only (it names files)")
    repeats = data.get("repeats", 5)
    if not (is_int(repeats) and repeats >= 1):
        ck.fail("repeats", f"got {repeats!r}; allowed: an integer >= 1")

    config = copy.deepcopy(DEFAULTS)
    own = {k: v for k, v in data.items() if k in DEFAULTS}
    check_config(ck, own, line_of=lambda p: p)
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


def _load_overrides(ck: Checker, raw: Any, config: dict[str, Any], section: str) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        ck.fail(section, f"must be a mapping of setting paths to values, got {type_name(raw)}")
        return {}
    out = {}
    for path, value in raw.items():
        key = f"{section}.{path}"
        problem = path_problem(config, path)
        if problem:
            ck.fail(key, problem)
            continue
        check_value(ck, path, value, key, key)
        if isinstance(value, list) and path == "model.hidden":
            for i, item in enumerate(value):
                check_value(ck, f"{path}.{i}", item, key, key)
        out[path] = value
    return out


def _load_matrix(ck: Checker, raw: Any, config: dict[str, Any]) -> dict[str, list[Any]]:
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        ck.fail("matrix", f"must be a mapping of setting paths to lists of values, got {type_name(raw)}")
        return {}
    out: dict[str, list[Any]] = {}
    for path, values in raw.items():
        key = f"matrix.{path}"
        if not isinstance(values, list) or not values:
            ck.fail(key, f"must be a non-empty list of values, got {values!r}")
            continue
        problem = path_problem(config, path)
        if problem:
            ck.fail(key, problem)
            continue
        if len({repr(v) for v in values}) != len(values):
            ck.fail(key, "lists a value twice")
        for i, value in enumerate(values):
            check_value(ck, path, value, f"{key}.{i}", key)
        out[path] = values
    return out


def _load_variants(ck: Checker, raw: Any, config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    if raw is None or raw == []:
        return []
    if not isinstance(raw, list):
        ck.fail("variants", f"must be a list of {{name, set}} mappings, got {type_name(raw)}")
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


def _load_report(ck: Checker, raw: Any, matrix: dict[str, list[Any]], has_variants: bool) -> tuple[dict, str]:
    if raw is None:
        raw = {}
    if not ck.closed(raw, REPORT_KEYS, "report"):
        return {}, "none"
    verdict = raw.get("verdict", "none")
    if verdict not in VERDICTS:
        ck.fail("report.verdict", f"got {verdict!r}; allowed: {', '.join(VERDICTS)}")
    baseline = raw.get("baseline") or {}
    if not isinstance(baseline, dict):
        ck.fail("report.baseline", f"must be a mapping of matrix axis to value, got {type_name(baseline)}")
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
    problems: list[str] = []
    for smoke in (False, True):
        for spec in expand(scenario, smoke=smoke, repeats=1):
            ck = Checker(scenario.source, {})
            cross_checks(ck, spec.config, f"matrix point [{spec.point_label}]")
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
