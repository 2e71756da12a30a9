"""Run a plan: each spec through the backend, each result saved the moment it exists.

Resume is by fingerprint: a (fingerprint, repetition) with an ``ok`` result is not run again
unless ``fresh``. Results are saved one by one, so a run killed halfway loses only the run in
flight (hyperfine's rule: export after every benchmark).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import inspect
import json
import os
import signal
import socket
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from suite import results
from suite.backends.base import Backend
from suite.plan import RunSpec, parse_device
from suite.progress import Progress, Ticker, duration_text
from suite.results import FAILED, FIT_S, PEAK, STATUS_SKIPPED, TEST_ACCURACY

LOCK_NAME = ".suite-run.lock"  # a dot name: never read as a result


class FolderBusy(Exception):
    """Another ``suite run`` holds the results folder; the message names it."""


@dataclass
class Summary:
    counts: Counter = field(default_factory=Counter)
    failures: list[str] = field(default_factory=list)
    stopped: str | None = None  # why the plan ended before its last run (a pool's cluster went away)

    @property
    def failed(self) -> bool:
        return bool(self.stopped) or any(self.counts[s] for s in FAILED)

    def lines(self) -> list[str]:
        parts = ", ".join(f"{n} {s}" for s, n in sorted(self.counts.items()))
        out = [f"runs: {parts or 'none'}"]
        if any(self.counts[s] for s in FAILED):
            out.append("some runs failed; they are recorded with their status and shown in the report:")
            out += [f"  {f}" for f in self.failures]
        if self.stopped:
            out.append(f"the plan stopped early: {self.stopped}")
        return out


def machine_dir(results_dir: Path, machine: str) -> Path:
    return results_dir / machine


def previous_runs(folder: Path) -> dict[tuple[str, int], results.RunResult]:
    """(fingerprint, repetition) -> the newest result on file."""
    if not folder.is_dir():
        return {}
    return results.latest_by_run([r for _, r in results.load_folder(folder)])


@contextlib.contextmanager
def hold_folder(folder: Path, *, wait: bool = False, say: Callable[[str], None] = print) -> Iterator[None]:
    """Hold ``folder`` for one ``suite run``: a second run on it would run the same points again.

    An advisory ``flock`` on a file inside, which records who holds it: the kernel releases it when
    the holder exits, also by SIGKILL, so a dead run never blocks the next one.
    """
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder(path)
            if not wait:
                raise FolderBusy(
                    f"results folder {folder} is in use by {holder}; let it finish, or pass --wait to run after it"
                ) from None
            say(f"waiting for {holder} to finish with {folder}")
            fcntl.flock(fd, fcntl.LOCK_EX)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started_at": datetime.now(UTC).isoformat()}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode() + b"\n", 0)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays, so a waiting run keeps locking the same inode


def _holder(path: Path) -> str:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return f"`suite run` process {data['pid']} on host {data['host']} (since {data['started_at']})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another `suite run`"  # it holds the lock but has not written its name yet


@dataclass
class _Step:
    """One spec and what the plan does with it, decided before the first run so the ETA knows the work."""

    spec: RunSpec
    action: str  # "done" (ok on file), "skip-again" (same skip on file), "skip", "run"
    reason: str | None = None


def _steps(specs: list[RunSpec], backend: Backend, previous: dict) -> list[_Step]:
    steps = []
    for spec in specs:
        before = previous.get((spec.fingerprint, spec.repetition))
        if before is not None and before.ok:
            steps.append(_Step(spec, "done"))
            continue
        reason = backend.skip_reason(spec)
        if reason and before is not None and before.status == STATUS_SKIPPED and before.message == reason:
            steps.append(_Step(spec, "skip-again", reason))
        else:
            steps.append(_Step(spec, "skip" if reason else "run", reason))
    return steps


def run_plan(
    specs: list[RunSpec],
    backend: Backend,
    results_dir: Path,
    machine: str,
    *,
    fresh: bool = False,
    say: Callable[[str], None] = print,
    live: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> Summary:
    """Run every spec in order and save each result as it comes.

    live: keep a status line (run, epoch, elapsed, plan ETA) on stdout, a terminal; otherwise only
        the line each run prints when it ends.
    """
    summary = Summary()
    folder = machine_dir(results_dir, machine)
    previous = {} if fresh else previous_runs(folder)
    peaks: dict[tuple, dict] = {}
    progress = Progress(say=say, stream=sys.stdout if live else None, clock=clock)
    old_handler = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    try:
        steps = _steps(specs, backend, previous)
        progress.plan([s.spec.fingerprint for s in steps if s.action == "run"])
        events = _accepts_on_event(backend)
        with Ticker(progress):
            for i, step in enumerate(steps, 1):
                spec = step.spec
                head = f"[{i}/{len(specs)}] {spec.scenario} [{spec.point_label}] rep {spec.repetition}"
                if step.action == "done":
                    summary.counts["already done"] += 1
                    progress.line(f"{head}: already done (ok result on file; --fresh reruns)")
                    continue
                if step.action == "skip-again":
                    summary.counts[STATUS_SKIPPED] += 1
                    progress.line(f"{head}: skipped, as recorded before: {step.reason}")
                    continue
                progress.start(head)
                if step.reason:
                    result = backend.skipped(spec, step.reason)
                else:
                    result = _run_with_peak(spec, backend, peaks, progress.on_event if events else None)
                seconds = progress.finish(spec.fingerprint if step.action == "run" else None)
                path = results.save(result, folder / spec.scenario, spec.run_id)
                summary.counts[result.status] += 1
                if result.status in FAILED:
                    summary.failures.append(
                        f"{head}: {result.status}: {result.message.splitlines()[0] if result.message else ''}"
                    )
                progress.line(f"{head}: {result.status}{_detail(result)} ({seconds:.1f} s{_eta(progress)}) -> {path}")
    finally:
        progress.close()
        signal.signal(signal.SIGTERM, old_handler)
        backend.close()
    return summary


def pool_previous_runs(
    results_dir: Path, counts: Callable[[results.RunResult], bool]
) -> dict[tuple[str, int], results.RunResult]:
    """(fingerprint, repetition) -> a result of the pool's kind in any machine folder under
    ``results_dir``: the newest ``ok`` one where there is one, else the newest. A pool runs each run
    once, on whichever node took it (a node that has left the cluster since included), so a run
    ``ok`` in any of them is done, whatever else is on file: the times of results made on different
    machines come from different clocks (a node's, the orchestrator's for a lost run), so "newest"
    cannot order a lost attempt against its retry. ``counts`` says which results are the pool's (a
    Ray node's, on the GPU model asked for); the others are not looked at."""
    found = [r for folder in result_folders(results_dir) for _, r in results.load_folder(folder) if counts(r)]
    newest = results.latest_by_run(found)
    return newest | results.latest_by_run([r for r in found if r.ok])


def result_folders(results_dir: Path) -> list[Path]:
    """The machine folders under a results folder (a name starting with '.' or '_' is none)."""
    if not results_dir.is_dir():
        return []
    return sorted(p for p in results_dir.iterdir() if p.is_dir() and not p.name.startswith((".", "_")))


def run_plan_pool(
    specs: list[RunSpec],
    pool: Any,
    results_dir: Path,
    *,
    fresh: bool = False,
    say: Callable[[str], None] = print,
    live: bool = False,
    clock: Callable[[], float] = time.monotonic,
) -> Summary:
    """Run a plan on a pool of nodes (``backends.ray_cluster.RayPool``): every run submitted at once,
    in the plan's interleaved order, each result saved the moment it comes back, under the machine
    folder of the node that ran it.

    The plan's rules are ``run_plan``'s: resume by fingerprint (across the pool's machine folders),
    the same skip records, one summary. Ctrl-C or SIGTERM cancels every task (each removes its
    container) after the results that already arrived are saved.
    """
    summary = Summary()
    progress = Progress(say=say, stream=sys.stdout if live else None, clock=clock)
    old_handler = signal.signal(signal.SIGTERM, _sigterm_as_interrupt)
    heads: dict[tuple[str, int], str] = {}
    try:
        previous = {} if fresh else pool_previous_runs(results_dir, pool.counts_as_done)
        steps = _steps(specs, pool, previous)
        total = len(specs)
        for i, step in enumerate(steps, 1):
            spec = step.spec
            head = f"[{i}/{total}] {spec.scenario} [{spec.point_label}] rep {spec.repetition}"
            heads[(spec.fingerprint, spec.repetition)] = head
            if step.action == "done":
                summary.counts["already done"] += 1
                progress.line(f"{head}: already done (ok result on file; --fresh reruns)")
            elif step.action == "skip-again":
                summary.counts[STATUS_SKIPPED] += 1
                progress.line(f"{head}: skipped, as recorded before: {step.reason}")
            elif step.reason:
                skipped = _PoolRecord(spec, pool.machine, pool.skipped(spec, step.reason))
                _save_pool(skipped, results_dir, head, summary, progress, retry=False)
            else:
                pool.submit(spec)
        if pool.pending:
            progress.line(f"{pool.pending} run(s) submitted to {pool.where}")
        with Ticker(progress):
            while pool.pending:
                for done in pool.collect():
                    head = heads[(done.spec.fingerprint, done.spec.repetition)]
                    retry = (done.result.run.get("ray") or {}).get("attempt", 1) > 1
                    _save_pool(done, results_dir, head, summary, progress, retry, pool=pool)
        summary.stopped = getattr(pool, "gone", None)
    except BaseException:  # noqa: BLE001 - Ctrl-C, SIGTERM, a lost cluster: no task may outlive the plan
        try:
            pool.cancel_all(say=progress.line)
        finally:
            # What the pool holds is saved, also after another Ctrl-C during the cancel: the results
            # taken before and not saved yet, and the runs that ended while the others were cancelled.
            for done in pool.held():
                head = heads.get((done.spec.fingerprint, done.spec.repetition), done.spec.run_id)
                retry = (done.result.run.get("ray") or {}).get("attempt", 1) > 1
                _save_pool(done, results_dir, head, summary, progress, retry, pool=pool)
        raise
    finally:
        progress.close()
        signal.signal(signal.SIGTERM, old_handler)
        pool.close()
    return summary


@dataclass
class _PoolRecord:
    spec: RunSpec
    machine: str
    result: results.RunResult


def _save_pool(
    done: Any, results_dir: Path, head: str, summary: Summary, progress: Progress, retry: bool, pool: Any = None
) -> None:
    """Save one result of a pool where it belongs; a lost run that is being retried is counted apart
    (its retry's own result is the run's last word, and counts). ``pool``: the pool holding the
    result until it is on file, told so the moment it is (before anything that can fail or wait)."""
    result, spec, machine = done.result, done.spec, done.machine
    path = results.save(result, machine_dir(results_dir, machine) / spec.scenario, spec.run_id)
    if pool is not None:
        pool.saved(done)
    if getattr(done, "retried", False):
        summary.counts[f"{result.status}, retried"] += 1
    else:
        summary.counts[result.status] += 1
        if result.status in FAILED:
            first = result.message.splitlines()[0] if result.message else ""
            summary.failures.append(f"{head}: {result.status}: {first}")
    again = " (retry)" if retry else ""
    wall = _wall_s(result)
    took = f" ({wall:.1f} s)" if wall is not None else ""
    progress.line(f"{head}{again} on {machine}: {result.status}{_detail(result)}{took} -> {path}")


def _wall_s(result: results.RunResult) -> float | None:
    try:
        started = datetime.fromisoformat(str(result.run["started_at"]))
        return (datetime.fromisoformat(str(result.run["finished_at"])) - started).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None


def _eta(progress: Progress) -> str:
    return f", plan ETA {duration_text(progress.eta())}" if progress.remaining else ""


def _accepts_on_event(backend: Backend) -> bool:
    """Whether ``backend.run`` takes ``on_event`` (a backend without live progress still runs)."""
    try:
        params = inspect.signature(backend.run).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "on_event" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)


def peak_key(spec: RunSpec, backend: Backend) -> tuple:
    """Everything that changes a device's matmul peak: where it runs, the framework, the device
    kind, the compute dtype (mixed precision) and the thread settings."""
    kind = parse_device(spec.device)[0]
    cfg = spec.config
    threads = cfg.get("threads") or {}
    return (
        backend.name,
        cfg.get("image") or "default",
        cfg["backend"],
        kind,
        "mixed" if cfg["training"].get("mixed_precision") else "float32",
        threads.get("intra_op"),
        threads.get("inter_op"),
    )


def _run_with_peak(
    spec: RunSpec,
    backend: Backend,
    peaks: dict[tuple, dict],
    on_event: Callable[[dict], None] | None = None,
) -> results.RunResult:
    """Run; the first ok run of each peak key in this invocation measures the peak, later ones reuse it.

    The cache lives for one ``suite run``: a figure measured on another day, under other load or
    another driver, is never carried over.
    """
    key = peak_key(spec, backend)
    cached = peaks.get(key)
    asked = dataclasses.replace(spec, calibrate_peak=cached is None)
    result = backend.run(asked, on_event=on_event) if on_event is not None else backend.run(asked)
    if not result.ok:
        return result
    if cached is None:
        if PEAK.of(result):
            peaks[key] = {**PEAK.of(result), "measured_in": spec.run_id}
        return result
    return dataclasses.replace(result, work={**result.work, PEAK.key: {**cached, "source": "cached"}})


def _detail(result: results.RunResult) -> str:
    if result.ok:
        fit = FIT_S.of(result)
        acc = TEST_ACCURACY.of(result)
        return f", fit {fit:.2f} s, test accuracy {acc:.3f}" if fit is not None and acc is not None else ""
    return f": {result.message.splitlines()[0][:200]}" if result.message else ""


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt(f"signal {signum}")
