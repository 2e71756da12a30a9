"""Scenario files: YAML -> validated, fully resolved settings, with errors a user can act on.

This module reads a file's sections (matrix, variants, smoke, report), from YAML read with the line
of every key (``suite.spec.yaml_file``), into errors that name the file and the line. What the
settings are and which values they allow is ``suite.spec.settings``. YAML holds values only:
models, optimizers, losses and verdicts are chosen by name from registries.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from suite.spec import names
from suite.spec.plan import MAX_RUNS, DataResolver, expand, overlaps, point_count, shape_text
from suite.spec.setting_paths import apply_overrides, path_problem
from suite.spec.settings import (
    AUTO,
    AUTO_FIRST,
    DEFAULTS,
    MAX_REPEATS,
    REPORT_KEYS,
    TOP_KEYS,
    VERDICTS,
    Checker,
    Scenario,
    ScenarioError,
    auto_settings,
    brief,
    check_config,
    check_value,
    cross_checks,
    is_int,
    is_precision,
    plain_text,
    resolve,
    type_name,
)
from suite.spec.yaml_file import read_yaml, safe_yaml
from suite.spec.yaml_numbers import text_number_advice

__all__ = [
    "DEFAULTS",
    "Checker",
    "Override",
    "Scenario",
    "ScenarioError",
    "load",
    "load_all",
    "override_problems",
    "overrides_problems",
    "parse_overrides",
]


# --------------------------------------------------------------------------- loading


def _load_auto(ck: Checker, data: dict[str, Any]) -> dict[str, Any] | None:
    precision, cap = data.get("precision"), data.get("max_repeats")
    problems = len(ck.problems)
    if precision is not None and not is_precision(precision):
        ck.fail(
            "precision",
            f"got {brief(precision)}; allowed: a number in [0.001, 1], the target half-width of a ratio's "
            f"interval on the log scale (0.03: about +-3%){text_number_advice(precision, is_precision)}",
        )
    if cap is not None and not (is_int(cap) and AUTO_FIRST <= cap <= MAX_REPEATS):
        ck.fail("max_repeats", f"got {brief(cap)}; allowed: an integer in [{AUTO_FIRST}, {MAX_REPEATS}]")
    return auto_settings(precision, cap) if len(ck.problems) == problems else None


def load(
    path: str | Path,
    max_runs: int = MAX_RUNS,
    repeats: int | None = None,
    resolve_data: DataResolver | None = None,
    text: str | None = None,
) -> Scenario:
    """Read and validate one scenario file. Raises ScenarioError listing every problem found.

    ``max_runs``: a plan of more runs than that (its points times ``repeats``, default the file's
    own count, or its ``max_repeats`` under ``repeats: auto``) is refused before any point is made.
    ``resolve_data``: where each point's data is looked for while its points are checked
    (``plan.expand``'s ``data``; default: on this machine, where data that cannot be read is refused).
    ``text``: the file's content as the caller read it (a report's pages read each file once)."""
    source = str(path)
    data, lines = read_yaml(Path(path), text)
    ck = Checker(source, lines)
    if not isinstance(data, dict):
        raise ScenarioError([f"{source}: the file must hold a mapping of settings, got {type_name(data)}"])
    ck.closed(data, TOP_KEYS + tuple(DEFAULTS), "")
    for key in ("name", "question"):
        if not isinstance(data.get(key), str) or not data.get(key, "").strip():
            ck.fail(key, "required; a non-empty string")
    if isinstance(data.get("name"), str) and data["name"].strip() and not names.is_safe(data["name"]):
        ck.fail("name", f"got {brief(data['name'])}; allowed: {names.ALLOWED}")
    # Text that reaches the terminal and the pages: no control characters (an escape sequence in a
    # question would rewrite the reader's terminal); a description may hold line breaks and tabs.
    for key, extra in (("question", ""), ("description", "\n\t")):
        if isinstance(data.get(key), str) and not plain_text(data[key], extra):
            ck.fail(
                key, "holds a control character; allowed: printable text" + (", line breaks and tabs" if extra else "")
            )
    own_repeats = data.get("repeats", 5)
    auto = _load_auto(ck, data) if own_repeats == AUTO else None
    if own_repeats == AUTO:
        own_repeats = AUTO_FIRST
    elif not (is_int(own_repeats) and 1 <= own_repeats <= MAX_REPEATS):
        ck.fail("repeats", f"got {brief(own_repeats)}; allowed: an integer in [1, {MAX_REPEATS}], or {AUTO}")
    for key in ("precision", "max_repeats"):
        if key in data and data.get("repeats") != AUTO:
            ck.fail(key, f"only with repeats: {AUTO}; a fixed count runs every point that many times")

    own = {k: v for k, v in data.items() if k in DEFAULTS}
    check_config(ck, own, line_of=lambda p: p)
    config = resolve(own)  # the defaults of the file's model kind, its own settings merged in

    matrix = _load_matrix(ck, data.get("matrix", {}), config)
    variants = _load_variants(ck, data.get("variants", []), config)
    for i, (_, settings) in enumerate(variants):
        _swept_by_matrix(ck, settings, matrix, f"variants.{i}.set", "its value would overrule the variant's")
    smoke = _load_overrides(ck, data.get("smoke", {}), config, "smoke")
    # (Where smoke makes two variants the same, their fingerprints tell: ``_point_problems``.)
    _swept_by_matrix(ck, smoke, matrix, "smoke", "at smoke size every point would run the smoke value")
    baseline, verdict = _load_report(ck, data.get("report", {}), matrix, bool(variants))
    if ck.problems:
        raise ScenarioError(ck.problems)

    scenario = Scenario(
        name=data["name"],
        question=data["question"].strip(),
        description=str(data.get("description") or "").strip(),
        source=source,
        config=config,
        repeats=own_repeats,
        matrix=matrix,
        variants=variants,
        smoke=smoke,
        baseline=baseline,
        verdict=verdict,
        auto=auto,
    )
    points, reps = point_count(scenario), repeats or (auto["max_repeats"] if auto else scenario.repeats)
    if points * reps > max_runs:
        ck.fail(
            "matrix",
            f"{points:,} points ({shape_text(scenario)}) x {reps} repetitions = {points * reps:,} runs; a plan holds "
            f"at most {max_runs:,} (take fewer points or repetitions, or pass a larger --max-runs)",
        )
        raise ScenarioError(ck.problems)
    # Every point resolved once (also at smoke size), so cross-field errors surface as the file loads.
    if problems := _point_problems(scenario, [], resolve_data):
        raise ScenarioError(problems)
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
            ck.fail(key, f"must be a non-empty list of values, got {brief(values)}")
            continue
        problem = path_problem(config, path)
        if problem:
            ck.fail(key, problem)
            continue
        if len({repr(_same_number(v)) for v in values}) != len(values):  # 0 and 0.0: one setting, two labels
            ck.fail(key, "lists a value twice; allowed: each value once (0 and 0.0 are one value)")
        if other := next((axis for axis in out if overlaps(axis, path)), None):
            ck.fail(key, f"sweeps a value matrix.{other} sweeps too; allowed: one axis per setting")
            continue
        for i, value in enumerate(values):
            check_value(ck, path, value, f"{key}.{i}", key)
        out[path] = values
    return out


def _same_number(value: Any) -> Any:
    """``value`` with a whole float as the int it equals, so that a matrix listing 0 and 0.0 lists one value twice."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _load_variants(ck: Checker, raw: Any, config: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    if raw is None or raw == []:
        return []
    if not isinstance(raw, list):
        ck.fail("variants", f"must be a list of {{name, set}} mappings, got {type_name(raw)}")
        return []
    out: list[tuple[str, dict[str, Any]]] = []
    names: dict[str, str] = {}  # each name as -k matches and a page shows it -> the name
    for i, item in enumerate(raw):
        key = f"variants.{i}"
        if not ck.closed(item, ("name", "set"), key):
            continue
        name = item.get("name")
        if not isinstance(name, str) or not name:
            ck.fail(f"{key}.name", "required; a non-empty string")
            continue
        if not plain_text(name, "\n\t"):  # line breaks and tabs are folded into spaces where it is shown
            ck.fail(f"{key}.name", f"got {brief(name)}; allowed: printable text (it is shown in labels and pages)")
            continue
        # -k matches names whatever their case, and a page shows a line break or tab as a space:
        # 'A' and 'a', or 'a b' and 'a\nb', would be two points that neither can tell apart.
        folded = name.replace("\n", " ").replace("\t", " ").lower()  # as -k compares
        if folded in names and names[folded] == name:
            ck.fail(f"{key}.name", f"variant {name!r} is named twice")
        elif folded in names:
            ck.fail(
                f"{key}.name",
                f"variant {name!r} reads as variant {names[folded]!r} (-k ignores case; pages show line breaks "
                "and tabs as spaces); allowed: a name that differs from the others in more than that",
            )
        names.setdefault(folded, name)
        settings = _load_overrides(ck, item.get("set") or {}, config, f"{key}.set")
        same = next((other for other, theirs in out if theirs == settings), None)
        if same is not None:  # one fingerprint: the second would only find the first's runs done
            ck.fail(f"{key}.set", f"the same settings as variant {same!r}; allowed: settings of its own")
        out.append((name, settings))
    return out


def _swept_by_matrix(
    ck: Checker, settings: dict[str, Any], matrix: dict[str, list[Any]], section: str, why: str
) -> None:
    """Refuse the settings of ``section`` (a variant's, the smoke size's) that the matrix sweeps. A
    variant's would be overruled by the matrix's value, its runs measuring the other variants'
    settings under its name; smoke's, applied last, would make the matrix's points one at smoke size."""
    for path in settings:
        if axis := next((a for a in matrix if overlaps(a, path)), None):
            ck.fail(
                f"{section}.{path}", f"the matrix sweeps {axis}; {why}; allowed: settings the matrix does not sweep"
            )


def _load_report(ck: Checker, raw: Any, matrix: dict[str, list[Any]], has_variants: bool) -> tuple[dict, str]:
    if raw is None:
        raw = {}
    if not ck.closed(raw, REPORT_KEYS, "report"):
        return {}, "none"
    verdict = raw.get("verdict", "none")
    if verdict not in VERDICTS:
        ck.fail("report.verdict", f"got {brief(verdict)}; allowed: {', '.join(VERDICTS)}")
    baseline = raw.get("baseline") or {}
    if not isinstance(baseline, dict):
        ck.fail("report.baseline", f"must be a mapping of matrix axis to value, got {type_name(baseline)}")
        return {}, verdict
    axes: dict[str, list[Any] | None] = dict(matrix)
    if has_variants:
        axes["variant"] = None  # any variant name
    for path, value in baseline.items():
        if path not in axes:
            ck.fail(f"report.baseline.{path}", f"not a matrix axis; axes: {', '.join(axes) or 'none'}")
        elif (values := axes[path]) is not None and value not in values:
            ck.fail(f"report.baseline.{path}", f"{value!r} is not one of the axis values {values}")
    return baseline, verdict


def _point_problems(scenario: Scenario, overrides: list[Override], data: DataResolver | None = None) -> list[str]:
    source = scenario.source + "".join(f" {o.source}" for o in overrides)  # "x.yaml --set backend=torch"
    problems: list[str] = []
    for smoke in (False, True):
        seen: dict[str, str] = {}  # fingerprint -> the first point's label
        for spec in expand(scenario, smoke=smoke, repeats=1, data=data, overrides=as_dict(overrides)):
            ck = Checker(source, {})
            cross_checks(ck, spec.config, f"matrix point [{spec.point_label}]")
            problems += [p for p in ck.problems if p not in problems]
            if (first := seen.setdefault(spec.fingerprint, spec.point_label)) != spec.point_label:
                # One fingerprint: the second point's runs would be filed as the first's, under its name.
                size = " at smoke size (its smoke settings overrule what tells them apart)" if smoke else ""
                problems.append(
                    f"{source}: matrix points [{first}] and [{spec.point_label}] run the same settings{size}; "
                    "allowed: points whose settings differ"
                )
    return problems


# --------------------------------------------------------------------------- --set KEY=VALUE


@dataclass(frozen=True)
class Override:
    """One ``--set KEY=VALUE``: a setting's dotted path and its value, read as YAML."""

    text: str  # the flag's argument as given: it names the "file" in every message about it
    path: str
    value: Any

    @property
    def source(self) -> str:
        return f"--set {self.text}"


def parse_overrides(texts: list[str]) -> list[Override]:
    """Each ``KEY=VALUE``, the value read as YAML would read it in a scenario file (``3``, ``true``,
    ``null``, ``gpu:2``, ``[512, 256]``). Raises ScenarioError with every problem, each naming its flag."""
    out: list[Override] = []
    problems: list[str] = []
    for text in texts:
        path, eq, raw = text.partition("=")
        path = path.strip()
        if not eq or not path:
            problems.append(f"--set {text}: expected KEY=VALUE with KEY a setting's path, e.g. --set training.epochs=3")
            continue
        try:
            value, _ = safe_yaml(raw)  # the files' loader and bounds: a duplicate key in {a: 1, a: 2} is refused
        except yaml.YAMLError as exc:
            problems.append(f"--set {text}: the value is not YAML: {getattr(exc, 'problem', None) or exc}")
            continue
        clash = next((o for o in out if overlaps(o.path, path)), None)
        if clash is not None:
            problems.append(f"--set {text}: key '{path}': also set by {clash.source}; give each setting once")
            continue
        out.append(Override(text, path, value))
    if problems:
        raise ScenarioError(problems)
    return out


def as_dict(overrides: list[Override]) -> dict[str, Any]:
    return {o.path: o.value for o in overrides}


def override_problems(scenario: Scenario, overrides: list[Override]) -> list[str]:
    """Why ``overrides`` cannot apply to ``scenario``: each checked like a line of its file (the key
    must name one setting, the value pass that setting's rules), with the flag named as the file;
    a setting the scenario's matrix or variants vary cannot be set for all its points."""
    problems: list[str] = []
    config = scenario.config
    for o in overrides:
        ck = Checker(o.source, {})
        if o.path == "repeats":
            ck.fail(o.path, "not a setting; --repeats N sets the repetitions per point")
        elif (problem := path_problem(config, o.path)) is not None:
            ck.fail(o.path, problem)
        elif (sweep := _varied(scenario, o.path)) is not None:
            ck.fail(o.path, sweep)
        else:
            try:
                config = apply_overrides(config, {o.path: o.value}, o.source, "set")
            except ScenarioError as exc:
                ck.problems += exc.problems
        problems += ck.problems
    if problems:
        return problems
    return _point_problems(scenario, overrides)


def _varied(scenario: Scenario, path: str) -> str | None:
    """Where ``scenario`` varies the setting at ``path`` (its matrix or variants), in words; None if it does not."""
    advice = "leave that scenario out (name the files to run, or -k) or drop this --set"
    for axis, values in scenario.matrix.items():
        if overlaps(axis, path):
            shown = ", ".join(str(v) for v in values)
            return f"{scenario.source} sweeps {axis} in its matrix ({shown}); {advice}"
    names = [name for name, sets in scenario.variants if any(overlaps(k, path) for k in sets)]
    if names:
        return f"{scenario.source} sets it in its variants {', '.join(map(repr, names))}; {advice}"
    return None


def overrides_problems(scenarios: list[Scenario], overrides: list[Override]) -> list[str]:
    """``override_problems`` over several scenarios: a problem all of them share is said once, one
    only some have names their files."""
    found: dict[str, list[str]] = {}
    for sc in scenarios:
        for problem in override_problems(sc, overrides):
            found.setdefault(problem, []).append(sc.source)
    out = []
    for problem, files in found.items():
        if len(files) < len(scenarios) and not any(f in problem for f in files):
            problem += f" (in {', '.join(files)})"
        out.append(problem)
    return out


def load_all(paths: list[str | Path], max_runs: int = MAX_RUNS, repeats: int | None = None) -> list[Scenario]:
    """Load several files (``load``'s ``max_runs`` and ``repeats`` for each); also refuses two
    scenarios with the same name."""
    scenarios: list[Scenario] = []
    problems: list[str] = []
    seen: dict[str, str] = {}
    for path in paths:
        try:
            sc = load(path, max_runs, repeats)
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
