"""The handlers of run, report, compare, reproduce, show, images, backends, data, env and schema."""

from __future__ import annotations

import argparse
import json
import os
import sys

from suite import backends, paths
from suite.backends.base import is_pool
from suite.cli.common import (
    UsageError,
    backend_options,
    check_backend_flags,
    check_writable,
    display_path,
    make_backend,
    make_plan,
    refuse_without_data,
)
from suite.environment import datasets, host_facts, mnist_fetch
from suite.record import saving
from suite.run import closing, results_folder, runner
from suite.run.progress import NORMAL, QUIET, VERBOSE, runs_text
from suite.safe.markdown import escaped, escaped_lines
from suite.spec import plan


def cmd_run(args: argparse.Namespace) -> int:
    """Console: the plan and the results folder once, skips grouped by reason, a line per run that
    fits 120 columns, and at the end the answer per scenario. No colour is used (so NO_COLOR holds)."""
    level = QUIET if args.quiet else VERBOSE if args.verbose else NORMAL
    say = print if level > QUIET else (lambda _line: None)
    made = make_plan(args)
    specs = made.specs
    if args.select is not None or made.overrides:  # otherwise the plan's size is said below, with the backend
        for line in made.lines(args.select):
            say(line)
    check_backend_flags(args)
    if args.hosts is not None:
        refuse_without_data(specs, args)  # each host's GPUs are its own: every run counts
        return _run_fleet(args, specs)
    machine = args.machine or host_facts.machine_name()
    folder = results_folder.machine_dir(args.results, machine)
    check_writable(folder)
    live = sys.stdout.isatty() and level > QUIET
    with results_folder.hold_folder(folder, wait=args.wait):
        from suite.backends.lifeline import foreign_worker_lines

        for line in foreign_worker_lines(folder):  # said at every level: it slows every run of this plan
            print(f"warning: {line}", file=sys.stderr)
        for line in saving.kept_elsewhere(machine):
            print(f"warning: {line}", file=sys.stderr)
        backend = make_backend(args.backend, args, say)
        pooled = is_pool(backend)  # a pool of nodes: results in each node's machine folder
        try:  # runs this backend skips (a GPU point without a GPU) need no data
            refuse_without_data([s for s in specs if backend.skip_reason(s) is None], args)
            if pooled:
                from suite.backends.ray_cluster.placement import split_auto_points

                for line in split_auto_points(specs, backend.nodes(), backend.gpu_model):
                    print(f"warning: {line}", file=sys.stderr)
        except BaseException:  # a refusal, a cluster that stopped answering, Ctrl-C: run_plan never closes it
            backend.close()
            raise
        where = f" ({backend.where})" if pooled else ""
        say(
            f"{runs_text(len(specs))} on backend {backend.name}{where}, results in {args.results if pooled else folder}"
        )
        summary = runner.run_plan(
            specs,
            backend,
            args.results,
            machine,
            fresh=args.fresh,
            live=live,
            level=level,
            auto=True,
            budget=args.budget,
        )
        folders = results_folder.result_folders(args.results) if pooled else [folder]
    for line in closing.closing_lines(args.results, folders, specs + summary.added) + summary.lines():
        print(line)
    print(f"pages: python -m suite report --results {display_path(args.results)}")
    if summary.stopped:
        # A pool whose cluster went away: every result is saved (fsync'ed), and what is left of the
        # Ray client only blocks until Ray ends the process itself, a minute on, without a word.
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(1)
    return 1 if summary.failed else 0


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
    for line in fleet.shared_engines(hosts, docker_engine.engine_id):
        print(line, file=sys.stderr)
    for host in hosts:
        check_writable(results_folder.machine_dir(args.results, host.name))
    run_args = [str(display_path(f)) for f in args.scenarios]
    run_args += ["--smoke"] * args.smoke + ["--fresh"] * args.fresh + ["--wait"] * args.wait
    run_args += ["--allow-synthetic"] * args.allow_synthetic
    if args.budget is not None:
        run_args += ["--budget", args.budget[0]]
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


def cmd_backends(args: argparse.Namespace) -> int:
    if args.prepare:
        failed = backends.prepare(args.prepare, backend_options(args))
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
        raise UsageError(f"--timeout {args.timeout:.15g}: allowed: seconds above 0, at most 86400")
    if args.source:
        mnist_fetch.import_from(args.source)
    else:
        mnist_fetch.fetch(args.url, timeout=args.timeout)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from suite.record import results
    from suite.report import figures, pages, up_to_date

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
        where = "report -k writes only into a folder of its own there" if args.select else "give the folder it leads to"
        raise UsageError(f"{out}: a link; {where}")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise UsageError(f"--out {args.out}: cannot be the report folder ({exc.strerror})") from None
    try:
        read = results.read_folder(args.results)
    except OSError as exc:  # a folder gone or unreadable while its files are listed
        raise UsageError(f"--results {args.results}: cannot be read ({exc.strerror or exc}: {exc.filename})") from None
    options = {"formats": sorted(formats), "reference": args.reference, "select": args.select}
    last = up_to_date.LastReport(out, args.results)
    if (unchanged := last.unchanged_files(up_to_date.inputs_digest(read, args.results, out, options))) is not None:
        for path in unchanged:
            print(f"unchanged {path}")
        print(f"{out}: as written before from these {len(read):,} result files, options and code; nothing rewritten")
    else:
        try:
            # Decoded once for the pages and the exports; frozen, as this command ends after it (load_folder).
            loaded = results.load_folder(args.results, frozen=True, read=read, slim=True)
            # The pages read each scenario file once, and the entry keeps the sha256 of those bytes.
            scenarios = up_to_date.ScenarioFiles()
            written = []
            if "md" in formats:
                written += pages.write_reports(args.results, out, args.reference, args.select, loaded, scenarios)
            written += figures.write_exports(args.results, loaded, out, formats, args.select)
        except pages.UnknownReference as exc:
            raise UsageError(str(exc)) from None
        except OSError as exc:  # a full disk: each page is replaced whole or not at all, so none is cut off
            print(f"error: cannot write the report into {out}: {exc.strerror or exc} ({exc.filename})", file=sys.stderr)
            return 1
        inputs = up_to_date.inputs_digest(read, args.results, out, options)  # of the bytes decoded (load_folder)
        last.save(inputs, scenarios.digests(), written)
        for path, _ in written:
            print(f"wrote {path}")
    if args.select is not None:
        full = (
            f"the full report in {args.out} is as it was"
            if (args.out / "README.md").is_file()
            else f"{args.out} holds no full report (`report` without -k writes it)"
        )
        print(f"-k {args.select!r}: the pages it takes are in {out}; {full}")
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
    first, second = args.folders
    if os.path.samefile(first, second):  # its runs would fill both columns, under one name or two
        raise UsageError(f"{first} and {second} are one folder: compare takes two different results folders")
    inner, outer = (first, second) if first.resolve().is_relative_to(second.resolve()) else (second, first)
    if inner.resolve().is_relative_to(outer.resolve()):  # the inner folder's runs would fill both columns
        raise UsageError(f"{inner} lies inside {outer}: compare takes two results folders that do not hold each other")
    for folder in args.folders:
        every = load_views(folder)
        if not every:
            raise UsageError(f"{folder}: holds no result files")
        # The scenario files' own settings, as hardware.md compares them: a --set run stands in for none.
        loaded = [v for v in every if not v.overrides]
        if not loaded:
            raise UsageError(f"{folder}: holds only runs made with --set; compare takes the scenario files' settings")
        machines = sorted({v.machine for v in loaded})
        if len(machines) > 1:  # one column per folder: several machines' runs would be mixed in it
            raise UsageError(
                f"{folder}: holds the results of {len(machines)} machines ({', '.join(machines)}); give the "
                "folder of one machine's results"
            )
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

    # A line may name a record's point (its label, from any machine): a control character in it is
    # shown as its escape, never obeyed by the terminal.
    def say(line: str) -> None:
        print(escaped_lines(line), file=sys.stderr if args.json else sys.stdout)

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
    print("".join(escaped(line) + "\n" for line in show.render_lines(args.result, result)), end="")
    return 0


def cmd_images(args: argparse.Namespace) -> int:
    from tabulate import tabulate

    from suite.environment import images, images_lock

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
            images_lock.lock_images(args.names or None, docker_host=args.docker_host)
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
