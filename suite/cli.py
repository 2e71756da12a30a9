"""``python -m suite``: run, check, report, data, env, images, compare, backends.

Exit codes: 0 everything ran (skips included), 1 some run failed (the failure is recorded and
reported), 2 bad input (scenario, results or arguments), 130 interrupted.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from suite import backends, datasets, hostinfo, plan, results, runner
from suite.scenario import ScenarioError, load_all

REPO_ROOT = Path(__file__).resolve().parents[1]
DEFAULT_SCENARIOS = REPO_ROOT / "scenarios"
DEFAULT_RESULTS = REPO_ROOT / "reports" / "results"
DEFAULT_REPORTS = REPO_ROOT / "reports"


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
    ) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    except datasets.FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted; results written so far are kept", file=sys.stderr)
        return 130


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m suite", description=__doc__.splitlines()[0])
    sub = p.add_subparsers(dest="command", required=True)

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
    r.set_defaults(func=cmd_run)

    c = sub.add_parser("check", help="validate scenarios and print the expanded plan without running")
    _scenario_args(c)
    c.set_defaults(func=cmd_check)

    rep = sub.add_parser("report", help="write Markdown reports from result files only")
    rep.add_argument("--results", type=Path, default=DEFAULT_RESULTS)
    rep.add_argument("--out", type=Path, default=DEFAULT_REPORTS)
    rep.add_argument("--reference", help="machine the hardware comparison divides by (default: first by name)")
    rep.set_defaults(func=cmd_report)

    cmp = sub.add_parser("compare", help="two result folders side by side: times, ratios, differing facts")
    cmp.add_argument("folders", nargs=2, type=Path, metavar="DIR")
    cmp.set_defaults(func=cmd_compare)

    im = sub.add_parser("images", help="the Docker images of docker/images.yaml: list, build, lock")
    im.add_argument("action", choices=("list", "build", "lock"))
    im.add_argument("names", nargs="*", help="image names from docker/images.yaml (default: all)")
    im.add_argument("--force", action="store_true", help="build: rebuild even when the recipe label matches")
    im.add_argument("--needed", action="store_true", help="build: only the defaults this machine uses (GPU if any)")
    im.add_argument("--base", help="build: FROM this image instead of the catalog's base (an image on the engine)")
    im.add_argument("--docker-host")
    im.set_defaults(func=cmd_images)

    b = sub.add_parser("backends", help="the backends --backend accepts; --prepare gets one ready (builds images)")
    b.add_argument("--names", action="store_true", help="names only, one per line (for scripts)")
    b.add_argument("--prepare", choices=backends.names(), metavar="NAME", help="get NAME ready; auto: every backend")
    b.add_argument("--docker-host")
    b.set_defaults(func=cmd_backends, results=DEFAULT_RESULTS, machine=None)

    d = sub.add_parser("data", help="MNIST on this machine: fetch it once into the Keras cache, show what is there")
    d.add_argument("action", choices=("fetch", "show"))
    d.add_argument(
        "--from",
        dest="source",
        type=Path,
        metavar="PATH",
        help="fetch: no download; take Keras' mnist.npz or a folder of the four MNIST IDX files (.gz or not)",
    )
    d.add_argument("--url", help=f"fetch: download from here (default: ${datasets.URL_ENV} or {datasets.MNIST_URL})")
    d.add_argument("--timeout", type=float, default=datasets.TIMEOUT_S, help="fetch: seconds without progress")
    d.set_defaults(func=cmd_data)

    e = sub.add_parser("env", help="what this machine offers: Python, TensorFlow, GPUs, Docker engine")
    e.add_argument("--docker-host")
    e.set_defaults(func=cmd_env)

    sc = sub.add_parser("schema", help="print a JSON Schema of the scenario format, for editors to validate with")
    sc.set_defaults(func=cmd_schema)
    return p


def _backend_arg(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--backend",
        choices=backends.names(),
        default=backends.AUTO,
        help="auto: the first of " + ", ".join(backends.BACKENDS) + " that can run here (docker: an engine "
        "answers and the images are there)",
    )


def _scenario_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenarios", nargs="*", type=Path, help="scenario YAML files (default: every file in scenarios/)")
    p.add_argument("--smoke", action="store_true", help="smoke size: the scenarios' smoke overrides, 1 repetition")
    p.add_argument("--repeats", type=int, help="repetitions per point (default: the scenario's)")


def _load_plan(args: argparse.Namespace) -> list[plan.RunSpec]:
    files = args.scenarios or sorted(DEFAULT_SCENARIOS.glob("*.yaml"))
    if not files:
        raise UsageError(f"no scenario files given and none in {DEFAULT_SCENARIOS}")
    if args.repeats is not None and args.repeats < 1:
        raise UsageError(f"--repeats {args.repeats}: must be >= 1")
    scenarios = load_all([_display_path(f) for f in files])
    specs = [s for sc in scenarios for s in plan.expand(sc, smoke=args.smoke, repeats=args.repeats)]
    return plan.interleave(specs)


def _display_path(path: Path) -> Path:
    """Paths inside the repository as relative ones: they end up in results and reports."""
    try:
        return path.resolve().relative_to(Path.cwd().resolve())
    except ValueError:
        return path


def cmd_check(args: argparse.Namespace) -> int:
    specs = _load_plan(args)
    from tabulate import tabulate

    rows = {}
    for s in specs:
        key = (s.scenario, s.point_label)
        rows.setdefault(key, [s.scenario, s.point_label, s.device, 0, s.fingerprint[:12]])[3] += 1
    print(
        tabulate(list(rows.values()), headers=["scenario", "point", "device", "reps", "fingerprint"], tablefmt="github")
    )
    print(f"\n{len(rows)} points, {len(specs)} runs")
    data: dict[str, tuple[int, str]] = {}
    for s in specs:
        identity = s.config["data"]["identity"]
        key = ", ".join(f"{k} {v}" for k, v in datasets.fingerprinted(identity).items())
        data[key] = (data.get(key, (0, ""))[0] + 1, identity.get("note", ""))
    for key, (n, note) in data.items():
        print(f"data for {n} runs: {key} ({note})")
    return 0


def _backend_options(args: argparse.Namespace) -> backends.BackendOptions:
    gpus = getattr(args, "gpus", None)
    return backends.BackendOptions(
        machine=args.machine or hostinfo.machine_name(),
        results_dir=args.results,
        docker_host=args.docker_host,
        gpus=[g.strip() for g in gpus.split(",") if g.strip()] if gpus else None,
    )


def make_backend(name: str, args: argparse.Namespace) -> Any:
    """The backend ``--backend`` names, ``auto`` resolved; raises BackendUnavailable when it cannot work here."""
    opts = _backend_options(args)
    if name == backends.AUTO:
        name, why = backends.choose(opts)
        print(f"backend: {name} ({why})")
    return backends.make(name, opts)


def cmd_run(args: argparse.Namespace) -> int:
    specs = _load_plan(args)
    if args.hosts is not None:
        _refuse_without_data(specs, args)  # each host's GPUs are its own: every run counts
        return _run_fleet(args, specs)
    machine = args.machine or hostinfo.machine_name()
    folder = runner.machine_dir(args.results, machine)
    _check_writable(folder)
    with runner.hold_folder(folder, wait=args.wait):
        backend = make_backend(args.backend, args)
        try:  # runs this backend skips (a GPU point without a GPU) need no data
            _refuse_without_data([s for s in specs if backend.skip_reason(s) is None], args)
        except UsageError:
            backend.close()
            raise
        print(f"{len(specs)} runs on backend {backend.name}, results in {folder}")
        summary = runner.run_plan(specs, backend, args.results, machine, fresh=args.fresh, live=sys.stdout.isatty())
    for line in summary.lines():
        print(line)
    return 1 if summary.failed else 0


def _refuse_without_data(specs: list[plan.RunSpec], args: argparse.Namespace) -> None:
    """Before anything runs: a full-size plan on synthetic digits would be published as if on MNIST."""
    problems = datasets.plan_problems(specs, smoke=args.smoke, allow_synthetic=args.allow_synthetic)
    if problems:
        raise UsageError("\n".join(problems))


def _run_fleet(args: argparse.Namespace, specs: list[plan.RunSpec]) -> int:
    """``run --hosts``: the same plan on every host of the file at once, one child ``suite run`` each."""
    from suite import engine, fleet

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
    names = ", ".join(h.name for h in hosts)
    print(f"{len(specs)} runs on each of {len(hosts)} hosts ({names}), results in {args.results}")
    return fleet.run_fleet(hosts, run_args, args.results, specs, probe=engine.why_not_answering)


def _check_writable(folder: Path) -> None:
    """Refuse a results folder that cannot hold results before anything runs, not after the first run."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as exc:
        raise UsageError(f"results folder {folder} cannot be created or written: {exc.strerror or exc}") from None


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
    if args.timeout <= 0:
        raise UsageError(f"--timeout {args.timeout}: must be > 0 seconds")
    if args.source:
        datasets.import_from(args.source)
    else:
        datasets.fetch(args.url, timeout=args.timeout)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from suite import report

    if not args.results.is_dir():
        raise UsageError(f"no results folder {args.results}; run `python -m suite run` first")
    written = report.write_reports(args.results, args.out, args.reference)
    for path in written:
        print(f"wrote {path}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """The first folder is the reference. Each folder's views are named after the folder."""
    import dataclasses

    from suite import compare
    from suite.views import load_views

    views = []
    for folder in args.folders:
        if not folder.is_dir():
            raise UsageError(f"{folder}: not a folder of result files")
        loaded = load_views(folder)
        if not loaded:
            raise UsageError(f"{folder}: holds no result files")
        views += [dataclasses.replace(v, machine=str(folder)) for v in loaded]
    print(compare.render(views, reference=str(args.folders[0]), title="Comparison"), end="")
    return 0


def cmd_images(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from suite import images

    try:
        if args.action == "list":
            rows = images.list_images(docker_host=args.docker_host)
            keys = ("name", "tag", "tensorflow", "cuda", "default_for", "state", "base", "base_digest")
            print(tabulate([[r[k] for k in keys] for r in rows], headers=keys, tablefmt="github"))
        elif args.action == "build":
            override = {"BASE_IMAGE": args.base} if args.base else None
            names = args.names or (images.needed_images() if args.needed else None)
            images.build_images(names, override, docker_host=args.docker_host, force=args.force)
        else:
            images.lock_images(args.names or None, docker_host=args.docker_host)
    except images.UnknownImage as exc:
        raise UsageError(str(exc)) from None
    except images.ImageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_env(args: argparse.Namespace) -> int:
    from suite import envinfo

    print(envinfo.render(envinfo.collect(docker_host=args.docker_host)))
    return 0


def cmd_schema(args: argparse.Namespace) -> int:
    import json

    from suite.schema import scenario_schema

    print(json.dumps(scenario_schema(), indent=2))
    return 0
