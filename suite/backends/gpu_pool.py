"""Which GPUs a backend may hand out and how a run is given them: the host's or engine's GPUs, narrowed
by an inherited CUDA_VISIBLE_DEVICES and by --gpus, and a run's devices named to its worker by UUID."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from typing import Any

from suite.backends.base import BackendUnavailable, Inventory
from suite.environment import host_facts
from suite.spec.plan import RunSpec, parse_device
from suite.worker import identity

# A GPU as --gpus and a hosts file's ``gpus`` name it: a host index (no leading zero: 0 and 00 would
# be two names of one GPU), or a whole GPU's UUID as nvidia-smi -L prints it. No MIG instance (the
# suite hands out whole GPUs: worker/identity), no comma (the list's separator), no control character.
GPU_ID = re.compile(r"0|[1-9][0-9]{0,3}|GPU-[A-Za-z0-9-]{1,100}")
GPU_IDS_ALLOWED = "distinct GPU indices (0, 1, ...) or whole GPUs' UUIDs as nvidia-smi -L prints them ('GPU-...')"


def is_gpu_id(value: object) -> bool:
    """Whether ``value`` names a GPU by index (an int or its digits) or by UUID."""
    if isinstance(value, int) and not isinstance(value, bool):
        return 0 <= value <= 9999
    return isinstance(value, str) and GPU_ID.fullmatch(value) is not None


def host_inventory(environ: Mapping[str, str] | None = None) -> Inventory:
    """The GPUs (NVML or nvidia-smi) and CPUs of the machine the suite runs on, as far as its
    inherited CUDA_VISIBLE_DEVICES lets it use them (``inherit_pool``)."""
    gpus, note = host_facts.gpu_inventory()
    return inherit_pool({"gpus": gpus, "gpu_note": note, "cpus": os.cpu_count()}, environ)


def inherit_pool(inventory: Inventory, environ: Mapping[str, str] | None = None) -> Inventory:
    """The inventory limited to the GPUs the orchestrator's own CUDA_VISIBLE_DEVICES allows.

    A batch scheduler hands a job its GPUs that way; the suite draws only from them (``--gpus``
    then chooses among them). The variable is read as CUDA reads it (``identity.visible_pool``);
    what cannot be honoured exactly (a MIG instance, an ambiguous UUID prefix) stops the run with
    BackendUnavailable. The inventory's ``pool`` records what was used and where it came from;
    ``outside_pool`` holds the GPUs left out, so ``--gpus`` naming one of them is an error.
    """
    environ = os.environ if environ is None else environ
    gpus = list(inventory.get("gpus", []))
    value = environ.get("CUDA_VISIBLE_DEVICES")
    if value is None:
        pool: dict[str, Any] = {"source": "every GPU of the host", "cuda_visible_devices": None}
        return {**inventory, "pool": {**pool, "uuids": [g.get("uuid") for g in gpus]}, "outside_pool": []}
    try:
        kept, note = identity.visible_pool(value, gpus, environ.get("CUDA_DEVICE_ORDER"))
    except identity.PoolError as exc:
        raise _unavailable(f"the inherited {exc}") from None
    pool = {
        "source": "CUDA_VISIBLE_DEVICES inherited by the suite",
        "cuda_visible_devices": value,
        "cuda_device_order": environ.get("CUDA_DEVICE_ORDER"),
        "uuids": [g.get("uuid") for g in kept],
    }
    said = f"GPUs limited by the inherited CUDA_VISIBLE_DEVICES={value}" + (f" ({note})" if note else "")
    return {
        **inventory,
        "gpus": kept,
        "gpu_note": "; ".join(filter(None, [inventory.get("gpu_note"), said])),
        "pool": pool,
        "outside_pool": [g for g in gpus if g not in kept],
    }


def _unavailable(message: str) -> Exception:
    return BackendUnavailable(message)  # the CLI reports it with exit code 2


def restrict_gpus(inventory: Inventory, allowed: list[str] | None) -> Inventory:
    """The inventory with only the GPUs ``allowed`` names (host indices or UUIDs), in its order.

    A name that is not on the host at all is noted (points needing more GPUs are then skipped with
    that note); one that is on the host but outside the inherited CUDA_VISIBLE_DEVICES pool is an
    error: the two settings contradict each other, and neither using that GPU (it is another job's)
    nor recording a whole plan of skipped points is what the user asked for.
    """
    if allowed is None:
        return inventory
    wanted = {str(a).strip() for a in allowed}

    def named(g: dict[str, Any]) -> bool:
        return str(g.get("index")) in wanted or g.get("uuid") in wanted

    outside = [g for g in inventory.get("outside_pool", []) if named(g)]
    if outside:
        pool = inventory.get("pool", {})
        listed = ", ".join(f"{g.get('index')} ({g.get('uuid')})" for g in outside)
        raise _unavailable(
            f"--gpus names GPU {listed}, outside the GPUs this process may use "
            f"(CUDA_VISIBLE_DEVICES={pool.get('cuda_visible_devices')} inherited from the environment: "
            f"{', '.join(str(g.get('index')) for g in inventory.get('gpus', [])) or 'none'}); "
            "drop it from --gpus or widen CUDA_VISIBLE_DEVICES"
        )
    kept = [g for g in inventory.get("gpus", []) if named(g)]
    found = {str(g.get("index")) for g in kept} | {str(g.get("uuid")) for g in kept}
    note = f"GPUs limited to {', '.join(sorted(wanted))}"
    if wanted - found:
        note += f"; not on this host: {', '.join(sorted(wanted - found))}"
    pool = {**inventory.get("pool", {}), "gpus_flag": sorted(wanted), "uuids": [g.get("uuid") for g in kept]}
    return {
        **inventory,
        "gpus": kept,
        "gpu_note": "; ".join(filter(None, [inventory.get("gpu_note"), note])),
        "pool": pool,
    }


def device_skip_reason(spec: RunSpec, inventory: Inventory, holder: str = "this machine has") -> str | None:
    """Why a GPU point cannot run here, or None: "needs 2 GPU(s); this machine has 1 GPU(s) (...)".
    ``holder`` says whose GPUs were counted: a Docker engine's containers see only the GPUs its
    runtime hands them, whatever its host has. Where ``--gpus`` or an inherited CUDA_VISIBLE_DEVICES
    left GPUs out, the limit is named instead."""
    kind, count = parse_device(spec.device)
    gpus = inventory.get("gpus", [])
    if kind == "gpu" and count > len(gpus):
        have = f"{len(gpus)} GPU(s)" if gpus else "no GPU"
        why = inventory.get("gpu_note") or ""
        if (inventory.get("pool") or {}).get("gpus_flag"):  # the user's limit, not the machine's
            holder = "--gpus allows"
        elif inventory.get("outside_pool"):  # GPUs the inherited CUDA_VISIBLE_DEVICES left out
            holder = "CUDA_VISIBLE_DEVICES allows"
        return f"needs {count} GPU(s); {holder} {have}" + (f" ({why})" if why else "")
    return None


def gpus_for(spec: RunSpec, inventory: Inventory) -> list[dict[str, Any]]:
    """The GPUs a spec gets: the first N of the inventory (the pool, in its order). Empty for CPU runs."""
    kind, count = parse_device(spec.device)
    return list(inventory["gpus"][:count]) if kind == "gpu" else []


def gpu_ids(spec: RunSpec, inventory: Inventory) -> list[str]:
    """What CUDA_VISIBLE_DEVICES gets for a spec: the GPUs' UUIDs (the host index only where the
    inventory knows no UUID, read in PCI bus order as CUDA_DEVICE_ORDER is set). Empty for CPU runs."""
    return [str(g.get("uuid") or g["index"]) for g in gpus_for(spec, inventory)]


def gpu_env(spec: RunSpec, inventory: Inventory) -> dict[str, str]:
    """The GPU part of a worker's environment: CUDA_VISIBLE_DEVICES by UUID ("" for CPU runs), and
    ``SUITE_GPUS``, the same GPUs by UUID and PCI bus id, which the worker checks its framework against."""
    given = gpus_for(spec, inventory)
    asked = [
        {"uuid": g.get("uuid"), "pci_bus_id": g.get("pci_bus_id"), "index": g.get("index"), "name": g.get("name")}
        for g in given
    ]
    return {"CUDA_VISIBLE_DEVICES": ",".join(gpu_ids(spec, inventory)), identity.ASKED_ENV: json.dumps(asked)}
