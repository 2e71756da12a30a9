"""What the commands share: the plan made from the scenario arguments (files, --set, -k, --repeats),
the backend made from the backend arguments, and the checks run does before anything runs."""

from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite import backends, paths
from suite.backends import gpu_pool
from suite.environment import datasets, host_facts
from suite.record import saving
from suite.run.progress import runs_text
from suite.spec import plan, select
from suite.spec.scenario import (
    Override,
    ScenarioError,
    as_dict,
    load_all,
    override_problems,
    overrides_problems,
    parse_overrides,
)
from suite.spec.settings import AUTO, AUTO_MAX_REPEATS, MAX_REPEATS, SETTINGS, Scenario, brief

DEFAULT_SCENARIOS = paths.default_scenarios()
DEFAULT_RESULTS = paths.default_results()
DEFAULT_REPORTS = paths.default_reports()


class UsageError(Exception):
    """Bad input that is not a scenario file (arguments, backends, result folders)."""


@dataclass(frozen=True)
class Plan:
    specs: list[plan.RunSpec]  # what runs, in order
    runs: int  # before -k
    points: int  # before -k
    overrides: list[Override]
    counted: bool = False  # repeats: auto: every point's count is known (its first stage on file)

    def lines(self, select_text: str | None) -> list[str]:
        """How big the plan is, and what -k and --set did to it, for run and check to say."""
        points = select.points_of(self.specs)
        if select_text is None:
            out = [f"{points} point{'' if points == 1 else 's'}, {runs_text(len(self.specs))}"]
        else:
            out = [f"{points} of {self.points} points, {len(self.specs)} of {self.runs} runs match -k {select_text!r}"]
        if not self.counted and any(AUTO in (s.report.get("repeats") or {}) for s in self.specs):
            out[0] += f" (repeats: {AUTO}: the runs of the first stage; more follow as its spread asks)"
        if self.overrides:
            out.append("--set, for every point: " + ", ".join(o.text for o in self.overrides))
        return out


def _most_runs(sc: Scenario, args: argparse.Namespace, auto: bool) -> int:
    """Runs a point of ``sc`` may take in this plan: ``--repeats N``; under ``--repeats auto`` or the
    file's ``repeats: auto`` (not at smoke size without the flag) its cap; else the fixed count."""
    if auto:
        return int(sc.auto["max_repeats"]) if sc.auto else AUTO_MAX_REPEATS
    if args.repeats is not None:
        return int(args.repeats)
    if args.smoke:
        return 1
    return int(sc.auto["max_repeats"]) if sc.auto else sc.repeats


def load_plan(args: argparse.Namespace) -> list[plan.RunSpec]:
    return make_plan(args).specs


def make_plan(args: argparse.Namespace) -> Plan:
    """The scenarios, with ``--set`` applied and ``-k``'s points taken, as one interleaved plan.

    ``--set`` is checked only on scenarios that keep points after ``-k``: ``-k scenario=a --set
    training.batch_size=64`` must not fail because another scenario sweeps the batch size.
    """
    files = args.scenarios or sorted(DEFAULT_SCENARIOS.glob("*.yaml"))
    if not files:
        raise UsageError(f"no scenario files given and none in {DEFAULT_SCENARIOS}")
    if args.repeats not in (None, AUTO) and not 1 <= args.repeats <= MAX_REPEATS:
        raise UsageError(f"--repeats {args.repeats}: allowed: an integer in [1, {MAX_REPEATS}], or {AUTO}")
    if args.max_runs < 1:
        raise UsageError(f"--max-runs {args.max_runs}: allowed: an integer >= 1")
    # repeats: auto counts at its cap (the scenario's max_repeats, or the default): the plan may grow
    # to that many runs a point. load checks the points alone then; the sizes below count the runs.
    auto = args.repeats == AUTO
    given = 1 if auto else args.repeats
    scenarios = load_all([display_path(f) for f in files], args.max_runs, given or (1 if args.smoke else None))
    sizes = {sc.source: plan.point_count(sc) * _most_runs(sc, args, auto) for sc in scenarios}
    if sum(sizes.values()) > args.max_runs:
        each = ", ".join(f"{source}: {n:,}" for source, n in sizes.items())
        raise UsageError(
            f"the plan holds {sum(sizes.values()):,} runs ({each}), more than --max-runs {args.max_runs:,}; "
            "take fewer points (-k, fewer files, --repeats) or pass a larger --max-runs"
        )
    overrides = parse_overrides(getattr(args, "overrides", None) or [])
    specs = []
    for sc in scenarios:
        # A scenario the overrides do not fit is expanded without them, for -k to see its labels.
        fits = bool(overrides) and not override_problems(sc, overrides)
        given = as_dict(overrides) if fits else None
        specs += plan.expand(sc, smoke=args.smoke, repeats=args.repeats, overrides=given)
    chosen = select.select_specs(specs, getattr(args, "select", None))
    if overrides:
        kept = {s.scenario for s in chosen}
        problems = overrides_problems([sc for sc in scenarios if sc.name in kept], overrides)
        if problems:
            raise ScenarioError(problems)
    return Plan(plan.interleave(chosen), len(specs), select.points_of(specs), overrides)


def display_path(path: Path) -> Path:
    """Paths inside the repository as relative ones: they end up in results and reports."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path


def gpus_flag(value: str | None) -> list[str] | None:
    """``--gpus 0,2`` as the GPUs it names; None where the flag is not given (every GPU)."""
    if value is None:
        return None
    gpus = [g.strip() for g in value.split(",")]
    if not all(map(gpu_pool.is_gpu_id, gpus)) or len(set(gpus)) != len(gpus):
        raise UsageError(f"--gpus {brief(value)}: comma-separated {gpu_pool.GPU_IDS_ALLOWED}")
    return gpus


def backend_options(args: argparse.Namespace) -> backends.BackendOptions:
    return backends.BackendOptions(
        machine=args.machine or host_facts.machine_name(),
        results_dir=args.results,
        docker_host=args.docker_host,
        gpus=gpus_flag(getattr(args, "gpus", None)),
        ray_address=getattr(args, "ray_address", None),
        gpu_model=getattr(args, "gpu_model", None),
    )


def check_backend_flags(args: argparse.Namespace) -> None:
    """Before anything runs: ``--gpus`` names GPUs, the Ray flags belong to --backend ray, and the
    flags that pick an engine or GPUs do not: on a cluster each node uses its own engine and the
    GPUs Ray assigns."""
    gpus_flag(getattr(args, "gpus", None))
    if args.backend == "ray":
        address = getattr(args, "ray_address", None)
        if address is not None and not address.strip():
            raise UsageError(
                "--ray-address is empty: give the head's HOST:PORT, or leave the flag out for a local instance"
            )
        model = getattr(args, "gpu_model", None)
        pattern = SETTINGS["gpu_model"]["pattern"]
        if model is not None and not re.search(pattern, model):
            raise UsageError(f"--gpu-model {model!r}: a resource name ({pattern}), e.g. H100")
        for flag in ("docker_host", "gpus"):
            if getattr(args, flag, None):
                raise UsageError(
                    f"--backend ray: each node runs on its own Docker engine with the GPUs Ray assigns; "
                    f"drop --{flag.replace('_', '-')}"
                )
        return
    for flag in ("ray_address", "gpu_model"):
        if getattr(args, flag, None) is not None:
            raise UsageError(f"--{flag.replace('_', '-')} is for --backend ray (given: --backend {args.backend})")


def make_backend(name: str, args: argparse.Namespace, say: Any = print) -> Any:
    """The backend ``--backend`` names, ``auto`` resolved (and said); raises BackendUnavailable when it
    cannot work here."""
    opts = backend_options(args)
    if name == backends.AUTO:
        name, why = backends.choose(opts)
        say(f"backend: {name} ({why})")
    return backends.make(name, opts)


def refuse_without_data(specs: list[plan.RunSpec], args: argparse.Namespace) -> None:
    """Before anything runs: a full-size plan on synthetic digits would be published as if on MNIST."""
    problems = datasets.plan_problems(specs, smoke=args.smoke, allow_synthetic=args.allow_synthetic)
    if problems:
        raise UsageError("\n".join(problems))


def check_writable(folder: Path) -> None:
    problem = saving.unwritable(folder)
    if problem:
        raise UsageError(problem)
