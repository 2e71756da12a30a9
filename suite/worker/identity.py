"""Which GPUs a run was given, and whether the framework trains on exactly those.

GPUs are named by UUID (``GPU-8932f937-...``, as ``nvidia-smi -L`` prints it) and by PCI bus id.
The host hands a run its GPUs in ``CUDA_VISIBLE_DEVICES`` (UUIDs) and tells the worker the same
GPUs in ``SUITE_GPUS``; the worker compares them with what its framework reports. Bus ids come in
several spellings (NVML ``00000000:3B:00.0``, TensorFlow and CUDA ``0000:3b:00.0``): they are
compared in one normal form.

The host also reads an inherited ``CUDA_VISIBLE_DEVICES`` (a batch scheduler's allocation) with
``visible_pool``, by the rules CUDA documents for it: integer indices in nvidia-smi's order, GPU
UUIDs or unambiguous prefixes of them, listed order kept, and nothing visible after the first
entry that names no GPU.

Standard library only: the worker imports it before its framework, and the host imports it too.
"""

from __future__ import annotations

import ctypes
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

ASKED_ENV = "SUITE_GPUS"  # JSON list of {"uuid", "pci_bus_id", "index", "name"}: the GPUs a run was given
DEVICE_ORDER = "PCI_BUS_ID"  # CUDA's default is FASTEST_FIRST, which numbers mixed GPUs unlike nvidia-smi

_BUS_ID = re.compile(r"(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])")
_UUID = re.compile(r"[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}")


class PoolError(ValueError):
    """An inherited CUDA_VISIBLE_DEVICES the suite cannot honour exactly; the message says why."""


def normalise_bus_id(value: Any) -> str | None:
    """``0000:3b:00.0`` for any spelling of a PCI bus id (NVML's 8-digit domain, upper case); None if none."""
    if value is None:
        return None
    match = _BUS_ID.fullmatch(str(value).strip().lower())
    if not match:
        return None
    domain, bus, device, function = match.groups()
    return f"{int(domain or '0', 16):04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def normalise_uuid(value: Any) -> str | None:
    """``GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx`` (lower case) from nvidia-smi's, NVML's or torch's form."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray)) and len(value) == 16:  # the CUDA driver's raw 16 bytes
        text = bytes(value).hex()
    else:
        text = (value.decode() if isinstance(value, (bytes, bytearray)) else str(value)).strip().lower()
        text = text.removeprefix("gpu-")
    if re.fullmatch(r"[0-9a-f]{32}", text):
        text = f"{text[:8]}-{text[8:12]}-{text[12:16]}-{text[16:20]}-{text[20:]}"
    return f"GPU-{text}" if _UUID.fullmatch(text) else None


def identity(uuid: Any = None, pci_bus_id: Any = None, **rest: Any) -> dict[str, Any]:
    """One GPU as the comparison sees it: normal forms, plus whatever else the caller knows (name, index)."""
    return {"uuid": normalise_uuid(uuid), "pci_bus_id": normalise_bus_id(pci_bus_id), **rest}


# -- the host: which GPUs an inherited CUDA_VISIBLE_DEVICES allows ----------------------------------


def visible_pool(value: str, gpus: Sequence[Mapping[str, Any]], device_order: str | None) -> tuple[list, str]:
    """(the GPUs of ``gpus`` that ``CUDA_VISIBLE_DEVICES=value`` makes visible, in its order; a note).

    ``gpus`` is the host's inventory in nvidia-smi's order (``index``, ``uuid``, ``name``).
    Raises PoolError where the suite cannot know which GPUs CUDA would show: a MIG instance
    (the suite measures whole GPUs), an index on a host of mixed GPUs without
    ``CUDA_DEVICE_ORDER=PCI_BUS_ID`` (CUDA then numbers them fastest first, which NVML cannot
    reproduce), a UUID prefix that fits several GPUs, a GPU named twice.
    """
    if not value.strip():
        return [], "CUDA_VISIBLE_DEVICES is empty: no GPU is visible"
    kept: list[Mapping[str, Any]] = []
    mixed = len({g.get("name") for g in gpus}) > 1
    for entry in (e.strip() for e in value.split(",")):
        if entry.upper().startswith("MIG-"):
            raise PoolError(
                f"CUDA_VISIBLE_DEVICES={value} names a MIG instance ({entry}); the suite measures whole GPUs "
                "and does not hand out MIG instances: unset it or name whole GPUs"
            )
        if re.fullmatch(r"[+-]?\d+", entry):
            if mixed and device_order != DEVICE_ORDER:
                raise PoolError(
                    f"CUDA_VISIBLE_DEVICES={value} names GPUs by index on a host with different GPU models, "
                    f"and CUDA_DEVICE_ORDER is {device_order or 'unset'}: CUDA then numbers them fastest first, "
                    "which cannot be matched to nvidia-smi's order; set CUDA_DEVICE_ORDER=PCI_BUS_ID or name GPUs "
                    "by UUID"
                )
            match = [g for g in gpus if str(g.get("index")) == str(int(entry))]
        elif entry.upper().startswith("GPU-"):
            prefix = entry.lower()
            match = [g for g in gpus if str(g.get("uuid") or "").lower().startswith(prefix)]
            if len(match) > 1:
                raise PoolError(f"CUDA_VISIBLE_DEVICES={value}: {entry} is the start of {len(match)} GPUs' UUIDs")
        else:
            match = []
        if not match:
            return list(kept), (
                f"CUDA_VISIBLE_DEVICES={value}: {entry!r} names no GPU of this host, and CUDA shows none listed "
                "after such an entry"
            )
        if match[0] in kept:
            raise PoolError(f"CUDA_VISIBLE_DEVICES={value} names GPU {match[0].get('index')} twice")
        kept.append(match[0])
    return list(kept), ""


# -- the worker: are the devices it trains on the ones it was given ---------------------------------


class AskedError(ValueError):
    """``SUITE_GPUS`` is set but is not the list of GPUs the host writes; the message says what is wrong."""


def asked_from_env(environ: Mapping[str, str]) -> list[dict[str, Any]] | None:
    """The GPUs the host gave this run (``SUITE_GPUS``), or None when it did not say.

    A value that is not a JSON list of objects raises AskedError: the run cannot check its GPUs
    against a list it cannot read, and must not report that the host named none.
    """
    raw = environ.get(ASKED_ENV)
    if raw is None:
        return None
    allowed = 'a JSON list of objects such as [{"uuid": "GPU-...", "pci_bus_id": "0000:3b:00.0"}] ([] for none)'
    try:
        listed = json.loads(raw)
    except ValueError as exc:
        raise AskedError(f"{ASKED_ENV}={raw[:200]!r} is malformed ({exc}); expected {allowed}") from None
    if not isinstance(listed, list) or not all(isinstance(g, dict) for g in listed):
        raise AskedError(f"{ASKED_ENV}={raw[:200]!r} is malformed: expected {allowed}")
    return [identity(**g) for g in listed]


def complete(asked: Sequence[Mapping[str, Any]], driver: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """``asked`` with a missing UUID or bus id filled in from the driver's own list (nvidia-smi's).

    The host may know a GPU by UUID only (the Docker engine's probe); the driver in the run's own
    namespace pairs that UUID with its bus id, which is what TensorFlow reports.
    """
    known = [identity(g.get("uuid"), g.get("pci_bus_id")) for g in driver]
    filled = []
    for gpu in asked:
        gpu = dict(gpu)
        for mine, other in (("uuid", "pci_bus_id"), ("pci_bus_id", "uuid")):
            if not gpu.get(other) and gpu.get(mine):
                match = [k for k in known if k[mine] == gpu[mine] and k[other]]
                if len(match) == 1:
                    gpu[other] = match[0][other]
        filled.append(gpu)
    return filled


def compare(asked: Sequence[Mapping[str, Any]], seen: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """How the GPUs the framework reports (``seen``) stand against those asked for.

    The answer's ``status``: ``confirmed`` (every GPU seen is one asked for, each asked one seen,
    by UUID where both sides know it, else by PCI bus id), ``mismatch`` (some GPU is not the one
    asked for, or the counts differ), or ``unconfirmed`` (the framework reports neither a UUID nor
    a bus id for some GPU, so only the count could be checked). ``by`` says which key decided.
    Order is not compared: which replica runs on which GPU does not change what is measured.
    """
    record: dict[str, Any] = {"asked": [dict(a) for a in asked], "seen": [dict(s) for s in seen], "by": None}
    if len(asked) != len(seen):
        return {**record, "status": "mismatch", "message": _mismatch("count differs", asked, seen)}
    for key in ("uuid", "pci_bus_id"):
        if all(a.get(key) for a in asked) and all(s.get(key) for s in seen):
            same = sorted(a[key] for a in asked) == sorted(s[key] for s in seen)
            if not same:
                return {**record, "by": key, "status": "mismatch", "message": _mismatch(f"by {key}", asked, seen)}
            return {**record, "by": key, "status": "confirmed", "message": ""}
    why = "the framework reports neither a UUID nor a PCI bus id for every GPU; only their number was checked"
    return {**record, "status": "unconfirmed", "message": why}


def _mismatch(how: str, asked: Sequence[Mapping[str, Any]], seen: Sequence[Mapping[str, Any]]) -> str:
    def show(gpus: Sequence[Mapping[str, Any]]) -> str:
        return "[" + "; ".join(f"{g.get('uuid') or '?'} at {g.get('pci_bus_id') or '?'}" for g in gpus) + "]"

    return (
        f"the framework trains on other GPUs than asked for ({how}): asked {show(asked)}, framework sees {show(seen)}"
    )


def bus_id_from_description(description: str) -> str | None:
    """The bus id in TensorFlow's device description: ``device: 0, name: ..., pci bus id: 0000:3b:00.0, ...``."""
    match = re.search(r"pci bus id:\s*([0-9A-Fa-f:.]+)", description or "")
    return normalise_bus_id(match.group(1)) if match else None


def cuda_driver_devices(library: str = "libcuda.so.1") -> list[dict[str, Any]] | None:
    """UUID and bus id of each device the CUDA driver enumerates in this process, by CUDA ordinal.

    This is what every framework's device N is built on (the same ``CUDA_VISIBLE_DEVICES`` and
    ``CUDA_DEVICE_ORDER``); used where a framework's own API names no UUID or bus id. Creates no
    context and allocates nothing. None when the driver library cannot be loaded or answers an error.
    """
    try:
        cuda = ctypes.CDLL(library)
    except OSError:
        return None
    count = ctypes.c_int()
    if cuda.cuInit(0) != 0 or cuda.cuDeviceGetCount(ctypes.byref(count)) != 0:
        return None
    found = []
    for ordinal in range(count.value):
        device = ctypes.c_int()
        bus = ctypes.create_string_buffer(64)
        raw = ctypes.create_string_buffer(16)
        if cuda.cuDeviceGet(ctypes.byref(device), ordinal) != 0:
            return None
        uuid_ok = getattr(cuda, "cuDeviceGetUuid_v2", cuda.cuDeviceGetUuid)(raw, device) == 0
        bus_ok = cuda.cuDeviceGetPCIBusId(bus, 64, device) == 0
        found.append(identity(raw.raw if uuid_ok else None, bus.value.decode() if bus_ok else None, index=ordinal))
    return found
