"""``python -m suite``: run, check, report, compare, reproduce, show, data, env, images, backends, schema.

Exit codes: 0 everything ran (skips included), 1 some run failed (the failure is recorded and
reported), 2 bad input (scenario, results or arguments), 130 interrupted.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from pathlib import Path
from typing import Any, NoReturn

from suite import backends, paths
from suite.cli.check import cmd_check
from suite.cli.commands import (
    cmd_backends,
    cmd_compare,
    cmd_data,
    cmd_env,
    cmd_images,
    cmd_report,
    cmd_reproduce,
    cmd_run,
    cmd_schema,
    cmd_show,
)
from suite.cli.common import DEFAULT_REPORTS, DEFAULT_RESULTS, UsageError
from suite.environment import datasets, mnist_fetch
from suite.record import code_identity, results, saving
from suite.report import provenance_text
from suite.run import results_folder
from suite.safe.markdown import escaped_lines
from suite.spec import names, plan, select
from suite.spec.scenario import ScenarioError
from suite.spec.settings import AUTO, MAX_REPEATS


def console() -> NoReturn:
    """The command line (``python -m suite``, the ``suite`` script): ``main``, then the exit.

    A command that ends holding records loaded frozen (report, compare: ``results.load_folder``)
    exits at once once its output is flushed: freeing 10,000 records object by object, then the
    interpreter's modules, would add a tenth to such a report, and those commands leave nothing else
    for exit to do (every file they write is closed, no thread runs). Other commands exit as usual.
    """
    code = main()
    if not results.held_frozen():
        sys.exit(code)
    for stream in (sys.stdout, sys.stderr):
        if stream is None:  # the process was started with it closed: nothing to flush
            continue
        try:
            stream.flush()
        except BrokenPipeError:
            code = code or 1  # the reader went away: as main treats it
        except OSError as exc:
            # What Python's own exit does where it cannot flush its streams: says so, exit code 120.
            with contextlib.suppress(OSError):
                os.write(2, f"error: the output could not be written: {exc.strerror or exc}\n".encode())
            code = 120
    os._exit(code)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    paths.code_digest()  # of the code as it is when the command starts, what its caches are keyed by
    try:
        return args.func(args)
    except (
        ScenarioError,
        results.ResultError,
        UsageError,
        backends.BackendUnavailable,
        results_folder.FolderBusy,
        datasets.BadSource,
        datasets.wdata.DataUnavailable,
        select.SelectError,
        names.UnsafeName,
    ) as exc:
        _error(exc)
        return 2
    except (datasets.FetchError, saving.Unsaved) as exc:
        _error(exc)
        return 1
    except RuntimeError as exc:
        # pathlib's resolve() on Python before 3.13 where a path given leads into a loop of links.
        found = re.fullmatch(r"Symlink loop from (.*)", str(exc), re.S)
        if found is None:
            raise
        _error(f"{found.group(1)}: a loop of symbolic links; allowed: a path that leads to a file or a folder")
        return 2
    except KeyboardInterrupt:
        print("interrupted; results written so far are kept", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader went away (`suite schema | head`): say nothing more, as a pipeline expects.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1


def _error(exc: Exception | str) -> None:
    """An error on stderr, each line with its control characters escaped: a message quotes input
    from elsewhere (a result's fields, a flag, a lock holder's host), and a terminal must show an
    escape sequence in it, not obey it."""
    print(escaped_lines(f"error: {exc}"), file=sys.stderr)


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
        "--budget",
        type=_duration,
        metavar="DURATION",
        help="start no run once this long has passed (2h, 90m, 1h30m, 600s); the rest waits for the next run",
    )
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
    c.add_argument(
        "--budget",
        type=_duration,
        metavar="DURATION",
        help="as for run: how many of the runs would start before this long has passed, by the estimates",
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
    d.add_argument(
        "--url", help=f"fetch: download from here (default: ${mnist_fetch.URL_ENV} or {mnist_fetch.MNIST_URL})"
    )
    d.add_argument(
        "--timeout",
        type=float,
        default=mnist_fetch.TIMEOUT_S,
        help=f"fetch: seconds without progress; the whole download may take at most ${mnist_fetch.DEADLINE_ENV} "
        f"seconds (default {mnist_fetch.DEADLINE_S:g})",
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


BUDGET_MAX_S = 30 * 24 * 3600


def _duration(text: str) -> tuple[str, float]:
    """``--budget``: (as given, seconds) from "2h", "90m", "1h30m", "45s" or a number of seconds."""
    match = re.fullmatch(r"(?:(\d+(?:\.\d+)?)h)?(?:(\d+(?:\.\d+)?)m)?(?:(\d+(?:\.\d+)?)s?)?", text.strip())
    if not text.strip() or match is None:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: a duration such as 2h, 90m, 1h30m or 600s")
    hours, minutes, seconds = (float(g) if g else 0.0 for g in match.groups())
    total = hours * 3600 + minutes * 60 + seconds
    if not 0 < total <= BUDGET_MAX_S:
        raise argparse.ArgumentTypeError(f"got {text!r}; allowed: more than 0 s and at most 30 days")
    return text.strip(), total


def _repeats(text: str) -> int | str:
    if text == AUTO:
        return AUTO
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"got {text!r}; allowed: an integer in [1, {MAX_REPEATS}], or {AUTO}"
        ) from None


def _scenario_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("scenarios", nargs="*", type=Path, help="scenario YAML files (default: every file in scenarios/)")
    p.add_argument("--smoke", action="store_true", help="smoke size: the scenarios' smoke overrides, 1 repetition")
    p.add_argument(
        "--repeats",
        type=_repeats,
        help=f"repetitions per point, 1 to {MAX_REPEATS}, or {AUTO}: 4, then more until each point's comparisons "
        "are within the precision (default: the scenario's)",
    )
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
