"""Whether a result was measured under load, in words: the thresholds, the figures a result's
telemetry holds (``load_of``), and the one warning the console, ``show``, the pages and the exports
print (``load_note``)."""

from __future__ import annotations

from typing import Any, NamedTuple

from suite.record.results import LOAD, RunResult

# A result measured under load: the thresholds and the words, in one place (the console, show, the
# pages and the exports all call ``load_note``; ``suite env`` judges the machine by the same figures).
# A quiet machine's own background (shell, sshd, journald, the desktop) uses about 1-3% of one core;
# another program that steadily takes 10% of a core or more competes with the run for CPU time and
# memory bandwidth measurably on a small machine. Steal of 5% means the hypervisor withheld one
# slice in twenty from this guest: its timings vary with the neighbours' load. Any other compute
# process on the run's GPUs shares the device's time and memory.
OTHERS_BUSY_CORES = 0.10
STEAL_BUSY_SHARE = 0.05


class Load(NamedTuple):
    """A result's load figures (``load_of``); None where not measured."""

    other_cores: float | None  # cores used by other processes over the timed fit, else the whole run
    steal_share: float | None  # over the fit, else the whole run
    gpu_others: list[dict[str, Any]]  # other compute processes on the run's GPUs ([] when none or not checked)
    gpu_checked: bool  # NVML answered for the run's GPUs
    loadavg_start: list[float] | None
    loadavg_end: list[float] | None
    cores: int | None  # the machine's logical cores
    window: str  # "fit" or "run": what other_cores and steal_share cover


def load_of(result: RunResult) -> Load | None:
    """The load a result was measured under: over the timed fit where the scans covered a second of
    it (what ``fit_s`` timed), else over the whole run; None when the record has no load block."""
    block = LOAD.of(result)
    if not isinstance(block, dict):
        return None
    fit = block.get("fit") if isinstance(block.get("fit"), dict) else None
    source = fit if fit and fit.get("other_cores") is not None else block
    gpus = block.get("gpu_others")
    others = [p for procs in (gpus or {}).values() for p in procs] if isinstance(gpus, dict) else []
    return Load(
        other_cores=source.get("other_cores"),
        steal_share=source.get("steal_share"),
        gpu_others=others,
        gpu_checked=isinstance(gpus, dict),
        loadavg_start=block.get("loadavg_start"),
        loadavg_end=block.get("loadavg_end"),
        cores=block.get("cores"),
        window="fit" if source is fit else "run",
    )


def cores_text(cores: float) -> str:
    """A CPU share in words: "85% of a core" below one core, "1.6 cores" from there on."""
    return f"{cores:.0%} of a core" if cores < 0.95 else f"{cores:.1f} cores"


def _load_parts(load: Load) -> list[str]:
    parts = []
    if load.other_cores is not None and load.other_cores >= OTHERS_BUSY_CORES:
        parts.append(f"other processes used {cores_text(load.other_cores)}")
    if load.steal_share is not None and load.steal_share >= STEAL_BUSY_SHARE:
        parts.append(f"the hypervisor took {load.steal_share:.0%} of the CPU time (steal)")
    if load.gpu_others:
        n = len({p.get("pid") for p in load.gpu_others})
        parts.append(f"{n} other process{'es' if n > 1 else ''} used the GPU")
    return parts


def load_note(result: RunResult) -> str | None:
    """The warning for a result measured under load, None when it was measured on a quiet machine
    or its load was not recorded: "measured while other processes used 85% of a core", with the
    hypervisor's steal and other processes on the run's GPUs where they pass their thresholds
    (``OTHERS_BUSY_CORES``, ``STEAL_BUSY_SHARE``, any other GPU process). The one place of these
    words and thresholds."""
    load = load_of(result)
    parts = _load_parts(load) if load is not None else []
    if not parts:
        return None
    return "measured while " + (parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1])


def point_load_note(runs: list[RunResult]) -> str | None:
    """``load_note`` for a point of several runs (a report row, the export's notes): the single
    run's note, or "2 of 3 runs measured under load (the most: other processes used 1.6 cores)";
    None when no run was measured under load."""
    noted = [(r, note) for r in runs if (note := load_note(r))]
    if not noted:
        return None
    if len(runs) == 1:
        return noted[0][1]

    def weight(item: tuple[RunResult, str]) -> float:
        load = load_of(item[0])
        return (load.other_cores or 0.0) if load else 0.0

    worst = max(noted, key=weight)[1].removeprefix("measured while ")
    return f"{len(noted)} of {len(runs)} runs measured under load (the most: {worst})"
