"""How a plan's runs are made (``runner.run_plan`` drives either): in order on this machine's
backend (``InOrder``), or all at once on a pool of nodes (``Pooled``: Ray's), each result handed
back as a ``Made`` to be saved."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Any, Protocol

from suite.backends.base import Backend
from suite.backends.peak_cache import run_with_peak
from suite.record import results
from suite.run.progress import Progress
from suite.run.results_folder import machine_dir, on_file, pool_previous_runs, wall_times
from suite.spec.plan import RunSpec


@dataclass
class Made:
    """A result to save: the machine folder it belongs to, and how its line reads."""

    spec: RunSpec
    machine: str
    result: results.RunResult
    took: str = ""  # "12.3 s": how long the run took, where known
    retry: bool = False  # the retry of a run whose node was lost
    retried: bool = False  # a lost run another attempt was submitted for: counted apart
    source: Any = None  # what the pool handed out (told ``saved`` once on file)


class Runs(Protocol):
    """How the plan's runs are made: in order here (``InOrder``) or on a pool of nodes (``Pooled``)."""

    machine: str  # the folder of the records the plan itself makes (skips, runs no node could take)
    names_machine: bool  # whether a run's line says where it ran

    @property
    def pending(self) -> int: ...  # results not yet saved: in flight, or held
    @property
    def gone(self) -> str | None: ...  # why no more results can come (a pool's cluster went away)

    def on_file(self, results_dir: Path, fresh: bool) -> tuple[dict, dict[str, list[float]] | None]:
        """(the results on file by (fingerprint, repetition), none with ``fresh``; the seconds earlier
        runs took by point key, None where the plan's end cannot be foretold)"""
        ...

    def skip_reason(self, spec: RunSpec) -> str | None: ...
    def skipped(self, spec: RunSpec, reason: str) -> results.RunResult: ...
    def close_starts_in(self, seconds: float) -> None:
        """``--budget``: none of the runs submitted starts once ``seconds`` have passed (a pool's
        queue; in order here, the plan checks the budget before each run itself)."""
        ...

    @property
    def unstarted(self) -> int: ...  # runs that reached a node after the budget and ran nothing
    def submit(self, spec: RunSpec, head: str, progress: Progress) -> None: ...
    def ready(self) -> list[Made]: ...
    def collect(self) -> list[Made]: ...
    def saved(self, made: Made) -> None: ...
    def submitted_text(self) -> str: ...
    def stop(self, say: Callable[[str], None]) -> list[Made]: ...
    def held(self) -> list[Made]: ...
    def close(self) -> None: ...


class InOrder:
    """One run at a time on this machine's backend, as the plan reaches it: its live progress on the
    status line, the device peak measured once per peak key and reused (``run_with_peak``)."""

    names_machine = False
    gone: str | None = None
    unstarted = 0  # the plan starts no run once the budget is spent (``runner._walk``)

    def __init__(self, backend: Backend, machine: str):
        self.backend, self.machine = backend, machine
        self.peaks: dict[tuple, dict] = {}
        self._made: list[Made] = []

    @property
    def pending(self) -> int:
        return len(self._made)

    def on_file(self, results_dir: Path, fresh: bool) -> tuple[dict, dict[str, list[float]]]:
        folder = machine_dir(results_dir, self.machine)
        found = on_file(folder)
        return {} if fresh else results.latest_by_run(found), wall_times(found)  # the ETA uses them all the same

    def skip_reason(self, spec: RunSpec) -> str | None:
        return self.backend.skip_reason(spec)

    def close_starts_in(self, seconds: float) -> None:
        pass  # each run starts when the plan reaches it, which checks the budget first

    def skipped(self, spec: RunSpec, reason: str) -> results.RunResult:
        return self.backend.skipped(spec, reason)

    def submit(self, spec: RunSpec, head: str, progress: Progress) -> None:
        progress.start(head, spec.fingerprint)
        result = run_with_peak(spec, self.backend, self.peaks, progress.on_event)
        seconds = progress.finish(spec.fingerprint)
        self._made.append(Made(spec, self.machine, result, took=f"{seconds:.1f} s"))

    def ready(self) -> list[Made]:
        return list(self._made)

    collect = ready

    def saved(self, made: Made) -> None:
        self._made = [m for m in self._made if m is not made]

    def submitted_text(self) -> str:
        return ""

    def stop(self, say: Callable[[str], None]) -> list[Made]:
        return []  # a run in flight was stopped by the interrupt inside it

    def held(self) -> list[Made]:
        # Nothing to save after a stop: a result interrupted while it was being saved is not saved
        # again (the save may have linked the file already; a second would be a duplicate record).
        return []

    def close(self) -> None:
        self.backend.close()


class Pooled:
    """Every run submitted at once to a pool of nodes (``backends.ray_cluster.RayPool``), each
    result taken as it comes back, under the machine folder of the node that ran it."""

    names_machine = True

    def __init__(self, pool: Any):
        self.pool, self.machine = pool, pool.machine

    @property
    def pending(self) -> int:
        return int(self.pool.pending)

    @property
    def gone(self) -> str | None:
        return getattr(self.pool, "gone", None)

    def on_file(self, results_dir: Path, fresh: bool) -> tuple[dict, None]:
        # Every node's folder is read only to resume; the runs go at once: no ETA.
        return {} if fresh else pool_previous_runs(results_dir, self.pool.counts_as_done), None

    @property
    def unstarted(self) -> int:
        return int(self.pool.unstarted)

    def skip_reason(self, spec: RunSpec) -> str | None:
        return self.pool.skip_reason(spec)

    def close_starts_in(self, seconds: float) -> None:
        self.pool.close_starts_in(seconds)  # every run is submitted at once: Ray's queue holds them

    def skipped(self, spec: RunSpec, reason: str) -> results.RunResult:
        return self.pool.skipped(spec, reason)

    def submit(self, spec: RunSpec, head: str, progress: Progress) -> None:
        self.pool.submit(spec)

    def ready(self) -> list[Made]:
        return []

    def collect(self) -> list[Made]:
        return [self._made(done) for done in self.pool.collect()]

    def saved(self, made: Made) -> None:
        if made.source is not None:
            self.pool.saved(made.source)

    def submitted_text(self) -> str:
        return f"{self.pool.pending} run(s) submitted to {self.pool.where}"

    def stop(self, say: Callable[[str], None]) -> list[Made]:
        self.pool.cancel_all(say=say)
        return self.held()

    def held(self) -> list[Made]:
        return [self._made(done) for done in self.pool.held()]

    def close(self) -> None:
        self.pool.close()

    @staticmethod
    def _made(done: Any) -> Made:
        result = done.result
        wall = wall_s(result)
        retry = (result.run.get("ray") or {}).get("attempt", 1) > 1
        took = f"{wall:.1f} s" if wall is not None else ""
        retried = bool(getattr(done, "retried", False))
        return Made(done.spec, done.machine, result, took=took, retry=retry, retried=retried, source=done)


def wall_s(result: results.RunResult) -> float | None:
    try:
        started = datetime.fromisoformat(str(result.run["started_at"]))
        return (datetime.fromisoformat(str(result.run["finished_at"])) - started).total_seconds()
    except (KeyError, TypeError, ValueError):
        return None
