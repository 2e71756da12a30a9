"""``suite reproduce``: the steps in order: read the inputs, check them against this machine, rerun,
compare, say the verdicts."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from suite import backends
from suite.environment import host_facts, image_catalog
from suite.record import results, saving
from suite.record.results import RunResult
from suite.reproduce.comparison import collect, compare_point, render
from suite.reproduce.here import NOTE_PREFIXES, advice, current_docker, current_local, differences_in_files
from suite.reproduce.originals import (
    Original,
    ReproduceError,
    all_points,
    files_text,
    load_inputs,
    rerun_specs,
    select_points,
    spec_of,
    superseded_text,
    take_points,
)
from suite.run import results_folder, runner
from suite.safe.markdown import escaped, escaped_lines
from suite.spec.settings import MAX_REPEATS


class Refused(Exception):
    """The results do not fit this checkout or machine; the message lists why and what to do."""


@dataclass
class Options:
    inputs: list[Path]
    backend: str | None  # None: each point's recorded backend
    docker_host: str | None
    results_dir: Path | None  # None: a new reproduce/<UTC timestamp>/ here
    repeats: int | None
    tolerance: float  # a fraction
    anyway: bool
    as_json: bool
    select: str | None = None  # -k EXPR: only the points it takes


def new_results_dir(base: Path, now: datetime | None = None) -> Path:
    """``base/reproduce/<UTC timestamp>``, made now; a suffix where that name is taken (never reused)."""
    stamp = (now or datetime.now(UTC)).strftime("%Y%m%dT%H%M%SZ")
    parent = base / "reproduce"
    try:
        parent.mkdir(parents=True, exist_ok=True)
        for attempt in range(1, 1000):
            folder = parent / (stamp if attempt == 1 else f"{stamp}-{attempt}")
            try:
                folder.mkdir()
                return folder
            except FileExistsError:
                continue
    except OSError as exc:
        raise ReproduceError(f"results folder {parent} cannot be created: {exc.strerror or exc}") from None
    raise ReproduceError(f"{parent}: no free folder name for {stamp}")


def _check_writable(folder: Path) -> None:
    problem = saving.unwritable(folder)
    if problem:
        raise ReproduceError(problem)


def _result_files(folder: Path) -> set[Path]:
    return set(results.result_paths(folder))  # as every reader lists them


def reproduce(opts: Options, say: Callable[[str], None] = print) -> int:
    """The command: check, rerun, compare; returns the exit code (0 every point reproduced, 1 not).

    Raises ReproduceError (bad input) or Refused (differences, without ``--anyway``) before anything runs.
    """
    if opts.repeats is not None and not 1 <= opts.repeats <= MAX_REPEATS:
        raise ReproduceError(f"--repeats {opts.repeats}: allowed: an integer in [1, {MAX_REPEATS}]")
    if not 0 < opts.tolerance < 1:
        raise ReproduceError(f"--tolerance {opts.tolerance * 100:g}: must be above 0 and below 100 (percent)")
    loaded = load_inputs(opts.inputs)
    named = {p.resolve() for p in opts.inputs if not p.is_dir()}
    points, left_out = take_points(select_points(all_points(loaded), opts.select), named)
    for line in left_out:
        say(line)
    if not points:
        if left_out:
            raise ReproduceError("nothing to rerun: no point given has an ok run to compare with")
        raise ReproduceError("no result files given")
    for point in points:  # every recorded config is checked as run checks a scenario, before anything starts
        spec_of(point)
    dropped = superseded_text(points)
    if dropped:
        say(dropped)
    names = {p.fingerprint: opts.backend or p.backend for p in points}  # fingerprint -> backend asked
    machine = host_facts.machine_name()
    made: dict[str, tuple[str, Any]] = {}  # backend asked -> (its name, the backend)
    try:
        for name in dict.fromkeys(names.values()):
            made[name] = _make_backend(name, opts, machine, say)
        diffs = _check(points, {p.fingerprint: made[names[p.fingerprint]] for p in points}, opts.anyway)
        folder = opts.results_dir if opts.results_dir is not None else new_results_dir(Path.cwd())
        machine_folder = results_folder.machine_dir(folder, machine)
        _check_writable(machine_folder)
        reruns = _rerun(points, opts, made, names, machine_folder, say)
    finally:
        for _, backend in made.values():
            backend.close()
    compared = []
    for p in points:
        mine = sorted(reruns.get(p.fingerprint, []), key=lambda item: int(item[1].spec.get("repetition", 0)))
        lines, notes, where = diffs[p.fingerprint]
        row = compare_point(p, [r for _, r in mine], opts.tolerance, (lines, notes), made[names[p.fingerprint]][0])
        row["difference_files"] = {d: [str(f) for f in where.get(d, [])] for d in [*lines, *notes]}
        row["rerun"]["files"] = [str(path) for path, _ in mine]
        compared.append(row)
    data = collect(compared, opts.tolerance, folder, opts.anyway, opts.inputs, left_out)
    if opts.as_json:
        print(json.dumps(data, indent=1, allow_nan=False))
    else:
        print()
        print(escaped_lines(render(data)), end="")  # the records' labels and facts, as they hold them
    return 0 if data["reproduced"] else 1


def _make_backend(name: str, opts: Options, machine: str, say: Callable[[str], None]) -> tuple[str, Any]:
    """(name, backend) for a backend asked by name, ``auto`` resolved; BackendUnavailable when it cannot work here."""
    options = backends.BackendOptions(
        machine=machine, results_dir=opts.results_dir or Path.cwd() / "reproduce", docker_host=opts.docker_host
    )
    if name == backends.AUTO:
        name, why = backends.choose(options)
        say(f"backend: {name} ({why})")
    try:
        return name, backends.make(name, options)
    except backends.BackendUnavailable as exc:
        if opts.backend is not None:
            raise  # asked for with --backend: the message names that flag rightly
        # The backend came from the results, not from a flag: say so, and how to get it or another.
        text = str(exc).removeprefix(f"--backend {name}: ")
        raise ReproduceError(
            f"the results were recorded by the {name} backend, and it cannot run here: {text} "
            "(another backend is not the setup the results recorded)"
        ) from None


def _check(
    points: list[Original], backend_of: dict[str, tuple[str, Any]], anyway: bool
) -> dict[str, tuple[list[str], list[str], dict[str, list[Path]]]]:
    """fingerprint -> (differences, notes, line -> files) of each point against what its rerun would
    get here; Refused, listing each difference with the files it applies to and what to do, where
    any differ and not ``anyway``."""
    diffs, heres = {}, []
    for p in points:
        chosen, backend = backend_of[p.fingerprint]
        try:
            here = current_docker(backend, spec_of(p)) if chosen == "docker" else current_local()
        except image_catalog.ImageError as exc:
            raise ReproduceError(str(exc)) from None
        heres.append(here)
        where = differences_in_files(p, here)
        notes = [line for line in where if line.startswith(NOTE_PREFIXES)]
        diffs[p.fingerprint] = ([line for line in where if line not in notes], notes, where)
    found = [
        f"  {p.label}: {d}\n    in {files_text(diffs[p.fingerprint][2].get(d, p.files))}"
        for p in points
        for d in diffs[p.fingerprint][0]
    ]
    if not found or anyway:
        return diffs
    dirty = {  # the modified trees the results were made from that this checkout's tree is not
        json.dumps(s, sort_keys=True): s
        for p, here in zip(points, heres, strict=True)
        for prov in p.provenance
        if prov and (s := prov.get("suite") or {}).get("git_dirty") and s != here.provenance.get("suite")
    }
    raise Refused(
        "the results do not fit this checkout and machine; nothing was run:\n"
        + "\n".join(dict.fromkeys(found))
        + "\nto reproduce exactly: "
        + escaped(  # one line, whatever the records' names hold
            advice(
                [d for p in points for d in diffs[p.fingerprint][0]],
                _recorded(points, "suite", "git_revision"),
                sorted({h.image_name for h in heres if h.image_name}),
                _recorded(points, "environment", "lock_file"),
                list(dirty.values()),
                heres[0].provenance.get("environment") if heres else None,
            )
        )
    )


def _recorded(points: list[Original], block: str, key: str) -> list[str]:
    """Every value the points' provenance records under ``block.key``, sorted."""
    return sorted({str(v) for p in points for prov in p.provenance if prov and (v := (prov.get(block) or {}).get(key))})


def _rerun(
    points: list[Original],
    opts: Options,
    made: dict[str, tuple[str, Any]],
    names: dict[str, str],
    machine_folder: Path,
    say: Callable[[str], None],
) -> dict[str, list[tuple[Path, RunResult]]]:
    """Run every point's reruns, backend by backend, into ``machine_folder``; fingerprint -> the
    (file, result) pairs this call saved (files there before are not counted)."""
    specs = rerun_specs(points, opts.repeats)
    reruns: dict[str, list[tuple[Path, RunResult]]] = {}
    folder, machine = machine_folder.parent, machine_folder.name
    with results_folder.hold_folder(machine_folder):
        before = _result_files(machine_folder)
        for name, (chosen, backend) in made.items():
            mine = [s for s in specs if names[s.fingerprint] == name]
            if not mine:
                continue
            say(f"{len(mine)} rerun(s) on backend {chosen}, results in {machine_folder}")
            live = not opts.as_json and sys.stdout.isatty()
            summary = runner.run_plan(mine, backend, folder, machine, fresh=True, say=say, live=live)
            for line in summary.lines():
                say(line)
        for path in sorted(_result_files(machine_folder) - before):
            result = results.load(path)
            reruns.setdefault(result.fingerprint, []).append((path, result))
    return reruns
