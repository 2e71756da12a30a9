"""Plan: a scenario's matrix expanded into fully resolved, fingerprinted runs.

A RunSpec is everything the worker needs and nothing the host keeps to itself: it is written
verbatim as ``spec.json``. Its fingerprint hashes the settings that change what is measured, so a
result can be matched to the run that produced it and a rerun can skip what is already done.
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from suite.environment import datasets
from suite.spec.setting_paths import apply_overrides
from suite.spec.settings import AUTO, Scenario, auto_settings
from suite.worker.devices import parse_device  # one definition, shared with the worker

__all__ = [
    "RunSpec",
    "axis_name",
    "coordinates",
    "expand",
    "fingerprint_of",
    "interleave",
    "override_flag",
    "parse_device",
    "with_data",
]


@dataclass(frozen=True)
class RunSpec:
    """One repetition of one matrix point, fully resolved."""

    scenario: str
    scenario_file: str
    question: str
    point: dict[str, Any]  # matrix coordinates, path -> value (includes "variant" when used)
    point_label: str
    repetition: int
    smoke: bool
    config: dict[str, Any]  # model, training, data (with the host's data.identity), device, backend, ...
    order: int = 0  # position in the interleaved plan
    report: dict[str, Any] = field(default_factory=dict)  # verdict kind, baseline: how to read it
    calibrate_peak: bool = False  # the host asks for a peak measurement when none is cached
    # ``--set`` on the command line, path -> value, as given: already applied to ``config`` (which
    # the fingerprint hashes), kept apart so the report can say what was changed and repeat it.
    overrides: dict[str, Any] = field(default_factory=dict)
    fingerprint: str = field(default="", compare=False)

    def to_dict(self) -> dict[str, Any]:
        return {
            "scenario": self.scenario,
            "scenario_file": self.scenario_file,
            "question": self.question,
            "point": self.point,
            "point_label": self.point_label,
            "repetition": self.repetition,
            "smoke": self.smoke,
            "config": self.config,
            "order": self.order,
            "report": self.report,
            "calibrate_peak": self.calibrate_peak,
            "overrides": self.overrides,
            "fingerprint": self.fingerprint or fingerprint_of(self),
        }

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RunSpec:
        return cls(**data)

    @property
    def device(self) -> str:
        return str(self.config["device"])

    @property
    def timeout_s(self) -> float:
        return float(self.config["timeout_s"])

    @property
    def run_id(self) -> str:
        """Stable file-name stem: fingerprint prefix and repetition."""
        return f"{self.fingerprint[:12]}-r{self.repetition}"


def fingerprint_of(spec: RunSpec) -> str:
    """SHA-256 of what changes the measurement: scenario, size (smoke or not), resolved config.

    The config includes the data's identity (source and sha256), but not its note: that says where
    the file lies or why the data is synthetic, which differs between machines with the same data.
    ``--set`` overrides count through the config they changed: one that sets a value the scenario
    already has measures the same thing, and finds the runs already done.
    """
    config = spec.config
    if "gpu_model" in config and config["gpu_model"] is None:
        # Unset, it changes nothing measured: results from before the key existed keep their fingerprints.
        config = {k: v for k, v in config.items() if k != "gpu_model"}
    identity = (config.get("data") or {}).get("identity")
    if identity is not None:
        config = {**config, "data": {**config["data"], "identity": datasets.fingerprinted(identity)}}
    payload = {"scenario": spec.scenario, "smoke": spec.smoke, "config": config}
    blob = json.dumps(payload, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()


def _label(point: dict[str, Any]) -> str:
    return ", ".join(f"{name}={value}" for name, value in coordinates(point).values()) or "default"


def coordinates(point: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """A point's coordinates as its label shows them: path -> (axis name, value text).

    ``-k`` matches against these, so a filter reads like the label it selects.
    """
    names = {path: axis_name(path) for path in point}
    shared = {name for name, n in collections.Counter(names.values()).items() if n > 1}
    # Two axes that would read alike (model.dense and a data.dense, say) go by their full paths.
    return {path: (path if names[path] in shared else names[path], _fmt(value)) for path, value in point.items()}


def axis_name(path: str) -> str:
    """A matrix path as people say it: the name its model kind gives it (model.hidden.0 -> width,
    model.filters.0 -> filters), else its last named part (training.batch_size -> batch_size), with
    the list index after it unless that is 0 (model.filters.1 -> filters.1: not the first layer's
    filters)."""
    from suite.worker.kinds import axis_name as kind_axis_name

    if (named := kind_axis_name(path)) is not None:
        return named
    parts = path.split(".")
    last = max((i for i, part in enumerate(parts) if not part.isdigit()), default=None)
    if last is None:
        return path
    index = parts[last + 1 :]
    return ".".join(parts[last:]) if index and any(part != "0" for part in index) else parts[last]


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def override_flag(path: str, value: Any) -> str:
    """``--set``'s argument for one override, which YAML reads back as the same value:
    ``training.epochs=3``, ``model.hidden=[512, 256]``, ``image=null``. A string stays plain where
    YAML reads it back as that string (``device=gpu:2``), else it is quoted (``image="null"``: the
    string, not null)."""
    import yaml  # host side only; the worker never formats flags

    if isinstance(value, str):
        try:  # a long string is quoted unread: YAML would parse what a result holds, any size
            plain = len(value) <= MAX_PLAIN and yaml.safe_load(value) == value and "\n" not in value
        except (yaml.YAMLError, RecursionError):
            plain = False
        return f"{path}={value if plain else json.dumps(value)}"
    return f"{path}={json.dumps(value, separators=(', ', ': '))}"


MAX_PLAIN = 200  # the longest string value override_flag writes unquoted

DataResolver = Callable[[dict[str, Any]], dict[str, Any]]

# Runs one plan may hold unless --max-runs says more: the four shipped scenarios are 235 runs at
# full size, and 10,000 runs of a minute each is a week of machine time. A matrix can describe a
# million points in one line; expanding them takes minutes and gigabytes before anything is said.
MAX_RUNS = 10_000


def point_count(scenario: Scenario) -> int:
    """The points ``expand`` would make (variants x the matrix's axes), counted without making them."""
    count = max(len(scenario.variants), 1)
    for values in scenario.matrix.values():
        count *= len(values)
    return count


def shape_text(scenario: Scenario) -> str:
    """How the points multiply, in words: "3 variants x 100 model.hidden.0 x 100 training.batch_size"."""
    parts = [f"{len(scenario.variants)} variants"] if scenario.variants else []
    parts += [f"{len(values)} {path}" for path, values in scenario.matrix.items()]
    return " x ".join(parts) or "1 point"


def expand(
    scenario: Scenario,
    *,
    smoke: bool = False,
    repeats: int | str | None = None,
    data: DataResolver | None = None,
    overrides: dict[str, Any] | None = None,
) -> list[RunSpec]:
    """Cartesian product of variants x matrix, smoke overrides last, one spec per repetition.

    Runs come out interleaved (repetition-major: every point once, then every point again) so
    that slow drift on the machine spreads evenly over the points instead of favouring one.
    ``data`` maps a point's ``data`` section to the identity of the data it will use (default:
    what this host has, ``datasets.identity_for``); it becomes ``config.data.identity``.
    ``overrides`` (``--set``, checked by ``scenario.override_problems`` first) change the scenario's
    own settings before the matrix, and win over its smoke size where both set a value.
    """
    # repeats: auto (the scenario's, or --repeats auto for any): its first stage; cmd_run adds the rest.
    auto = (
        (scenario.auto or auto_settings())
        if repeats == AUTO
        else scenario.auto
        if repeats is None and not smoke
        else None
    )
    reps = auto["first"] if auto else int(repeats) if repeats is not None else (1 if smoke else scenario.repeats)
    resolve = data or datasets.identity_for
    overrides = dict(overrides or {})
    recorded: dict[str, Any] = {}
    if overrides:
        changed = dataclasses.replace(
            scenario,
            config=apply_overrides(scenario.config, overrides, "--set", "set"),
            smoke={k: v for k, v in scenario.smoke.items() if not any(overlaps(k, o) for o in overrides)},
        )
        # --set values that leave every run's settings as they were (the file's or the smoke size's
        # values) change nothing: not recorded, so that these runs, which share the scenario's own
        # fingerprints, are the scenario's own (not a --set view). Any change records them all.
        if _sized(changed, smoke) != _sized(scenario, smoke):
            recorded = overrides
        scenario = changed
    points = []
    for point, config in _points(scenario):
        if smoke:
            config = apply_overrides(config, scenario.smoke, scenario.source, "smoke")
        # After the smoke overrides, which may change the data section (data_dir, sample counts).
        points.append((point, with_data(config, resolve)))
    specs: list[RunSpec] = []
    for rep in range(reps):
        for point, config in points:
            spec = RunSpec(
                scenario=scenario.name,
                scenario_file=scenario.source,
                question=scenario.question,
                point=point,
                point_label=_label(point),
                repetition=rep,
                smoke=smoke,
                config=config,
                order=len(specs),
                report={
                    "verdict": scenario.verdict,
                    "baseline": scenario.baseline,
                    "description": scenario.description,
                    **({"repeats": {AUTO: auto}} if auto else {}),
                },
                overrides=dict(recorded),
            )
            specs.append(_with_fingerprint(spec))
    return specs


def _sized(scenario: Scenario, smoke: bool) -> str:
    """The scenario's own settings at the size run, as its fingerprints read them (0 is not 0.0)."""
    config = apply_overrides(scenario.config, scenario.smoke, scenario.source, "smoke") if smoke else scenario.config
    return json.dumps(config, sort_keys=True)


def overlaps(a: str, b: str) -> bool:
    """Whether setting paths ``a`` and ``b`` touch the same value: equal, or one inside the other
    (``model.hidden`` and ``model.hidden.0``)."""
    return a == b or a.startswith(b + ".") or b.startswith(a + ".")


def with_data(config: dict[str, Any], resolve: DataResolver | None = None) -> dict[str, Any]:
    """``config`` with ``data.identity`` set to what ``resolve`` (default: this host) says it uses."""
    plain = _without_data(config)
    identity = (resolve or datasets.identity_for)(plain["data"])
    return {**plain, "data": {**plain["data"], "identity": identity}}


def _without_data(config: dict[str, Any]) -> dict[str, Any]:
    data = {k: v for k, v in config["data"].items() if k != "identity"}
    return {**config, "data": data}


def _with_fingerprint(spec: RunSpec) -> RunSpec:
    return RunSpec(**{**spec.__dict__, "fingerprint": fingerprint_of(spec)})


def _points(scenario: Scenario) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    variants = scenario.variants or [("", {})]
    axes = list(scenario.matrix.items())
    out = []
    for variant_name, variant_set in variants:
        for values in itertools.product(*(vals for _, vals in axes)):
            point: dict[str, Any] = {"variant": variant_name} if scenario.variants else {}
            overrides = dict(variant_set)
            for (path, _), value in zip(axes, values, strict=True):
                point[path] = value
                overrides[path] = value
            config = apply_overrides(scenario.config, overrides, scenario.source, "matrix")
            out.append((point, config))
    return out


def interleave(specs: list[RunSpec]) -> list[RunSpec]:
    """Order a multi-scenario plan repetition-major and number it.

    Every point of every scenario runs once before any runs twice, so drift on the machine (heat,
    other load) spreads over all points instead of landing on whichever ran last.
    """
    ordered = sorted(enumerate(specs), key=lambda item: (item[1].repetition, item[0]))
    return [RunSpec(**{**s.__dict__, "order": i}) for i, (_, s) in enumerate(ordered)]
