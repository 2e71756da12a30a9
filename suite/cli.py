"""``python -m suite``: run, check, report, compare, reproduce, show, data, env, images, backends, schema.

Exit codes: 0 everything ran (skips included), 1 some run failed (the failure is recorded and
reported), 2 bad input (scenario, results or arguments), 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from suite import backends, paths
from suite.environment import datasets, host_facts
from suite.record import code_identity, results
from suite.report import provenance_text
from suite.run import runner
from suite.run.progress import NORMAL, QUIET, VERBOSE, duration_text
from suite.safe.markdown import escaped
from suite.spec import names, plan, select
from suite.spec.scenario import (
    Override,
    ScenarioError,
    as_dict,
    load_all,
    override_problems,
    overrides_problems,
    parse_overrides,
)
from suite.spec.settings import MAX_REPEATS, SETTINGS

DEFAULT_SCENARIOS = paths.default_scenarios()
DEFAULT_RESULTS = paths.default_results()
DEFAULT_REPORTS = paths.default_reports()


class UsageError(Exception):
    """Bad input that is not a scenario file (arguments, backends, result folders)."""


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return args.func(args)
    except (
        ScenarioError,
        results.ResultError,
        UsageError,
        backends.BackendUnavailable,
        runner.FolderBusy,
        datasets.BadSource,
        datasets.wdata.DataUnavailable,
        select.SelectError,
        names.UnsafeName,
    ) as exc:
        _error(exc)
        return 2
    except (datasets.FetchError, results.Unsaved) as exc:
        _error(exc)
        return 1
    except KeyboardInterrupt:
        print("interrupted; results written so far are kept", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`suite schema | head`): say nothing more, as a pipeline expects.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _error(exc: Exception) -> None:
    """An error on stderr, each line with its control characters escaped: a message quotes input
    from elsewhere (a result's fields, a flag, a lock holder's host), and a terminal must show an
    escape sequence in it, not obey it."""
    print("\n".join(escaped(line) for line in f"error: {exc}".split("\n")), file=sys.stderr)


class _Version(argparse.Action):
    """``--version``: worked out when asked, so git runs only then."""

    def __init__(self, option_strings: list[str], dest: str = argparse.SUPPRESS, **kwargs: Any):
        super().__init__(option_strings, dest=dest, default=argparse.SUPPRESS, nargs=0, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        print(version_text())
        parser.exit()


def version_text() -> str:
    """``keras-speed-suite 0.1.0 (git 1a2b3c4d5e6f)``; where the tree differs from that revision,
    ``+ uncommitted changes (N files, diff sha256 ...)``: the words and hash a result's provenance
    records, so a checkout can be matched to a result by eye before ``reproduce`` checks it."""

    name, version = paths.DISTRIBUTION, paths.version()
    if paths.CHECKOUT is None:
        return f"{name} {version} (installed package at {paths.PACKAGE_DIR}: no git revision)"
    identity = code_identity.suite_identity(paths.CHECKOUT)
    if not identity.get("git_revision"):
        return f"{name} {version} (no git revision: not a git checkout, or git is missing)"
    return f"{name} {version} (git {provenance_text.suite_text(identity)})"


def _parser() -> argparse.ArgumentParser:
    # `suite` where the installed command runs this, else the module form every doc shows.
    prog = "suite" if Path(sys.argv[0]).name == "suite" else "python -m suite"
    p = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    p.add_argument("--version", action=_Version, help="the suite's version (pyproject.toml) and git revision")
    sub = p.add_subparsers(dest="command", required=True)
    _run_parser(sub)
    _check_parser(sub)
    _report_parser(sub)
    _compare_parser(sub)
    _reproduce_parser(sub)
    _show_parser(sub)
    _images_parser(sub)
    _backends_parser(sub)
    _data_parser(sub)
    _env_parser(sub)
    _schema_parser(sub)
    return p


def _run_parser(sub: Any) -> None:
    r = sub.add_parser("run", help="run scenarios and record one result file per run")
    _scenario_args(r)
    _backend_arg(r)
    r.add_argument("--results", type=Path, default=DEFAULT_RESULTS, help="results folder (default: reports/results)")
    r.add_argument("--fresh", action="store_true", help="rerun runs that already have an ok result")
    r.add_argument("--machine", help="name of this machine's results folder (default: the hostname)")
    r.add_argument("--docker-host", help="Docker daemon address (default: DOCKER_HOST or the local socket)")
    r.add_argument("--wait", action="store_true", help="when another `suite run` holds the results folder, wait")
    r.add_argument(
        "--hosts",
        type=Path,
        help="a hosts file (name -> Docker engine): run the plan on every host at once, results per host name",
    )
    r.add_argument(
        "--gpus",
        help="comma-separated host GPU indices or UUIDs the suite may hand out (default: every GPU the host has)",
    )
    r.add_argument(
        "--allow-synthetic",
        action="store_true",
        help="let a full-size run train on synthetic digits where MNIST is not cached (smoke runs may anyway)",
    )
    loud = r.add_mutually_exclusive_group()
    loud.add_argument("-q", "--quiet", action="store_true", help="print only errors and the closing summary")
    loud.add_argument(
        "-v", "--verbose", action="store_true", help="a line per run, skipped and done ones too, with its result file"
    )
    r.set_defaults(func=cmd_run)


def _check_parser(sub: Any) -> None:
    c = sub.add_parser(
        "check",
        help="validate scenarios and print the plan without running: per point, whether it runs here, and how long",
    )
    _scenario_args(c)
    _backend_arg(c)
    c.add_argument(
        "--results",
        type=Path,
        default=DEFAULT_RESULTS,
        help="results folder whose earlier runs say what is done and how long a point takes (default: reports/results)",
    )
    c.add_argument("--fresh", action="store_true", help="plan as `run --fresh` would: runs with an ok result run again")
    c.add_argument("--machine", help="this machine's results folder name, as for run (default: the hostname)")
    c.add_argument("--docker-host", help="Docker daemon address, as for run (default: DOCKER_HOST or the local socket)")
    c.add_argument("--gpus", help="the GPUs the suite may hand out, as for run (default: every GPU the host has)")
    c.add_argument(
        "--allow-synthetic", action="store_true", help="as for run: a full-size plan may train on synthetic digits"
    )
    c.set_defaults(func=cmd_check)


def _report_parser(sub: Any) -> None:
    rep = sub.add_parser("report", help="write Markdown reports (and JSON, CSV) from result files only")
    rep.add_argument(
        "--results", type=Path, default=DEFAULT_RESULTS, help="results folder to read (default: reports/results)"
    )
    rep.add_argument("--out", type=Path, default=DEFAULT_REPORTS, help="where the pages go (default: reports)")
    rep.add_argument(
        "-k",
        dest="select",
        metavar="EXPR",
        help="show only the points EXPR takes (as run -k); each page says what it leaves out",
    )
    rep.add_argument(
        "--format",
        default="md",
        help="md, json, csv or several, comma-separated (default md): Markdown pages, report.json, "
        "points.csv + runs.csv (docs/export.md)",
    )
    rep.add_argument("--reference", help="machine the hardware comparison divides by (default: first by name)")
    rep.set_defaults(func=cmd_report)


def _compare_parser(sub: Any) -> None:
    cmp = sub.add_parser("compare", help="two result folders side by side: times, ratios, differing facts")
    cmp.add_argument("folders", nargs=2, type=Path, metavar="DIR", help="two results folders, the first the reference")
    cmp.add_argument("--json", action="store_true", help="the comparison as JSON (docs/export.md)")
    cmp.set_defaults(func=cmd_compare)


def _reproduce_parser(sub: Any) -> None:
    rp = sub.add_parser(
        "reproduce",
        help="rerun the points of result files here, exactly as recorded, and say whether their times came out again",
    )
    rp.add_argument(
        "inputs",
        nargs="+",
        type=Path,
        metavar="RESULT.json|DIR",
        help="result files from any machine, or folders of them; grouped by point (same fingerprint); a point "
        "of a folder with no ok run (skipped here, failed) is left out and named, a file given by name is not",
    )
    rp.add_argument(
        "-k",
        dest="select",
        metavar="EXPR",
        help="only the points EXPR takes (as run -k): KEY=VALUE terms as the point labels show them (width=750, "
        "device=gpu, scenario=NAME) or words in the label, with and, or, not, parentheses",
    )
    rp.add_argument(
        "--anyway",
        action="store_true",
        help="run even where the suite revision, its tree, the environment lock, the image recipe or the data "
        "differ from the results' (the differences are shown above the verdict)",
    )
    rp.add_argument(
        "--backend",
        # Not the pool of a cluster: the comparison needs the rerun's environment known before it
        # runs; a result a Ray node made recorded that node's backend (docker or local), rerun here.
        choices=[n for n in backends.names() if backends.environment_of(n) == backends.DEFAULT_ENVIRONMENT],
        help="run on this backend instead of the one each result recorded (auto: the first that can run here)",
    )
    rp.add_argument("--docker-host", help=DOCKER_HOST_HELP)
    rp.add_argument(
        "--results",
        type=Path,
        help="where the reruns' result files go (default: a new folder reproduce/<UTC timestamp>/ here)",
    )
    rp.add_argument(
        "--repeats",
        type=int,
        help="reruns per point (default: as many as the point's original ok runs)",
    )
    rp.add_argument(
        "--tolerance",
        type=float,
        metavar="PCT",
        help="how far (percent) the rerun's fit time may lie from the original's: reproduced when the ratio's "
        "90%% interval lies within it (two one-sided tests at 5%% each), differs when its 95%% interval lies "
        "wholly outside (default: 10)",
    )
    rp.add_argument("--json", action="store_true", help="the comparison as one JSON document (docs/reproduce.md)")
    rp.set_defaults(func=cmd_reproduce)


def _show_parser(sub: Any) -> None:
    sh = sub.add_parser("show", help="one result file, readable: status, spec, timings, telemetry, environment")
    sh.add_argument("result", type=Path, metavar="RESULT.json", help="a result file under the results folder")
    sh.add_argument("--json", action="store_true", help="the raw record, after schema migration")
    sh.set_defaults(func=cmd_show)


def _images_parser(sub: Any) -> None:
    im = sub.add_parser("images", help="the Docker images of docker/images.yaml: list, build, lock")
    im.add_argument(
        "action",
        choices=("list", "build", "lock"),
        help="list: state on the engine; build: the images (skipped while the recipe is unchanged); "
        "lock: base digests and how Debian-made bases were made (docker/images.lock)",
    )
    im.add_argument("names", nargs="*", help="image names from docker/images.yaml (default: all)")
    im.add_argument("--force", action="store_true", help="build: rebuild even when the recipe label matches")
    im.add_argument("--needed", action="store_true", help="build: only the defaults this machine uses (GPU if any)")
    im.add_argument("--base", help="build: FROM this image instead of the catalog's base (an image on the engine)")
    im.add_argument(
        "--from-debian",
        action="store_true",
        help="build: on a base made from Debian packages (debootstrap, this machine's pip), without asking a "
        "registry (default: only where the engine cannot pull the catalog's base)",
    )
    im.add_argument("--docker-host", help=DOCKER_HOST_HELP)
    im.set_defaults(func=cmd_images)


def _backends_parser(sub: Any) -> None:
    b = sub.add_parser("backends", help="the backends --backend accepts; --prepare gets one ready (builds images)")
    b.add_argument("--names", action="store_true", help="names only, one per line (for scripts)")
    b.add_argument("--prepare", choices=backends.names(), metavar="NAME", help="get NAME ready; auto: every backend")
    b.add_argument("--docker-host", help=DOCKER_HOST_HELP)
    b.set_defaults(func=cmd_backends, results=DEFAULT_RESULTS, machine=None)


def _data_parser(sub: Any) -> None:
    d = sub.add_parser("data", help="MNIST on this machine: fetch it once into the Keras cache, show what is there")
    d.add_argument(
        "action", choices=("fetch", "show"), help="fetch: into the Keras cache, checked; show: what is there"
    )
    d.add_argument(
        "--from",
        dest="source",
        type=Path,
        metavar="PATH",
        help="fetch: no download; take Keras' mnist.npz or a folder of the four MNIST IDX files (.gz or not)",
    )
    d.add_argument("--url", help=f"fetch: download from here (default: ${datasets.URL_ENV} or {datasets.MNIST_URL})")
    d.add_argument(
        "--timeout",
        type=float,
        default=datasets.TIMEOUT_S,
        help=f"fetch: seconds without progress; the whole download may take at most ${datasets.DEADLINE_ENV} "
        f"seconds (default {datasets.DEADLINE_S:g})",
    )
    d.set_defaults(func=cmd_data)


def _env_parser(sub: Any) -> None:
    e = sub.add_parser("env", help="what this machine offers (Python, GPUs, Docker); is it quiet enough to benchmark")
    e.add_argument("--docker-host", help=DOCKER_HOST_HELP)
    e.add_argument("--json", action="store_true", help="the same facts as JSON")
    e.set_defaults(func=cmd_env)


def _schema_parser(sub: Any) -> None:
    sc = sub.add_parser("schema", help="print a JSON Schema of the scenario format, for editors to validate with")
    sc.set_defaults(func=cmd_schema)


def _backend_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=backends.names(),
        default=backends.AUTO,
        help="auto: the first of docker, local that can run here (docker: an engine answers and the images "
        "are there); ray: a Ray cluster's nodes (docs/cluster.md)",
    )
    p.add_argument(
        "--ray-address",
        metavar="HOST:PORT",
        help="--backend ray: the Ray cluster's head (GCS address); default: a local Ray instance the suite "
        "starts and stops (RAY_ADDRESS is not read)",
    )
    p.add_argument(
        "--gpu-model",
        metavar="NAME",
        help="--backend ray: run on nodes offering the resource gpu_model:NAME (a scenario's gpu_model wins)",
    )


DOCKER_HOST_HELP = "Docker daemon address (default: DOCKER_HOST or the local socket)"


def _scenario_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenarios", nargs="*", type=Path, help="scenario YAML files (default: every file in scenarios/)")
    p.add_argument("--smoke", action="store_true", help="smoke size: the scenarios' smoke overrides, 1 repetition")
    p.add_argument("--repeats", type=int, help=f"repetitions per point, 1 to {MAX_REPEATS} (default: the scenario's)")
    p.add_argument(
        "--max-runs",
        type=int,
        default=plan.MAX_RUNS,
        metavar="N",
        help=f"refuse a plan of more than N runs before making it (default: {plan.MAX_RUNS:,}, before -k)",
    )
    p.add_argument(
        "-k",
        dest="select",
        metavar="EXPR",
        help="only the points EXPR takes: KEY=VALUE terms as the point labels show them (width=750, "
        "device=gpu, variant=jit_compile, scenario=NAME) or words in the label, with and, or, not, parentheses",
    )
    p.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="change one setting of every scenario before its matrix, checked as in the YAML (repeatable): "
        "--set training.epochs=3 --set model.hidden=[512,256]; part of the fingerprint and the report",
    )


@dataclass(frozen=True)
class _Plan:
    specs: list[plan.RunSpec]  # what runs, in order
    runs: int  # before -k
    points: int  # before -k
    overrides: list[Override]

    def lines(self, select_text: str | None) -> list[str]:
        """How big the plan is, and what -k and --set did to it, for run and check to say."""
        points = select.points_of(self.specs)
        if select_text is None:
            out = [f"{points} points, {len(self.specs)} runs"]
        else:
            out = [f"{points} of {self.points} points, {len(self.specs)} of {self.runs} runs match -k {select_text!r}"]
        if self.overrides:
            out.append("--set, for every point: " + ", ".join(o.text for o in self.overrides))
        return out


def _load_plan(args: argparse.Namespace) -> list[plan.RunSpec]:
    return _make_plan(args).specs


def _make_plan(args: argparse.Namespace) -> _Plan:
    """The scenarios, with ``--set`` applied and ``-k``'s points taken, as one interleaved plan.

    ``--set`` is checked only on scenarios that keep points after ``-k``: ``-k scenario=a --set
    training.batch_size=64`` must not fail because another scenario sweeps the batch size.
    """
    files = args.scenarios or sorted(DEFAULT_SCENARIOS.glob("*.yaml"))
    if not files:
        raise UsageError(f"no scenario files given and none in {DEFAULT_SCENARIOS}")
    if args.repeats is not None and not 1 <= args.repeats <= MAX_REPEATS:
        raise UsageError(f"--repeats {args.repeats}: allowed: an integer in [1, {MAX_REPEATS}]")
    if args.max_runs < 1:
        raise UsageError(f"--max-runs {args.max_runs}: allowed: an integer >= 1")
    scenarios = load_all([_display_path(f) for f in files], args.max_runs, args.repeats or (1 if args.smoke else None))
    sizes = {sc.source: plan.point_count(sc) * (args.repeats or (1 if args.smoke else sc.repeats)) for sc in scenarios}
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
    return _Plan(plan.interleave(chosen), len(specs), select.points_of(specs), overrides)


def _display_path(path: Path) -> Path:
    """Paths inside the repository as relative ones: they end up in results and reports."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path


def cmd_check(args: argparse.Namespace) -> int:
    """The plan, point by point: whether it runs on this machine (or is skipped, or done), and for how long.

    The backend is the one ``run`` would use (``--backend``, or what ``auto`` picks here); earlier
    results come from this machine's folder under ``--results``, as ``run`` would resume from.
    """
    made = _make_plan(args)
    specs = made.specs
    from tabulate import tabulate

    _check_ray_args(args)
    machine = args.machine or host_facts.machine_name()
    folder = runner.machine_dir(args.results, machine)
    backend, chosen = _check_backend(args)
    try:
        folders = [folder]
        if getattr(backend, "where", None) is not None:  # a pool: its runs lie in each node's folder
            folders = runner.result_folders(args.results)
            on_file = [r for f in folders for _, r in results.load_folder(f) if backend.counts_as_done(r)]
        else:
            on_file = [r for _, r in results.load_folder(folder)] if folder.is_dir() else []
        done = {} if args.fresh else results.latest_by_run(on_file)
        walls = runner.wall_times(on_file)
        points: dict[tuple[str, str], list[plan.RunSpec]] = {}
        for s in specs:
            points.setdefault((s.scenario, s.point_label), []).append(s)
        rows: list[list[Any]] = []
        total = _Totals()
        for (scenario, label), runs in points.items():
            first = runs[0]
            status, estimate = _point_plan(runs, backend.skip_reason(first), done, walls.get(first.fingerprint), total)
            rows.append([scenario, label, first.device, len(runs), first.fingerprint[:12], status, estimate])
        try:  # what run refuses before anything runs: check says so instead of "will run"
            _refuse_without_data([s for s in specs if backend.skip_reason(s) is None], args)
            refused = results.unwritable_here(folder)
        except UsageError as exc:
            refused = str(exc)
        if refused:
            total.refused = True
            for row in rows:  # "will run 2 of 3 (...)" -> "run refuses 2 of 3 (...) (below)"
                if row[5].startswith("will run"):
                    row[5] = row[5].replace("will run", "run refuses", 1) + " (below)"
        pool_note = None
        if getattr(backend, "where", None) is not None:
            slots = sum(float(n.get("Resources", {}).get("suite_slot", 0)) for n in backend.nodes() if n.get("Alive"))
            pool_note = (
                f"on {backend.where}: the estimate adds the runs up; up to {slots:g} run at once (suite_slot), "
                "and a node may still skip a point its engine or TensorFlow cannot run (no GPU runtime)"
            )
    finally:
        backend.close()
    headers = ["scenario", "point", "device", "reps", "fingerprint", "plan here", "estimate"]
    print(tabulate(rows, headers=headers, tablefmt="github", disable_numparse=True))
    print()
    for line in made.lines(args.select):
        print(line)
    shown = ", ".join(str(_display_path(f)) for f in folders)
    print(f"backend: {chosen}; earlier results: {shown}" + ("" if any(f.is_dir() for f in folders) else " (none yet)"))
    print(total.text())
    if pool_note:
        print(pool_note)
    data: dict[str, tuple[int, str]] = {}
    for s in specs:
        identity = s.config["data"]["identity"]
        key = ", ".join(f"{k} {v}" for k, v in datasets.fingerprinted(identity).items())
        data[key] = (data.get(key, (0, ""))[0] + 1, identity.get("note", ""))
    for key, (n, note) in data.items():
        print(f"data for {_runs(n)}: {key} ({note})")
    if refused:
        print(f"run would refuse this plan: {refused}")
    return 0


def _check_backend(args: argparse.Namespace) -> tuple[Any, str]:
    """The backend ``run`` would use, and how it was chosen; for asking which points it would skip."""
    opts = _backend_options(args)
    name, why = args.backend, "--backend"
    if name == backends.AUTO:
        name, why = backends.choose(opts)
        why = f"auto: {why}"
    return backends.make(name, opts), f"{name} ({why})"


@dataclass
class _Totals:
    """The plan on this machine, added up: counts of runs and the time they are expected to take."""

    run: int = 0
    skipped: int = 0
    done: int = 0
    known_s: float = 0.0  # from earlier results
    unknown: int = 0  # runs without an earlier result
    bound_s: float = 0.0  # their timeouts, added up
    refused: bool = False  # run would refuse the plan (said below the totals)

    def text(self) -> str:
        verb = "would run, but run refuses the plan (below)" if self.refused else "will run"
        counts = f"{_runs(self.run)} {verb}, {self.skipped} skipped, {self.done} already done (ok on file)"
        if not self.run:
            return f"here: {counts}; nothing to run"
        parts = []
        if self.run > self.unknown:
            parts.append(f"about {duration_text(self.known_s)} from earlier results")
        if self.unknown:
            parts.append(
                f"at most {duration_text(self.bound_s)} for {_runs(self.unknown)} without an earlier result "
                "(timeout_s each)"
            )
        return f"here: {counts}; estimated time: " + " + ".join(parts)


def _runs(n: int) -> str:
    return f"{n} run" if n == 1 else f"{n} runs"


def _point_plan(
    runs: list[plan.RunSpec],
    skip: str | None,
    done: dict[tuple[str, int], results.RunResult],
    walls: list[float] | None,
    total: _Totals,
) -> tuple[str, str]:
    """(what run does with this point here, how long it takes), as run would: ok on file is done,
    then the backend's skip rule, then run. The estimate is the median wall time of the point's
    earlier ok runs (same fingerprint) per run, else its timeout as an upper bound."""
    ok = sum(1 for s in runs if (r := done.get((s.fingerprint, s.repetition))) is not None and r.ok)
    left = len(runs) - ok
    total.done += ok
    if left == 0:
        return "done (ok on file; --fresh reruns)", "-"
    also = f" ({ok} of {len(runs)} ok on file)" if ok else ""
    if skip is not None:
        total.skipped += left
        return f"skipped: {skip}{also}", "-"
    total.run += left
    status = ("will run" if not ok else f"will run {left} of {len(runs)}") + also
    if walls:
        each = statistics.median(walls)
        total.known_s += left * each
        times = f"{left} x {duration_text(each)}, " if left > 1 else ""
        return status, f"~{duration_text(left * each)} ({times}median of {len(walls)} earlier)"
    total.unknown += left
    total.bound_s += left * runs[0].timeout_s
    per = f"{left} x " if left > 1 else ""
    return status, f"<= {duration_text(left * runs[0].timeout_s)} ({per}timeout_s; no earlier result)"


def _backend_options(args: argparse.Namespace) -> backends.BackendOptions:
    gpus = getattr(args, "gpus", None)
    return backends.BackendOptions(
        machine=args.machine or host_facts.machine_name(),
        results_dir=args.results,
        docker_host=args.docker_host,
        gpus=[g.strip() for g in gpus.split(",") if g.strip()] if gpus else None,
        ray_address=getattr(args, "ray_address", None),
        gpu_model=getattr(args, "gpu_model", None),
    )


def _check_ray_args(args: argparse.Namespace) -> None:
    """The Ray flags belong to --backend ray, and the flags that pick an engine or GPUs do not: on a
    cluster each node uses its own engine and the GPUs Ray assigns."""
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
    opts = _backend_options(args)
    if name == backends.AUTO:
        name, why = backends.choose(opts)
        say(f"backend: {name} ({why})")
    return backends.make(name, opts)


def cmd_run(args: argparse.Namespace) -> int:
    """Console: the plan and the results folder once, skips grouped by reason, a line per run that
    fits 120 columns, and at the end the answer per scenario. No colour is used (so NO_COLOR holds)."""
    level = QUIET if args.quiet else VERBOSE if args.verbose else NORMAL
    say = print if level > QUIET else (lambda _line: None)
    made = _make_plan(args)
    specs = made.specs
    if args.select is not None or made.overrides:  # otherwise the plan's size is said below, with the backend
        for line in made.lines(args.select):
            say(line)
    _check_ray_args(args)
    if args.hosts is not None:
        _refuse_without_data(specs, args)  # each host's GPUs are its own: every run counts
        return _run_fleet(args, specs)
    machine = args.machine or host_facts.machine_name()
    folder = runner.machine_dir(args.results, machine)
    _check_writable(folder)
    live = sys.stdout.isatty() and level > QUIET
    with runner.hold_folder(folder, wait=args.wait):
        from suite.backends.lifeline import foreign_worker_lines

        for line in foreign_worker_lines(folder):  # said at every level: it slows every run of this plan
            print(f"warning: {line}", file=sys.stderr)
        backend = make_backend(args.backend, args, say)
        try:  # runs this backend skips (a GPU point without a GPU) need no data
            _refuse_without_data([s for s in specs if backend.skip_reason(s) is None], args)
        except UsageError:
            backend.close()
            raise
        if getattr(backend, "where", None) is not None:  # a pool of nodes: results per node
            say(f"{_runs(len(specs))} on backend {backend.name} ({backend.where}), results in {args.results}")
            summary = runner.run_plan_pool(specs, backend, args.results, fresh=args.fresh, live=live, level=level)
            folders = runner.result_folders(args.results)
        else:
            say(f"{_runs(len(specs))} on backend {backend.name}, results in {folder}")
            summary = runner.run_plan(specs, backend, args.results, machine, fresh=args.fresh, live=live, level=level)
            folders = [folder]
    for line in runner.closing_lines(args.results, folders, specs) + summary.lines():
        print(line)
    print(f"pages: python -m suite report --results {_display_path(args.results)}")
    if summary.stopped:
        # A pool whose cluster went away: every result is saved (fsync'ed), and what is left of the
        # Ray client only blocks until Ray ends the process itself, a minute on, without a word.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    return 1 if summary.failed else 0


def _refuse_without_data(specs: list[plan.RunSpec], args: argparse.Namespace) -> None:
    """Before anything runs: a full-size plan on synthetic digits would be published as if on MNIST."""
    problems = datasets.plan_problems(specs, smoke=args.smoke, allow_synthetic=args.allow_synthetic)
    if problems:
        raise UsageError("\n".join(problems))


def _run_fleet(args: argparse.Namespace, specs: list[plan.RunSpec]) -> int:
    """``run --hosts``: the same plan on every host of the file at once, one child ``suite run`` each."""
    from suite.environment import docker_engine
    from suite.run import fleet

    for flag in ("machine", "docker_host", "gpus"):
        if getattr(args, flag):
            raise UsageError(f"--hosts names each host's engine, folder and GPUs: drop --{flag.replace('_', '-')}")
    if args.backend not in (backends.AUTO, "docker"):
        raise UsageError(f"--hosts runs every host through its Docker engine; --backend {args.backend} cannot")
    hosts = fleet.load_hosts(args.hosts)
    for host in hosts:
        _check_writable(runner.machine_dir(args.results, host.name))
    run_args = [str(_display_path(f)) for f in args.scenarios]
    run_args += ["--smoke"] * args.smoke + ["--fresh"] * args.fresh + ["--wait"] * args.wait
    run_args += ["--allow-synthetic"] * args.allow_synthetic
    if args.repeats is not None:
        run_args += ["--repeats", str(args.repeats)]
    if args.max_runs != plan.MAX_RUNS:
        run_args += ["--max-runs", str(args.max_runs)]
    if args.select is not None:  # each host plans the same points with the same settings
        run_args += ["-k", args.select]
    for text in args.overrides:
        run_args += ["--set", text]
    names = ", ".join(h.name for h in hosts)
    print(f"{len(specs)} runs on each of {len(hosts)} hosts ({names}), results in {args.results}")
    return fleet.run_fleet(hosts, run_args, args.results, specs, probe=docker_engine.why_not_answering)


def _check_writable(folder: Path) -> None:
    problem = results.unwritable(folder)
    if problem:
        raise UsageError(problem)


def cmd_backends(args: argparse.Namespace) -> int:
    if args.prepare:
        failed = backends.prepare(args.prepare, _backend_options(args))
        for line in failed:
            print(f"not ready: {line}", file=sys.stderr)
        return 1 if failed else 0
    for name, entry in backends.BACKENDS.items():
        print(name if args.names else f"{name}: {entry.about}")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    if args.action == "show":
        if args.source or args.url:
            raise UsageError("--from and --url belong to `data fetch`")
        for line in datasets.describe():
            print(line)
        return 0
    if args.source and args.url:
        raise UsageError("--from PATH takes the data from PATH; drop --url")
    if not 0 < args.timeout <= 86400:  # NaN and infinity fail too
        raise UsageError(f"--timeout {args.timeout}: allowed: seconds above 0, at most 86400")
    if args.source:
        datasets.import_from(args.source)
    else:
        datasets.fetch(args.url, timeout=args.timeout)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from suite.report import figures, pages

    try:
        formats = figures.parse_formats(args.format)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    if not args.results.is_dir():
        raise UsageError(f"no results folder {args.results}; run `python -m suite run` first")
    if "json" in formats and args.out.resolve().is_relative_to(args.results.resolve()):
        # report.json among the results would be read back as a result (and refused) by every later report.
        raise UsageError(f"--out {args.out}: inside the results folder {args.results}; write report.json elsewhere")
    # A cut with -k goes to a folder of its own: it never replaces the full report's pages or index.
    out = args.out if args.select is None else pages.selected_dir(args.out)
    if out.is_symlink():
        raise UsageError(f"{out}: a link; report -k writes only into a folder of its own there")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {args.out}: cannot be the report folder ({exc.strerror})") from None
    try:
        written = pages.write_reports(args.results, out, args.reference, args.select) if "md" in formats else []
        written += figures.write_exports(args.results, out, formats, args.select)
    except pages.UnknownReference as exc:
        raise UsageError(str(exc)) from None
    except OSError as exc:  # a full disk: each page is replaced whole or not at all, so none is cut off
        print(f"error: cannot write the report into {out}: {exc.strerror or exc} ({exc.filename})", file=sys.stderr)
        return 1
    for path in written:
        print(f"wrote {path}")
    if args.select is not None:
        print(f"-k {args.select!r}: the pages it takes are in {out}; the full report in {args.out} is as it was")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """The first folder is the reference. Each folder's views are named after the folder."""
    import dataclasses

    from suite.report import compare
    from suite.report.points import load_views

    views = []
    for folder in args.folders:
        if not folder.is_dir():
            raise UsageError(f"{folder}: not a folder of result files")
        loaded = load_views(folder)
        if not loaded:
            raise UsageError(f"{folder}: holds no result files")
        views += [dataclasses.replace(v, machine=str(folder)) for v in loaded]
    if args.json:
        print(json.dumps(compare.collect(views, reference=str(args.folders[0])), indent=1, allow_nan=False))
        return 0
    print(compare.render(views, reference=str(args.folders[0]), title="Comparison"), end="")
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    """Exit 0 when every point reproduced, 1 when one did not (differs, inconclusive, a rerun failed),
    2 for bad input or results that do not fit this checkout (without --anyway)."""
    from suite import reproduce

    tolerance = reproduce.equivalence.DEFAULT_TOLERANCE_PCT if args.tolerance is None else args.tolerance
    opts = reproduce.command.Options(
        inputs=args.inputs,
        backend=args.backend,
        docker_host=args.docker_host,
        results_dir=args.results,
        repeats=args.repeats,
        tolerance=tolerance / 100,
        anyway=args.anyway,
        as_json=args.json,
        select=args.select,
    )
    say = (lambda line: print(line, file=sys.stderr)) if args.json else print
    try:
        return reproduce.command.reproduce(opts, say=say)
    except (reproduce.originals.ReproduceError, reproduce.command.Refused) as exc:
        raise UsageError(str(exc)) from None


def cmd_show(args: argparse.Namespace) -> int:
    from suite.report import show

    result = show.load(args.result)
    if args.json:  # JSON escapes control characters itself
        print(show.raw(result), end="")
        return 0
    # A record from elsewhere may hold escape sequences (in its message, its log tail): shown, not obeyed.
    print("".join(escaped(line) + "\n" for line in show.render(args.result, result).splitlines()), end="")
    return 0


def cmd_images(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from suite.environment import images

    try:
        if args.action == "list":
            rows = images.list_images(docker_host=args.docker_host)
            keys = ("name", "tag", "tensorflow", "cuda", "default_for", "state", "built_on", "base", "base_digest")
            print(tabulate([[r[k] for k in keys] for r in rows], headers=keys, tablefmt="github"))
        elif args.action == "build":
            if args.base and args.from_debian:
                raise UsageError("images build: --base and --from-debian exclude each other")
            override = {"BASE_IMAGE": args.base} if args.base else None
            names = args.names or (images.needed_images() if args.needed else None)
            images.build_images(
                names,
                override,
                docker_host=args.docker_host,
                force=args.force,
                from_debian=True if args.from_debian else None,
            )
        else:
            if paths.CHECKOUT is None:
                raise UsageError(
                    f"images lock writes docker/images.lock, a file of the suite's own repository; this suite is an "
                    f"installed package ({paths.PACKAGE_DIR}): run it from a clone (docs/install.md)"
                )
            images.lock_images(args.names or None, docker_host=args.docker_host)
    except images.UnknownImage as exc:
        raise UsageError(str(exc)) from None
    except images.ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from suite import envinfo

    facts = envinfo.collect(docker_host=args.docker_host)
    print(json.dumps(facts, indent=1, default=str) if args.json else envinfo.render(facts))
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    import json

    from suite.spec.schema import scenario_schema

    print(json.dumps(scenario_schema(), indent=2))
    return 0
