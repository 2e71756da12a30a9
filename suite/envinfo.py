"""``python -m suite env``: what this machine offers, so a user sees before a long run what will be skipped."""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys
from typing import Any

from suite import hostinfo
from suite.worker.facts import collect_host

PACKAGES = ("tensorflow", "tensorflow-cpu", "keras", "jax", "torch", "numpy", "docker", "nvidia-ml-py")


def collect(docker_host: str | None = None) -> dict[str, Any]:
    gpus, note = hostinfo.gpu_inventory()
    pool = _pool(gpus)
    facts: dict[str, Any] = {
        "machine": hostinfo.machine_name(),
        "python": f"{platform.python_version()} ({sys.executable})",
        "cpu": f"{collect_host()['cpu_model']}, {os.cpu_count()} logical cores",
        "packages": {name: _version(name) for name in PACKAGES},
        "gpus": gpus,
        "gpu_note": note,
        "pool": pool,
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


def _pool(gpus: list[dict[str, Any]]) -> dict[str, Any]:
    """Which of this host's GPUs the local backend may hand out (an inherited CUDA_VISIBLE_DEVICES), or why none."""
    from suite.backends import BackendUnavailable
    from suite.backends.base import inherit_pool

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


def _gpu_line(g: dict[str, Any]) -> str:
    def shown(key: str, unit: str = "") -> str:
        value = g.get(key)
        return "?" if value is None else f"{value}{unit}"

    return (
        f"  [{g.get('index')}] {g.get('name')}, {g.get('uuid')}, bus {shown('pci_bus_id')}, {shown('memory_mib')} MiB, "
        f"driver {shown('driver')} (CUDA {shown('cuda_driver_version')}), VBIOS {shown('vbios')}, "
        f"power limit {shown('power_limit_w', ' W')}, persistence {shown('persistence_mode')}, "
        f"application clocks {shown('app_clock_graphics_mhz')}/{shown('app_clock_memory_mhz')} MHz, "
        f"compute mode {shown('compute_mode')}"
    )


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
        lines += [_gpu_line(g) for g in facts["gpus"]]
        pool = facts.get("pool") or {}
        if "error" in pool:
            lines.append(f"  pool: {pool['error']}")
        else:
            indices = ", ".join(str(i) for i in pool.get("indices", [])) or "none"
            lines.append(f"  pool: GPUs {indices} ({pool.get('source')})")
            lines.append(
                "  a point asking for gpu:N runs on the pool's first N GPUs (--gpus chooses among them), "
                "by UUID; more than the pool holds: skipped"
            )
    else:
        lines.append(f"gpus:     none ({facts['gpu_note']}); every GPU point will be recorded as skipped")
    docker = facts.get("docker") or {}
    if "error" in docker:
        lines.append(f"docker:   {docker['error']}")
    else:
        lines.append("docker:   " + ", ".join(f"{k}: {v}" for k, v in docker.items()))
    engine = facts.get("engine_gpus")
    if engine is not None:
        found = engine["gpus"]
        listed = "; ".join(f"[{g.get('index')}] {g.get('name')}, {g.get('uuid')}" for g in found) or "none"
        lines.append(f"engine's host GPUs (what --backend docker hands out): {listed} ({engine['note']})")
    return "\n".join(lines)
