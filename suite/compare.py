"""Machines side by side: the same scenario points on every machine, and which recorded facts differ.

``reports/hardware.md`` covers every machine folder under the results directory;
``python -m suite compare DIR_A DIR_B`` prints the same for two result folders.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from tabulate import tabulate

from suite import stats
from suite.markdown import cell, code
from suite.results import (
    ENV_GPUS,
    ENV_HOST,
    ENV_VERSIONS,
    FIT_S,
    RUN_BACKEND,
    RUN_ENGINE_VERSION,
    RUN_IMAGE_ID,
    Field,
    RunResult,
    finished_at,
)
from suite.views import ScenarioView


def _gpus(r: RunResult, key: str) -> str:
    gpus = ENV_GPUS.of(r) or []
    return ", ".join(sorted({str(g.get(key)) for g in gpus})) or "none"


def _env(r: RunResult, field: Field, key: str) -> Any:
    return r.environment.get(field.key, {}).get(key)


FACTS: list[tuple[str, Callable[[RunResult], Any]]] = [
    ("GPU model", lambda r: _gpus(r, "name")),
    ("GPU driver", lambda r: _gpus(r, "driver")),
    ("CPU", lambda r: _env(r, ENV_HOST, "cpu_model")),
    ("CPU cores", lambda r: _env(r, ENV_HOST, "cpu_count")),
    ("backend", lambda r: RUN_BACKEND.of(r)),
    ("image ID", lambda r: RUN_IMAGE_ID.of(r) or "none (local)"),
    ("Docker engine", lambda r: RUN_ENGINE_VERSION.of(r) or "-"),
    ("Python", lambda r: _env(r, ENV_HOST, "python")),
    ("TensorFlow", lambda r: _env(r, ENV_VERSIONS, "tensorflow")),
    ("Keras", lambda r: _env(r, ENV_VERSIONS, "keras")),
    ("CUDA build", lambda r: _env(r, ENV_VERSIONS, "tf_cuda_build") or "-"),
    ("cuDNN build", lambda r: _env(r, ENV_VERSIONS, "tf_cudnn_build") or "-"),
]


GPU_FACTS = ("GPU model", "GPU driver")


def machine_facts(views: list[ScenarioView]) -> dict[str, str]:
    """Facts of one machine: GPU facts from its newest run of a GPU point (a CPU run, in a container
    above all, sees no GPU), the rest from its newest run that reached the worker."""
    newest = max((v.newest for v in views), key=finished_at)
    gpu_runs = [r for v in views for r in v.gpu_runs]
    newest_gpu = max(gpu_runs, key=finished_at) if gpu_runs else None
    facts = {}
    for name, get in FACTS:
        source = newest_gpu if name in GPU_FACTS and newest_gpu is not None else newest
        facts[name] = str(get(source))
    return facts


def render(views: list[ScenarioView], reference: str | None = None, title: str = "Hardware comparison") -> str:
    names = sorted({v.machine for v in views})
    if not names:
        return f"# {title}\n\nNo results.\n"
    ref = reference if reference in names else names[0]
    machines = [ref, *[m for m in names if m != ref]]
    lines = [
        f"# {title}",
        "",
        f"Machines: {', '.join(code(m) for m in machines)}. Reference: {code(ref)}. Each cell is the "
        "geometric mean of the total `fit` times in seconds (the mean the ratio divides); beside it, the "
        f"reference's time over this machine's (above 1: this machine is faster): the {stats.METHOD}.",
    ]
    by_scenario: dict[str, dict[str, ScenarioView]] = {}
    for v in views:
        by_scenario.setdefault(v.scenario, {})[v.machine] = v
    alone = []
    for scenario, per_machine in sorted(by_scenario.items()):
        if len(per_machine) < 2 <= len(machines):
            alone.append(f"{cell(scenario)} (only on {code(next(iter(per_machine)))})")
            continue
        lines += ["", f"## {cell(scenario)}", "", _table(per_machine, machines, ref)]
    if alone:
        lines += ["", f"Not compared, measured on one machine only: {', '.join(alone)}."]
    lines += ["", "## Recorded facts", "", *_facts(views, machines)]
    return "\n".join(lines) + "\n"


def _table(per_machine: dict[str, ScenarioView], machines: list[str], ref: str) -> str:
    labels: list[str] = []
    for m in machines:
        for p in per_machine[m].points if m in per_machine else []:
            if p.label not in labels:
                labels.append(p.label)
    rows = []
    for label in labels:
        points = {m: per_machine[m].point_by_label(label) if m in per_machine else None for m in machines}
        base = points.get(ref)
        row = [cell(label)]
        for m in machines:
            p = points[m]
            fit = p.values(FIT_S) if p else []
            if not fit:
                row.append(cell(p.status if p else "not run"))
            elif m == ref or not (base and base.values(FIT_S)):
                row.append(f"{stats.geometric_mean(fit):.2f}")
            else:
                r = stats.ratio(base.values(FIT_S), fit)
                row.append(f"{stats.geometric_mean(fit):.2f} ({r.text()})")
        rows.append(row)
    smoke = [m for m in machines if m in per_machine and per_machine[m].smoke]
    table = tabulate(rows, headers=["point", *[cell(m) for m in machines]], tablefmt="github", disable_numparse=True)
    note = (
        f"\n\nSmoke size on: {', '.join(code(m) for m in smoke)} (not comparable with full-size runs)." if smoke else ""
    )
    return table + note


def _facts(views: list[ScenarioView], machines: list[str]) -> list[str]:
    facts = {m: machine_facts([v for v in views if v.machine == m]) for m in machines}
    rows = [[name, *[cell(facts[m][name]) for m in machines]] for name, _ in FACTS]
    differ = [name for name, _ in FACTS if len({facts[m][name] for m in machines}) > 1]
    same = [name for name, _ in FACTS if name not in differ]
    return [
        tabulate(rows, headers=["fact", *[cell(m) for m in machines]], tablefmt="github", disable_numparse=True),
        "",
        f"Differ: {', '.join(differ) or 'nothing recorded'}.",
        f"Same: {', '.join(same) or 'nothing recorded'}.",
    ]
