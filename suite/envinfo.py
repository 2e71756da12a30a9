"""``python -m suite env``: what this machine offers, so a user sees before a long run what will be
skipped, and whether it is quiet enough to benchmark now (as ``pyperf system check`` asks)."""

from __future__ import annotations

import glob
import importlib.metadata
import os
import platform
import sys
from typing import Any

from suite import telemetry
from suite.environment import host_facts
from suite.record import under_load
from suite.safe.console import fitted
from suite.worker.facts import collect_host

PACKAGES = ("tensorflow", "tensorflow-cpu", "keras", "jax", "torch", "numpy", "docker", "nvidia-ml-py")


def collect(docker_host: str | None = None) -> dict[str, Any]:
    gpus, note = host_facts.gpu_inventory()
    pool = _pool(gpus)
    facts: dict[str, Any] = {
        "machine": host_facts.machine_name(),
        "python": f"{platform.python_version()} ({sys.executable})",
        "cpu": f"{collect_host()['cpu_model']}, {os.cpu_count()} logical cores",
        "packages": {name: _version(name) for name in PACKAGES},
        "gpus": gpus,
        "gpu_note": note,
        "pool": pool,
        "load": quietness(gpus),
    }
    try:
        from suite.backends.docker import engine_facts
    except ImportError as exc:
        facts["docker"] = {"error": f"docker backend not available: {exc}"}
    else:
        facts["docker"] = engine_facts(docker_host=docker_host)
        if "error" not in facts["docker"]:
            facts["engine_gpus"] = _engine_gpus(docker_host)
    return facts


FACT_COLUMN = len("machine:  ")  # where each fact's value starts, and its wrapped lines
QUIET_SAMPLE_S = 1.0  # long enough for a busy program to show, short enough to wait for
GOVERNORS = "/sys/devices/system/cpu/cpu*/cpufreq/scaling_governor"


def quietness(gpus: list[dict[str, Any]] | None = None, seconds: float = QUIET_SAMPLE_S) -> dict[str, Any]:
    """Whether this machine is quiet enough to benchmark now: a short sample of the load (what
    other processes use, steal, other compute processes on this host's GPUs), the load average
    against the logical cores, and the CPU frequency governors. ``quiet`` False when other
    processes use at least ``under_load.OTHERS_BUSY_CORES``, steal reaches
    ``under_load.STEAL_BUSY_SHARE`` (the thresholds a result's ``load_note`` uses), any other process
    computes on a GPU, or the last minute's load average reaches the core count (the sample may
    have fallen in a lull of a busy minute). A governor other than ``performance`` is advice, not
    busy: clocks that follow the load add noise, but a laptop cannot always change it."""
    uuids = [str(g["uuid"]) for g in gpus or [] if g.get("uuid")]
    try:
        block = telemetry.sample_machine(seconds, gpus=uuids)
    except OSError as exc:
        return {"quiet": None, "verdict": f"not checked: no /proc here ({exc})", "governors": _governors()}
    cores = block.get("cores") or 1
    load1 = (block.get("loadavg") or [None])[0]
    others, steal = block.get("other_cores"), block.get("steal_share")
    gpu_users = [p for procs in (block.get("gpu_others") or {}).values() for p in procs]
    busy = []
    if load1 is not None and load1 >= cores:
        busy.append(f"load {load1:.1f} on {cores} cores")
    if others is not None and others >= under_load.OTHERS_BUSY_CORES:
        top = (block.get("top_others") or [{}])[0]
        most = f", most {top['name']} (pid {top['pid']})" if top.get("name") else ""
        busy.append(f"other processes use {under_load.cores_text(others)}{most}")
    if steal is not None and steal >= under_load.STEAL_BUSY_SHARE:
        busy.append(f"the hypervisor takes {steal:.0%} of the CPU time (steal)")
    if gpu_users:
        busy.append(f"{len(gpu_users)} other process{'es' if len(gpu_users) > 1 else ''} compute on the GPUs")
    figures = [
        "load ?" if load1 is None else f"load {load1:.2f} on {cores} cores",
        "other processes " + ("?" if others is None else under_load.cores_text(others)),
        "steal " + ("?" if steal is None else f"{steal:.1%}"),
    ]
    if busy:
        verdict = "busy: " + "; ".join(busy) + " (results will be noisy)"
    else:
        verdict = "quiet enough to benchmark (" + ", ".join(figures) + f", over {block.get('window_s') or 0:.1f} s)"
    return {**block, "quiet": not busy, "verdict": verdict, "governors": _governors()}


def _governors() -> dict[str, int]:
    """CPU frequency governor -> how many CPUs use it; empty where cpufreq is not exposed (most VMs)."""
    counts: dict[str, int] = {}
    for path in sorted(glob.glob(GOVERNORS)):
        try:
            with open(path, encoding="ascii") as fh:
                name = fh.read().strip()
        except OSError:
            continue
        counts[name] = counts.get(name, 0) + 1
    return counts


def _load_lines(load: dict[str, Any]) -> list[str]:
    lines = [f"load:     {load.get('verdict')}"]
    governors = load.get("governors") or {}
    slow = {g: n for g, n in governors.items() if g != "performance"}
    if slow:
        total = sum(governors.values())
        named = ", ".join(f"{g} on {n} of {total} CPUs" for g, n in sorted(slow.items()))
        lines.append(
            f"  CPU frequency governor: {named}; clocks follow the load "
            "('sudo cpupower frequency-set -g performance' holds them)"
        )
    elif governors:
        lines.append("  CPU frequency governor: performance")
    return lines


def _pool(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """Which of this host's GPUs the local backend may hand out (an inherited CUDA_VISIBLE_DEVICES), or why none."""
    from suite.backends import BackendUnavailable
    from suite.backends.gpu_pool import inherit_pool

    try:
        inventory = inherit_pool({"gpus": gpus})
    except BackendUnavailable as exc:
        return {"error": str(exc)}
    return {**inventory["pool"], "indices": [g.get("index") for g in inventory["gpus"]]}


def _engine_gpus(docker_host: str | None) -> dict[str, Any]:
    """The GPUs of the engine's host, as the Docker backend asks that engine (a remote server's own)."""
    from suite.backends.docker import DockerBackend

    backend = DockerBackend(docker_host=docker_host)
    try:
        inventory = backend.inventory()
    finally:
        backend.close()
    return {"gpus": inventory.get("gpus", []), "note": inventory.get("gpu_note") or inventory.get("source", "")}


def _gpu_lines(g: dict[str, Any]) -> list[str]:
    """A GPU in lines within 120 columns: which one it is, its driver, its settings."""

    def shown(key: str, unit: str = "") -> str:
        value = g.get(key)
        return "?" if value is None else f"{value}{unit}"

    return [
        f"  [{g.get('index')}] {g.get('name')}, {shown('uuid')}, bus {shown('pci_bus_id')}, {shown('memory_mib')} MiB",
        f"      driver {shown('driver')} (CUDA {shown('cuda_driver_version')}), VBIOS {shown('vbios')}",
        f"      power limit {shown('power_limit_w', ' W')}, persistence {shown('persistence_mode')}, "
        f"application clocks {shown('app_clock_graphics_mhz')}/{shown('app_clock_memory_mhz')} MHz, "
        f"compute mode {shown('compute_mode')}",
    ]


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def render(facts: dict[str, Any]) -> str:
    lines = [
        f"machine:  {facts['machine']} (results go to reports/results/{facts['machine']}/)",
        f"python:   {facts['python']}",
        f"cpu:      {facts['cpu']}",
        "packages: " + ", ".join(f"{k} {v}" for k, v in facts["packages"].items()),
    ]
    if facts["gpus"]:
        lines.append(f"gpus ({facts['gpu_note']}):")
        lines += [line for g in facts["gpus"] for line in _gpu_lines(g)]
        pool = facts.get("pool") or {}
        if "error" in pool:
            lines.append(f"  pool: {pool['error']}")
        else:
            indices = ", ".join(str(i) for i in pool.get("indices", [])) or "none"
            lines.append(f"  pool: GPUs {indices} ({pool.get('source')})")
            lines.append(
                "  a point asking for gpu:N runs on the pool's first N GPUs (--gpus chooses among them), by UUID;"
            )
            lines.append("    more than the pool holds: skipped")
    else:
        lines.append(f"gpus:     none ({facts['gpu_note']}); every GPU point will be recorded as skipped")
    if facts.get("load"):
        lines += _load_lines(facts["load"])
    docker = facts.get("docker") or {}
    if "error" in docker:
        lines.append(f"docker:   {docker['error']}")
    else:
        lines.append("docker:   " + "; ".join(f"{k}: {_word(v)}" for k, v in docker.items()))
    engine = facts.get("engine_gpus")
    if engine is not None:
        found = engine["gpus"]
        listed = "; ".join(f"[{g.get('index')}] {g.get('name')}, {g.get('uuid')}" for g in found) or "none"
        lines.append(f"engine's host GPUs (what --backend docker hands out): {listed} ({engine['note']})")
    return "\n".join(part for line in lines for part in fitted(line, FACT_COLUMN))


def _word(value: Any) -> str:
    """A fact of the engine as words: a list joined, no value as "none", a flag as "yes" or "no"."""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, list):
        return ", ".join(map(str, value)) or "none"
    return "none" if value is None else str(value)
