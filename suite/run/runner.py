"""Run a plan: each spec through the backend, each result saved the moment it exists.

Resume is by fingerprint: a (fingerprint, repetition) with an ``ok`` result is not run again
unless ``fresh``. Results are saved one by one, so a run killed halfway loses only the run in
flight (hyperfine's rule: export after every benchmark).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import signal
import stat
import sys
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from suite.backends.base import Backend, is_pool
from suite.record import results, saving, under_load
from suite.record.results import FAILED, FIT_S, STATUS_OK, STATUS_SKIPPED, TEST_ACCURACY
from suite.report import points, reasons, stats
from suite.run import executors
from suite.run.progress import NORMAL, QUIET, VERBOSE, WIDTH, Progress, Ticker, fit_line, fits, runs_text, shorten
from suite.run.results_folder import machine_dir
from suite.safe.console import fitted
from suite.spec import names
from suite.spec.plan import RunSpec, parse_device
from suite.spec.settings import AUTO

# A run that ended ok but trained below the accuracy gate: counted apart from ok, as the pages do.
BELOW_GATE = "below the accuracy gate"
ALREADY_DONE = "already done"
_COUNT_ORDER = (STATUS_OK, BELOW_GATE, *FAILED, STATUS_SKIPPED, ALREADY_DONE)


def count_key(result: results.RunResult) -> str:
    """What a result counts as in a summary: its status, or BELOW_GATE for an ok run under the gate."""
    return BELOW_GATE if result.ok and _below_gate(TEST_ACCURACY.of(result)) else result.status


def _below_gate(accuracy: float | None) -> bool:
    """A test accuracy recorded and under the gate (a worker records one for every ok run)."""
    return accuracy is not None and accuracy < points.ACCURACY_GATE


def counts_text(counts: Counter) -> str:
    """'2 ok, 1 below the accuracy gate, 37 skipped': ok first, then the others, "already done" last."""
    order = {k: i for i, k in enumerate(_COUNT_ORDER)}
    keys = sorted(counts, key=lambda k: (order.get(k.split(",")[0], len(order)), k))
    return ", ".join(f"{counts[k]} {k}" for k in keys if counts[k]) or "none"


@dataclass
class Summary:
    counts: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    stopped: str | None = None  # why the plan ended before its last run (a pool's cluster went away)
    added: list[RunSpec] = field(default_factory=list)  # repeats: auto's second stage, beyond the specs given
    budget: str | None = None  # run --budget, as given
    unstarted: int = 0  # runs the budget left for the next run

    @property
    def failed(self) -> bool:
        return bool(self.stopped) or any(self.counts[s] for s in FAILED)

    def lines(self) -> list[str]:
        out = [f"runs: {counts_text(self.counts)}"]
        if any(self.counts[s] for s in FAILED):
            out.append("some runs failed; they are recorded with their status and shown in the report:")
            out += [f"  {f}" for f in self.failures]
        if self.stopped:
            out.append(f"the plan stopped early: {self.stopped}")
        if self.unstarted:
            out.append(
                f"--budget {self.budget} spent: {runs_text(self.unstarted)} not started; "
                "run the same command again to go on"
            )
        return out


@dataclass
class _Step:
    """One spec and what the plan does with it, decided before the first run so the ETA knows the work."""

    spec: RunSpec
    action: str  # "done" (ok on file), "skip-again" (same skip on file), "skip", "run"
    reason: str | None = None
    number: int = 0  # among the runs that run, from 1 (0: not one of them)
    of: int = 0  # how many runs run
    reps: int = 1  # repetitions of the point in the plan

    def head(self) -> str:
        """'[3/8] scenario [point] run 2 of 3': runs and repetitions both counted from 1."""
        return self.line("")[: -len(": ")]

    def line(self, tail: str, width: int | None = WIDTH, note: str = "") -> str:
        """The step's head, ``note`` after it (" on node-a"), then ``tail``; in ``width`` columns,
        or whole where ``width`` is None."""
        before, after = self._parts(tail, note)
        return fit_line(before, self.spec.point_label, after, width or sys.maxsize)  # None: whole, on one line

    def fitting(self, tails: list[str], note: str = "") -> str:
        """The line of the first of ``tails`` that fits WIDTH without cutting the point label below
        its floor; the last one, cut to fit, where none does."""
        for tail in tails:
            before, after = self._parts(tail, note)
            if fits(before, self.spec.point_label, after):
                return fit_line(before, self.spec.point_label, after)
        return self.line(tails[-1], WIDTH, note)

    def _parts(self, tail: str, note: str) -> tuple[str, str]:
        before = (f"[{self.number}/{self.of}] " if self.number else "") + f"{self.spec.scenario} "
        return before, f" run {self.spec.repetition + 1} of {self.reps}{note}: {tail}"


def _steps(specs: list[RunSpec], backend: executors.Runs, previous: dict) -> list[_Step]:
    reps: Counter = Counter()
    for spec in specs:
        reps[spec.fingerprint] = max(reps[spec.fingerprint], spec.repetition + 1)
    steps = []
    for spec in specs:
        before = previous.get((spec.fingerprint, spec.repetition))
        if before is not None and before.ok:
            steps.append(_Step(spec, "done", reps=reps[spec.fingerprint]))
            continue
        reason = backend.skip_reason(spec)
        if reason and before is not None and before.status == STATUS_SKIPPED and before.message == reason:
            steps.append(_Step(spec, "skip-again", reason, reps=reps[spec.fingerprint]))
        else:
            steps.append(_Step(spec, "skip" if reason else "run", reason, reps=reps[spec.fingerprint]))
    to_run = [s for s in steps if s.action == "run"]
    for i, step in enumerate(to_run, 1):
        step.number, step.of = i, len(to_run)
    return steps


def _start_plan(
    progress: Progress, steps: list[_Step], earlier: dict[str, list[float]] | None, first_stage: bool = False
) -> None:
    """Tell ``progress`` the work, and say once what the plan does: the skips grouped by reason, the
    runs already done, how many run and when the plan should end. ``earlier`` (the seconds of the
    runs on file, by point key) is None where the end cannot be foretold (a pool's runs go at once).
    ``first_stage``: the steps are the first stage of ``repeats: auto``, which more runs may follow."""
    to_run = [s.spec for s in steps if s.action == "run"]
    eta = earlier is not None
    if eta:
        progress.plan([s.fingerprint for s in to_run], {s.fingerprint: s.timeout_s for s in to_run}, earlier)
    for text in _skip_lines(steps):
        progress.line(text)
    done = sum(1 for s in steps if s.action == "done")
    if done:
        progress.line(f"{runs_text(done)} already done (ok result on file; --fresh reruns)")
    if not to_run:
        progress.line("nothing to run in the first stage of repeats: auto" if first_stage else "nothing to run")
    elif eta:  # a pool says instead how many runs it submitted
        progress.line(f"{runs_text(len(to_run))} to run; {progress.eta_text()} ({progress.eta_basis()})")


def _skip_lines(steps: list[_Step]) -> list[str]:
    """One line per skip reason, in its short form (the full reason is in each result file):
    "6 GPU points skipped: needs 1 GPU(s); this machine has no GPU"."""
    groups: dict[str, list[_Step]] = {}
    for step in steps:
        if step.action in ("skip", "skip-again") and step.reason:
            groups.setdefault(reasons.short_reason(step.reason), []).append(step)
    return [
        skip_line([s.spec for s in group], reason, again=all(s.action == "skip-again" for s in group))
        for reason, group in groups.items()
    ]


def skip_line(specs: list[RunSpec], reason: str, again: bool = False) -> str:
    """ "6 GPU points (12 runs) skipped: <reason>" within WIDTH, the reason cut to its first clause
    where it would not fit (the result files, and ``check``'s lines below it, hold it whole)."""
    npoints = len({(s.scenario, s.point_label) for s in specs})
    kinds = {parse_device(s.device)[0] for s in specs}
    kind = f"{kinds.pop().upper()} " if len(kinds) == 1 else ""
    runs = f" ({len(specs)} runs)" if len(specs) != npoints else ""
    head = f"{npoints} {kind}point{'' if npoints == 1 else 's'}{runs} skipped"
    head += f"{', as recorded before' if again else ''}: "
    if len(head) + len(reason) > WIDTH:
        reason = reason.split("; ")[0]  # its first clause
    return shorten(head + reason, WIDTH)


def run_plan(
    specs: list[RunSpec],
    backend: Backend | Any,
    results_dir: Path,
    machine: str,
    *,
    fresh: bool = False,
    say: Callable[[str], None] = print,
    live: bool = False,
    clock: Callable[[], float] = time.monotonic,
    level: int = NORMAL,
    auto: bool = False,
    budget: tuple[str, float] | None = None,
) -> Summary:
    """Run every spec of the plan and save each result the moment it exists: in order on this
    machine's backend, or, on a pool of nodes (``is_pool``: Ray's), all submitted at once in the
    plan's interleaved order, each result saved under the machine folder of the node that ran it.

    The plan's rules are the same for both: resume by fingerprint (``fresh`` runs all again), the
    same skip records, one summary. Ctrl-C or SIGTERM stops what runs (a pool's tasks each remove
    their container) after the results that already arrived are saved.

    live: keep a status line (run, epoch, elapsed, plan ETA) on stdout, a terminal; otherwise only
        the line each run prints when it ends.
    level: QUIET (failures only), NORMAL (a line per run that runs), VERBOSE (a line per spec, with
        its result file).
    auto: points of ``repeats: auto`` take their second stage once the plan's first is on file
        (``second_stage``); without it the plan is the specs given (reproduce reruns them as recorded).
    budget: (as given, seconds): no run starts once that long has passed since the plan began; the
        runs left are not recorded, so the next ``run`` takes them up. A pool's board refuses a task
        that Ray starts later, by the board's clock (``Runs.close_starts_in``).
    """
    summary = Summary(budget=budget[0] if budget else None)
    deadline = clock() + budget[1] if budget else None
    runs: executors.Runs = executors.Pooled(backend) if is_pool(backend) else executors.InOrder(backend, machine)
    progress = Progress(say=say, stream=sys.stdout if live else None, clock=clock, level=level)
    old_handlers = _stop_signals_as_interrupt()
    by_run: dict[tuple[str, int], _Step] = {}

    def save(made: executors.Made) -> None:
        step = by_run.get((made.spec.fingerprint, made.spec.repetition)) or _Step(made.spec, "run")
        _save(made, results_dir, step, summary, progress, runs)

    def spent() -> bool:
        return deadline is not None and clock() >= deadline

    try:
        if deadline is not None:
            runs.close_starts_in(max(0.0, deadline - clock()))
        previous, earlier = runs.on_file(results_dir, fresh)
        steps = _steps(specs, runs, previous)
        staged = auto and any((s.report.get("repeats") or {}).get(AUTO) for s in specs)
        _start_plan(progress, steps, earlier, first_stage=staged)
        by_run.update({(s.spec.fingerprint, s.spec.repetition): s for s in steps})
        with Ticker(progress):
            _walk_and_collect(steps, runs, summary, progress, save, spent)
            summary.stopped = summary.stopped or runs.gone  # a pool's cluster gone: no second stage
            on_file = runs.on_file(results_dir, False)[0] if auto and not summary.stopped else {}
            more = second_stage(specs, on_file)
            summary.added = more
            if more:
                progress.line(f"repeats: auto: the first stage's spreads ask for {runs_text(len(more))} more")
                steps = _steps(more, runs, {} if fresh else on_file)
                _start_plan(progress, steps, earlier)
                by_run.update({(s.spec.fingerprint, s.spec.repetition): s for s in steps})
                _walk_and_collect(steps, runs, summary, progress, save, spent)
            if summary.stopped:  # stop the rest, keep what has come back
                for made in runs.stop(progress.line):
                    save(made)
        summary.stopped = summary.stopped or runs.gone
        summary.unstarted += runs.unstarted
    except BaseException:  # noqa: BLE001 - Ctrl-C, SIGTERM, a lost cluster: nothing may outlive the plan
        try:
            runs.stop(progress.line)
        finally:
            # What is held is saved, also after another Ctrl-C during the stop: the results taken
            # before and not saved yet, and the runs that ended while the others were stopped.
            for made in runs.held():
                save(made)
        raise
    finally:
        progress.close()
        _restore_signals(old_handlers)
        runs.close()
    return summary


def auto_counts(specs: list[RunSpec], on_file: dict) -> dict[str, int]:
    """Fingerprint -> the count of each ``repeats: auto`` point whose first stage is on file, all ok
    and timed: the runs that stage's spread of log fit times sets (``stats.two_stage_count``); the
    first stage alone where a run of it is below the accuracy gate (the point is kept out of every
    verdict: more runs would narrow an interval nothing concludes from). A point whose first stage
    is not whole has no count yet."""
    counts: dict[str, int] = {}
    for spec in specs:
        rule = (spec.report.get("repeats") or {}).get(AUTO)
        if not rule or spec.fingerprint in counts:
            continue
        found = [on_file.get((spec.fingerprint, r)) for r in range(rule["first"])]
        first = [float(FIT_S.of(r)) for r in found if r is not None and r.ok and FIT_S.of(r)]
        if len(first) == rule["first"] and any(r is not None and _below_gate(TEST_ACCURACY.of(r)) for r in found):
            counts[spec.fingerprint] = int(rule["first"])
        elif len(first) == rule["first"]:
            var = np.log(first).var(ddof=1)
            counts[spec.fingerprint] = int(
                stats.two_stage_count(var, rule["precision"], rule["max_repeats"], rule["first"])
            )
    return counts


def second_stage(specs: list[RunSpec], on_file: dict) -> list[RunSpec]:
    """The runs ``repeats: auto`` adds to each point with a count (``auto_counts``), in the plan's
    interleaved order. A point whose first stage is not all ok takes no more (its counts stay fixed)."""
    counts = auto_counts(specs, on_file)
    extra: list[RunSpec] = []
    seen: set[str] = set()
    for spec in specs:
        if spec.fingerprint not in counts or spec.fingerprint in seen:
            continue
        seen.add(spec.fingerprint)
        start = int(spec.report["repeats"][AUTO]["first"])
        extra += [dataclasses.replace(spec, repetition=r) for r in range(start, counts[spec.fingerprint])]
    extra.sort(key=lambda s: (s.repetition, s.order))
    return [dataclasses.replace(s, order=len(specs) + i) for i, s in enumerate(extra)]


def _walk_and_collect(
    steps: list[_Step],
    runs: executors.Runs,
    summary: Summary,
    progress: Progress,
    save: Callable[[executors.Made], None],
    spent: Callable[[], bool],
) -> None:
    """Every step of ``steps`` run, or submitted and collected (a pool), unless the plan stopped."""
    _walk(steps, runs, summary, progress, save, spent)
    if runs.pending and not summary.stopped:
        progress.line(runs.submitted_text())
    while runs.pending and not summary.stopped:
        for made in runs.collect():
            save(made)


def _walk(
    steps: list[_Step],
    runs: executors.Runs,
    summary: Summary,
    progress: Progress,
    save: Callable[[executors.Made], None],
    spent: Callable[[], bool],
) -> None:
    """Each step in plan order: counted when done or skipped as before, its skip record saved, or
    its run made (in order: here and now; a pool's: submitted), unless the budget is ``spent``: then
    counted as not started. Stops at a result that could not be saved: the next would meet the same
    full disk."""
    for step in steps:
        spec = step.spec
        if step.action == "done":
            summary.counts[ALREADY_DONE] += 1
            progress.line(step.line("already done (ok result on file; --fresh reruns)", None), VERBOSE)
        elif step.action == "skip-again":
            summary.counts[STATUS_SKIPPED] += 1
            progress.line(step.line(f"skipped, as recorded before: {step.reason}", None), VERBOSE)
        elif step.reason:
            save(executors.Made(spec, runs.machine, runs.skipped(spec, step.reason)))
        elif spent():
            summary.unstarted += 1
        else:
            runs.submit(spec, step.head(), progress)
            for made in runs.ready():  # in order: the run just made; a pool's come in collect
                save(made)
        if summary.stopped:
            return


def _saved(result: results.RunResult, folder: Path, spec: RunSpec, summary: Summary, progress: Progress) -> Path | None:
    """``saving.save``; None where it could not save the result where it belongs: then the record
    was kept elsewhere (the line says where), and ``summary.stopped`` ends the plan, whose next
    results would meet the same full disk or unwritable folder."""
    try:
        return saving.save(result, folder, spec.run_id)
    except saving.Unsaved as exc:
        progress.line(f"error: {exc}", QUIET)
        summary.stopped = f"a result could not be saved in {folder} (above); rerun when it can, to resume"
        return None


def _count(summary: Summary, step: _Step, result: results.RunResult) -> None:
    summary.counts[count_key(result)] += 1
    if result.status in FAILED:
        first = result.message.splitlines()[0] if result.message else ""
        summary.failures.append(shorten(f"{step.head()}: {result.status}: {first}", WIDTH - 2))


def _say_result(
    progress: Progress, step: _Step, result: results.RunResult, took: str, path: Path, note: str = ""
) -> None:
    """The run's line: its outcome, how long it took and the plan's ETA after it; a failure's first
    line of message at the end (cut to fit; whole, with the result file, under -v)."""
    eta = progress.eta_text() if progress.remaining else ""
    what, message = _outcome(result)
    load = under_load.load_note(result)  # "measured while other processes used 85% of a core": a line of its own
    if progress.level >= VERBOSE:
        progress.line(step.line(f"{_tail(what, message[:200], took, eta)} -> {path}", None, note), VERBOSE)
    else:
        # What gives way when the line is too long: the ETA, then the run's time (the next line and
        # the result file have them), never the outcome.
        tails = [_tail(what, message, took, eta)]
        if not message:  # a failure's message stands last and is cut instead
            tails += [_tail(what, "", took, ""), what]
        progress.line(step.fitting(tails, note), QUIET if result.status in FAILED else NORMAL)
    if load:
        progress.line("\n".join(fitted(f"  {load}", 4)), NORMAL)


def _tail(what: str, message: str, took: str, eta: str) -> str:
    times = "; ".join(t for t in (took, eta) if t)
    return what + (f" ({times})" if times else "") + (f": {message}" if message else "")


def _outcome(result: results.RunResult) -> tuple[str, str]:
    """(what became of the run, its message's first line for one that did not end ok)."""
    if not result.ok:
        return result.status, result.message.splitlines()[0] if result.message else ""
    accuracy, fit = TEST_ACCURACY.of(result), FIT_S.of(result)
    if _below_gate(accuracy):
        return points.gate_text(accuracy), ""
    if fit is None or accuracy is None:
        return STATUS_OK, ""
    return f"ok, fit {fit:.2f} s, test accuracy {accuracy:.3f}", ""


def _save(
    made: executors.Made, results_dir: Path, step: _Step, summary: Summary, progress: Progress, runs: executors.Runs
) -> None:
    """Save one result where it belongs and say so; a lost run that is being retried is counted
    apart (its retry's own result is the run's last word, and counts). ``runs`` is told the moment
    the result is on file (before anything that can fail or wait): a pool holds it until then."""
    result, spec, machine = made.result, made.spec, made.machine
    if not names.is_safe(machine):  # a node's label chose it: never a path outside the results folder
        safe = "unsafe-label-" + hashlib.sha256(str(machine).encode()).hexdigest()[:12]
        progress.line(f"a node's machine name {machine!r} is not a safe folder name; its result goes to {safe}/")
        if isinstance(result.run, dict) and result.run.get("machine") == machine:
            # The record names the folder it lies in, as every reader checks it (a report would
            # refuse the label); the label itself is kept beside it.
            result.run["machine"], result.run["machine_label"] = safe, machine
        machine = safe
    path = _saved(result, machine_dir(results_dir, machine) / spec.scenario, spec, summary, progress)
    runs.saved(made)  # on file, or kept elsewhere as the line above says
    if path is None:
        _count(summary, step, result)
        return
    if made.retried:
        summary.counts[f"{count_key(result)}, retried"] += 1
    else:
        _count(summary, step, result)
    note = (" (retry)" if made.retry else "") + (f" on {machine}" if runs.names_machine else "")
    if result.status == STATUS_SKIPPED and step.action == "skip":  # said once, grouped, when the plan started
        progress.line(step.line(f"skipped: {result.message} -> {path}", None, note), VERBOSE)
        return
    _say_result(progress, step, result, made.took, path, note)


# A hangup (the terminal closed, the ssh link dropped) stops a plan as SIGTERM does, not by the
# default action, which ends the process at once: no worker stopped, no temp folder removed.
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)


def _stop_signals_as_interrupt() -> dict[int, Any]:
    """Make STOP_SIGNALS raise KeyboardInterrupt (Ctrl-C's path: the run in flight stopped, what was
    saved kept, exit code 130); the handlers they had, for ``_restore_signals``."""
    return {signum: signal.signal(signum, _sigterm_as_interrupt) for signum in STOP_SIGNALS}


def _restore_signals(handlers: dict[int, Any]) -> None:
    for signum, handler in handlers.items():
        signal.signal(signum, handler)


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    if signum == signal.SIGHUP:
        leave_a_hung_up_terminal()
    raise KeyboardInterrupt(f"signal {signum}")


def leave_a_hung_up_terminal() -> None:
    """Point stdout and stderr at /dev/null where they are a terminal that hung up: a write to it
    fails (EIO), and the stop must not fail on its last words. A hung-up terminal is still a
    character device but no longer answers as a terminal (``isatty``); a live one (SIGHUP sent by
    hand), files and pipes are kept."""
    try:
        null = os.open(os.devnull, os.O_WRONLY)
    except OSError:
        return
    try:
        null_device = os.fstat(null).st_rdev
        for stream in (sys.stdout, sys.stderr):
            try:
                fd = stream.fileno()
                info = os.fstat(fd)
                if stat.S_ISCHR(info.st_mode) and info.st_rdev != null_device and not os.isatty(fd):
                    os.dup2(null, fd)
            except (OSError, ValueError):
                continue
    finally:
        os.close(null)
