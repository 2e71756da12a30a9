"""Machines side by side: the same scenario points on every machine, and which recorded facts differ.

``reports/hardware.md`` covers every machine folder under the results directory;
``python -m suite compare DIR_A DIR_B`` prints the same for two result folders.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import orjson
from tabulate import tabulate

from suite.record import provenance
from suite.record.results import (
    ENV_GPUS,
    ENV_HOST,
    ENV_VERSIONS,
    FIT_S,
    RUN_BACKEND,
    RUN_ENGINE_VERSION,
    RUN_IMAGE_ID,
    STATUS_SKIPPED,
    Field,
    RunResult,
    finished_at,
)
from suite.report import provenance_text, stats, verdicts
from suite.report.points import ScenarioView, fit_ratio
from suite.safe.markdown import cell, code


def _gpus(r: RunResult, key: str) -> str:
    gpus = ENV_GPUS.of(r) or []
    if not gpus:
        return "none"
    # nvidia-smi's "[N/A]" is recorded as null: a fact not recorded, never the word None.
    return ", ".join(sorted({str(g[key]) for g in gpus if g.get(key) is not None})) or NOT_RECORDED


def _env(r: RunResult, field: Field, key: str) -> Any:
    return r.environment.get(field.key, {}).get(key)


FACTS: list[tuple[str, Callable[[RunResult], Any]]] = [
    ("GPU model", lambda r: _gpus(r, "name")),
    ("GPU driver", lambda r: _gpus(r, "driver")),
    ("CPU", lambda r: _env(r, ENV_HOST, "cpu_model")),
    ("CPU cores", lambda r: _env(r, ENV_HOST, "cpu_count")),
    ("backend", lambda r: RUN_BACKEND.of(r)),
    ("image ID", lambda r: _image_id(r)),
    ("Docker engine", lambda r: _engine(r)),
    ("Python", lambda r: _env(r, ENV_HOST, "python")),
    ("TensorFlow", lambda r: _env(r, ENV_VERSIONS, "tensorflow")),
    ("Keras", lambda r: _env(r, ENV_VERSIONS, "keras")),
    ("CUDA build", lambda r: _cuda_build(r, "tf_cuda_build")),
    ("cuDNN build", lambda r: _cuda_build(r, "tf_cudnn_build")),
]


def _engine(r: RunResult) -> str | None:
    """The Docker engine a run's container ran on: none for a local run (a process of its own);
    None (not recorded) for any other run without it (a pool's node may run containers)."""
    if version := RUN_ENGINE_VERSION.of(r):
        return str(version)
    return "none (local)" if RUN_BACKEND.of(r) == "local" else None


def _cuda_build(r: RunResult, key: str) -> str | None:
    """The CUDA (or cuDNN) version TensorFlow was built for; "none (CPU build)" for a TensorFlow
    built without CUDA; None (not recorded) where the run recorded neither."""
    versions = r.environment.get(ENV_VERSIONS.key, {})
    if versions.get(key):
        return str(versions[key])
    return "none (CPU build)" if versions.get("tf_built_with_cuda") is False else None


NOT_RECORDED = provenance_text.NOT_RECORDED


def _image_id(r: RunResult) -> str:
    """The image a run ran in: none for a local run; not recorded for one that got no image (a
    container's run skipped before one started)."""
    if image_id := RUN_IMAGE_ID.of(r):
        return str(image_id)
    return "none (local)" if RUN_BACKEND.of(r) == "local" else NOT_RECORDED


def _section(r: RunResult) -> dict[str, Any]:
    return provenance.of_result(r.provenance, r.run)


def _suite_revision(r: RunResult) -> str:
    return provenance_text.suite_text(_section(r).get("suite"))


def _suite_code(r: RunResult) -> str:
    """The committed code outside the outputs (``code_tree``), with the uncommitted diff's hash: two
    revisions that differ only in published pages and results ran the same code."""
    suite = _section(r).get("suite") or {}
    tree = suite.get("code_tree")
    if not tree:
        return NOT_RECORDED
    diff = suite.get("diff_sha256")
    dirty = f" + diff {provenance_text.short(diff)}" if suite.get("git_dirty") and diff else ""
    return provenance_text.short(tree) + dirty


def _environment_lock(r: RunResult) -> str:
    section = _section(r)
    environment, image = section.get("environment"), section.get("image")
    if provenance.got_no_image(environment, image):  # skipped before it got one: unknown, not another lock
        return NOT_RECORDED
    text = provenance_text.lock_text(environment, image)
    if environment and environment.get("matches_lock") is False:
        text += " (installed packages differ from it)"
    return text


def _image_recipe(r: RunResult) -> str:
    section = _section(r)
    image = section.get("image")
    if image:
        recipe = image.get("recipe_hash")
        return provenance_text.short(recipe) if recipe else NOT_RECORDED
    if RUN_BACKEND.of(r) == "local":
        return "none (local)"
    if provenance.got_no_image(section.get("environment"), image):  # skipped before it got one
        return NOT_RECORDED
    return "none" if r.provenance else NOT_RECORDED


def _data(r: RunResult) -> str:
    """The data a run trained on, as its fingerprint sees it: "synthetic", or the source with the
    sha256 of its bytes; what runs of other data were never compared on, named for the reader."""
    identity = ((r.spec.get("config") or {}).get("data") or {}).get("identity")
    if not isinstance(identity, dict):
        return NOT_RECORDED
    source, sha = identity.get("source"), identity.get("sha256")
    return f"{source} sha256 {provenance_text.short(str(sha))}" if sha else str(source)


FACTS += [
    ("data", _data),
    ("suite revision", _suite_revision),
    ("suite code", _suite_code),
    ("environment lock", _environment_lock),
    ("image recipe", _image_recipe),
]


GPU_FACTS = ("GPU model", "GPU driver")
# Facts of what ran rather than of the machine: every value its runs record is shown, so a machine
# whose runs came from two revisions says so instead of showing the newest.
PROVENANCE_FACTS = ("suite revision", "suite code", "environment lock", "image recipe")
CODE_FACTS = ("suite code", "suite revision")  # the code where both record it, else the revision
ENVIRONMENT_FACTS = ("environment lock", "image recipe")


def machine_facts(views: list[ScenarioView]) -> dict[str, str]:
    """Facts of one machine: GPU facts from its newest run of a GPU point (a CPU run, in a container
    above all, sees no GPU: without one they are not recorded), provenance facts from every run that
    reached the worker (each value once, "; " between; every run where none did), the rest from its
    newest run that reached the worker; the data, every value the runs that reached the worker
    record (where none did, every run's)."""
    newest = max((v.newest for v in views), key=finished_at)
    gpu_runs = [r for v in views for r in v.gpu_runs]
    newest_gpu = max(gpu_runs, key=finished_at) if gpu_runs else None
    # The runs that made its figures: a page of skips only states its skips' provenance, but those
    # runs started nothing (no image) and measured nothing, so the machine's facts are of the others.
    reached = [r for v in views for p in v.points for r in p.runs if r.environment]
    ran = _distinct_provenance(reached or [r for v in views for r in v.provenance_runs])
    trained = reached or [r for v in views for p in v.points for r in p.runs]  # whose data the "data" fact lists
    facts = {}
    for name, get in FACTS:
        if name in PROVENANCE_FACTS or name == "data":  # what runs did not record is no other value where others did
            values = {str(get(r)) for r in (trained if name == "data" else ran)}
            facts[name] = "; ".join(sorted(values - {NOT_RECORDED} or values))
        elif name in GPU_FACTS:  # a CPU run, in a container above all, sees no GPU: it cannot say
            facts[name] = str(get(newest_gpu)) if newest_gpu is not None else NOT_RECORDED
        else:  # a field the run recorded as null, or not at all, is not a value that two machines share
            value = get(newest)
            facts[name] = NOT_RECORDED if value is None else str(value)
    return facts


def _distinct_provenance(runs: list[RunResult]) -> list[RunResult]:
    """One of ``runs`` for each distinct set of what the provenance facts read of a run (its section
    as reports read it, its backend, whether it recorded a section): a machine's thousands of runs
    share a few, and each fact is worked out once for each."""
    distinct: dict[bytes, RunResult] = {}
    for r in runs:
        try:
            key = orjson.dumps([_section(r), RUN_BACKEND.of(r), bool(r.provenance)], option=orjson.OPT_SORT_KEYS)
        except TypeError:  # not JSON (never from a record): on its own
            key = b"%d" % id(r)
        distinct.setdefault(key, r)
    return list(distinct.values())


LISTED_SKIPPED = 6  # points skipped on every machine named in their sentence; beyond, counted
FORMAT = "keras-speed-suite/compare"
VERSION = 1
# Which way ``speedup_vs_reference`` divides, in words, for whoever reads the JSON without the docs.
RATIO_DIRECTION = (
    "speedup_vs_reference is the reference's geometric mean fit time over this machine's: above 1, this "
    "machine is faster; speedup_text says it as the table does, a factor of 1 or more and the word faster or "
    "slower (the interval inverted with it)"
)
THAN = "the reference"


def collect(views: list[ScenarioView], reference: str | None = None) -> dict[str, Any]:
    """The comparison as plain data (``compare --json``); ``render`` formats exactly this."""
    names = sorted({v.machine for v in views})
    # By default the first machine by name with full-size results: a reference at smoke size leaves
    # every full-size machine uncompared (their jobs differ).
    full = sorted({v.machine for v in views if not v.smoke})
    ref = reference if reference in names else next(iter(full or names), None)
    machines = [ref, *[m for m in names if m != ref]] if ref else []
    by_scenario: dict[str, dict[str, ScenarioView]] = {}
    for v in views:
        by_scenario.setdefault(v.scenario, {})[v.machine] = v
    scenarios, alone = [], []
    for scenario, per_machine in sorted(by_scenario.items()):
        assert ref is not None  # there is a view, so a machine
        if len(per_machine) < 2 <= len(machines):
            alone.append({"scenario": scenario, "machine": next(iter(per_machine))})
            continue
        scenarios.append(_scenario(scenario, per_machine, machines, ref))
    facts = {m: machine_facts([v for v in views if v.machine == m]) for m in machines}
    # A fact a machine did not record is neither the same nor different on that machine: it is
    # unknown there, and compared among the machines that record it (one machine of older results
    # does not hide that two others ran different code).
    recorded = {name: [m for m in machines if facts[m][name] != NOT_RECORDED] for name, _ in FACTS}
    unrecorded = [name for name, _ in FACTS if len(recorded[name]) < len(machines)]
    differ = [name for name, _ in FACTS if len({facts[m][name] for m in recorded[name]}) > 1]
    same = [name for name, _ in FACTS if name not in differ and len(recorded[name]) >= 2]  # one machine: none
    return {
        "format": FORMAT,
        "version": VERSION,
        "reference": ref,
        "machines": machines,
        "interval": {"level": stats.LEVEL, "method": stats.METHOD, "min_runs": stats.MIN_RUNS_FOR_INTERVAL},
        "ratio_direction": RATIO_DIRECTION,
        "scenarios": scenarios,
        "not_compared": alone,
        "facts": facts,
        "facts_differ": differ,
        "facts_same": same,
        "facts_unrecorded": unrecorded,
    }


def _scenario(scenario: str, per_machine: dict[str, ScenarioView], machines: list[str], ref: str) -> dict[str, Any]:
    labels: list[str] = []
    for m in machines:
        for p in per_machine[m].points if m in per_machine else []:
            if p.label not in labels:
                labels.append(p.label)
    points = []
    for label in labels:
        found = {m: per_machine[m].point_by_label(label) if m in per_machine else None for m in machines}
        base = found.get(ref)
        base_fit = base.values(FIT_S) if base else []
        cells = {}
        for m in machines:
            got = found[m]
            fit = got.values(FIT_S) if got else []
            # A point that trained below the accuracy gate is left out of comparisons, as on its page.
            below_gate = bool(fit) and got is not None and not got.passes_gate
            base_gated = bool(base_fit) and base is not None and not base.passes_gate
            # Smoke size trains a smaller job than full size: the two times are of different work.
            size_differs = (
                bool(fit)
                and m != ref
                and m in per_machine
                and ref in per_machine
                and (per_machine[m].smoke != per_machine[ref].smoke)
            )
            # As on a page: runs on other data or with other settings measured other work.
            differs = (
                verdicts.not_comparable_across_machines(got, base)
                if base and got and fit and base_fit and m != ref and not size_differs
                else ""
            )
            # The reference's time over this one's.
            r = (
                fit_ratio(base, got)
                if base
                and got
                and fit
                and base_fit
                and m != ref
                and not below_gate
                and not base_gated
                and not size_differs
                and not differs
                else None
            )
            cells[m] = {
                "status": got.status if got else "not run",
                "below_gate": below_gate,
                "size_differs": size_differs,
                "not_compared": differs or None,
                "runs_ok": len(got.ok_runs) if got else 0,
                "runs_total": len(got.runs) if got else 0,
                "fit_s_geomean": stats.geometric_mean(fit) if fit else None,
                "speedup_vs_reference": r.value if r else None,
                "speedup_ci_low": r.low if r else None,
                "speedup_ci_high": r.high if r else None,
                "speedup_runs_reference": r.runs[0] if r else None,
                "speedup_runs_machine": r.runs[1] if r else None,
                "speedup_significant": r.significant if r else None,
                "speedup_text": r.text(than=THAN) if r else None,
            }
        points.append({"point": label, "machines": cells})
    smoke = [m for m in machines if m in per_machine and per_machine[m].smoke]
    present = [m for m in machines if m in per_machine]
    return {"scenario": scenario, "machines": present, "smoke_on": smoke, "points": points}


def render(views: list[ScenarioView], reference: str | None = None, title: str = "Hardware comparison") -> str:
    data = collect(views, reference)
    machines, ref = data["machines"], data["reference"]
    if not machines:
        return f"# {title}\n\nNo results.\n"
    if len(machines) == 1:  # nothing to compare yet: what a cell holds, and what would add a column
        head = (
            f"Machines: {code(ref)}. Each cell is the geometric mean of the total `fit` times in seconds. The "
            "results of another machine, in a folder of its own beside this one's, add a column that says how "
            "much faster or slower than the reference it is."
        )
    else:
        head = (
            f"Machines: {', '.join(code(m) for m in machines)}. Reference: {code(ref)}. Each cell is the "
            "geometric mean of the total `fit` times in seconds (the mean the ratio divides); beside it, how "
            'much faster or slower than the reference this machine is, by the ratio of those means ("2.50x '
            "slower than the reference\": its time is 2.5 times the reference's; a factor is never below 1, the "
            f"word says which way): the {stats.METHOD}."
        )
    lines = [f"# {title}", "", head]
    for s in data["scenarios"]:
        lines += ["", f"## {cell(s['scenario'])}", "", _table(s, machines)]
    alone = [f"{cell(a['scenario'])} (only on {code(a['machine'])})" for a in data["not_compared"]]
    if alone:
        lines += ["", f"Not compared, measured on one machine only: {', '.join(alone)}."]
    lines += ["", "## Recorded facts", "", *_facts(data)]
    return "\n".join(lines) + "\n"


def _table(scenario: dict[str, Any], machines: list[str]) -> str:
    """The scenario's points, a row each, and one sentence for those skipped on every machine that
    ran the scenario: such a row compares nothing (a GPU point on machines without one)."""
    rows, skipped, present = [], [], scenario["machines"]  # a machine without the scenario ran none of it
    for point in scenario["points"]:
        by_machine = point["machines"]
        if all(by_machine[m]["fit_s_geomean"] is None and by_machine[m]["status"] == STATUS_SKIPPED for m in present):
            skipped.append(point["point"])
            continue
        row = [cell(point["point"])]
        for m in machines:
            c = by_machine[m]
            if c["fit_s_geomean"] is None:
                row.append(cell(c["status"]))
            elif c["below_gate"]:
                row.append(f"{c['fit_s_geomean']:.2f} (below the accuracy gate: not compared)")
            elif c["size_differs"]:
                sizes = (_size(scenario, m), _size(scenario, machines[0]))
                row.append(f"{c['fit_s_geomean']:.2f} (not compared: {sizes[0]} size, the reference {sizes[1]} size)")
            elif c.get("not_compared"):
                row.append(f"{c['fit_s_geomean']:.2f} (not compared: {cell(c['not_compared'])})")
            elif c["speedup_vs_reference"] is None:
                row.append(f"{c['fit_s_geomean']:.2f}")
            else:
                row.append(f"{c['fit_s_geomean']:.2f}, {c['speedup_text']}")
        rows.append(row)
    parts = []
    if rows:
        parts.append(
            tabulate(rows, headers=["point", *[cell(m) for m in machines]], tablefmt="github", disable_numparse=True)
        )
    if skipped:
        where = "every machine" if len(present) == len(machines) > 1 else _listed([code(m) for m in present])
        which = f": {'; '.join(cell(label) for label in skipped)}" if len(skipped) <= LISTED_SKIPPED else ""
        parts.append(f"{len(skipped)} point{'s' if len(skipped) > 1 else ''} skipped on {where}{which}.")
    smoke = scenario["smoke_on"]
    timed = any(c["fit_s_geomean"] is not None for point in scenario["points"] for c in point["machines"].values())
    if smoke and timed:  # beside times only: a section of skips has none to compare
        parts.append(f"Smoke size on: {', '.join(code(m) for m in smoke)} (not comparable with full-size runs).")
    return "\n\n".join(parts)


def _listed(words: list[str]) -> str:
    """ "`a`", "`a` and `b`", "`a`, `b` and `c`"."""
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"


def _size(scenario: dict[str, Any], machine: str) -> str:
    return "smoke" if machine in scenario["smoke_on"] else "full"


def _facts(data: dict[str, Any]) -> list[str]:
    machines, facts = data["machines"], data["facts"]
    rows = [[name, *[cell(_shown(name, facts[m][name])) for m in machines]] for name, _ in FACTS]
    table = tabulate(rows, headers=["fact", *[cell(m) for m in machines]], tablefmt="github", disable_numparse=True)
    if len(machines) == 1:  # nothing differs from, or is the same as, another machine
        unrecorded = data.get("facts_unrecorded") or []
        gpu = " (GPU facts come from runs of GPU points that reached the worker)"
        gpu = gpu if set(GPU_FACTS) & set(unrecorded) else ""
        return [table, "", f"Not recorded by its results: {', '.join(unrecorded)}{gpu}."] if unrecorded else [table]
    return [
        table,
        "",
        f"Differ: {', '.join(data['facts_differ']) or 'nothing recorded'}.",
        f"Same: {', '.join(data['facts_same']) or 'nothing recorded'}.",
        *_unrecorded(data),
        *_ran_differently(data),
    ]


def _shown(name: str, value: str) -> str:
    """A fact as its cell shows it: an image ID as the scenario pages show it (12 hex digits), the
    rest as recorded (``collect`` keeps the whole ID)."""
    return provenance_text.short(value) if name == "image ID" and value.startswith("sha256:") else value


def _unrecorded(data: dict[str, Any]) -> list[str]:
    """Which machines' results do not record which facts: a sentence per set of such machines."""
    machines, facts = data["machines"], data["facts"]
    groups: dict[tuple[str, ...], list[str]] = {}
    for name in data.get("facts_unrecorded") or []:
        groups.setdefault(tuple(m for m in machines if facts[m][name] == NOT_RECORDED), []).append(name)
    lines = []
    for missing, names in groups.items():
        who = " and ".join(code(m) for m in missing)
        lines.append(f"Not recorded by the results of {who}, so not compared there: {', '.join(names)}.")
    return lines


def _ran_differently(data: dict[str, Any]) -> list[str]:
    """A sentence per machine whose code or environment differs from the reference's, in plain words."""
    machines, facts = data["machines"], data["facts"]
    ref, lines = machines[0], []
    for m in machines[1:]:
        pair = f"{code(ref)} and {code(m)}"

        def values(name: str, other: str = m) -> str:
            return f"{code(ref)} {cell(facts[ref][name])}, {code(other)} {cell(facts[other][name])}"

        differ = [
            name
            for name in data["facts_differ"]
            if NOT_RECORDED not in (facts[ref][name], facts[m][name]) and facts[ref][name] != facts[m][name]
        ]
        both_know_code = NOT_RECORDED not in (facts[ref]["suite code"], facts[m]["suite code"])
        code_differs = [n for n in CODE_FACTS[: 1 if both_know_code else 2] if n in differ]
        if both_know_code and not code_differs and "suite revision" in differ:
            lines += ["", f"{pair} ran the same suite code at different revisions (they differ only in outputs)."]
        environment_differs = [n for n in ENVIRONMENT_FACTS if n in differ]
        if code_differs:
            lines += ["", f"{pair} ran different suite code: {values(code_differs[0])}."]
        if environment_differs:
            said = "; ".join(f"{name}: {values(name)}" for name in environment_differs)
            lines += ["", f"{pair} ran in different environments: {said}."]
    return lines
